package messages

// RestoreDetected: the node found evidence that its store is older than
// state it already used — restored from a backup, a VM snapshot or a
// copy — and took the recovery steps on its own (docs/operations.md,
// "Backup and restore"). Plane is "delivery" or "sync". Evidence is from
// a closed set: "mark" (a mark kept beside node.db is above the store's
// own count, or is missing or damaged beside a store that has state),
// "peer" (a peer holds events signed by this node above the clock the
// store resumed from). Detail says what was compared, for logs and
// operators. LostSends (delivery plane) is how many messages this device
// accepted for sending that the restored store no longer holds: their
// ACKs, when they come, are SentMessageLost notices. Nothing is asked of
// the application.
type RestoreDetected struct {
	Plane     string
	Evidence  string
	Detail    string
	LostSends uint64
}

func (RestoreDetected) notice() {}
