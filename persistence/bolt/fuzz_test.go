package bolt

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// FuzzDecodeRecords feeds arbitrary bytes to every stored-record and key
// decoder: each returns a value or an error matching persistence.ErrCorrupt,
// never panics.
func FuzzDecodeRecords(f *testing.F) {
	tk := persistence.TableKey{Schema: "s", Table: "t"}
	ev, _ := messages.Marshal(&eventRecord{V: 1, ID: make([]byte, 32), Site: make([]byte, 16), HLC: 7, Schema: "s", Table: "t", RowKey: []byte{1}, Raw: []byte{2}})
	key := messages.Columns{"id": messages.MustValue(1)}.Encode()
	row, _ := encodeRow(&persistence.Row{Exists: true, Existence: messages.Clock{HLC: 1, Site: messages.SiteID{1}},
		Cells: map[string]persistence.Cell{"c": {Value: messages.Null, Clock: messages.Clock{HLC: 1}}}})
	tbl, _ := messages.Marshal(&tableRecord{V: 1, Schema: "s", Table: "t", KeyColumns: []string{"id"}})
	held := append(groupPrefix(nil, persistence.GroupKey{Schema: "s", Table: "t"}), u64(3)...)
	f.Add(ev, key)
	f.Add(row, key)
	rowIDs, _ := encodeRow(&persistence.Row{Existence: messages.Clock{HLC: 2, Site: messages.SiteID{1}, ID: messages.EventID{9}},
		Tomb: messages.Clock{Site: messages.SiteID{2}, ID: messages.EventID{3}}})
	f.Add(rowIDs, key)
	f.Add(tbl, []byte{})
	typed, _ := messages.Marshal(&tableRecord{V: 1, Schema: "s", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a"}, Types: map[string]uint8{"a": 3, "id": 250}})
	f.Add(typed, []byte{})
	f.Add(held, []byte{0xa0})
	f.Add([]byte{0xa1, 0x01, 0x02}, []byte{0xff})
	cur, _ := messages.Marshal(&cursorRecord{V: 1, Seq: 9})
	wm, _ := messages.Marshal(&watermarkRecord{V: 1, HLC: 5, Seq: 2})
	prog, _ := messages.Marshal(&progressRecord{V: 1, Log: make([]byte, 16), Through: 4})
	f.Add(cur, []byte{})
	f.Add(wm, []byte{})
	f.Add(prog, []byte{})
	gap, _ := encodeGap(persistence.GroupKey{Schema: "s", Table: "t"})
	f.Add(gap, []byte{})
	f.Fuzz(func(t *testing.T, data, rowKey []byte) {
		check := func(what string, err error) {
			if err != nil && !isCorrupt(err) {
				t.Fatalf("%s: error %v does not match ErrCorrupt", what, err)
			}
		}
		_, err := decodeEvent(1, data)
		check("event", err)
		ref, err := decodeRow(tk, rowKey, data)
		check("row", err)
		fast, ferr := readRow(tk, rowKey, data)
		check("row (hand reader)", ferr)
		// The hand reader accepts only canonical records, a subset of
		// what the reflective decoder accepts, and reads them the same.
		if ferr == nil && (err != nil || !reflect.DeepEqual(ref, fast)) {
			t.Fatalf("hand reader accepted what the codec reads differently:\n%+v\n%+v (%v)", fast, ref, err)
		}
		// ... and exactly the canonical records: what it accepts is what
		// encodeRow writes for the row it read.
		if ferr == nil {
			if again, _ := encodeRow(&fast); !bytes.Equal(again, data) {
				t.Fatalf("hand reader accepted a non-canonical row record %x (canonical %x)", data, again)
			}
		}
		// Reading with a name cache (the apply path's, warmed by a first
		// read) decides and reads exactly as without one.
		var names nameCache
		for range 2 {
			cached, cerr := readRowKeyed(tk, rowKey, nil, data, &names)
			if (cerr == nil) != (ferr == nil) || (cerr == nil && !reflect.DeepEqual(cached, fast)) {
				t.Fatalf("read with a name cache differs: %+v (%v), without %+v (%v)", cached, cerr, fast, ferr)
			}
		}
		if err == nil && ferr != nil {
			if again, _ := encodeRow(&ref); bytes.Equal(again, data) {
				t.Fatalf("hand reader refused a canonical row record %x: %v", data, ferr)
			}
		}
		_, err = decodeTable(data)
		check("table", err)
		_, _, err = parseGroupKey(data)
		check("held key", err)
		_, _, err = readLP(data)
		check("length prefix", err)
		_, err = decodeCursor(data)
		check("cursor", err)
		_, err = decodeWatermark(data)
		check("watermark", err)
		_, err = decodeProgress(data)
		check("peer progress", err)
		_, err = decodeGap(data)
		check("peer gap", err)
		_, err = decodeUsage(data)
		check("held usage", err)
	})
}

func isCorrupt(err error) bool { return errors.Is(err, persistence.ErrCorrupt) }
