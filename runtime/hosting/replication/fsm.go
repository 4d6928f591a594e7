package replication

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// unitMarker marks a directory of UnitsDir as a unit replica: the unit
// index is rebuilt from the markers at Open.
const unitMarker = ".unit"

// maxOwnHandles bounds the node.db files the engine itself keeps open per
// partition (the replicas it applies to while it does not lead).
const maxOwnHandles = 64

// store is one partition's unit replicas on this member.
type store struct {
	e *Engine
	p int

	mu       sync.Mutex
	units    map[string]struct{}
	own      map[string]*bolt.DB // opened by the engine
	attached map[string]*bolt.DB // the serving leader's open DB
}

func newStore(e *Engine, p int) *store {
	return &store{e: e, p: p, units: map[string]struct{}{}, own: map[string]*bolt.DB{}, attached: map[string]*bolt.DB{}}
}

func (s *store) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.units)
}

func (e *Engine) unitDir(unit string) string {
	return filepath.Join(e.cfg.UnitsDir, filepath.FromSlash(unit))
}

// loadUnits rebuilds the unit index from the markers under UnitsDir.
func (e *Engine) loadUnits() error {
	return filepath.WalkDir(e.cfg.UnitsDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || d.Name() != unitMarker {
			return nil
		}
		rel, err := filepath.Rel(e.cfg.UnitsDir, filepath.Dir(path))
		if err != nil {
			return err
		}
		unit := filepath.ToSlash(rel)
		if checkUnitPath(unit) != nil {
			return nil
		}
		s := e.stores[e.PartitionOf(unit)]
		s.units[unit] = struct{}{}
		return nil
	})
}

// ensureUnit creates the unit's directory and marker. Callers hold s.mu.
func (s *store) ensureUnit(unit string) error {
	if _, ok := s.units[unit]; ok {
		return nil
	}
	dir := s.e.unitDir(unit)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, unitMarker), nil, 0o600); err != nil {
		return err
	}
	s.units[unit] = struct{}{}
	return nil
}

// db returns the DB to apply a unit's write sets to. Callers hold s.mu.
func (s *store) db(unit string) (*bolt.DB, error) {
	if d := s.attached[unit]; d != nil {
		return d, nil
	}
	if d := s.own[unit]; d != nil {
		return d, nil
	}
	if err := s.ensureUnit(unit); err != nil {
		return nil, err
	}
	if len(s.own) >= maxOwnHandles {
		for u, d := range s.own {
			_ = d.Close()
			delete(s.own, u)
		}
	}
	d, err := bolt.Open(filepath.Join(s.e.unitDir(unit), dbName), bolt.Options{NoSync: true, Timeout: s.e.cfg.ElectionTimeout, Logger: s.e.log})
	if err != nil {
		return nil, err
	}
	s.own[unit] = d
	return d, nil
}

func (s *store) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for u, d := range s.own {
		_ = d.Close()
		delete(s.own, u)
	}
}

// writeFile writes a unit's small file: temporary file, fsync, rename.
// Callers hold s.mu.
func (s *store) writeFile(unit, name string, data []byte) error {
	if err := s.ensureUnit(unit); err != nil {
		return err
	}
	return writeAtomic(filepath.Join(s.e.unitDir(unit), name), data, false)
}

func writeAtomic(path string, data []byte, sync bool) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// remove deletes a unit's replica. Callers hold s.mu.
func (s *store) remove(unit string) error {
	if d := s.own[unit]; d != nil {
		_ = d.Close()
		delete(s.own, unit)
	}
	delete(s.attached, unit)
	delete(s.units, unit)
	return os.RemoveAll(s.e.unitDir(unit))
}

// fsm is a partition's raft.FSM over its store.
type fsm struct{ s *store }

var _ raft.BatchingFSM = (*fsm)(nil)

// Apply applies one committed entry. Its error (the response) goes back
// to the proposer on the leader; on a follower it is logged: the replica
// is then behind until a snapshot replaces it.
func (f *fsm) Apply(l *raft.Log) any {
	if l.Type != raft.LogCommand {
		return nil
	}
	s := f.s
	en, err := decodeEntry(l.Data)
	if err == nil {
		s.mu.Lock()
		err = s.applyLocked(l.Index, en)
		s.mu.Unlock()
	}
	return s.result(l.Index, en, err)
}

