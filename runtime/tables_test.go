package runtime

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fxamacker/cbor/v2"
	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/actors/syncgroup"
	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// seededPeer is a peer whose key comes from seed (the same peer in a
// child process and in its parent).
func seededPeer(t *testing.T, site byte, seed []byte) *peer {
	return &peer{t: t, signer: sign.NewSigner(messages.SiteID{site}, ed25519.NewKeyFromSeed(seed))}
}

// defAB is the table the AddColumn tests grow by column z.
var defAB = TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a", "b"}}

var tableT = persistence.TableKey{Schema: "app", Table: "t"}

// storedRows renders every stored row of app.t, as the store holds it.
func storedRows(t testing.TB, n *Node) string {
	var b strings.Builder
	if err := n.store.View(context.Background(), func(tx persistence.SyncReader) error {
		return tx.Rows(tableT, nil, func(k []byte, r persistence.Row) (bool, error) {
			if len(r.Cells) == 0 {
				r.Cells = nil
			}
			fmt.Fprintf(&b, "%x %+v\n", k, r)
			return true, nil
		})
	}); err != nil {
		t.Fatalf("rows: %v", err)
	}
	return b.String()
}

func pendingRebuilds(t testing.TB, n *Node) []syncgroup.ColumnRebuild {
	var rs []syncgroup.ColumnRebuild
	if err := n.store.View(context.Background(), func(tx persistence.SyncReader) error {
		var err error
		rs, err = syncgroup.ColumnRebuilds(tx)
		return err
	}); err != nil {
		t.Fatalf("rebuilds: %v", err)
	}
	return rs
}

