// Package invariants holds checks of conditions the code itself must never
// break — as opposed to bad input, which gets a typed error. They are
// compiled in only under the `invariants` build tag (after pebble's
// internal/invariants): without it Enabled is a false constant, every
// check sits behind `if invariants.Enabled`, and the compiler drops it, so
// the hot paths pay nothing. CI runs the packages that carry checks with
// the tag (Makefile, test target).
//
// What is checked, and where:
//   - a stored watermark never goes down (syncgroup's checked store,
//     PutWatermark);
//   - every stored row is canonical: the form the materializer writes, so
//     two nodes holding the same events hold the same bytes (checked
//     store, PutRow);
//   - the sync plane's rows, log and table state are written only by its
//     committer (checked store: every write of those from another
//     transaction fails);
//   - a clock never issues an HLC at or below one it issued before, nor
//     above its durable high-water mark (actors/clock);
//   - a component's teardown runs once (Once).
package invariants

import (
	"fmt"
	"sync/atomic"
)

// Violation is a failed check. Fail panics with it unless a handler is
// installed; the sync committer turns one raised inside its transaction
// into that transaction's error (the transaction rolls back).
type Violation struct{ Msg string }

func (v Violation) Error() string { return "invariant violated: " + v.Msg }

var handler atomic.Pointer[func(Violation)]

// Fail reports a violation: to the handler installed by SetHandler, else
// by a panic. Call it only behind `if Enabled`.
func Fail(format string, args ...any) {
	v := Violation{Msg: fmt.Sprintf(format, args...)}
	if h := handler.Load(); h != nil {
		(*h)(v)
		return
	}
	panic(v)
}

// SetHandler routes violations to h instead of a panic until restore is
// called: a test that injects a violation on purpose records it this way.
func SetHandler(h func(Violation)) (restore func()) {
	prev := handler.Swap(&h)
	return func() { handler.Store(prev) }
}

// Once checks that a teardown runs at most once: the owner of a
// component closes it exactly once (the public Close methods are
// idempotent; what they tear down must not be torn down twice).
type Once struct{ n atomic.Int32 }

// Done records one teardown of what; a second one is a violation.
func (o *Once) Done(what string) {
	if Enabled && o.n.Add(1) > 1 {
		Fail("%s torn down twice", what)
	}
}
