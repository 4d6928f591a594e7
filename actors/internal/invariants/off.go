//go:build !invariants

package invariants

// Enabled is false: this build carries no invariant checks (build with
// -tags invariants to compile them in).
const Enabled = false
