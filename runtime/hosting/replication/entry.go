package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/syncmesh/syncmesh/persistence/bolt"
)

// An entry of a partition's log: one unit's write set, small file,
// removal, or a reservation of a counted slot and its release.
//
//	version(1)=1 | kind(1) | len(uvarint) | unit path | len(uvarint) | name | payload
//
// Limits, the same for the writer (Commit, WriteFile, RemoveUnit) and the
// decoder (the FSM): a unit path of 1 to MaxUnitPathLen bytes made of
// clean relative segments; a file name of 1 to MaxFileNameLen bytes, one
// segment, not starting with "." (the engine's own files) and not
// "node.db" (written only through write sets); a payload of at most
// bolt.MaxWriteSetSize bytes. A reservation's payload is its limit, a
// uvarint of 1 to MaxReserveLimit in its shortest form; a release has
// none.

// Limits of an entry (see the encoding above).
const (
	MaxUnitPathLen = 1024
	MaxFileNameLen = 255
	// MaxFileSize bounds WriteFile's data: the same as a write set.
	MaxFileSize = bolt.MaxWriteSetSize
	// MaxReserveLimit bounds Reserve's limit.
	MaxReserveLimit = 1 << 31
)

// ErrBadEntry is returned (wrapped) for an entry or an argument that
// breaks the limits above; nothing is proposed or applied.
var ErrBadEntry = errors.New("replication: bad entry")

type entryKind byte

const (
	kindWriteSet entryKind = 1
	kindFile     entryKind = 2
	kindRemove   entryKind = 3
	kindReserve  entryKind = 4
	kindRelease  entryKind = 5
)

// dbName is the unit's bbolt file inside its directory.
const dbName = "node.db"

type entry struct {
	kind    entryKind
	unit    string
	name    string
	payload []byte
}

func badEntry(format string, args ...any) error {
	return fmt.Errorf("replication: "+format+": %w", append(args, ErrBadEntry)...)
}

// checkUnitPath refuses a unit path that is not a clean relative path.
func checkUnitPath(u string) error {
	if len(u) == 0 || len(u) > MaxUnitPathLen {
		return badEntry("unit path of %d bytes", len(u))
	}
	if path.Clean(u) != u || strings.HasPrefix(u, "/") || strings.Contains(u, "\\") || strings.ContainsRune(u, 0) {
		return badEntry("unit path %q is not clean and relative", u)
	}
	for _, seg := range strings.Split(u, "/") {
		if seg == ".." || seg == "." || strings.HasPrefix(seg, ".") {
			return badEntry("unit path %q has a reserved segment", u)
		}
	}
	return nil
}

// checkFileName refuses a name WriteFile may not write.
func checkFileName(n string) error {
	if len(n) == 0 || len(n) > MaxFileNameLen || strings.ContainsAny(n, "/\\\x00") || strings.HasPrefix(n, ".") || n == dbName {
		return badEntry("file name %q", n)
	}
	return nil
}

func (e entry) check() error {
	if err := checkUnitPath(e.unit); err != nil {
		return err
	}
	switch e.kind {
	case kindWriteSet, kindRemove:
		if e.name != "" {
			return badEntry("name on a kind %d entry", e.kind)
		}
	case kindFile, kindRelease:
		if err := checkFileName(e.name); err != nil {
			return err
		}
	case kindReserve:
		if err := checkFileName(e.name); err != nil {
			return err
		}
		if _, err := reserveLimit(e.payload); err != nil {
			return err
		}
	default:
		return badEntry("kind %d", e.kind)
	}
	if len(e.payload) > MaxFileSize {
		return badEntry("payload of %d bytes", len(e.payload))
	}
	if (e.kind == kindRemove || e.kind == kindRelease) && len(e.payload) != 0 {
		return badEntry("payload on a kind %d entry", e.kind)
	}
	return nil
}

// reserveLimit decodes a reservation's limit: one shortest uvarint of 1
// to MaxReserveLimit, and nothing after it.
func reserveLimit(b []byte) (int, error) {
	n, w := binary.Uvarint(b)
	if w <= 0 || w != len(b) || n < 1 || n > MaxReserveLimit || len(binary.AppendUvarint(nil, n)) != w {
		return 0, badEntry("reservation limit")
	}
	return int(n), nil
}

func (e entry) encode() ([]byte, error) {
	if err := e.check(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, 2+2*binary.MaxVarintLen64+len(e.unit)+len(e.name)+len(e.payload))
	b = append(b, 1, byte(e.kind))
	b = binary.AppendUvarint(b, uint64(len(e.unit)))
	b = append(b, e.unit...)
	b = binary.AppendUvarint(b, uint64(len(e.name)))
	b = append(b, e.name...)
	return append(b, e.payload...), nil
}

func decodeEntry(b []byte) (entry, error) {
	if len(b) < 2 || b[0] != 1 {
		return entry{}, badEntry("no version 1 header")
	}
	e := entry{kind: entryKind(b[1])}
	rest := b[2:]
	str := func(max int) (string, error) {
		n, w := binary.Uvarint(rest)
		// The shortest form only: one entry has one encoding.
		if w <= 0 || n > uint64(max) || n > uint64(len(rest)-w) || w != len(binary.AppendUvarint(nil, n)) {
			return "", badEntry("length")
		}
		s := string(rest[w : w+int(n)])
		rest = rest[w+int(n):]
		return s, nil
	}
	var err error
	if e.unit, err = str(MaxUnitPathLen); err != nil {
		return entry{}, err
	}
	if e.name, err = str(MaxFileNameLen); err != nil {
		return entry{}, err
	}
	e.payload = rest
	if err := e.check(); err != nil {
		return entry{}, err
	}
	return e, nil
}
