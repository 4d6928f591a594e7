//go:build syncmesh_aeadtrace

package ratchet

import "errors"

// ObserveSeals installs f to be called with the AES-GCM key and nonce of
// every ratchet encryption, before it seals, and returns the function that
// removes it. It exists only under the syncmesh_aeadtrace build tag, for
// soaks in other packages that assert no (key, nonce) pair is ever used
// twice (docs/protocol.md, "Envelope version 2"); a production build has
// no way to observe message keys. Only one observer at a time: a second
// call before the first stop fails, because two soaks sharing it would
// count each other's seals.
func ObserveSeals(f func(key [32]byte, nonce [12]byte)) (stop func(), err error) {
	if !sealObserver.CompareAndSwap(nil, &f) {
		return nil, errors.New("ratchet: ObserveSeals: an observer is already installed")
	}
	return func() { sealObserver.Store(nil) }, nil
}