func openAB(t testing.TB, cfg Config, peers []*peer) *Node {
	t.Helper()
	cfg.MeshID, cfg.ReconcileInterval = testMesh, -1
	if cfg.Wall == nil {
		cfg.Wall = newWall().Now
	}
	if cfg.Dir == "" {
		cfg.InMemory = true
	}
	n, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	ctx := context.Background()
	if defs, err := n.Tables(ctx); err != nil {
		t.Fatal(err)
	} else if len(defs) == 0 { // a new store; a reopened one has its table
		if err := n.DefineTable(ctx, defAB); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range peers {
		if err := n.Trust(ctx, p.key()); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func applyAll(t testing.TB, n *Node, raws [][]byte) {
	t.Helper()
	if len(raws) == 0 {
		return
	}
	if _, err := n.ApplySignedBatch(context.Background(), raws); err != nil {
		t.Fatalf("apply: %v", err)
	}
}

// genColumnEvents draws signed events on rows 0..rows-1 of app.t, from
// two sites with distinct HLCs per site: upserts of a, b and the column z
// that is unknown until AddColumn, and deletes (so resurrections).
func genColumnEvents(rt *rapid.T, peers []*peer, rows int) [][]byte {
	base := newWall().MS()
	used := map[[2]int]bool{}
	var raws [][]byte
	for i, n := 0, rapid.IntRange(1, 40).Draw(rt, "events"); i < n; i++ {
		s, l := rapid.IntRange(0, len(peers)-1).Draw(rt, "site"), rapid.IntRange(1, 60).Draw(rt, "logical")
		if used[[2]int{s, l}] {
			continue
		}
		used[[2]int{s, l}] = true
		id, h := rapid.IntRange(0, rows-1).Draw(rt, "row"), hlcAt(base, uint16(l))
		if rapid.IntRange(0, 4).Draw(rt, "op") == 0 {
			raws = append(raws, peers[s].del(h, id))
			continue
		}
		cols := map[string]any{}
		for _, c := range []string{"a", "b", "z"} {
			switch rapid.IntRange(0, 3).Draw(rt, "cell") {
			case 1:
				cols[c] = nil
			case 2, 3:
				cols[c] = rapid.IntRange(0, 9).Draw(rt, "v")
			}
		}
		raws = append(raws, peers[s].upsert(h, id, cols))
	}
	return raws
}

// An AddColumn rebuilt in chunks of 1..5 rows, with the rest of the events
// applied between its chunks (and after it), stores exactly the rows of a
// one-shot rebuild after every event (SSP/1 §13.6); the change log aside,
// which records when each cell changed.
func TestPropertyChunkedAddColumnEqualsOneShot(t *testing.T) {
	peers := []*peer{newPeer(t, 1), newPeer(t, 2)}
	rapid.Check(t, func(rt *rapid.T) {
		rows := rapid.IntRange(1, 12).Draw(rt, "rows")
		raws := genColumnEvents(rt, peers, rows)
		cut := rapid.IntRange(0, len(raws)).Draw(rt, "before-add")
		perChunk := rapid.IntRange(0, 3).Draw(rt, "applied-per-chunk")

		ref := openAB(t, Config{AddColumnChunk: 1 << 20}, peers)
		defer ref.Close()
		applyAll(t, ref, raws)
		if err := ref.AddColumn(context.Background(), "app", "t", "z"); err != nil {
			rt.Fatal(err)
		}

		rest := raws[cut:]
		var n *Node
		chunks := 0
		n = openAB(t, Config{AddColumnChunk: rapid.IntRange(1, 5).Draw(rt, "chunk"), Failpoint: func(name string) error {
			if name != FailpointAddColumnChunk {
				return nil
			}
			chunks++
			k := min(perChunk, len(rest))
			applyAll(t, n, rest[:k]) // concurrent writes, between two chunks
			rest = rest[k:]
			return nil
		}}, peers)
		defer n.Close()
		applyAll(t, n, raws[:cut])
		if err := n.AddColumn(context.Background(), "app", "t", "z"); err != nil {
			rt.Fatal(err)
		}
		applyAll(t, n, rest)
		if rs := pendingRebuilds(t, n); len(rs) != 0 {
			rt.Fatalf("rebuilds still pending: %+v", rs)
		}
		if got, want := storedRows(t, n), storedRows(t, ref); got != want {
			rt.Fatalf("chunked rebuild (%d chunks) differs from one-shot\nwant:\n%s\ngot:\n%s", chunks, want, got)
		}
	})
}

// What readers and writers see while an AddColumn is interrupted: the
// definition has the column; the rows rebuilt so far (row-key order, up
// to the stored progress) read it, the others read it unwritten; an event
// applied meanwhile writes it on any row. Reopening resumes the rebuild
// and ends with the one-shot rebuild's rows.
func TestAddColumnInterruptedResumesOnOpen(t *testing.T) {
	peers := []*peer{newPeer(t, 1)}
	base := newWall().MS()
	var raws [][]byte
	for id := 0; id < 10; id++ {
		raws = append(raws, peers[0].upsert(hlcAt(base, uint16(id+1)), id, map[string]any{"a": id, "z": 100 + id}))
	}
	late := peers[0].upsert(hlcAt(base, 50), 9, map[string]any{"z": 999})

	ref := openAB(t, Config{}, peers)
	defer ref.Close()
	applyAll(t, ref, append(raws, late))
	if err := ref.AddColumn(context.Background(), "app", "t", "z"); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	injected := errors.New("crash")
	chunks := 0
	n := openAB(t, Config{Dir: dir, NoSync: true, AddColumnChunk: 3, Failpoint: func(name string) error {
		if name == FailpointAddColumnChunk {
			if chunks++; chunks == 2 {
				return injected
			}
		}
		return nil
	}}, peers)
	applyAll(t, n, raws)
	if err := n.AddColumn(context.Background(), "app", "t", "z"); !errors.Is(err, injected) {
		t.Fatalf("AddColumn at the failpoint: %v", err)
	}
	defs, err := n.Tables(context.Background())
	if err != nil || len(defs) != 1 || strings.Join(defs[0].Columns, ",") != "a,b,z" {
		t.Fatalf("definition while rebuilding: %+v, %v", defs, err)
	}
	rs := pendingRebuilds(t, n)
	if len(rs) != 1 || rs[0].Column != "z" || len(rs[0].After) == 0 {
		t.Fatalf("pending rebuilds after 2 chunks: %+v", rs)
	}
	rebuilt := 0
	for id := 0; id < 10; id++ {
		r, ok, err := n.Get(context.Background(), "app", "t", map[string]any{"id": id})
		if err != nil || !ok {
			t.Fatalf("get %d: %v %v", id, ok, err)
		}
		var z int
		st, err := r.Value("z", &z)
		done := string(messages.Columns{"id": messages.MustValue(id)}.Encode()) <= string(rs[0].After)
		switch {
		case err != nil:
			t.Fatalf("row %d: %v", id, err)
		case done && (st != Written || z != 100+id):
			t.Fatalf("row %d behind the progress reads z = %v %d, want set %d", id, st, z, 100+id)
		case !done && st != Unmaterialized:
			t.Fatalf("row %d past the progress reads z set before its rebuild", id)
		}
		if done {
			rebuilt++
		}
	}
	if rebuilt != 6 {
		t.Fatalf("%d rows rebuilt after 2 chunks of 3", rebuilt)
	}
	applyAll(t, n, [][]byte{late}) // a write meanwhile, on a row not rebuilt yet
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n = openAB(t, Config{Dir: dir, NoSync: true, AddColumnChunk: 3}, peers) // resumes
	defer n.Close()
	if rs := pendingRebuilds(t, n); len(rs) != 0 {
		t.Fatalf("rebuilds pending after reopening: %+v", rs)
	}
	if got, want := storedRows(t, n), storedRows(t, ref); got != want {
		t.Fatalf("resumed rebuild differs from one-shot\nwant:\n%s\ngot:\n%s", want, got)
	}
}

// A SIGKILL in the middle of an AddColumn rebuild: a child process builds
// the table on a bbolt file (fsync on), rebuilds one row per transaction
// and kills itself after the third chunk is durable. The parent reopens
// the file: Open resumes the rebuild, which ends with the rows of a
// one-shot rebuild of the same events.
const addColumnKillEnv = "SYNCMESH_ADDCOLUMN_KILL_DIR"

func TestAddColumnSIGKILLMidRebuildResumes(t *testing.T) {
	if dir := os.Getenv(addColumnKillEnv); dir != "" {
		addColumnKillChild(t, dir)
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestAddColumnSIGKILLMidRebuildResumes$")
	cmd.Env = append(os.Environ(), addColumnKillEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child: %v (want killed by SIGKILL)\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "events.cbor"))
	if err != nil {
		t.Fatal(err)
	}
	var saved struct {
		Keys [][]byte
		Raws [][]byte
	}
	if err := cbor.Unmarshal(b, &saved); err != nil {
		t.Fatal(err)
	}
	peers := []*peer{seededPeer(t, 1, saved.Keys[0])}
	ref := openAB(t, Config{}, peers)
	defer ref.Close()
	applyAll(t, ref, saved.Raws)
	if err := ref.AddColumn(context.Background(), "app", "t", "z"); err != nil {
		t.Fatal(err)
	}
	n := openAB(t, Config{Dir: filepath.Join(dir, "node")}, peers)
	defer n.Close()
	if rs := pendingRebuilds(t, n); len(rs) != 0 {
		t.Fatalf("rebuilds pending after reopening: %+v", rs)
	}
	if got, want := storedRows(t, n), storedRows(t, ref); got != want {
		t.Fatalf("resumed rebuild differs from one-shot\nwant:\n%s\ngot:\n%s", want, got)
	}
}

func addColumnKillChild(t *testing.T, dir string) {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		t.Fatal(err)
	}
	p := seededPeer(t, 1, seed)
	base := newWall().MS()
	var raws [][]byte
	for id := 0; id < 8; id++ {
		raws = append(raws, p.upsert(hlcAt(base, uint16(2*id+1)), id, map[string]any{"a": id, "z": 10 * id}))
		if id%3 == 0 {
			raws = append(raws, p.del(hlcAt(base, uint16(2*id+2)), id))
		}
	}
	b, err := cbor.Marshal(struct {
		Keys [][]byte
		Raws [][]byte
	}{[][]byte{seed}, raws})
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "events.cbor"), b, 0o600)
	}
	if err != nil {
		t.Fatal(err)
	}
	chunks := 0
	n := openAB(t, Config{Dir: filepath.Join(dir, "node"), AddColumnChunk: 1, Failpoint: func(name string) error {
		if name == FailpointAddColumnChunk {
			if chunks++; chunks == 3 {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		}
		return nil
	}}, []*peer{p})
	applyAll(t, n, raws)
	_ = n.AddColumn(context.Background(), "app", "t", "z")
	t.Fatal("the child was not killed mid-rebuild")
}
