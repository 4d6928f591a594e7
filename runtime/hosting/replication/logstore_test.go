package replication

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// testdata/legacy_raftdb_r1.tar.gz is member a's data (Dir a/raft,
// UnitsDir a/units) written by 25d121e's engine (raft-boltdb raft.db per
// partition) and frozen: a one-member cluster (R = 1, 2 partitions); unit
// tenant/dev-1 (partition 0) and tenant/dev-0 (partition 1) each got
// k0..k4 = "<unit>-v<i>", the file storage.key = "key-of-<unit>", then
// k5..k9; partition 0 was snapshotted between the two halves (snapshot at
// index 9), partition 1 never was.
const fixtureLegacyR1 = "testdata/legacy_raftdb_r1.tar.gz"

func untar(t *testing.T, path, dst string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dst, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dst+string(filepath.Separator)) {
			t.Fatalf("fixture entry %q escapes", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o700); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			out, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(out, tr); err != nil {
				t.Fatal(err)
			}
			if err := out.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestLegacyRaftDBMigratesToWAL: a member of the previous release
// (raft.db per partition) restarts on its data directories: each
// partition's log and raft's term and vote are copied into a WAL, raft.db
// goes, every acknowledged write is still there (replayed from the
// copied log, after partition 0's snapshot), and the partitions take new
// writes. A second start opens the WAL as it is.
func TestLegacyRaftDBMigratesToWAL(t *testing.T) {
	root := t.TempDir()
	untar(t, fixtureLegacyR1, root)
	const units = "tenant/dev-1 tenant/dev-0"
	terms := map[int]uint64{}
	for p := range 2 {
		old, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(root, "a", "raft", fmt.Sprintf("p%d", p), legacyLogName)})
		if err != nil {
			t.Fatal(err)
		}
		if terms[p], err = old.GetUint64([]byte("CurrentTerm")); err != nil || terms[p] == 0 {
			t.Fatalf("fixture partition %d: term %d, %v", p, terms[p], err)
		}
		_ = old.Close()
	}
	for round := range 2 {
		c := &cluster{t: t, root: root, engines: map[string]*Engine{}, addrs: map[string]string{}, replicas: 1, members: []string{"a"}}
		e := c.start("a", "127.0.0.1:0")
		c.setMembers()
		for p, unit := range strings.Fields(units) {
			if e.PartitionOf(unit) != p {
				t.Fatalf("%s is in partition %d, the fixture says %d", unit, e.PartitionOf(unit), p)
			}
			dir := e.partDir(p)
			if _, err := os.Stat(filepath.Join(dir, legacyLogName)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("round %d partition %d: raft.db still there (%v)", round, p, err)
			}
			if _, err := os.Stat(filepath.Join(dir, walDirName)); err != nil {
				t.Fatalf("round %d partition %d: no WAL: %v", round, p, err)
			}
			c.leader(p)
			pt, err := e.part(p)
			if err != nil {
				t.Fatal(err)
			}
			if got := pt.raft.CurrentTerm(); got < terms[p] {
				t.Fatalf("round %d partition %d: term %d went back from %d", round, p, got, terms[p])
			}
			if err := e.Barrier(context.Background(), p); err != nil {
				t.Fatal(err)
			}
			for i := range 10 {
				if v, ok := metaOf(t, e, unit, fmt.Sprint("k", i)); !ok || v != fmt.Sprint(unit, "-v", i) {
					t.Fatalf("round %d %s: k%d = %q, %v", round, unit, i, v, ok)
				}
			}
			if b, err := os.ReadFile(filepath.Join(e.unitDir(unit), "storage.key")); err != nil || string(b) != "key-of-"+unit {
				t.Fatalf("round %d %s: storage.key %q, %v", round, unit, b, err)
			}
			if round > 0 {
				if v, ok := metaOf(t, e, unit, "new"); !ok || v != "after" {
					t.Fatalf("round %d %s: the write after the migration: %q, %v", round, unit, v, ok)
				}
			}
			w := c.writer(unit)
			w.put("new", "after")
			w.close()
			if pt.raft.State() != raft.Leader {
				t.Fatalf("partition %d: not leading", p)
			}
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestInterruptedMigrationStartsOver: a wal.tmp left by a crash during the
// copy is discarded and the copy made again from raft.db; a raft.db left
// beside a complete WAL (a crash after the rename) is removed.
func TestInterruptedMigrationStartsOver(t *testing.T) {
	root := t.TempDir()
	untar(t, fixtureLegacyR1, root)
	dir := filepath.Join(root, "a", "raft", "p1")
	tmp := filepath.Join(dir, walTmpName)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "junk"), []byte("half a copy"), 0o600); err != nil {
		t.Fatal(err)
	}
	old, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, legacyLogName)})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := old.FirstIndex()
	last, _ := old.LastIndex()
	_ = old.Close()
	if last == 0 {
		t.Fatal("fixture partition 1 has an empty log")
	}
	// Keep a copy of raft.db to put back beside the finished WAL.
	saved, err := os.ReadFile(filepath.Join(dir, legacyLogName))
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		ls, err := openLogStore(dir, true, hclog.NewNullLogger())
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		defer ls.Close()
		f, _ := ls.FirstIndex()
		l, _ := ls.LastIndex()
		if f != first || l != last {
			t.Fatalf("%s: log [%d, %d], raft.db had [%d, %d]", what, f, l, first, last)
		}
		for _, name := range []string{walTmpName, legacyLogName} {
			if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s: %s still there (%v)", what, name, err)
			}
		}
	}
	check("after an interrupted copy")
	if err := os.WriteFile(filepath.Join(dir, legacyLogName), saved, 0o600); err != nil {
		t.Fatal(err)
	}
	check("with raft.db beside the WAL")
}

