package runtime

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// TestReplicaStoreKeepsNoMarkFiles: a node whose node.db is a replica of
// a replicated log (OpenStore, NoMarkFiles) opens its store through the
// hook and keeps nothing else beside it; a node.db copied alone into an
// empty directory — a replica rebuilt from a snapshot — opens as current,
// not as restored, and its delivery sessions go on (bob decrypts every
// envelope, no repair).
func TestReplicaStoreKeepsNoMarkFiles(t *testing.T) {
	ctx := context.Background()
	net := NewNetwork(1)
	key := bytes.Repeat([]byte{9}, 32)
	aAddr, bAddr := DeviceAddress{User: "alice", Device: 1}, DeviceAddress{User: "bob", Device: 1}
	var opened, released atomic.Int32
	openAlice := func(dir string) *testNode {
		a := openTestNode(t, Config{Name: "alice", Dir: dir, NoSync: true, SyncInterval: -1, StorageKey: key, NoMarkFiles: true,
			OpenStore: func(path string, opts bolt.Options) (*bolt.DB, func(), error) {
				opened.Add(1)
				db, err := bolt.Open(path, opts)
				return db, func() { released.Add(1) }, err
			},
			Device: &DeviceConfig{Address: aAddr, Transport: net.DeviceTransport("alice", aAddr)}})
		net.Register(a.Name(), a.Node)
		net.RegisterDevice(a.Name(), a.Node)
		return a
	}
	bob := openTestNode(t, Config{Name: "bob", SyncInterval: -1, Device: &DeviceConfig{Address: bAddr,
		Transport: net.DeviceTransport("bob", bAddr), Buffer: 16}})
	net.Register(bob.Name(), bob.Node)
	net.RegisterDevice(bob.Name(), bob.Node)
	var bobLog noticeLog
	defer bobLog.watch(bob.Node)()
	send := func(a *testNode, body string) {
		t.Helper()
		if _, err := a.Send(ctx, bAddr, []byte(body)); err != nil {
			t.Fatal(err)
		}
		receiveCommit(t, bob, body)
		if err := net.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	alice := openAlice(dir)
	if opened.Load() != 1 {
		t.Fatalf("OpenStore called %d times, want 1", opened.Load())
	}
	send(alice, "one")
	send(alice, "two")
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
	if released.Load() != 1 {
		t.Fatalf("release called %d times after Close, want 1", released.Load())
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "node.db" {
			t.Errorf("%s beside node.db of a replicated store", e.Name())
		}
	}

	rebuilt := t.TempDir()
	copyFile(t, filepath.Join(dir, "node.db"), filepath.Join(rebuilt, "node.db"))
	alice = openAlice(rebuilt)
	if st := alice.RestoreStatus(); st.Suspected || st.DeliverySuspected {
		t.Fatalf("a replica rebuilt from a snapshot looks restored: %+v", st)
	}
	send(alice, "three")
	if undecryptable, repairs := bobLog.counts(); undecryptable != 0 || len(repairs) != 0 {
		t.Fatalf("bob: %d undecryptable envelopes, repairs %+v", undecryptable, repairs)
	}
	if err := alice.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestNoMarkFilesOnlyForReplicatedStores: dropping the marks of a plain
// store would hide a restore, so NoMarkFiles needs OpenStore and a
// StorageKey (a key file would not be replicated).
func TestNoMarkFilesOnlyForReplicatedStores(t *testing.T) {
	open := func(path string, opts bolt.Options) (*bolt.DB, func(), error) {
		db, err := bolt.Open(path, opts)
		return db, nil, err
	}
	key := bytes.Repeat([]byte{9}, 32)
	for name, cfg := range map[string]Config{
		"no OpenStore":        {Dir: t.TempDir(), MeshID: testMesh, NoMarkFiles: true, StorageKey: key},
		"no StorageKey":       {Dir: t.TempDir(), MeshID: testMesh, NoMarkFiles: true, OpenStore: open},
		"OpenStore, InMemory": {InMemory: true, MeshID: testMesh, OpenStore: open},
	} {
		_, err := Open(context.Background(), cfg)
		var ce *ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%s: %v, want a ConfigError", name, err)
		}
	}
}

// loopCommitter is a one-replica log: it applies each write set to the
// node's own DB and keeps it for a mirror.
type loopCommitter struct {
	mu    sync.Mutex
	db    *bolt.DB
	index uint64
	log   [][]byte
}

func (c *loopCommitter) Commit(_ context.Context, ws []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.index++
	c.log = append(c.log, bytes.Clone(ws))
	return c.db.ApplyWriteSet(c.index, ws)
}

// TestReplicatedStoreMirrorOpensAsTheNode: a node whose every write goes
// through a committer (the store hands each transaction's write set to
// it and sees it only once applied) works as usual, and a node.db built
// only from those write sets — another replica, in a directory with
// nothing else — opens as the same node (same site, same rows), current,
// not restored.
func TestReplicatedStoreMirrorOpensAsTheNode(t *testing.T) {
	ctx := context.Background()
	key := bytes.Repeat([]byte{5}, 32)
	lc := &loopCommitter{}
	cfg := Config{Dir: t.TempDir(), MeshID: testMesh, NoSync: true, SyncInterval: -1, StorageKey: key, NoMarkFiles: true,
		OpenStore: func(path string, opts bolt.Options) (*bolt.DB, func(), error) {
			opts.Committer = lc
			db, err := bolt.Open(path, opts)
			lc.db = db
			return db, nil, err
		}}
	n := openTestNode(t, cfg)
	def := TableDef{Schema: "s", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"v"}}
	if err := n.EnsureTable(ctx, def); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Upsert(ctx, "s", "t", map[string]any{"id": 1}, map[string]any{"v": "one"}); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if len(lc.log) == 0 {
		t.Fatal("no write went through the committer")
	}

	mirror := filepath.Join(t.TempDir(), "node.db")
	for i, ws := range lc.log {
		if err := bolt.ApplyWriteSetFile(mirror, uint64(i+1), ws, bolt.Options{NoSync: true}); err != nil {
			t.Fatalf("apply %d: %v", i+1, err)
		}
	}
	m := openTestNode(t, Config{Dir: filepath.Dir(mirror), MeshID: testMesh, NoSync: true, SyncInterval: -1, StorageKey: key, NoMarkFiles: true,
		OpenStore: func(path string, opts bolt.Options) (*bolt.DB, func(), error) {
			db, err := bolt.Open(path, opts)
			return db, nil, err
		}})
	defer m.Close()
	if st := m.RestoreStatus(); st.Suspected || st.DeliverySuspected {
		t.Fatalf("the mirror looks restored: %+v", st)
	}
	row, ok, err := m.Get(ctx, "s", "t", map[string]any{"id": 1})
	var v string
	if _, verr := row.Value("v", &v); err != nil || !ok || verr != nil || v != "one" {
		t.Fatalf("mirror row: %q %v %v", v, ok, err)
	}
}
