package device

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"
)

// Logical ids ascend with the clock (a 48-bit millisecond prefix), so one
// sender's rows sit together in both stores; within a millisecond the 80
// random bits keep them apart.
func TestLogicalMessageIDsAscendWithTheClock(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_000)
	prev, err := newLogicalMessageID(at)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[[16]byte]bool{prev: true}
	for i := 1; i <= 2000; i++ {
		now := at.Add(time.Duration(i/4) * time.Millisecond)
		id, err := newLogicalMessageID(now)
		if err != nil {
			t.Fatal(err)
		}
		var ms [8]byte
		copy(ms[2:], id[:6])
		if got := binary.BigEndian.Uint64(ms[:]); got != uint64(now.UnixMilli()) {
			t.Fatalf("id %x: time prefix %d, want %d", id, got, now.UnixMilli())
		}
		if i%4 == 0 && bytes.Compare(id[:], prev[:]) <= 0 {
			t.Fatalf("id %x of a later millisecond sorts before %x", id, prev)
		}
		if seen[id] {
			t.Fatalf("id %x drawn twice", id)
		}
		seen[id] = true
		prev = id
	}
	if id, err := newLogicalMessageID(time.UnixMilli(-5)); err != nil || !bytes.Equal(id[:6], make([]byte, 6)) {
		t.Fatalf("an id before 1970: %x, %v (want a zero prefix)", id, err)
	}
	if a, _ := NewLogicalMessageID(); bytes.Equal(a[:6], make([]byte, 6)) {
		t.Fatalf("NewLogicalMessageID %x has no time prefix", a)
	}
}
