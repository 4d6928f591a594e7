//go:build invariants

package invariants

// Enabled is true: this build checks invariants (the `invariants` tag).
const Enabled = true
