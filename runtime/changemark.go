package runtime

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"

	"github.com/syncmesh/syncmesh/persistence"
)

// Change sequences are never reused. A watcher keeps the last sequence it
// processed and resumes after it; were node.db restored from an older
// copy, the store would assign the sequences its lost part had assigned
// again, to other changes, and the watcher would silently skip them. Two
// floors keep every Open above what the node may have assigned before:
//
//   - changes.mark, a small file beside node.db (as the clock's,
//     restore.go), written ahead of the sequences assigned (one atomic
//     file write per changeMarkLease changes) and set to the exact last
//     sequence on Close. It catches a restore of node.db alone, and the
//     stretch a crash left unused.
//   - The wall clock in Unix microseconds. A restore of the whole
//     directory brings back the copy's changes.mark too, so the mark
//     cannot see it; but the lost history began at an earlier Open,
//     at or above that Open's clock, and assigned fewer numbers than
//     microseconds went by since, unless it sustained more than one
//     change per microsecond or the clock was set back past it. An
//     in-memory store cannot be restored and starts at 1.
//
// Open continues above the higher floor and records the stretch skipped
// (From, To] in node.db (metaChangeGaps): a watcher resuming inside it
// holds a position of a history this store does not have and gets a
// *WatchRestoredError saying to re-read the table and from where. After a
// clean restart or a crash the stretch held no committed change, so no
// watcher can be inside it: the sequences only jump.

const changeMarkName = "changes.mark"

var changeMarkMagic = []byte("smchange")

func encodeChangeMark(m uint64) []byte { return encodeMarkFile(changeMarkMagic, m) }

func decodeChangeMark(b []byte) (uint64, error) { return decodeMarkFile(changeMarkMagic, "change", b) }

// A mark file (changes.mark, delivery.mark) is magic(8) | mark(8, big
// endian) | CRC-32 IEEE of the first 16 bytes (4).
const markFileSize = 8 + 8 + 4

func encodeMarkFile(magic []byte, m uint64) []byte {
	b := append(make([]byte, 0, markFileSize), magic...)
	b = binary.BigEndian.AppendUint64(b, m)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

func decodeMarkFile(magic []byte, what string, b []byte) (uint64, error) {
	if len(b) != markFileSize {
		return 0, fmt.Errorf("%d bytes, want %d", len(b), markFileSize)
	}
	if !bytes.Equal(b[:len(magic)], magic) {
		return 0, fmt.Errorf("not a %s mark file", what)
	}
	if crc32.ChecksumIEEE(b[:16]) != binary.BigEndian.Uint32(b[16:]) {
		return 0, fmt.Errorf("checksum mismatch")
	}
	return binary.BigEndian.Uint64(b[8:16]), nil
}

// readChangeMark reads the mark file; a missing file is 0.
func readChangeMark(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("runtime: read change mark: %w", err)
	}
	m, err := decodeChangeMark(b)
	if err != nil {
		return 0, fmt.Errorf("runtime: change mark %s: %w: %w", path, persistence.ErrCorrupt, err)
	}
	return m, nil
}

// writeFileAtomic replaces path with data (temporary file, fsync, rename,
// fsync of the directory; no fsync with noSync).
func writeFileAtomic(path string, data []byte, noSync bool) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil && !noSync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil && !noSync {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// openChangeLog readies the change log's bookkeeping at Open: the trim
// floor of a log trimmed before per-table marks were kept, and the change
// mark (see above). It pushes the closer that sets the mark file to the
// exact last sequence.
func (n *Node) openChangeLog(ctx context.Context) error {
	path := ""
	var fileMark, clockFloor uint64
	if !n.cfg.InMemory {
		clockFloor = uint64(max(n.cfg.Wall().UnixMicro(), 0))
	}
	if n.cfg.markFiles() {
		path = filepath.Join(n.cfg.Dir, changeMarkName)
		var err error
		if fileMark, err = readChangeMark(path); err != nil {
			return err
		}
	}
	var last uint64
	var gap *ChangeGap
	err := n.store.Update(ctx, func(tx persistence.SyncTx) error {
		oldest, l, err := tx.ChangeBounds()
		if err != nil {
			return err
		}
		if _, ok, err := tx.Meta(metaChangeTrimFloor); err != nil {
			return err
		} else if !ok {
			// Whatever was trimmed before per-table marks existed
			// counts as trimmed for every table.
			floor := uint64(0)
			switch {
			case oldest > 0:
				floor = oldest - 1
			case l > 0:
				floor = l
			}
			if err := tx.PutMeta(metaChangeTrimFloor, binary.BigEndian.AppendUint64(nil, floor)); err != nil {
				return err
			}
		}
		last = l
		top := max(fileMark, clockFloor)
		if top <= l {
			return nil
		}
		if err := tx.RaiseChangeSeq(top); err != nil {
			return err
		}
		gaps, err := readGaps(tx)
		if err != nil {
			return err
		}
		gap = &ChangeGap{From: l, To: top}
		last = top
		return tx.PutMeta(metaChangeGaps, encodeGaps(addGap(gaps, *gap)))
	})
	if err != nil {
		return err
	}
	switch {
	case gap != nil && fileMark > gap.From:
		n.log.Warn("change sequences continue above the change mark: node.db ends below it (restored from a copy, or a crash); watchers inside the stretch must re-read",
			"store_last", gap.From, "mark", fileMark, "continue_above", gap.To)
	case gap != nil:
		n.log.Debug("change sequences continue above the wall clock", "store_last", gap.From, "continue_above", gap.To)
	case !n.cfg.InMemory && clockFloor <= last:
		n.log.Debug("change sequences continue without a jump: the wall clock is not above the last change (clock set back, or more than one change per microsecond)",
			"store_last", last, "clock_floor", clockFloor)
	}
	if path == "" {
		return nil
	}
	f := &n.changes
	f.markMu.Lock()
	f.markPath, f.noSync = path, n.cfg.NoSync
	err = f.writeMarkLocked(last + changeMarkLease)
	f.markMu.Unlock()
	if err != nil {
		return err
	}
	n.closers.push(n.closeChangeMark)
	return nil
}

// closeChangeMark sets the mark file to the exact last sequence, so a
// clean restart continues without a jump.
func (n *Node) closeChangeMark() error {
	var last uint64
	err := n.store.View(context.Background(), func(tx persistence.SyncReader) error {
		var err error
		_, last, err = tx.ChangeBounds()
		return err
	})
	if err != nil {
		return err
	}
	f := &n.changes
	f.markMu.Lock()
	defer f.markMu.Unlock()
	return f.writeMarkLocked(last)
}
