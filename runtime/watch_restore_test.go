package runtime

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/persistence"
)

// A whole directory restored from an older copy (node.db and changes.mark
// together, as a VM snapshot or a cold backup brings them back) never
// assigns a change sequence its lost history assigned: a watcher that
// processed changes of the lost history gets a *WatchRestoredError even
// after the new history has more changes than the lost one, never other
// changes under numbers it already saw; LastChangeSeq names a change the
// store holds, and a watcher at a position the copy holds continues with
// the new changes only.
func TestWatchAfterWholeDirectoryRestoreNeverSeesReusedSequences(t *testing.T) {
	dir := t.TempDir()
	clock := newWall()
	cfg := Config{Dir: dir, NoSync: true, ReconcileInterval: -1, SyncInterval: -1, Wall: clock.Now}
	put := func(n *testNode, i int, v string) {
		t.Helper()
		if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": i}, map[string]any{"a": v}); err != nil {
			t.Fatal(err)
		}
	}
	n := openTestNode(t, cfg)
	n.define(defT)
	for i := 0; i < 5; i++ {
		put(n, i, "before")
	}
	copyLast := lastChange(t, n.Node)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	backup := t.TempDir()
	copyDir(t, dir, backup)

	clock.Advance(time.Minute)
	n = openTestNode(t, cfg)
	for i := 5; i < 10; i++ {
		put(n, i, "lost")
	}
	seen := take(t, n.Node, 0, 10)
	processed := seen[len(seen)-1].Seq
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	copyDir(t, backup, dir)
	clock.Advance(time.Minute)
	n = openTestNode(t, cfg)
	if got := lastChange(t, n.Node); got != copyLast {
		t.Fatalf("LastChangeSeq after the restore: %d, want the copy's last change %d", got, copyLast)
	}
	// More changes than the lost history had: the new history passes the
	// watcher's position.
	for i := 10; i < 30; i++ {
		put(n, i, "after")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for c, err := range n.Watch(ctx, "app", "t", processed) {
		var re *WatchRestoredError
		if !errors.As(err, &re) || !errors.Is(err, ErrWatchRestored) {
			var a string
			_, _ = c.Value("a", &a)
			t.Fatalf("watch after %d, past a whole-directory restore: change %d (a=%q), err %v; want a *WatchRestoredError", processed, c.Seq, a, err)
		}
		if re.After != processed || re.Lost.From != copyLast || re.Lost.To < processed || re.Resume <= processed {
			t.Fatalf("restore error %+v (copy's last %d)", re, copyLast)
		}
		break
	}
	// From the copy's last change (what LastChangeSeq said, and where the
	// error says the store resumed): exactly the new changes, above every
	// number the lost history used.
	got := take(t, n.Node, copyLast, 20)
	for i, c := range got {
		var a string
		if _, err := c.Value("a", &a); err != nil {
			t.Fatal(err)
		}
		if a != "after" || c.Seq <= processed || (i > 0 && c.Seq != got[i-1].Seq+1) {
			t.Fatalf("change %d: seq %d a=%q: want a new change above %d", i, c.Seq, a, processed)
		}
	}
}

// The stretches skipped at Opens, property-checked against a simulated
// history of Opens (each skipping a stretch or not) and appends: the list
// stays ordered, disjoint and bounded, and round-trips through its meta
// encoding; every number an Open skipped stays inside a recorded stretch
// (a position of a lost history is always recognized), and while no
// stretches were merged no assigned number is inside one; the trim window
// holds the newest keep changes exactly (at most keep once merged).
func TestChangeGapsAndTrimWindow(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for run := 0; run < 40; run++ {
		opens := 1 + rng.IntN(60)
		if run%10 == 9 {
			opens = maxChangeGaps + 1 + rng.IntN(300) // past the bound: merges
		}
		var gaps []ChangeGap
		var skipped []ChangeGap
		var assigned []uint64
		var c uint64
		for o := 0; o < opens; o++ {
			if rng.IntN(4) > 0 {
				top := c + 1 + uint64(rng.IntN(1000))
				skipped = append(skipped, ChangeGap{From: c, To: top})
				gaps = addGap(gaps, ChangeGap{From: c, To: top})
				c = top
			}
			for k := rng.IntN(8); k > 0; k-- {
				c++
				assigned = append(assigned, c)
			}
		}
		merged := len(skipped) > maxChangeGaps
		if len(gaps) > maxChangeGaps {
			t.Fatalf("run %d: %d stretches, bound %d", run, len(gaps), maxChangeGaps)
		}
		back, err := decodeGaps(encodeGaps(gaps))
		if err != nil || !slices.Equal(back, gaps) {
			t.Fatalf("run %d: round trip %v, %v", run, back, err)
		}
		for _, s := range skipped {
			for _, p := range []uint64{s.From + 1, s.To, (s.From + s.To + 1) / 2} {
				if _, ok := gapOf(gaps, p); !ok {
					t.Fatalf("run %d: skipped %d (of %+v) is in no recorded stretch", run, p, s)
				}
			}
		}
		if !merged {
			for _, p := range assigned {
				if g, ok := gapOf(gaps, p); ok {
					t.Fatalf("run %d: assigned %d reads as skipped (%+v)", run, p, g)
				}
			}
		}
		for _, keep := range []uint64{1, 2, 7, uint64(len(assigned)), uint64(len(assigned) + 3), uint64(rng.IntN(len(assigned)+1)) + 1} {
			w := trimWindow(gaps, c, keep)
			kept := uint64(0)
			for _, p := range assigned {
				if c-p < w {
					kept++
				}
			}
			want := min(keep, uint64(len(assigned)))
			if kept > want || (!merged && kept != want) {
				t.Fatalf("run %d (merged %v): window %d keeps %d changes, want %d of %d", run, merged, w, kept, want, len(assigned))
			}
		}
	}
}

