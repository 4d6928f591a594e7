package replication

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"github.com/hashicorp/raft-wal/fs"
	"github.com/hashicorp/raft-wal/metadb"
	"github.com/hashicorp/raft-wal/migrate"
	"github.com/hashicorp/raft-wal/segment"
	"github.com/hashicorp/raft-wal/types"
)

// A partition's raft log and stable state live in Dir/p<N>/wal
// (hashicorp/raft-wal: append-only segment files, one fsync per append,
// and a small bbolt file for raft's term and vote). Members of earlier
// releases kept both in Dir/p<N>/raft.db (raft-boltdb: a bbolt commit,
// two fdatasyncs and rewritten pages per append); such a partition is
// copied into a WAL once, when it starts, and raft.db is removed.
const (
	walDirName     = "wal"
	walTmpName     = "wal.tmp"
	legacyLogName  = "raft.db"
	walSegmentSize = 8 << 20
)

// logStore is a partition's raft log and stable store.
type logStore interface {
	raft.LogStore
	raft.StableStore
	Close() error
}

// hasLogState reports whether dir holds a partition's raft log, in
// either layout.
func hasLogState(dir string) bool {
	for _, name := range []string{walDirName, legacyLogName} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return true
		}
	}
	return false
}

// openLogStore opens the partition's WAL in dir, first copying a
// raft.db left by an earlier release into it. The copy is built in
// wal.tmp and renamed into place only once complete, so a crash during it
// leaves raft.db the partition's log and the next start copies again; a
// crash after the rename leaves a raft.db that is removed now.
func openLogStore(dir string, noSync bool, log hclog.Logger) (logStore, error) {
	walDir := filepath.Join(dir, walDirName)
	legacy := filepath.Join(dir, legacyLogName)
	if _, err := os.Stat(walDir); errors.Is(err, os.ErrNotExist) {
		if err := os.RemoveAll(filepath.Join(dir, walTmpName)); err != nil {
			return nil, err
		}
		if _, err := os.Stat(legacy); err == nil {
			if err := migrateLegacyLog(dir, noSync, log); err != nil {
				return nil, fmt.Errorf("copy %s into a WAL: %w", legacy, err)
			}
		} else if err := os.Mkdir(walDir, 0o700); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if err := os.Remove(legacy); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return openWAL(walDir, noSync, log)
}

// walStore is a WAL with its meta store, which WAL.Close leaves open
// (and locked): Close closes both.
type walStore struct {
	*wal.WAL
	meta *metadb.BoltMetaDB
}

func (w walStore) Close() error { return errors.Join(w.WAL.Close(), w.meta.Close()) }

// GetLog refuses an entry below FirstIndex: the WAL drops compacted
// entries a whole segment at a time, so one may still be readable, and
// raft takes a readable entry as one to replicate rather than sending the
// snapshot that replaced it.
func (w walStore) GetLog(index uint64, l *raft.Log) error {
	first, err := w.WAL.FirstIndex()
	if err != nil {
		return err
	}
	if index < first {
		return raft.ErrLogNotFound
	}
	return w.WAL.GetLog(index, l)
}

func openWAL(dir string, noSync bool, log hclog.Logger) (walStore, error) {
	var vfs types.VFS = fs.New()
	if noSync {
		vfs = noSyncVFS{vfs}
	}
	meta := &metadb.BoltMetaDB{}
	// Segments are preallocated: a smaller size than the library's 64 MiB
	// keeps a member with many partitions from reserving gigabytes up
	// front; a log compacted after a snapshot still spans a few segments.
	w, err := wal.Open(dir, wal.WithLogger(log.Named("wal")), wal.WithSegmentSize(walSegmentSize),
		wal.WithSegmentFiler(segment.NewFiler(dir, vfs)), wal.WithMetaStore(meta))
	if err != nil {
		return walStore{}, errors.Join(err, meta.Close())
	}
	return walStore{w, meta}, nil
}

// raftStableKeys are the keys hashicorp/raft keeps in its StableStore
// (raft.go: keyCurrentTerm, keyLastVoteTerm as uint64s; keyLastVoteCand).
var raftStableKeys = struct{ uints, bytes [][]byte }{
	uints: [][]byte{[]byte("CurrentTerm"), []byte("LastVoteTerm")},
	bytes: [][]byte{[]byte("LastVoteCand")},
}

// migrateLegacyLog copies dir/raft.db's log entries and raft's stable
// keys into a new WAL at dir/wal.
func migrateLegacyLog(dir string, noSync bool, log hclog.Logger) error {
	old, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, legacyLogName), NoSync: true})
	if err != nil {
		return err
	}
	defer old.Close()
	tmp := filepath.Join(dir, walTmpName)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	w, err := openWAL(tmp, noSync, log)
	if err != nil {
		return err
	}
	if err := copyLegacy(w, old); err != nil {
		_ = w.Close()
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, walDirName)); err != nil {
		return err
	}
	if noSync {
		return nil
	}
	return syncDir(dir)
}

func copyLegacy(dst walStore, src *raftboltdb.BoltStore) error {
	last, err := src.LastIndex()
	if err != nil {
		return err
	}
	if last > 0 {
		if err := migrate.CopyLogs(context.Background(), dst, src, 1<<20, nil); err != nil {
			return err
		}
	}
	// A key raft never set (a partition that was never part of a
	// configuration) stays unset.
	for _, k := range raftStableKeys.uints {
		v, err := src.GetUint64(k)
		if errors.Is(err, raftboltdb.ErrKeyNotFound) {
			continue
		}
		if err == nil {
			err = dst.SetUint64(k, v)
		}
		if err != nil {
			return fmt.Errorf("stable key %s: %w", k, err)
		}
	}
	for _, k := range raftStableKeys.bytes {
		v, err := src.Get(k)
		if errors.Is(err, raftboltdb.ErrKeyNotFound) {
			continue
		}
		if err == nil {
			err = dst.Set(k, v)
		}
		if err != nil {
			return fmt.Errorf("stable key %s: %w", k, err)
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// noSyncVFS is the WAL's file system without fsync (Config.NoSync).
type noSyncVFS struct{ types.VFS }

func (v noSyncVFS) Create(dir, name string, size uint64) (types.WritableFile, error) {
	f, err := v.VFS.Create(dir, name, size)
	if err != nil {
		return nil, err
	}
	return noSyncFile{f}, nil
}

func (v noSyncVFS) OpenWriter(dir, name string) (types.WritableFile, error) {
	f, err := v.VFS.OpenWriter(dir, name)
	if err != nil {
		return nil, err
	}
	return noSyncFile{f}, nil
}

type noSyncFile struct{ types.WritableFile }

func (noSyncFile) Sync() error { return nil }