// applyLocked applies one decoded entry. Callers hold s.mu.
func (s *store) applyLocked(index uint64, en entry) error {
	var err error
	switch en.kind {
	case kindWriteSet:
		var d *bolt.DB
		if d, err = s.db(en.unit); err == nil {
			err = d.ApplyWriteSet(index, en.payload)
		}
		if errors.Is(err, persistence.ErrClosed) && s.attached[en.unit] == d {
			// The serving DB was closed without its detach: the
			// replica goes on through the engine's own handle.
			delete(s.attached, en.unit)
			if d, err = s.db(en.unit); err == nil {
				err = d.ApplyWriteSet(index, en.payload)
			}
		}
	case kindFile:
		err = s.writeFile(en.unit, en.name, en.payload)
	case kindRemove:
		err = s.remove(en.unit)
	case kindReserve:
		limit, _ := reserveLimit(en.payload) // checked by decodeEntry
		err = s.reserve(en.unit, en.name, limit)
	case kindRelease:
		err = s.release(en.unit, en.name)
	}
	return err
}

// reserve creates the unit's empty file name unless it exists, if the
// unit holds fewer than limit files: the count and the creation are one
// step of the log, so every replica decides alike and two reservations
// never both take the last slot. Callers hold s.mu.
func (s *store) reserve(unit, name string, limit int) error {
	if err := s.ensureUnit(unit); err != nil {
		return err
	}
	dir := s.e.unitDir(unit)
	if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
		return nil
	}
	n, err := countFiles(dir)
	if err != nil {
		return err
	}
	if n >= limit {
		return fmt.Errorf("replication: %s holds %d of %d: %w", unit, n, limit, ErrLimit)
	}
	return writeAtomic(filepath.Join(dir, name), nil, false)
}