// A corrupt or disordered stretch list is a corrupt-store error.
func TestDecodeGapsRefusesDisorder(t *testing.T) {
	for name, gaps := range map[string][]ChangeGap{
		"empty stretch": {{From: 5, To: 5}},
		"reversed":      {{From: 9, To: 3}},
		"overlap":       {{From: 1, To: 10}, {From: 5, To: 20}},
		"out of order":  {{From: 30, To: 40}, {From: 1, To: 10}},
	} {
		if _, err := decodeGaps(encodeGaps(gaps)); !errors.Is(err, persistence.ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := decodeGaps(make([]byte, 15)); !errors.Is(err, persistence.ErrCorrupt) {
		t.Errorf("15 bytes: %v", err)
	}
	if _, err := decodeGaps(make([]byte, 16*(maxChangeGaps+1))); !errors.Is(err, persistence.ErrCorrupt) {
		t.Errorf("past the bound: %v", err)
	}
}

// FuzzDecodeGaps: never panics; what decodes is ordered and re-encodes
// identically.
func FuzzDecodeGaps(f *testing.F) {
	f.Add(encodeGaps([]ChangeGap{{0, 1_800_000_000_000_000}}))
	f.Add(encodeGaps([]ChangeGap{{0, 10}, {15, 99}}))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		gaps, err := decodeGaps(b)
		if err != nil {
			return
		}
		if string(encodeGaps(gaps)) != string(b) {
			t.Fatalf("%x decodes to %v, which encodes differently", b, gaps)
		}
		for i, g := range gaps {
			if g.From >= g.To || (i > 0 && g.From < gaps[i-1].To) {
				t.Fatalf("decoded disordered %v", gaps)
			}
		}
	})
}

// The change log keeps its newest Config.ChangeLogLimit changes across a
// jump of the sequences (a crash leaves changes.mark ahead of the store
// by up to a lease; every Open continues above the wall clock): the
// numbers skipped are not counted, so a watcher inside the retained
// changes does not lag because of the jump.
func TestChangeLogKeepsItsLimitAcrossASequenceJump(t *testing.T) {
	const limit = 8
	dir := t.TempDir()
	cfg := Config{Dir: dir, NoSync: true, ReconcileInterval: -1, SyncInterval: -1, ChangeLogLimit: limit}
	n := openTestNode(t, cfg)
	n.define(defT)
	put := func(n *testNode, i int) {
		t.Helper()
		if _, err := n.Upsert(n.ctx, "app", "t", map[string]any{"id": i}, map[string]any{"a": i}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 5; i++ {
		put(n, i)
	}
	seen := take(t, n.Node, 0, 5)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	// As a crash leaves it: the mark ahead of the store's last change.
	if err := writeFileAtomic(filepath.Join(dir, changeMarkName), encodeChangeMark(seen[4].Seq+1000), true); err != nil {
		t.Fatal(err)
	}
	n = openTestNode(t, cfg)
	put(n, 5)
	got := take(t, n.Node, seen[1].Seq, 4)
	for i, c := range got[:3] {
		if c.Seq != seen[2+i].Seq {
			t.Fatalf("change %d after the jump: seq %d, want the retained %d", i, c.Seq, seen[2+i].Seq)
		}
	}
	if got[3].Seq <= seen[4].Seq+1000 {
		t.Fatalf("new change %d, want above the mark %d", got[3].Seq, seen[4].Seq+1000)
	}
}
