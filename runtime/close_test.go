package runtime

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
)

// Close drains the group actors: every caller gets an answer, and every
// event answered "applied" is durable.
func TestCloseDrainsInFlightApplies(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	w := newWall()
	n, err := Open(ctx, Config{Dir: dir, MeshID: testMesh, Wall: w.Now})
	if err != nil {
		t.Fatal(err)
	}
	tn := &testNode{Node: n, t: t, wall: w, ctx: ctx}
	tn.define(defT)
	p := newPeer(t, 1)
	tn.trust(p)
	var raws [][]byte
	for i := 0; i < 300; i++ {
		raws = append(raws, p.upsert(hlcAt(w.MS(), uint16(i+1)), i, map[string]any{"a": i}))
	}
	var mu sync.Mutex
	applied := map[int]bool{}
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < len(raws); i += 6 {
				out, err := n.ApplySigned(ctx, raws[i])
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("apply %d: %v", i, err)
					return
				}
				if out.Kind == messages.Applied {
					mu.Lock()
					applied[i] = true
					mu.Unlock()
				}
			}
		}(g)
	}
	for {
		mu.Lock()
		k := len(applied)
		mu.Unlock()
		if k >= 30 {
			break
		}
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait() // every caller returned: none was stranded by the close
	n, err = Open(ctx, Config{Dir: dir, Wall: w.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	tn.Node = n
	for i := range applied {
		if _, ok := tn.get(i); !ok {
			t.Fatalf("event %d was answered applied but is gone after reopen", i)
		}
	}
}