// release removes the unit's file name (none: nothing to do). Callers
// hold s.mu.
func (s *store) release(unit, name string) error {
	if _, ok := s.units[unit]; !ok {
		return nil
	}
	if err := os.Remove(filepath.Join(s.e.unitDir(unit), name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// countFiles counts a unit directory's files, the engine's own (".")
// left out.
func countFiles(dir string) (int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, de := range ents {
		if de.Type().IsRegular() && !strings.HasPrefix(de.Name(), ".") {
			n++
		}
	}
	return n, nil
}

// maxApplyWorkers bounds the units of one batch applied at once.
const maxApplyWorkers = 16

// ApplyBatch applies a batch of committed entries (raft.BatchingFSM).
// Each unit is its own file, so the write sets of different units are
// applied concurrently, each unit's in log order; files and removals
// apply alone, in order. Every replica ends with the same files as
// applying one entry at a time would give, and the proposer waits only
// for the slowest unit of its batch, not for the sum of them.
func (f *fsm) ApplyBatch(logs []*raft.Log) []any {
	s := f.s
	out := make([]any, len(logs))
	ens := make([]entry, len(logs))
	errs := make([]error, len(logs))
	var run []int // indexes of consecutive write sets
	flush := func() {
		s.applyRun(logs, ens, errs, run)
		run = run[:0]
	}
	s.mu.Lock()
	for i, l := range logs {
		if l.Type != raft.LogCommand {
			continue
		}
		ens[i], errs[i] = decodeEntry(l.Data)
		if errs[i] != nil {
			continue
		}
		if ens[i].kind == kindWriteSet {
			run = append(run, i)
			continue
		}
		flush()
		errs[i] = s.applyLocked(l.Index, ens[i])
	}
	flush()
	s.mu.Unlock()
	for i, l := range logs {
		if l.Type == raft.LogCommand {
			out[i] = s.result(l.Index, ens[i], errs[i])
		}
	}
	return out
}

// applyRun applies the write sets logs[run[...]], concurrently by unit.
// Callers hold s.mu; the workers touch no map of s.
func (s *store) applyRun(logs []*raft.Log, ens []entry, errs []error, run []int) {
	if len(run) == 0 {
		return
	}
	byUnit := map[string][]int{}
	var order []string
	for _, i := range run {
		u := ens[i].unit
		if _, ok := byUnit[u]; !ok {
			order = append(order, u)
		}
		byUnit[u] = append(byUnit[u], i)
	}
	// Resolving a handle may evict the engine's own ones: apply one at a
	// time when the batch's units do not all fit beside them.
	if len(order) < 2 || len(s.own)+len(order) > maxOwnHandles {
		for _, i := range run {
			errs[i] = s.applyLocked(logs[i].Index, ens[i])
		}
		return
	}
	dbs := make([]*bolt.DB, len(order))
	for k, u := range order {
		d, err := s.db(u)
		if err != nil {
			for _, i := range byUnit[u] {
				errs[i] = err
			}
			continue
		}
		dbs[k] = d
	}
	sem := make(chan struct{}, maxApplyWorkers)
	var wg sync.WaitGroup
	stopped := make([]int, len(order)) // position of the first entry not applied; -1: all
	for k, u := range order {
		stopped[k] = -1
		if dbs[k] == nil {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			for j, i := range byUnit[u] {
				err := dbs[k].ApplyWriteSet(logs[i].Index, ens[i].payload)
				if errors.Is(err, persistence.ErrClosed) {
					stopped[k] = j
					return
				}
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	// A closed serving DB: the rest of its unit's entries go through
	// applyLocked, which carries on with the engine's own handle.
	for k, u := range order {
		if stopped[k] < 0 {
			continue
		}
		for _, i := range byUnit[u][stopped[k]:] {
			errs[i] = s.applyLocked(logs[i].Index, ens[i])
		}
	}
}

// result turns an entry's apply error into its response, counting and
// logging the failures.
func (s *store) result(index uint64, en entry, err error) any {
	if err == nil {
		return nil
	}
	if errors.Is(err, bolt.ErrStaleWriteSet) || errors.Is(err, ErrLimit) {
		// Refused alike on every replica: the proposer retries.
		return fmt.Errorf("replication: apply entry %d: %w", index, err)
	}
	s.e.applyErrors.Add(1)
	s.e.log.Error("replication: apply failed", "partition", s.p, "index", index, "unit", en.unit, "err", err)
	return fmt.Errorf("replication: apply entry %d: %w", index, err)
}

// Snapshot copies the partition's unit files (node.db as one consistent
// read transaction) into a staging directory; Persist streams it. raft
// calls Snapshot between Applies, so the copy is the state at one index.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	s := f.s
	s.mu.Lock()
	defer s.mu.Unlock()
	stage, err := os.MkdirTemp(s.e.partDir(s.p), "snap-")
	if err != nil {
		return nil, err
	}
	snap := &fsmSnapshot{dir: stage}
	units := make([]string, 0, len(s.units))
	for u := range s.units {
		units = append(units, u)
	}
	sort.Strings(units)
	for i, u := range units {
		files, err := s.stageUnit(u, filepath.Join(stage, fmt.Sprint(i)))
		if err != nil {
			snap.Release()
			return nil, fmt.Errorf("replication: snapshot unit %s: %w", u, err)
		}
		snap.units = append(snap.units, snapUnit{unit: u, dir: filepath.Join(stage, fmt.Sprint(i)), files: files})
	}
	s.e.snapshots.Add(1)
	return snap, nil
}

// stageUnit copies one unit's files into dir. Callers hold s.mu.
func (s *store) stageUnit(unit, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	src := s.e.unitDir(unit)
	ents, err := os.ReadDir(src)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, de := range ents {
		name := de.Name()
		if !de.Type().IsRegular() || strings.HasPrefix(name, ".") {
			continue
		}
		if name == dbName {
			d, err := s.db(unit)
			if err != nil {
				return nil, err
			}
			out, err := os.Create(filepath.Join(dir, name))
			if err != nil {
				return nil, err
			}
			_, err = d.WriteBackup(context.Background(), func(int64) (io.Writer, error) { return out, nil })
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return nil, err
			}
		} else {
			data, err := os.ReadFile(filepath.Join(src, name))
			if err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				return nil, err
			}
		}
		files = append(files, name)
	}
	return files, nil
}

type snapUnit struct {
	unit, dir string
	files     []string
}

type fsmSnapshot struct {
	dir   string
	units []snapUnit
}

// Snapshot stream: per file 'F' | len(uvarint) | unit | len(uvarint) |
// name | size(8, big-endian) | bytes; then 'E'.
func (sn *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	w := bufio.NewWriterSize(sink, 1<<16)
	err := func() error {
		for _, u := range sn.units {
			for _, name := range u.files {
				f, err := os.Open(filepath.Join(u.dir, name))
				if err != nil {
					return err
				}
				st, err := f.Stat()
				if err == nil {
					hdr := []byte{'F'}
					hdr = binary.AppendUvarint(hdr, uint64(len(u.unit)))
					hdr = append(hdr, u.unit...)
					hdr = binary.AppendUvarint(hdr, uint64(len(name)))
					hdr = append(hdr, name...)
					hdr = binary.BigEndian.AppendUint64(hdr, uint64(st.Size()))
					if _, err = w.Write(hdr); err == nil {
						_, err = io.Copy(w, f)
					}
				}
				_ = f.Close()
				if err != nil {
					return err
				}
			}
		}
		if err := w.WriteByte('E'); err != nil {
			return err
		}
		return w.Flush()
	}()
	if err != nil {
		_ = sink.Cancel()
		return err
	}
	return sink.Close()
}

func (sn *fsmSnapshot) Release() { _ = os.RemoveAll(sn.dir) }

// ErrBadSnapshot is returned (wrapped) by a restore of a snapshot stream
// that does not decode; the replicas stay as they were.
var ErrBadSnapshot = errors.New("replication: bad snapshot")

// Restore replaces the partition's unit replicas with a snapshot's: the
// stream is staged first, then swapped in. A member that crashes mid-way
// restores the snapshot again at its next start.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	s := f.s
	stage, err := os.MkdirTemp(s.e.partDir(s.p), "restore-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	files, err := readSnapshot(bufio.NewReaderSize(rc, 1<<16), stage)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for u := range s.units {
		if s.attached[u] != nil {
			return fmt.Errorf("replication: restore: unit %s is open for serving", u)
		}
	}
	if err := s.removeAllLocked(); err != nil {
		return err
	}
	for _, sf := range files {
		if err := s.ensureUnit(sf.unit); err != nil {
			return err
		}
		if err := os.Rename(sf.staged, filepath.Join(s.e.unitDir(sf.unit), sf.name)); err != nil {
			return err
		}
	}
	s.e.restores.Add(1)
	return nil
}

// removeAll deletes every unit replica of the partition.
func (s *store) removeAll() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.removeAllLocked()
}

func (s *store) removeAllLocked() error {
	for u := range s.units {
		if err := s.remove(u); err != nil {
			return err
		}
	}
	return nil
}

type stagedFile struct{ unit, name, staged string }

func readSnapshot(r *bufio.Reader, stage string) ([]stagedFile, error) {
	var out []stagedFile
	str := func(max int) (string, error) {
		n, err := binary.ReadUvarint(r)
		if err != nil || n > uint64(max) {
			return "", fmt.Errorf("replication: snapshot: length: %w", ErrBadSnapshot)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return "", fmt.Errorf("replication: snapshot: %w: %w", ErrBadSnapshot, err)
		}
		return string(b), nil
	}
	for i := 0; ; i++ {
		k, err := r.ReadByte()
		if err != nil {
			return nil, fmt.Errorf("replication: snapshot: %w: %w", ErrBadSnapshot, err)
		}
		if k == 'E' {
			return out, nil
		}
		if k != 'F' {
			return nil, fmt.Errorf("replication: snapshot: record %q: %w", k, ErrBadSnapshot)
		}
		unit, err := str(MaxUnitPathLen)
		if err != nil {
			return nil, err
		}
		name, err := str(MaxFileNameLen)
		if err != nil {
			return nil, err
		}
		if checkUnitPath(unit) != nil || (name != dbName && checkFileName(name) != nil) {
			return nil, fmt.Errorf("replication: snapshot: file %q of %q: %w", name, unit, ErrBadSnapshot)
		}
		var sz [8]byte
		if _, err := io.ReadFull(r, sz[:]); err != nil {
			return nil, fmt.Errorf("replication: snapshot: %w: %w", ErrBadSnapshot, err)
		}
		staged := filepath.Join(stage, fmt.Sprint(i))
		fh, err := os.Create(staged)
		if err != nil {
			return nil, err
		}
		n, err := io.CopyN(fh, r, int64(binary.BigEndian.Uint64(sz[:])))
		if err == nil {
			err = fh.Sync()
		}
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("replication: snapshot: %d bytes of a file: %w: %w", n, ErrBadSnapshot, err)
		}
		out = append(out, stagedFile{unit: unit, name: name, staged: staged})
	}
}

