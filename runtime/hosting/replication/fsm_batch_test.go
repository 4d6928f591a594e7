package replication

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// logCommitter appends each write set of its unit to a log and applies
// it to its own scratch copy at that index, as a leader would.
type logCommitter struct {
	unit string
	db   *bolt.DB
	l    *testLog
}

type testLog struct{ logs []*raft.Log }

func (l *testLog) add(typ raft.LogType, data []byte) uint64 {
	idx := uint64(len(l.logs) + 1)
	l.logs = append(l.logs, &raft.Log{Index: idx, Type: typ, Data: data})
	return idx
}

func (c *logCommitter) Commit(_ context.Context, ws []byte) error {
	b, err := entry{kind: kindWriteSet, unit: c.unit, payload: ws}.encode()
	if err != nil {
		return err
	}
	idx := uint64(len(c.l.logs) + 1)
	c.l.logs = append(c.l.logs, &raft.Log{Index: idx, Type: raft.LogCommand, Data: b})
	return c.db.ApplyWriteSet(idx, ws)
}

// TestApplyBatchMatchesOneAtATime applies one log — write sets of
// several units interleaved, a file, a removal, a stale write set, an
// entry that does not decode, a no-op, and a unit whose serving DB was
// closed without its detach — once entry by entry (Apply) and once as
// one batch (ApplyBatch, units applied concurrently): the responses and
// every replica's content are the same.
func TestApplyBatchMatchesOneAtATime(t *testing.T) {
	root := t.TempDir()
	open := func(name string) *Engine {
		e, err := Open(context.Background(), testConfig(t, root, name, "127.0.0.1:0"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		return e
	}
	one, batch := open("one"), open("batch")
	var units []string
	for i := 0; len(units) < 5; i++ {
		if u := fmt.Sprintf("tenant/dev-%d", i); one.PartitionOf(u) == 0 {
			units = append(units, u)
		}
	}
	l := &testLog{}
	writers := map[string]*bolt.DB{}
	for _, u := range units {
		c := &logCommitter{unit: u, l: l}
		d, err := bolt.Open(filepath.Join(t.TempDir(), "scratch.db"), bolt.Options{NoSync: true, Committer: c})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		c.db = d
		writers[u] = d
	}
	var stale []byte
	var staleAt uint64
	hold := holdCommitter(func(ws []byte) { stale = ws })
	sd, err := bolt.Open(filepath.Join(t.TempDir(), "stale.db"), bolt.Options{NoSync: true, Committer: hold})
	if err != nil {
		t.Fatal(err)
	}
	defer sd.Close()
	_ = putMeta(context.Background(), sd, "stale", "1")
	for round := range 4 {
		for k, u := range units {
			switch {
			case round == 2 && k == 1:
				b, _ := entry{kind: kindFile, unit: u, name: "storage.key", payload: []byte("key of " + u)}.encode()
				l.add(raft.LogCommand, b)
			case round == 3 && k == 3:
				b, _ := entry{kind: kindRemove, unit: u}.encode()
				l.add(raft.LogCommand, b)
				continue
			case round == 1 && k == 2:
				b, _ := entry{kind: kindWriteSet, unit: u, payload: stale}.encode()
				staleAt = l.add(raft.LogCommand, b)
				l.add(raft.LogCommand, []byte("not an entry"))
				l.add(raft.LogNoop, nil)
			}
			if err := putMeta(context.Background(), writers[u], fmt.Sprintf("k%d", round), u); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The batch side serves units[0] from a DB closed without detach.
	closed, _, err := batch.OpenUnit(units[0], bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = closed.Close()
	closedOne, _, err := one.OpenUnit(units[0], bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = closedOne.Close()

	var want, got []any
	for _, lg := range l.logs {
		want = append(want, (&fsm{s: one.stores[0]}).Apply(lg))
	}
	got = (&fsm{s: batch.stores[0]}).ApplyBatch(l.logs)
	if len(got) != len(want) {
		t.Fatalf("%d responses, want %d", len(got), len(want))
	}
	for i := range want {
		we, _ := want[i].(error)
		ge, _ := got[i].(error)
		if (we == nil) != (ge == nil) || (we != nil && (errors.Is(we, bolt.ErrStaleWriteSet) != errors.Is(ge, bolt.ErrStaleWriteSet) || errors.Is(we, ErrBadEntry) != errors.Is(ge, ErrBadEntry))) {
			t.Fatalf("entry %d: batch response %v, one at a time %v", i+1, got[i], want[i])
		}
	}
	if e, _ := want[staleAt-1].(error); !errors.Is(e, bolt.ErrStaleWriteSet) {
		t.Fatalf("the stale set's response is %v, want bolt.ErrStaleWriteSet", want[staleAt-1])
	}
	for _, u := range units {
		w, g := dumpUnit(t, one, u), dumpUnit(t, batch, u)
		if strings.Join(w, "\n") != strings.Join(g, "\n") {
			t.Fatalf("%s: batch replica\n%s\none at a time\n%s", u, strings.Join(g, "\n"), strings.Join(w, "\n"))
		}
		if u != units[3] && len(w) == 0 {
			t.Fatalf("%s: empty replica", u)
		}
	}
	if n := batch.Stats().ApplyErrors; n != one.Stats().ApplyErrors || n != 1 {
		t.Fatalf("apply errors: batch %d, one at a time %d, want 1 (the entry that does not decode)", n, one.Stats().ApplyErrors)
	}
}
