package hosting

import (
	"context"
	"fmt"
)

// Principal is who a Client call acts for: the tenant an application
// authenticated (a member vouches for the principals of its callers; the
// members themselves are authenticated by their certificates). It travels
// in Request.Principal.
type Principal struct {
	// Tenant owns the units it creates; by default only it may act on
	// them. Empty: no principal (every tenant operation is refused).
	Tenant string `cbor:"1,keyasint"`
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p: every Client call made with it
// acts for p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the principal ctx carries (ok false: none).
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// Access is what an Authorizer decides on: one operation of a principal
// on a unit.
type Access struct {
	Principal Principal // the caller's principal (zero: none)
	Op        Op        // the operation
	Unit      Unit      // the unit acted on
	// Owner is the tenant owning the unit ("" for OpCreate of a unit not
	// provisioned yet).
	Owner string
}

// Authorizer decides which units a principal may act on. Authorize
// returns nil to allow, an error (wrapped in ErrForbidden by the host) to
// refuse. It runs on the unit's host before the operation, for every
// operation but device-to-device delivery and bundle requests (OpDeliver,
// OpBundle), which are attributed from the calling member's certificate
// instead (the sending device must be placed on that member). It must be
// safe for concurrent use and must not block.
type Authorizer interface {
	Authorize(a Access) error
}

// AuthorizerFunc adapts a function to Authorizer.
type AuthorizerFunc func(a Access) error

// Authorize implements Authorizer.
func (f AuthorizerFunc) Authorize(a Access) error { return f(a) }

// OwnerOnly is the default Authorizer: a principal with a tenant may
// create units (owned by its tenant, within its quota), and every other
// operation on a unit — reading pending messages, committing, discarding,
// pruning, sending as a device, any group operation, deleting — is its
// owner's alone.
var OwnerOnly Authorizer = AuthorizerFunc(func(a Access) error {
	switch {
	case a.Principal.Tenant == "":
		return fmt.Errorf("%s on %s %q without a principal", a.Op, a.Unit.Kind, a.Unit.Identity)
	case a.Op == OpCreate && a.Owner == "":
		return nil
	case a.Principal.Tenant != a.Owner:
		return fmt.Errorf("tenant %q may not %s %s %q", a.Principal.Tenant, a.Op, a.Unit.Kind, a.Unit.Identity)
	}
	return nil
})
