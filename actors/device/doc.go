package device

// # Guarantees (docs/protocol.md, commit boundary)
//
// At-least-once application delivery until an explicit commit or discard;
// deduplicated protocol handling (one pending entry per (sender, logical
// id); finalized ids are acknowledged, not delivered again); an ACK means
// the receiving application durably finalized the message. It is not
// exactly-once processing: apply messages idempotently keyed by (sender,
// id), because a crash between the application's own commit and
// CommitReceivedMessage redelivers the message.
//
// # Decisions where the specification is silent
//
// These are this project's choices, recorded here as its documentation:
//
//   - Discard (docs/protocol.md, commit boundary, "Discard"): a discarded message
//     is ACKed exactly like a committed one, so the sender cannot tell
//     them apart; its reason is one of persistence.DiscardReason's closed
//     set, stored with the processed entry (ProcessedMessage) and never
//     sent. Committing a discarded id answers ALREADY_DISCARDED and
//     discarding a committed id ALREADY_COMMITTED: the first finalization
//     wins and is never replaced.
//   - Sender side (docs/protocol.md, commit boundary, "Sender side"): Send stores
//     the message before the hand-off with attempts = 1; a failed
//     encryption or hand-off leaves it pending and returns ErrNotHandedOff.
//     An ACK for an id that is not pending (abandoned, or a repeated ACK)
//     is an Acknowledgement with Cleared = false; for an id the store
//     never retired either (a send a rolled-back store lost) UnknownAck
//     is set. Abandon only forgets the message locally; a copy already
//     sent may still be applied, and the id stays retired.
//   - Retry schedule (beyond the spec; off in this package's zero
//     Config, on by default in runtime.DeviceConfig): every
//     RetryPolicy.Interval, each pending sent message whose last attempt
//     is older than Interval·Backoff^(attempts−1) (capped by MaxInterval,
//     shortened by Jitter) is resent as a fresh encryption, each
//     recipient's on a worker of its own; every try counts as an attempt;
//     a message at MaxAttempts stays pending and is reported once per
//     process to OnRetryExhausted.
//   - Application hand-off: a commit or discard removes every queued
//     copy of the message, and no copy is handed over after it; a copy
//     of a message handed over less than RedeliverAfter ago is not
//     handed again.
//   - Flow control (beyond the spec, off by default):
//     MaxPendingPerSender refuses a NEW message of a sender at the cap
//     before its ratchet step is persisted (inbound.ErrSenderBacklogFull);
//     copies of pending or finalized messages and ACKs are never refused,
//     and nothing already accepted is ever dropped.
//   - Prune schedule (beyond the spec, off by default): PruneSchedule runs
//     PruneProcessedMessages with its policy every Interval.
//   - Transport ordering: Receive calls for one sender are serialized by
//     that sender's session actor; the sequence reflects local acceptance
//     order only.
//   - Legacy processed entries (no digest) exist only if imported by a
//     migration (persistence.LegacyImporter), which writes a sealed legacy
//     marker; a copy then counts as committed. An entry without digest
//     and without the marker is persistence.ErrCorrupt.
//   - Context cancellation: a call whose context ends before the sender's
//     peer actor reaches it changes nothing; one whose writes were handed
//     to the store's committer completes, and its caller gets ctx.Err() — for a
//     receive that is the crash window "after the receive commit, before
//     Delivery reached the application" (the message is delivered again).
