package etcdmember

import "time"

// leaseState is what the member knows about its registration. It is
// decided by step alone (a pure function of the state and one input), so
// the rules below are tested with a fake clock.
//
// The rule it keeps: the member claims its registration (ValidUntil) only
// up to TTL−Margin after the send time of a renewal etcd accepted. Past
// that the registration has LAPSED: the member serves nothing (it may be
// cut off from etcd while the other members see its lease expire and
// place its units elsewhere), but it is not lost yet. etcd unreachable
// for everyone (an outage, a restart) expires no lease — a restarted etcd
// gives every lease a full TTL again — so when a later renewal is
// accepted and the member's key is found unchanged since it registered
// (same create revision, same lease: no member's view ever lost it), the
// registration is valid again from that renewal's send time and the
// member resumes under the same id. If the lease or the key is gone, the
// registration is lost and the member rejoins under a new id.
type leaseState struct {
	valid   time.Time // ValidUntil
	lapsed  bool      // valid passed without an accepted renewal
	pending time.Time // lapsed: send time of an accepted renewal awaiting the key check
	lost    bool
}

// leaseInput is one thing that happened to the registration.
type leaseInput struct {
	kind leaseInputKind
	now  time.Time
	sent time.Time // inRenewed: when the accepted renewal was sent
}

type leaseInputKind uint8

const (
	inTick      leaseInputKind = iota // time passed
	inRenewed                         // etcd accepted a renewal (TTL > 0)
	inLeaseGone                       // etcd answered that the lease is gone
	inKeyGone                         // the member's key is gone or was replaced
	inKeyHeld                         // the key check found the key unchanged since registration
)

// leaseEffect is what the registration does after a step.
type leaseEffect uint8

const (
	effNone     leaseEffect = iota
	effLapse                // the window passed: report it (nothing to serve until a renewal)
	effCheckKey             // read the member's key (create revision, lease) and report inKeyHeld or inKeyGone
	effResume               // the registration holds again (ValidUntil moved forward)
	effLose                 // the registration is lost: the member rejoins under a new id
)

// step decides the registration's next state from one input. window is
// TTL − Margin.
func step(s leaseState, in leaseInput, window time.Duration) (leaseState, leaseEffect) {
	if s.lost {
		return s, effNone
	}
	switch in.kind {
	case inTick:
		if !s.lapsed && !in.now.Before(s.valid) {
			s.lapsed = true
			return s, effLapse
		}
	case inRenewed:
		if !s.lapsed && in.now.Before(s.valid) {
			if v := in.sent.Add(window); v.After(s.valid) {
				s.valid = v
			}
			return s, effNone
		}
		// Accepted after the window: the lease still exists, so it never
		// expired; the key must be checked too (it could have been
		// deleted by hand) before the member claims anything again.
		s.lapsed = true
		if in.sent.After(s.pending) {
			s.pending = in.sent
		}
		return s, effCheckKey
	case inKeyHeld:
		if !s.lapsed || s.pending.IsZero() {
			return s, effNone
		}
		v := s.pending.Add(window)
		s.pending = time.Time{}
		if !in.now.Before(v) {
			// The check took longer than the window: still lapsed; the
			// next accepted renewal checks again.
			return s, effNone
		}
		s.valid, s.lapsed = v, false
		return s, effResume
	case inLeaseGone, inKeyGone:
		s.lost = true
		return s, effLose
	}
	return s, effNone
}
