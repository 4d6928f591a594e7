package runtime

import (
	"context"
	"fmt"
	"testing"
)

// A node joining a three-node mesh in which every node writes its own
// rows (each holds all three sites' events, in its own log order)
// receives each event about once, not once per peer.
func TestJoinFromThreeWritersReceivesEachEventOnce(t *testing.T) {
	const perNode = 150
	writers := []string{"a", "b", "c"}
	m := newTestMesh(t, 1, append(append([]string{}, writers...), "j"), func(string) Config { return Config{PushBatch: 50} })
	for _, a := range writers {
		for _, b := range writers {
			if a != b {
				m.link(a, b)
			}
		}
	}
	for k, w := range writers {
		n := m.nodes[w]
		for i := 0; i < perNode; i++ {
			id := int64(k*perNode + i)
			if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": id}, map[string]any{"a": fmt.Sprint(w, " ", i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	m.syncAll(40)
	total := uint64(len(writers) * perNode)
	for _, w := range writers {
		if seq, err := m.nodes[w].LastSeq(context.Background()); err != nil || seq != total {
			t.Fatalf("%s holds %d of %d events (%v)", w, seq, total, err)
		}
		m.link(w, "j")
	}
	ctx := context.Background()
	offered := 0
	for round := 0; ; round++ {
		if round > 200 {
			t.Fatal("writers not done with the joiner after 200 rounds")
		}
		done := true
		for _, w := range writers {
			rep, err := m.nodes[w].SyncNow(ctx, "j", "")
			if err != nil || rep.Err != nil {
				t.Fatalf("SyncNow %s: %v %v", w, err, rep.Err)
			}
			offered += rep.Offered
			done = done && rep.Done()
		}
		if done {
			break
		}
	}
	j := m.nodes["j"]
	if seq, err := j.LastSeq(j.ctx); err != nil || seq != total {
		t.Fatalf("joiner holds %d of %d events (%v)", seq, total, err)
	}
	if s, ref := state(t, j.Node), state(t, m.nodes["a"].Node); s != ref {
		t.Fatalf("joiner's state differs from a's")
	}
	t.Logf("%d events received for %d held", offered, total)
	if float64(offered) > 1.05*float64(total) {
		t.Fatalf("the joiner received %d events from 3 writers for %d distinct ones (%.2f copies)", offered, total, float64(offered)/float64(total))
	}
}
