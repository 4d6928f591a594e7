package sign

import "errors"

// Sentinel errors of the package. Verify wraps them with %w, so callers
// tell them apart with errors.Is. An event payload that fails to decode is
// not one of these: Verify returns the messages decode error wrapped, so it
// matches messages.ErrMalformed (and messages.ErrEmptyRowKey for a null or
// empty row key, SSP/1 §13.6).
var (
	// ErrMalformedSignature marks bytes that are not a COSE_Sign1 object of
	// the one shape SSP/1 events use (tag 18, protected {1: -8, 4: kid},
	// empty unprotected header, attached payload, 64-byte signature).
	ErrMalformedSignature = errors.New("sign: malformed COSE_Sign1")
	// ErrUnknownKid marks a kid that is not in the trusted-peer keyring.
	ErrUnknownKid = errors.New("sign: unknown kid")
	// ErrBadSignature marks a signature that does not verify under the
	// kid's key with external_aad = the local mesh id.
	ErrBadSignature = errors.New("sign: bad signature")
	// ErrSiteMismatch marks an event whose site is not its signer's site.
	ErrSiteMismatch = errors.New("sign: event site does not match the signer's site")
	// ErrRetired marks an event whose HLC is above its signer's retirement
	// cutoff (SSP/1 §12 step 1).
	ErrRetired = errors.New("sign: event HLC above the signer's retirement cutoff")
	// ErrTooLarge marks a signed event over MaxSignedSize.
	ErrTooLarge = errors.New("sign: signed event too large")
	// ErrNoMeshID marks an empty mesh id: signatures must be bound to a mesh.
	ErrNoMeshID = errors.New("sign: empty mesh id")
	// ErrInvalidKey marks a keyring entry or private key of the wrong shape.
	ErrInvalidKey = errors.New("sign: invalid key")
	// ErrSmallOrderKey marks a public key in the curve's small-order
	// subgroup (the identity and the 7 other torsion points, in any
	// encoding). The cofactored verification equation holds for such a
	// key on any message, so a keyring refuses it; the error also matches
	// ErrInvalidKey.
	ErrSmallOrderKey = errors.New("sign: public key of small order")
)

// IsSignatureFailure reports whether err is a failure of SSP/1 §12 step 1
// (signature verification): a malformed COSE structure, an unknown kid, a
// bad signature, a site mismatch or a retired key. Such events are dropped
// and surfaced, never held.
func IsSignatureFailure(err error) bool {
	return errors.Is(err, ErrMalformedSignature) ||
		errors.Is(err, ErrUnknownKid) ||
		errors.Is(err, ErrBadSignature) ||
		errors.Is(err, ErrSiteMismatch) ||
		errors.Is(err, ErrRetired)
}
