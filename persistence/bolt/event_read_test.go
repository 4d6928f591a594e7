package bolt

import (
	"bytes"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// sameEvent reports whether two decoded events are equal, nil and empty
// slices apart.
func sameEvent(a, b persistence.StoredEvent) bool {
	return a.Seq == b.Seq && a.ID == b.ID && a.Site == b.Site && a.HLC == b.HLC && a.Schema == b.Schema &&
		a.Table == b.Table && bytes.Equal(a.RowKey, b.RowKey) && bytes.Equal(a.Raw, b.Raw) && (a.RowKey == nil) == (b.RowKey == nil)
}

// TestReadEventReadsWhatEncodeEventWrites: every record encodeEvent
// writes takes the hand reader's path and reads as the codec reads it;
// the decoded event does not alias the record.
func TestReadEventReadsWhatEncodeEventWrites(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		er := eventRecord{V: recordVersion, ID: rapid.SliceOfN(rapid.Byte(), 32, 32).Draw(t, "id"),
			Site: rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "site"), HLC: rapid.Uint64().Draw(t, "hlc"),
			Schema: rapid.String().Draw(t, "schema"), Table: rapid.String().Draw(t, "table"),
			RowKey: rapid.SliceOf(rapid.Byte()).Draw(t, "rowkey"), Raw: rapid.SliceOf(rapid.Byte()).Draw(t, "raw")}
		if rapid.Bool().Draw(t, "nilrowkey") {
			er.RowKey = nil
		}
		v := encodeEvent(&er)
		seq := rapid.Uint64().Draw(t, "seq")
		fast, ok := readCanonicalEvent(seq, v)
		if !ok {
			t.Fatalf("hand reader refused a record encodeEvent wrote: %x", v)
		}
		ref, err := decodeEvent(seq, v)
		if err != nil {
			t.Fatal(err)
		}
		if !sameEvent(fast, ref) {
			t.Fatalf("hand reader read\n%+v\nthe codec\n%+v", fast, ref)
		}
		for i := range v {
			v[i] ^= 0xff
		}
		if !sameEvent(fast, ref) {
			t.Fatal("the decoded event aliases the record")
		}
	})
}

// TestReadEventLeavesTheRestToTheCodec: a record off the canonical shape
// is decided by decodeEvent (read the same, or refused as corrupt).
func TestReadEventLeavesTheRestToTheCodec(t *testing.T) {
	canon := encodeEvent(&eventRecord{V: recordVersion, ID: make([]byte, 32), Site: make([]byte, 16), HLC: 7, Schema: "s", Table: "t", RowKey: []byte{1}, Raw: []byte{2}})
	// The same fields in another order: not canonical, the codec reads it.
	reordered := messages.AppendMapHeader(nil, 8)
	reordered = messages.AppendBytes(messages.AppendUint(reordered, 8), []byte{2})
	reordered = messages.AppendUint(messages.AppendUint(reordered, 1), recordVersion)
	reordered = messages.AppendBytes(messages.AppendUint(reordered, 2), make([]byte, 32))
	reordered = messages.AppendBytes(messages.AppendUint(reordered, 3), make([]byte, 16))
	reordered = messages.AppendUint(messages.AppendUint(reordered, 4), 7)
	reordered = messages.AppendText(messages.AppendUint(reordered, 5), "s")
	reordered = messages.AppendText(messages.AppendUint(reordered, 6), "t")
	reordered = messages.AppendBytes(messages.AppendUint(reordered, 7), []byte{1})
	for _, tc := range []struct {
		name    string
		v       []byte
		corrupt bool
	}{
		{"reordered fields", reordered, false},
		{"trailing byte", append(bytes.Clone(canon), 0), true},
		{"truncated", canon[:len(canon)-1], true},
		{"short id", encodeEvent(&eventRecord{V: recordVersion, ID: make([]byte, 31), Site: make([]byte, 16)}), true},
		{"other version", encodeEvent(&eventRecord{V: recordVersion + 1, ID: make([]byte, 32), Site: make([]byte, 16)}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, ok := readCanonicalEvent(1, tc.v); ok {
				t.Fatalf("hand reader accepted %x", tc.v)
			}
			got, err := readEvent(1, tc.v)
			ref, rerr := decodeEvent(1, tc.v)
			if tc.corrupt != (err != nil) || (err != nil) != (rerr != nil) || (err != nil && !isCorrupt(err)) {
				t.Fatalf("readEvent: %v, decodeEvent: %v, want corrupt %v", err, rerr, tc.corrupt)
			}
			if err == nil && !sameEvent(got, ref) {
				t.Fatalf("readEvent read\n%+v\nthe codec\n%+v", got, ref)
			}
		})
	}
}

// FuzzReadEvent holds the hand reader to the codec: what it accepts, the
// codec reads the same, and it is exactly what encodeEvent writes for the
// event read; readEvent's verdict is always decodeEvent's.
func FuzzReadEvent(f *testing.F) {
	f.Add(encodeEvent(&eventRecord{V: recordVersion, ID: make([]byte, 32), Site: make([]byte, 16), HLC: 7, Schema: "s", Table: "t", RowKey: []byte{1}, Raw: []byte{2}}))
	f.Add(encodeEvent(&eventRecord{V: recordVersion, ID: make([]byte, 32), Site: make([]byte, 16), HLC: 1 << 40, Schema: "app", Table: "t", Raw: make([]byte, 300)}))
	f.Add([]byte{0xa8, 0x01, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		ref, rerr := decodeEvent(3, data)
		if rerr != nil && !isCorrupt(rerr) {
			t.Fatalf("decodeEvent: %v does not match ErrCorrupt", rerr)
		}
		if fast, ok := readCanonicalEvent(3, data); ok {
			if rerr != nil || !sameEvent(fast, ref) {
				t.Fatalf("hand reader accepted what the codec reads differently:\n%+v\n%+v (%v)", fast, ref, rerr)
			}
			er := eventRecord{V: recordVersion, ID: fast.ID[:], Site: fast.Site[:], HLC: uint64(fast.HLC), Schema: fast.Schema, Table: fast.Table, RowKey: fast.RowKey, Raw: fast.Raw}
			if again := encodeEvent(&er); !bytes.Equal(again, data) {
				t.Fatalf("hand reader accepted a non-canonical record %x (canonical %x)", data, again)
			}
		}
		got, err := readEvent(3, data)
		if (err != nil) != (rerr != nil) || (err == nil && !sameEvent(got, ref)) {
			t.Fatalf("readEvent (%+v, %v) differs from decodeEvent (%+v, %v)", got, err, ref, rerr)
		}
	})
}