// TestCompactedEntriesReadAsGone: after raft compacts the head of the
// log, an entry below FirstIndex is ErrLogNotFound (raft then sends the
// snapshot), although the WAL drops it only with its whole segment; a
// closed WAL can be opened again in the same process (its meta store's
// lock is released).
func TestCompactedEntriesReadAsGone(t *testing.T) {
	dir := t.TempDir()
	for round := range 2 {
		w, err := openWAL(dir, true, hclog.NewNullLogger())
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if round == 0 {
			storeTen(t, w)
			if err := w.DeleteRange(1, 5); err != nil {
				t.Fatal(err)
			}
		}
		var l raft.Log
		if err := w.GetLog(3, &l); !errors.Is(err, raft.ErrLogNotFound) {
			t.Fatalf("round %d: compacted entry 3: %v (data %v)", round, err, l.Data)
		}
		if err := w.GetLog(6, &l); err != nil || l.Index != 6 || l.Data[0] != 6 {
			t.Fatalf("round %d: entry 6: %+v, %v", round, l, err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTruncatedTailReopens: a follower whose log's tail a new leader
// overwrote (raft deletes the conflicting suffix, Raft §5.3) restarts with
// its log readable: the WAL seals the truncated segment with its index
// block, so a member restarted after a take-over does not fail to start
// its partition ("sealed segment has no index block").
func TestTruncatedTailReopens(t *testing.T) {
	dir := t.TempDir()
	for round := range 2 {
		w, err := openWAL(dir, true, hclog.NewNullLogger())
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if round == 0 {
			storeTen(t, w)
			// The new leader's entries replace 9 and 10.
			if err := w.DeleteRange(9, 10); err != nil {
				t.Fatal(err)
			}
			if err := w.StoreLogs([]*raft.Log{{Index: 9, Term: 2, Type: raft.LogCommand, Data: []byte{90}}}); err != nil {
				t.Fatal(err)
			}
		}
		for i, want := range map[uint64]byte{1: 1, 8: 8, 9: 90} {
			var l raft.Log
			if err := w.GetLog(i, &l); err != nil || l.Index != i || l.Data[0] != want {
				t.Fatalf("round %d: entry %d: %+v, %v", round, i, l, err)
			}
		}
		if last, err := w.LastIndex(); err != nil || last != 9 {
			t.Fatalf("round %d: last index %d, %v", round, last, err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// storeTen stores entries 1 to 10 of term 1 (data: the index).
func storeTen(t *testing.T, w raft.LogStore) {
	t.Helper()
	var logs []*raft.Log
	for i := uint64(1); i <= 10; i++ {
		logs = append(logs, &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte{byte(i)}})
	}
	if err := w.StoreLogs(logs); err != nil {
		t.Fatal(err)
	}
}
