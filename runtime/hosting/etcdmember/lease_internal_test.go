package etcdmember

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

var t0 = time.Unix(1_000_000, 0)

const window = 2700 * time.Millisecond // TTL 3 s, Margin 300 ms

func at(d time.Duration) time.Time { return t0.Add(d) }

// TestLeaseOutageLapsesThenResumes: etcd stops answering at 0.5 s (the
// last renewal was sent at 0): the registration holds until 2.7 s, then
// lapses (not lost); etcd returns at 20 s and accepts a renewal sent at
// 20.1 s: the key is checked, found held, and the registration resumes,
// valid until 22.8 s, under the same id.
func TestLeaseOutageLapsesThenResumes(t *testing.T) {
	s := leaseState{valid: at(window)}
	var eff leaseEffect
	s, eff = step(s, leaseInput{kind: inTick, now: at(2690 * time.Millisecond)}, window)
	if s.lapsed || eff != effNone {
		t.Fatalf("lapsed before the window ended: %+v %v", s, eff)
	}
	s, eff = step(s, leaseInput{kind: inTick, now: at(window)}, window)
	if !s.lapsed || s.lost || eff != effLapse {
		t.Fatalf("at the window's end: %+v %v, want lapsed (not lost) and effLapse", s, eff)
	}
	for d := 3 * time.Second; d < 20*time.Second; d += time.Second {
		if s, eff = step(s, leaseInput{kind: inTick, now: at(d)}, window); eff != effNone || s.lost {
			t.Fatalf("during the outage at %v: %+v %v", d, s, eff)
		}
	}
	s, eff = step(s, leaseInput{kind: inRenewed, now: at(20200 * time.Millisecond), sent: at(20100 * time.Millisecond)}, window)
	if eff != effCheckKey || !s.lapsed || s.valid.After(at(20*time.Second)) {
		t.Fatalf("renewal after the window: %+v %v, want effCheckKey and still lapsed", s, eff)
	}
	s, eff = step(s, leaseInput{kind: inKeyHeld, now: at(20300 * time.Millisecond)}, window)
	if eff != effResume || s.lapsed || !s.valid.Equal(at(20100*time.Millisecond+window)) {
		t.Fatalf("key held: %+v %v, want resumed until 22.8 s", s, eff)
	}
}

// TestLeaseGoneOrKeyGoneIsLost: etcd answering that the lease is gone, or
// the key check finding another key, loses the registration, for good.
func TestLeaseGoneOrKeyGoneIsLost(t *testing.T) {
	for _, k := range []leaseInputKind{inLeaseGone, inKeyGone} {
		s := leaseState{valid: at(window), lapsed: true}
		s, eff := step(s, leaseInput{kind: k, now: at(5 * time.Second)}, window)
		if !s.lost || eff != effLose {
			t.Fatalf("input %d: %+v %v, want lost", k, s, eff)
		}
		s2, eff := step(s, leaseInput{kind: inKeyHeld, now: at(5 * time.Second)}, window)
		if eff != effNone || s2 != s {
			t.Fatalf("input %d: a lost registration changed: %+v %v", k, s2, eff)
		}
		s2, eff = step(s, leaseInput{kind: inRenewed, now: at(5 * time.Second), sent: at(5 * time.Second)}, window)
		if eff != effNone || s2 != s {
			t.Fatalf("input %d: a lost registration renewed: %+v %v", k, s2, eff)
		}
	}
}

// TestLeaseKeyCheckSlowerThanTheWindow: a key check that answers after
// the resumed window would have ended resumes nothing.
func TestLeaseKeyCheckSlowerThanTheWindow(t *testing.T) {
	s := leaseState{valid: at(window), lapsed: true}
	s, _ = step(s, leaseInput{kind: inRenewed, now: at(10 * time.Second), sent: at(10 * time.Second)}, window)
	s, eff := step(s, leaseInput{kind: inKeyHeld, now: at(10*time.Second + window)}, window)
	if eff != effNone || !s.lapsed {
		t.Fatalf("late key check: %+v %v, want still lapsed", s, eff)
	}
	// A key check with no accepted renewal before it resumes nothing.
	if s, eff = step(s, leaseInput{kind: inKeyHeld, now: at(11 * time.Second)}, window); eff != effNone || !s.lapsed {
		t.Fatalf("key check without a renewal: %+v %v", s, eff)
	}
}

// TestLeaseValidityProperty: whatever the inputs (renewals accepted at
// any delay after they were sent, ticks, key checks, losses, in any
// order), ValidUntil never exceeds the send time of an accepted renewal
// plus the window, the registration is never valid once lost, and once
// lapsed it is valid again only through a key check after a renewal.
func TestLeaseValidityProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := leaseState{valid: at(window)}
		now := t0
		lastSent := t0 // registration
		renewedSinceLapse := false
		for i, n := 0, rapid.IntRange(1, 60).Draw(t, "n"); i < n; i++ {
			now = now.Add(time.Duration(rapid.IntRange(0, 4000).Draw(t, "dt")) * time.Millisecond)
			in := leaseInput{kind: leaseInputKind(rapid.IntRange(0, 4).Draw(t, "kind")), now: now}
			if in.kind == inRenewed {
				in.sent = now.Add(-time.Duration(rapid.IntRange(0, 5000).Draw(t, "rtt")) * time.Millisecond)
				if in.sent.After(lastSent) {
					lastSent = in.sent
				}
			}
			if in.kind == inKeyGone && rapid.Bool().Draw(t, "rare") {
				in.kind = inTick // keep losses rarer than other inputs
			}
			was := s
			var eff leaseEffect
			s, eff = step(s, in, window)
			if s.valid.After(lastSent.Add(window)) {
				t.Fatalf("valid until %v past the last accepted renewal's send time + window (%v)", s.valid, lastSent.Add(window))
			}
			if was.lost && (s != was || eff != effNone) {
				t.Fatalf("a lost registration changed: %+v → %+v (%v)", was, s, eff)
			}
			if s.lapsed && in.kind == inRenewed {
				renewedSinceLapse = true
			}
			if was.lapsed && !s.lapsed {
				if in.kind != inKeyHeld || !renewedSinceLapse || eff != effResume {
					t.Fatalf("resumed by input %d (renewed since lapse: %v, effect %v)", in.kind, renewedSinceLapse, eff)
				}
				renewedSinceLapse = false
			}
			if !s.lapsed && !s.lost && !now.Before(s.valid) && in.kind != inTick {
				// Not lapsed yet only until the next tick; a tick at now must lapse it.
				if s2, _ := step(s, leaseInput{kind: inTick, now: now}, window); !s2.lapsed {
					t.Fatalf("past the window and a tick does not lapse it: %+v", s)
				}
			}
		}
	})
}
