package bolt

import (
	"bytes"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

func genClock(t *rapid.T, label string) messages.Clock {
	if rapid.IntRange(0, 3).Draw(t, label+"-zero") == 0 {
		return messages.Clock{}
	}
	var c messages.Clock
	c.HLC = messages.HLC(rapid.Uint64().Draw(t, label+"-hlc"))
	if rapid.IntRange(0, 5).Draw(t, label+"-hlc0") == 0 {
		c.HLC = 0
	}
	copy(c.Site[:], rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, label+"-site"))
	if rapid.IntRange(0, 3).Draw(t, label+"-id0") != 0 {
		copy(c.ID[:], rapid.SliceOfN(rapid.Byte(), 32, 32).Draw(t, label+"-id"))
	}
	return c
}

// The hand-written encoders of the hot records write exactly what the
// codec's reflective Marshal writes, so either may have written a stored
// record and the strict decoder reads both.
func TestRecordEncodersMatchCodec(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		row := persistence.Row{Exists: rapid.Bool().Draw(t, "exists"), Existence: genClock(t, "ex"), Tomb: genClock(t, "tomb")}
		if n := rapid.IntRange(0, 6).Draw(t, "cells"); n > 0 {
			row.Cells = map[string]persistence.Cell{}
			for i := 0; i < n; i++ {
				name := rapid.StringMatching(`[a-z]{1,30}`).Draw(t, "name")
				var v messages.Value
				if !rapid.Bool().Draw(t, "nilvalue") {
					v = messages.MustValue(rapid.String().Draw(t, "v"))
				}
				row.Cells[name] = persistence.Cell{Value: v, Clock: genClock(t, "cell")}
			}
		}
		got, _ := encodeRow(&row)
		rec := rowRecord{V: rowRecordVersion, Exists: row.Exists, Existence: toClockRecord(row.Existence), Tomb: toClockRecord(row.Tomb)}
		if len(row.Cells) > 0 {
			rec.Cells = map[string]cellRecord{}
			for n, c := range row.Cells {
				v := []byte(c.Value)
				if v == nil {
					v = []byte{}
				}
				rec.Cells[n] = cellRecord{Value: v, Clock: toClockRecord(c.Clock)}
			}
		}
		want, err := messages.Marshal(&rec)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("row:\n got %x\nwant %x", got, want)
		}

		er := eventRecord{V: recordVersion, ID: rapid.SliceOfN(rapid.Byte(), 32, 32).Draw(t, "id"),
			Site: rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "site"), HLC: rapid.Uint64().Draw(t, "hlc"),
			Schema: rapid.String().Draw(t, "schema"), Table: rapid.String().Draw(t, "table"),
			RowKey: rapid.SliceOf(rapid.Byte()).Draw(t, "rowkey"), Raw: rapid.SliceOf(rapid.Byte()).Draw(t, "raw")}
		if rapid.Bool().Draw(t, "nilrowkey") {
			er.RowKey = nil
		}
		want, err = messages.Marshal(&er)
		if err != nil {
			t.Fatal(err)
		}
		if got := encodeEvent(&er); !bytes.Equal(got, want) {
			t.Fatalf("event:\n got %x\nwant %x", got, want)
		}

		ch := persistence.RowChange{Key: messages.Columns{}, Exists: rapid.Bool().Draw(t, "ch-exists"),
			Existence: genClock(t, "ch-ex"), Tomb: genClock(t, "ch-tomb"), Event: genClock(t, "ch-event"),
			Cause: persistence.ChangeCause(rapid.Uint8().Draw(t, "cause")), Cells: row.Cells}
		for i, n := 0, rapid.IntRange(1, 3).Draw(t, "keys"); i < n; i++ {
			ch.Key[rapid.StringMatching(`[a-z]{1,8}`).Draw(t, "key")] = messages.MustValue(rapid.Int().Draw(t, "kv"))
		}
		switch rapid.IntRange(0, 2).Draw(t, "cleared") {
		case 1:
			ch.Cleared = []string{}
		case 2:
			ch.Cleared = rapid.SliceOfN(rapid.StringMatching(`[a-z]{1,30}`), 1, 30).Draw(t, "names")
		}
		// The record as AppendChange built it before it was hand-encoded.
		cr := changeRecord{V: recordVersion, RowKey: ch.Key.Encode(), Exists: ch.Exists,
			Existence: toClockRecord(ch.Existence), Tomb: toClockRecord(ch.Tomb),
			Cleared: ch.Cleared, Cause: uint8(ch.Cause), Event: toClockRecord(ch.Event), Cells: rec.Cells}
		if want, err = messages.Marshal(&cr); err != nil {
			t.Fatal(err)
		}
		if got := encodeChange(&ch, ch.Key.Encode()); !bytes.Equal(got, want) {
			t.Fatalf("change:\n got %x\nwant %x", got, want)
		}
	})
}

// BenchmarkEncodeRecords encodes the row and the change record the apply
// path writes per event for the benchmark workload's table (two cells).
func BenchmarkEncodeRecords(b *testing.B) {
	clk := messages.Clock{HLC: 1 << 50, Site: messages.SiteID{1, 0xbe}, ID: messages.EventID{7}}
	cells := map[string]persistence.Cell{"a": {Value: messages.MustValue("value 12"), Clock: clk}, "b": {Value: messages.MustValue(4711), Clock: clk}}
	row := persistence.Row{Exists: true, Existence: clk, Cells: cells}
	key := messages.Columns{"id": messages.MustValue(4711)}
	ch := persistence.RowChange{Key: key, Exists: true, Existence: clk, Event: clk, Cells: cells}
	rowKey := key.Encode()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encodeRow(&row); err != nil {
			b.Fatal(err)
		}
		_ = encodeChange(&ch, rowKey)
	}
}
