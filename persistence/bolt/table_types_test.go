package bolt

import (
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// A definition without declared types (or with only TypeAny) is stored
// exactly as before column types existed — a five-field record that every
// build of this layout reads — and such a stored record reads back with
// every column of type any.
func TestUntypedTableRecordUnchanged(t *testing.T) {
	old, err := messages.Marshal(&struct {
		V          uint64   `cbor:"1,keyasint"`
		Schema     string   `cbor:"2,keyasint"`
		Table      string   `cbor:"3,keyasint"`
		KeyColumns []string `cbor:"4,keyasint"`
		Columns    []string `cbor:"5,keyasint"`
	}{recordVersion, "s", "t", []string{"id"}, []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	s := mustOpen(t, t.TempDir()+"/db", Options{NoSync: true})
	defer s.Close()
	def := persistence.TableDef{Schema: "s", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a"},
		Types: map[string]messages.ColumnType{"a": messages.TypeAny}}
	if err := s.Sync().Update(t.Context(), func(tx persistence.SyncTx) error { return tx.PutTable(def) }); err != nil {
		t.Fatal(err)
	}
	var stored []byte
	if err := s.bolt.View(func(tx *bbolt.Tx) error {
		stored = append([]byte(nil), tx.Bucket(bucketSyncTables).Get(tablePrefix(nil, persistence.TableKey{Schema: "s", Table: "t"}))...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if string(stored) != string(old) {
		t.Fatalf("untyped definition stored as %x, want the pre-types record %x", stored, old)
	}
	got, err := decodeTable(old)
	if err != nil || got.TypeOf("a") != messages.TypeAny || got.TypeOf("id") != messages.TypeAny {
		t.Fatalf("pre-types record: %+v, %v", got, err)
	}
}
