package messages

import (
	"testing"
)

func TestHLCPacking(t *testing.T) {
	cases := []struct {
		ms  uint64
		l   uint16
		raw uint64
	}{
		{0, 0, 0},
		{0, 1, 1},
		{1, 0, 1 << 16},
		{1_700_000_000_000, 7, 1_700_000_000_000<<16 | 7},
		{MaxPhysicalMS, 0xffff, ^uint64(0)},
	}
	for _, c := range cases {
		h, err := NewHLC(c.ms, c.l)
		if err != nil {
			t.Fatalf("NewHLC(%d, %d): %v", c.ms, c.l, err)
		}
		if uint64(h) != c.raw || h.Physical() != c.ms || h.Logical() != c.l {
			t.Fatalf("NewHLC(%d, %d) = %#x (%d, %d)", c.ms, c.l, uint64(h), h.Physical(), h.Logical())
		}
	}
	if _, err := NewHLC(MaxPhysicalMS+1, 0); err == nil {
		t.Fatal("NewHLC accepted 49-bit physical time")
	}
	if _, err := NewHLC(^uint64(0), 0); err == nil {
		t.Fatal("NewHLC accepted 64-bit physical time")
	}
	if got := HLC(5<<16 | 3).String(); got != "5.3" {
		t.Fatalf("String = %q", got)
	}
	// Packing preserves order: physical dominates logical.
	a, _ := NewHLC(10, 0xffff)
	b, _ := NewHLC(11, 0)
	if !(a < b) {
		t.Fatal("physical time does not dominate logical counter")
	}
	// CBOR form is a single uint.
	if got := enc(t, HLC(1<<16|1)); len(got) != 5 || got[0] != 0x1a {
		t.Fatalf("HLC CBOR form % x", got)
	}
}

func TestClockCompareTotalOrder(t *testing.T) {
	lo, hi := testSite(1), testSite(2)
	clocks := []Clock{
		{},
		{HLC: 1, Site: lo},
		{HLC: 1, Site: hi},
		{HLC: 2, Site: lo},
		{HLC: 2 << 16, Site: lo},
		{HLC: 2 << 16, Site: hi},
	}
	// clocks is sorted ascending: Compare must agree with the index order.
	for i, a := range clocks {
		for j, b := range clocks {
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := a.Compare(b); got != want {
				t.Fatalf("Compare(%v, %v) = %d, want %d", a, b, got, want)
			}
			if a.Beats(b) != (want > 0) {
				t.Fatalf("Beats(%v, %v) wrong", a, b)
			}
		}
	}
	if !(Clock{}).IsZero() || clocks[1].IsZero() || (Clock{}).String() != "none" {
		t.Fatal("zero clock handling")
	}
	// Site tiebreak compares bytes, not e.g. the first byte only.
	var s1, s2 SiteID
	s1[15], s2[15] = 1, 2
	if (Clock{HLC: 3, Site: s1}).Compare(Clock{HLC: 3, Site: s2}) != -1 {
		t.Fatal("site tiebreak ignores later bytes")
	}
	e := Event{HLC: 9, Site: hi}
	if e.Clock() != (Clock{HLC: 9, Site: hi}) {
		t.Fatal("Event.Clock")
	}
}

func TestSiteIDParse(t *testing.T) {
	s := testSite(0xa0)
	got, err := ParseSiteID(s.String())
	if err != nil || got != s {
		t.Fatalf("ParseSiteID round trip: %v %v", got, err)
	}
	for _, bad := range []string{"", "00", s.String()[:30], s.String() + "00", "zz" + s.String()[2:]} {
		if _, err := ParseSiteID(bad); err == nil {
			t.Fatalf("ParseSiteID(%q) accepted", bad)
		}
	}
}
