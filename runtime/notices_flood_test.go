package runtime

import (
	"sync"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// A peer that sends garbage causes one notice per event (every dropped
// event is surfaced). Behind a Subscribe callback that does not keep up,
// the node holds at most its notice queue's bound of them: the rest are
// counted and reported as one NoticesMissed in their place, and nothing
// is lost from the count. On the old code every notice was queued.
func TestAttackSlowSubscriberFloodIsBounded(t *testing.T) {
	const flood = 6000
	n := openTestNode(t, Config{})
	n.define(defT)
	stranger := newPeer(t, 9) // never trusted: every event is dropped

	release := make(chan struct{})
	var mu sync.Mutex
	delivered, dropped, missed := 0, 0, uint64(0)
	first := true
	cancel := n.Subscribe(func(x messages.Notice) {
		if first {
			first = false
			<-release
		}
		mu.Lock()
		defer mu.Unlock()
		delivered++
		switch m := x.(type) {
		case messages.EventDropped:
			dropped++
		case messages.NoticesMissed:
			missed += m.Count
		}
	})
	defer cancel()

	batch := make([][]byte, 0, 500)
	for i := 0; i < flood; i++ {
		batch = append(batch, stranger.upsert(hlcAt(n.wall.MS(), uint16(i)), i, map[string]any{"a": "x"}))
		if len(batch) == cap(batch) {
			outs, err := n.ApplySignedBatch(n.ctx, batch)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range outs {
				if o.Kind != messages.Dropped {
					t.Fatalf("outcome %v, want dropped", o)
				}
			}
			batch = batch[:0]
		}
	}
	close(release)
	// Delivery is asynchronous: wait until every dropped event is
	// accounted for, delivered or counted missed.
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		accounted := uint64(dropped) + missed
		d := delivered
		mu.Unlock()
		if accounted >= flood {
			if accounted != flood {
				t.Fatalf("%d dropped events accounted for (%d delivered, %d missed), want %d", accounted, dropped, missed, flood)
			}
			// One notice in the blocked callback, the queue behind it.
			if d > DefaultNoticeQueue+1 {
				t.Fatalf("a blocked callback was handed %d notices afterwards; at most %d may be held for it", d, DefaultNoticeQueue+1)
			}
			if missed == 0 {
				t.Fatal("no NoticesMissed for a flood past the queue")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d dropped events accounted for (%d delivered)", accounted, flood, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The queue keeps its order: a NoticesMissed stands where the missed
// notices were, later notices follow it, and it never holds more than its
// limit.
func TestNoticeQueueCountsMissedInPlace(t *testing.T) {
	q := newNoticeQueue(4)
	for i := 0; i < 10; i++ {
		q.push(messages.GroupReleased{Events: i})
	}
	if len(q.items) != 4 {
		t.Fatalf("%d queued, limit 4", len(q.items))
	}
	pop := func() messages.Notice {
		x, ok := q.pop()
		if !ok {
			t.Fatal("queue closed")
		}
		return x
	}
	for i := 0; i < 3; i++ {
		if x := pop(); x != (messages.GroupReleased{Events: i}) {
			t.Fatalf("pop %d: %#v", i, x)
		}
	}
	q.push(messages.GroupReleased{Events: 10})
	q.push(messages.GroupReleased{Events: 11})
	q.push(messages.GroupReleased{Events: 12})
	want := []messages.Notice{messages.NoticesMissed{Count: 7}, messages.GroupReleased{Events: 10}, messages.GroupReleased{Events: 11}, messages.NoticesMissed{Count: 1}}
	if len(q.items) != len(want) {
		t.Fatalf("queue %#v, want %#v", q.items, want)
	}
	for i, w := range want {
		if x := pop(); x != w {
			t.Fatalf("entry %d: %#v, want %#v", i, x, w)
		}
	}
	q.close()
	if _, ok := q.pop(); ok {
		t.Fatal("pop after close")
	}
}
