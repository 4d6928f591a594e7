package sign

import (
	"crypto/ed25519"
	"encoding/binary"
	"fmt"

	"github.com/fxamacker/cbor/v2"

	"github.com/syncmesh/syncmesh/messages"
)

// envelope is a structurally valid COSE_Sign1 of the SSP/1 event shape.
// Its slices alias the input.
type envelope struct {
	rawProtected []byte // the protected bstr including its head, as received
	kid          []byte
	payload      []byte
	signature    []byte
}

// algEdDSA is the COSE algorithm id of EdDSA (RFC 9053 §2.2).
const algEdDSA = -8

// parseEnvelope strictly parses a COSE_Sign1_Tagged object of the one shape
// SSP/1 events use:
//
//	18([ bstr .cbor {1: -8, 4: kid}, {}, bstr payload, bstr .size 64 ])
//
// The envelope (everything outside the protected header and the payload,
// which the signature covers) must use the shortest encoding and the
// unprotected header must be empty. Unsigned bytes could otherwise be
// changed in transit without breaking the signature, giving one event many
// event ids (event_id is BLAKE3 of the bytes as received, docs/protocol.md, "Wire
// formats") and letting a relay inject header parameters. Every failure
// matches ErrMalformedSignature.
func parseEnvelope(raw []byte) (envelope, error) {
	if len(raw) == 0 {
		return envelope{}, malformed("empty input")
	}
	// COSE_Sign1_Tagged is required: tag 18 in its one-byte form (0xd2),
	// then an array of exactly four items (0x84).
	if raw[0] != 0xc0|coseTagSign1 {
		if raw[0] == 0x84 {
			return envelope{}, malformed("untagged COSE_Sign1 (tag 18 required)")
		}
		return envelope{}, malformed("not COSE_Sign1_Tagged (tag 18)")
	}
	if len(raw) < 2 || raw[1] != 0x84 {
		return envelope{}, malformed("COSE_Sign1 must be an array of 4 items")
	}
	rest := raw[2:]

	// [0] protected header: bstr .cbor header_map.
	protStart := rest
	prot, rest, err := readBstr(rest, "protected header")
	if err != nil {
		return envelope{}, err
	}
	rawProtected := protStart[:len(protStart)-len(rest)]
	kid, err := parseProtected(prot)
	if err != nil {
		return envelope{}, err
	}

	// [1] unprotected header: must be the empty map.
	if len(rest) == 0 {
		return envelope{}, malformed("truncated before the unprotected header")
	}
	if rest[0] != 0xa0 {
		return envelope{}, unprotectedError(rest)
	}
	rest = rest[1:]

	// [2] payload: attached bstr (nil means detached, which events never are).
	if len(rest) > 0 && rest[0] == 0xf6 {
		return envelope{}, malformed("detached (nil) payload")
	}
	payload, rest, err := readBstr(rest, "payload")
	if err != nil {
		return envelope{}, err
	}

	// [3] signature: an Ed25519 signature is 64 bytes.
	sig, rest, err := readBstr(rest, "signature")
	if err != nil {
		return envelope{}, err
	}
	if len(sig) != ed25519.SignatureSize {
		return envelope{}, malformed(fmt.Sprintf("signature must be %d bytes, got %d", ed25519.SignatureSize, len(sig)))
	}
	if len(rest) != 0 {
		return envelope{}, malformed(fmt.Sprintf("%d trailing bytes", len(rest)))
	}
	return envelope{rawProtected: rawProtected, kid: kid, payload: payload, signature: sig}, nil
}

// parseProtected checks the serialized protected header: a map holding
// exactly alg (1) = EdDSA (-8) and kid (4) = a bstr of 1..MaxKidLen bytes.
func parseProtected(b []byte) ([]byte, error) {
	if len(b) == 0 {
		return nil, malformed("empty protected header (alg and kid required)")
	}
	if len(b) > maxProtectedLen {
		return nil, malformed(fmt.Sprintf("protected header of %d bytes", len(b)))
	}
	if b[0]>>5 != 5 {
		return nil, malformed("protected header is not a map")
	}
	if kid, ok := canonicalProtected(b); ok {
		return kid, nil
	}
	return parseProtectedGeneral(b)
}

