package device

import (
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// TestCopyPushedWhileTheFirstIsBeingHandedIsNotHanded: the dispatcher
// takes the first copy of a message from the queue; before it hands it, a
// sender's retry pushes a second copy (the first is then neither queued
// nor being sent). The application takes the first from the Messages
// channel and will finalize it; the second must not be handed into the
// channel meanwhile (a finalization cannot reach the channel, so it would
// be received again after its commit).
func TestCopyPushedWhileTheFirstIsBeingHandedIsNotHanded(t *testing.T) {
	now := time.Unix(1000, 0)
	q := newDeliveryQueue(16, 1<<20, func() {})
	q.now, q.redeliverAfter = func() time.Time { return now }, 30*time.Second
	q.feed = make(chan ReceivedMessage, 1)
	m := ReceivedMessage{Sender: messages.DeviceAddress{User: "alice", Device: 1}, ID: messages.LogicalMessageID{1}, Sequence: 1, Plaintext: []byte("m1")}

	q.push(m)
	first, ok, _, _ := q.take()
	if !ok {
		t.Fatal("nothing queued")
	}
	q.push(m) // the retry's copy, in the window between take and handing
	if !q.handing(first) {
		t.Fatal("the first copy was not handed")
	}
	q.feed <- first
	q.fed(true)
	<-q.feed // the application takes it (and commits it next)
	second, ok, _, _ := q.take()
	if ok && q.handing(second) {
		t.Fatalf("the copy pushed while the first was being handed is handed too (Sequence %d): the application receives it after committing the first", second.Sequence)
	}
}
