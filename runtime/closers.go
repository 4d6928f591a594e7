package runtime

import (
	"errors"
	"fmt"
)

// closerStack is the one teardown of a component that opens several
// resources (Node, Remote). Every resource is pushed the moment it is
// open; unwind runs the pushed closers last first, on an error in a later
// phase of opening and in Close alike. So a failure halfway through
// opening leaves nothing open, and Close tears down in exactly the
// reverse of the opening order. Not safe for concurrent use: the opener
// pushes, then Close (under its sync.Once) unwinds.
type closerStack []func() error

// push adds the closer of a resource just opened.
func (s *closerStack) push(close func() error) { *s = append(*s, close) }

// pushFunc adds the closer of a resource whose teardown cannot fail.
func (s *closerStack) pushFunc(close func()) {
	s.push(func() error { close(); return nil })
}

// unwind runs every closer, last pushed first, each once, and joins their
// errors (nil when none failed). The stack is empty afterwards.
func (s *closerStack) unwind() error {
	var errs []error
	for i := len(*s) - 1; i >= 0; i-- {
		fn := (*s)[i]
		(*s)[i] = nil
		*s = (*s)[:i]
		if err := fn(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// phase is one step of opening a component: run opens what the step
// owns and pushes its closers.
type phase struct {
	name string
	run  func() error
}

// runPhases runs phases in order. After each one, fault (tests only; nil
// in production) may fail the opening there as a real error would; the
// first error is returned, an injected one wrapped with the phase's name.
// The caller unwinds its closer stack on an error.
func runPhases(phases []phase, fault func(phase string) error) error {
	for _, p := range phases {
		if err := p.run(); err != nil {
			return err
		}
		if fault != nil {
			if err := fault(p.name); err != nil {
				return fmt.Errorf("runtime: fault after phase %s: %w", p.name, err)
			}
		}
	}
	return nil
}
