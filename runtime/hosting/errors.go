package hosting

import (
	"errors"
	"fmt"

	"github.com/syncmesh/syncmesh/persistence"
	"github.com/syncmesh/syncmesh/runtime"
)

// Errors of the package. Errors from a unit's host arrive as *ReplyError,
// which matches the sentinel of its Code with errors.Is.
var (
	// ErrUnavailable: the unit could not be reached or is not available
	// on its host right now (member stopping, storage still locked by a
	// previous host, request timed out). Nothing is known to have been
	// done; every operation is idempotent, so the request may be retried.
	ErrUnavailable = errors.New("hosting: unit unavailable")
	// ErrBadRequest: the request is malformed or does not fit the unit's
	// kind.
	ErrBadRequest = errors.New("hosting: bad request")
	// ErrClosed: the placement was closed. It wraps persistence.ErrClosed
	// (runtime.ErrClosed).
	ErrClosed = persistence.NewClosedError("hosting: placement closed")
	// ErrInvalidConfig: a Config or ClusterConfig is incomplete or wrong.
	ErrInvalidConfig = errors.New("hosting: invalid config")
	// ErrInvalidIdentity: an identity is empty, too long, not UTF-8, or (for
	// a device) not a device address.
	ErrInvalidIdentity = errors.New("hosting: invalid identity")
	// ErrFailed: the operation failed on the unit's host (ReplyError.Message
	// says why).
	ErrFailed = errors.New("hosting: operation failed")
	// ErrForbidden: the caller may not do this: the Authorizer refused the
	// principal, or a device-to-device delivery or bundle request named a
	// sending device not placed on the member whose certificate carried it.
	// Nothing was done.
	ErrForbidden = errors.New("hosting: forbidden")
	// ErrNotProvisioned: the unit was never created (Client.Create) or was
	// deleted. Nothing was done, and no unit was made.
	ErrNotProvisioned = errors.New("hosting: unit not provisioned")
	// ErrQuota: creating the unit would exceed its tenant's quota
	// (Config.TenantQuota). Nothing was created.
	ErrQuota = errors.New("hosting: tenant quota exceeded")
)

// ErrFenced: the member lost its registration (or no longer sees itself)
// and fenced itself; the unit is unavailable here until it rejoins under
// a new member id. It matches ErrUnavailable: retry elsewhere.
var ErrFenced = fmt.Errorf("%w: member fenced", ErrUnavailable)

// ErrNotOwner: the member's own view of the membership places the unit
// on another member, so it does not activate or serve it. It matches
// ErrUnavailable: retry (the caller's view catches up).
var ErrNotOwner = fmt.Errorf("%w: not the unit's owner", ErrUnavailable)

// ReplyError is a failure reported by the member hosting a unit.
type ReplyError struct {
	Code    Code   // the reply's code
	Member  string // the member that reported it
	Message string // the failure, readable
}

// Error implements the error interface.
func (e *ReplyError) Error() string {
	return fmt.Sprintf("hosting: %s (code %d, member %q)", e.Message, e.Code, e.Member)
}

// Is maps the code to its sentinel: CodeUnavailable → ErrUnavailable,
// CodeBadRequest → ErrBadRequest, CodeFailed → ErrFailed,
// CodeNotHandedOff → runtime.ErrNotHandedOff, CodeNotPending →
// runtime.ErrNotPending, CodeUnknownTable → runtime.ErrUnknownTable,
// CodeForbidden → ErrForbidden, CodeNotProvisioned → ErrNotProvisioned,
// CodeQuota → ErrQuota, CodeLagged → runtime.ErrWatchLagged, CodeRestored
// → runtime.ErrWatchRestored.
func (e *ReplyError) Is(target error) bool {
	switch e.Code {
	case CodeUnavailable:
		return target == ErrUnavailable
	case CodeBadRequest:
		return target == ErrBadRequest
	case CodeFailed:
		return target == ErrFailed
	case CodeNotHandedOff:
		return target == runtime.ErrNotHandedOff
	case CodeNotPending:
		return target == runtime.ErrNotPending
	case CodeUnknownTable:
		return target == runtime.ErrUnknownTable
	case CodeForbidden:
		return target == ErrForbidden
	case CodeNotProvisioned:
		return target == ErrNotProvisioned
	case CodeQuota:
		return target == ErrQuota
	case CodeLagged:
		return target == runtime.ErrWatchLagged
	case CodeRestored:
		return target == runtime.ErrWatchRestored
	}
	return false
}

// isClosed reports whether err comes from a closed component. Every
// component's "closed" sentinel wraps one base (runtime.ErrClosed, which is
// persistence.ErrClosed), so one check covers them all. A request that
// meets one reached a unit while it was being closed (its member stopping
// or fencing itself, the grain passivating): nothing is known to have been
// done, and the unit's next host can serve it, so it is CodeUnavailable
// (retry elsewhere), never CodeFailed.
func isClosed(err error) bool { return errors.Is(err, runtime.ErrClosed) }

// codeOf classifies a runtime error for a Reply.
func codeOf(err error) Code {
	switch {
	case err == nil:
		return CodeOK
	case isClosed(err), errors.Is(err, runtime.ErrLocked), errors.Is(err, ErrUnavailable):
		return CodeUnavailable
	case errors.Is(err, ErrBadRequest), errors.Is(err, ErrInvalidIdentity), errors.Is(err, runtime.ErrNoDevice):
		return CodeBadRequest
	case errors.Is(err, runtime.ErrNotHandedOff):
		return CodeNotHandedOff
	case errors.Is(err, runtime.ErrNotPending):
		return CodeNotPending
	case errors.Is(err, runtime.ErrUnknownTable):
		return CodeUnknownTable
	case errors.Is(err, ErrForbidden):
		return CodeForbidden
	case errors.Is(err, ErrNotProvisioned):
		return CodeNotProvisioned
	case errors.Is(err, ErrQuota):
		return CodeQuota
	case errors.Is(err, runtime.ErrWatchLagged):
		return CodeLagged
	case errors.Is(err, runtime.ErrWatchRestored):
		return CodeRestored
	}
	return CodeFailed
}