// OpenUnit opens a unit's node.db for serving on the partition's leader:
// the engine releases its own handle of the file, opens it with opts, the
// unit's Committer and NoSync (the raft log is the durable record; a
// restart rebuilds the replicas from the snapshot and the log), and
// attaches it (applies go through it). Call Barrier first: the copy then
// holds everything committed before. detach
// ends the attachment; the caller closes the DB after detach.
func (e *Engine) OpenUnit(unitPath string, opts bolt.Options) (db *bolt.DB, detach func(), err error) {
	if err := checkUnitPath(unitPath); err != nil {
		return nil, nil, err
	}
	s := e.stores[e.PartitionOf(unitPath)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.own[unitPath]; d != nil {
		_ = d.Close()
		delete(s.own, unitPath)
	}
	if err := s.ensureUnit(unitPath); err != nil {
		return nil, nil, err
	}
	opts.Committer = e.Committer(unitPath)
	opts.NoSync = true // the raft log is the durable record (startPartition)
	d, err := bolt.Open(filepath.Join(e.unitDir(unitPath), dbName), opts)
	if err != nil {
		return nil, nil, err
	}
	s.attached[unitPath] = d
	return d, e.detacher(s, unitPath, d), nil
}

// Attach makes db — the unit's node.db, opened by the serving leader
// after the engine released its own handle (OpenUnit does both) — the
// handle applies go through. detach ends it.
func (e *Engine) Attach(unitPath string, db *bolt.DB) (detach func()) {
	s := e.stores[e.PartitionOf(unitPath)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := s.own[unitPath]; d != nil {
		_ = d.Close()
		delete(s.own, unitPath)
	}
	_ = s.ensureUnit(unitPath)
	s.attached[unitPath] = db
	return e.detacher(s, unitPath, db)
}

func (e *Engine) detacher(s *store, unit string, db *bolt.DB) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.attached[unit] == db {
				delete(s.attached, unit)
			}
			s.mu.Unlock()
		})
	}
}
