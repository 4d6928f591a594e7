package reconcile

import "time"

// Status summarizes the last reconciliation a node started with one peer
// (what the runtime reports in its peers' status). A zero At means none
// has run yet.
type Status struct {
	// At is when it finished; Took how long it ran.
	At   time.Time
	Took time.Duration
	// Rounds are the range-message round trips; BytesSent and
	// BytesReceived the encoded messages and fetch replies on the wire.
	Rounds                   int
	BytesSent, BytesReceived int
	// Missing counts the events found held by the peer and lacking here;
	// Fetched the events received for them (every one went through the
	// apply chokepoint).
	Missing, Fetched int
	// Err is why it failed; nil on success.
	Err error
}

// OK reports whether a reconciliation ran and succeeded.
func (s Status) OK() bool { return !s.At.IsZero() && s.Err == nil }
