package bolt

import (
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// FuzzDecodeRetired feeds arbitrary bytes to the retired outbound record
// and entry decoders: each returns a value or an error matching
// persistence.ErrCorrupt, never panics, and an accepted entry is valid.
func FuzzDecodeRetired(f *testing.F) {
	rec, _ := messages.Marshal(&retiredRecord{V: recordVersion, Entry: []byte{1, 2}})
	ent, _ := messages.Marshal(&retiredEntry{How: 1, RetiredAt: 5, Digest: make([]byte, 32)})
	f.Add(rec)
	f.Add(ent)
	f.Add([]byte{0xa3, 0x01, 0x03, 0x02, 0x00, 0x03, 0x40})
	to := messages.DeviceAddress{User: "bob", Device: 2}
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := decodeRetired(data); err != nil && !isCorrupt(err) {
			t.Fatalf("record: %v does not match ErrCorrupt", err)
		}
		r, err := retiredOf(to, messages.LogicalMessageID{1}, data)
		if err != nil {
			if !isCorrupt(err) {
				t.Fatalf("entry: %v does not match ErrCorrupt", err)
			}
			return
		}
		if err := persistence.CheckRetiredOutbound(r); err != nil {
			t.Fatalf("accepted an invalid entry %+v: %v", r, err)
		}
	})
}
