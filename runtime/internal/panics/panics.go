// Package panics turns the panics of protoactor-go's start-up calls
// (remote.Start on a taken port, cluster.StartMember on a provider
// failure) into errors: a library must return them, not crash its host.
package panics

import "fmt"

// Call runs fn and returns what it panicked with as an error (nil when it
// returned normally).
func Call(fn func()) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if e, ok := p.(error); ok {
				err = e
			} else {
				err = fmt.Errorf("%v", p)
			}
		}
	}()
	fn()
	return nil
}