// parseProtectedGeneral is parseProtected for any encoding of the header
// map, through the strict reflective decoder.
func parseProtectedGeneral(b []byte) ([]byte, error) {
	var m map[int64]cbor.RawMessage
	if err := messages.Unmarshal("COSE protected header", b, &m, maxProtectedLen); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformedSignature, err)
	}
	algRaw, hasAlg := m[1]
	kidRaw, hasKid := m[4]
	switch {
	case !hasAlg:
		return nil, malformed("protected header has no alg")
	case !hasKid:
		return nil, malformed("protected header has no kid")
	case len(m) != 2:
		return nil, malformed(fmt.Sprintf("protected header must hold exactly alg and kid, has %d parameters", len(m)))
	}
	var alg int64
	if len(algRaw) == 0 || algRaw[0]>>5 > 1 {
		return nil, malformed("alg is not an integer")
	}
	if err := messages.Unmarshal("COSE alg", algRaw, &alg, 0); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformedSignature, err)
	}
	if alg != algEdDSA {
		return nil, malformed(fmt.Sprintf("unsupported alg %d (only EdDSA, -8)", alg))
	}
	if len(kidRaw) == 0 || kidRaw[0]>>5 != 2 {
		return nil, malformed("kid is not a byte string")
	}
	var kid []byte
	if err := messages.Unmarshal("COSE kid", kidRaw, &kid, 0); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformedSignature, err)
	}
	if len(kid) == 0 || len(kid) > MaxKidLen {
		return nil, malformed(fmt.Sprintf("kid must be 1..%d bytes, got %d", MaxKidLen, len(kid)))
	}
	return kid, nil
}

// canonicalProtected reads the protected header exactly as SignPayload
// writes it (Core Deterministic: {1: -8, 4: h'kid'} with shortest heads)
// without the reflective decoder, which costs more than the rest of the
// envelope. It accepts a subset of what parseProtected's general path
// accepts, with the same kid (oracle-tested); ok is false for anything else.
func canonicalProtected(b []byte) (kid []byte, ok bool) {
	if len(b) < 5 || b[0] != 0xa2 || b[1] != 0x01 || b[2] != 0x20|(-1-algEdDSA) || b[3] != 0x04 {
		return nil, false
	}
	k, rest, err := readBstr(b[4:], "kid")
	if err != nil || len(rest) != 0 || len(k) == 0 || len(k) > MaxKidLen {
		return nil, false
	}
	return k, true
}

// unprotectedError explains why a non-empty unprotected header is refused.
func unprotectedError(rest []byte) error {
	if rest[0]>>5 != 5 {
		return malformed("unprotected header is not a map")
	}
	var m map[any]cbor.RawMessage
	if _, err := diagMode.UnmarshalFirst(rest, &m); err == nil {
		for k := range m {
			if n, ok := k.(int64); ok && n == 4 {
				return malformed("kid in the unprotected header")
			}
			if n, ok := k.(uint64); ok && n == 4 {
				return malformed("kid in the unprotected header")
			}
		}
	}
	return malformed("unprotected header must be empty")
}

// diagMode decodes a refused unprotected header only to name the reason.
var diagMode = func() cbor.DecMode {
	dm, err := cbor.DecOptions{
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
		IndefLength:      cbor.IndefLengthForbidden,
		TagsMd:           cbor.TagsForbidden,
		MaxNestedLevels:  8,
		MaxArrayElements: 64,
		MaxMapPairs:      64,
	}.DecMode()
	if err != nil {
		panic(err) // static options; cannot fail at run time
	}
	return dm
}()

// readBstr reads one definite-length byte string in its shortest encoding
// from the front of b and returns its content and the remaining bytes.
func readBstr(b []byte, what string) (content, rest []byte, err error) {
	if len(b) == 0 {
		return nil, nil, malformed("truncated before the " + what)
	}
	if b[0]>>5 != 2 {
		return nil, nil, malformed(what + " is not a byte string")
	}
	ai := b[0] & 0x1f
	var n uint64
	var hdr int
	switch {
	case ai < 24:
		n, hdr = uint64(ai), 1
	case ai == 24 && len(b) >= 2:
		n, hdr = uint64(b[1]), 2
		if n < 24 {
			return nil, nil, malformed(what + " length not in shortest form")
		}
	case ai == 25 && len(b) >= 3:
		n, hdr = uint64(binary.BigEndian.Uint16(b[1:])), 3
		if n <= 0xff {
			return nil, nil, malformed(what + " length not in shortest form")
		}
	case ai == 26 && len(b) >= 5:
		n, hdr = uint64(binary.BigEndian.Uint32(b[1:])), 5
		if n <= 0xffff {
			return nil, nil, malformed(what + " length not in shortest form")
		}
	case ai == 27 && len(b) >= 9:
		n, hdr = binary.BigEndian.Uint64(b[1:]), 9
		if n <= 0xffffffff {
			return nil, nil, malformed(what + " length not in shortest form")
		}
	case ai == 31:
		return nil, nil, malformed(what + " has indefinite length")
	case ai >= 24 && ai <= 27:
		return nil, nil, malformed("truncated " + what + " length")
	default:
		return nil, nil, malformed(what + " has a reserved length encoding")
	}
	if n > uint64(len(b)-hdr) {
		return nil, nil, malformed(fmt.Sprintf("truncated %s: %d bytes declared, %d present", what, n, len(b)-hdr))
	}
	end := hdr + int(n)
	return b[hdr:end:end], b[end:], nil
}

func malformed(why string) error {
	return fmt.Errorf("%w: %s", ErrMalformedSignature, why)
}
