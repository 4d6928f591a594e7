package replication

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// holds reports which of names exist in e's replica of unit.
func holds(e *Engine, unit string, names ...string) map[string]bool {
	out := map[string]bool{}
	for _, n := range names {
		_, err := os.Stat(filepath.Join(e.unitDir(unit), n))
		out[n] = err == nil
	}
	return out
}

// TestReserveHoldsTheLimitAcrossMembers: reservations through any member
// (the leader or a follower, which forwards to it) count against one
// limit kept in the partition's log; a repeated reservation takes one
// slot; a release frees it; every replica holds the same slots, and a
// member rebuilt after losing its disk holds them too and is refused
// alike.
func TestReserveHoldsTheLimitAcrossMembers(t *testing.T) {
	c := newCluster(t, nil, "a", "b", "c")
	const unit = "tenants/7431"
	p := c.engines["a"].PartitionOf(unit)
	l := c.leader(p)
	var f []string
	for _, n := range []string{"a", "b", "c"} {
		if n != l {
			f = append(f, n)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	step := func(who, op, name string, want error) {
		t.Helper()
		var err error
		if op == "reserve" {
			err = c.engines[who].Reserve(ctx, unit, name, 2)
		} else {
			err = c.engines[who].Release(ctx, unit, name)
		}
		if (want == nil && err != nil) || (want != nil && !errors.Is(err, want)) {
			t.Fatalf("%s %s on %s: %v, want %v", op, name, who, err, want)
		}
	}
	step(f[0], "reserve", "x1", nil)
	step(f[1], "reserve", "x1", nil) // the same slot again
	step(l, "reserve", "x2", nil)
	step(f[1], "reserve", "x3", ErrLimit)
	step(f[0], "release", "x1", nil)
	step(f[1], "reserve", "x3", nil)
	step(l, "reserve", "x4", ErrLimit)
	step(f[0], "release", "never", nil)

	c.caughtUp(p, l, "a", "b", "c")
	for n, e := range c.engines {
		if got := holds(e, unit, "x1", "x2", "x3", "x4"); got["x1"] || !got["x2"] || !got["x3"] || got["x4"] {
			t.Fatalf("%s holds %v, want x2 and x3", n, got)
		}
	}

	victim := f[0]
	addr := c.loseDisk(t, victim)
	c.start(victim, addr)
	c.setMembers()
	eventually(t, victim+" rebuilt holding x2 and x3", func() bool {
		got := holds(c.engines[victim], unit, "x2", "x3")
		return got["x2"] && got["x3"]
	})
	step(victim, "reserve", "x5", ErrLimit)
}

// TestReserveRefusesBadArguments: a limit or name outside the entry's
// bounds is refused before anything is proposed.
func TestReserveRefusesBadArguments(t *testing.T) {
	c := newCluster(t, nil, "a")
	c.replicas = 1
	e := c.engines["a"]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, err := range []error{
		e.Reserve(ctx, "tenants/x", "n", 0),
		e.Reserve(ctx, "tenants/x", ".unit", 1),
		e.Reserve(ctx, "../x", "n", 1),
		e.Release(ctx, "tenants/x", "a/b"),
	} {
		if !errors.Is(err, ErrBadEntry) {
			t.Fatalf("%v, want ErrBadEntry", err)
		}
	}
	if _, err := decodeForwarded(mustEncode(t, entry{kind: kindFile, unit: "u", name: "n"}), partitionOf("u", 2), 2); !errors.Is(err, ErrBadEntry) {
		t.Fatalf("a forwarded file write: %v, want ErrBadEntry", err)
	}
	if _, err := decodeForwarded(mustEncode(t, entry{kind: kindRelease, unit: "u", name: "n"}), 1-partitionOf("u", 2), 2); !errors.Is(err, ErrBadEntry) {
		t.Fatalf("a forwarded entry of another partition: %v, want ErrBadEntry", err)
	}
}

func mustEncode(t testing.TB, e entry) []byte {
	t.Helper()
	b, err := e.encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func FuzzDecodeForwarded(f *testing.F) {
	for _, e := range []entry{
		{kind: kindReserve, unit: "tenants/74", name: "group.ab", payload: []byte{3}},
		{kind: kindRelease, unit: "tenants/74", name: "group.ab"},
		{kind: kindFile, unit: "u", name: "n"},
	} {
		f.Add(mustEncode(f, e))
	}
	f.Add([]byte{1, 4, 1, 'u', 1, 'n', 0x80, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeForwarded(b, partitionOf("tenants/74", 4), 4)
		if err != nil {
			if !errors.Is(err, ErrBadEntry) {
				t.Fatalf("error %v is not ErrBadEntry", err)
			}
			return
		}
		if e.kind != kindReserve && e.kind != kindRelease {
			t.Fatalf("kind %d accepted", e.kind)
		}
		again, err := e.encode()
		if err != nil || string(again) != string(b) {
			t.Fatalf("re-encoded %x (%v), decoded from %x", again, err, b)
		}
	})
}
