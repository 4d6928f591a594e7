// Package sign signs and verifies SSP/1 events as COSE_Sign1 objects and
// holds the trusted-peer keyring with retirement cutoffs.
//
// A signed event is COSE_Sign1_Tagged (CBOR tag 18) with protected header
// {1: -8 (EdDSA), 4: kid}, an empty unprotected header, the event bytes
// (messages.EncodeEvent) as attached payload and external_aad = the local
// mesh id (docs/protocol.md, "Wire formats"). Verify implements SSP/1 §12 step 1:
// the COSE structure and the signature are checked before the payload is
// decoded, so no later check consumes unauthenticated input.
package sign

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"slices"
	"sync"

	cose "github.com/veraison/go-cose"

	"github.com/syncmesh/syncmesh/crypto/eventid"
	"github.com/syncmesh/syncmesh/messages"
)

// MaxSignedSize is the largest signed event Verify accepts: the largest
// event plus room for the COSE envelope (tag, headers, signature).
const MaxSignedSize = messages.MaxEventSize + 1024

// coseTagSign1 is the CBOR tag of COSE_Sign1_Tagged (RFC 9052 §4.2).
const coseTagSign1 = 18

// maxProtectedLen bounds the serialized protected header: {1: -8, 4: kid}
// with a kid of at most MaxKidLen bytes fits easily.
const maxProtectedLen = 128

// Signer signs events for one site with one Ed25519 key. It is immutable
// and safe for concurrent use.
type Signer struct {
	site   messages.SiteID
	kid    []byte
	pub    ed25519.PublicKey
	signer cose.Signer
	err    error // set when the private key is unusable
}

// NewSigner returns a signer for site with priv. Its kid is KidFor(priv's
// public key). A private key of the wrong size yields a signer whose Sign
// fails with ErrInvalidKey.
func NewSigner(site messages.SiteID, priv ed25519.PrivateKey) *Signer {
	s := &Signer{site: site}
	if len(priv) != ed25519.PrivateKeySize {
		s.err = fmt.Errorf("%w: Ed25519 private key must be %d bytes, got %d", ErrInvalidKey, ed25519.PrivateKeySize, len(priv))
		return s
	}
	priv = ed25519.PrivateKey(bytes.Clone(priv))
	s.pub = priv.Public().(ed25519.PublicKey)
	s.kid = KidFor(s.pub)
	cs, err := cose.NewSigner(cose.AlgorithmEdDSA, priv)
	if err != nil {
		s.err = fmt.Errorf("%w: %v", ErrInvalidKey, err)
		return s
	}
	s.signer = cs
	return s
}

// Kid returns a copy of the signer's key id.
func (s *Signer) Kid() []byte { return bytes.Clone(s.kid) }

// Site returns the signer's site.
func (s *Signer) Site() messages.SiteID { return s.site }

// PublicKey returns a copy of the signer's public key.
func (s *Signer) PublicKey() ed25519.PublicKey { return ed25519.PublicKey(bytes.Clone(s.pub)) }

// Key returns the keyring entry (no cutoff) that verifies this signer's events.
func (s *Signer) Key() Key { return Key{Kid: s.Kid(), Site: s.site, PublicKey: s.PublicKey()} }

// Sign encodes e and returns it as COSE_Sign1_Tagged bound to meshID. It
// fails with ErrSiteMismatch when e.Site is not the signer's site, with
// ErrNoMeshID for an empty mesh id, and with the messages encode error for
// an invalid event.
func (s *Signer) Sign(e *messages.Event, meshID []byte) ([]byte, error) {
	if s.err != nil {
		return nil, s.err
	}
	if e == nil {
		return nil, fmt.Errorf("sign: nil event")
	}
	if len(meshID) == 0 {
		return nil, ErrNoMeshID
	}
	if e.Site != s.site {
		return nil, fmt.Errorf("%w: event site %s, signer site %s", ErrSiteMismatch, e.Site, s.site)
	}
	payload, err := messages.EncodeEvent(e)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	return s.SignPayload(payload, meshID)
}

// SignPayload signs already-encoded event bytes as they are, without
// checking that they decode: for tools that sign hand-made events and for
// tests of how receivers treat malformed payloads. Use Sign for events.
func (s *Signer) SignPayload(payload []byte, meshID []byte) ([]byte, error) {
	if s.err != nil {
		return nil, s.err
	}
	if len(meshID) == 0 {
		return nil, ErrNoMeshID
	}
	headers := cose.Headers{
		Protected: cose.ProtectedHeader{
			cose.HeaderLabelAlgorithm: cose.AlgorithmEdDSA,
			cose.HeaderLabelKeyID:     s.kid,
		},
	}
	out, err := cose.Sign1(rand.Reader, s.signer, headers, payload, meshID)
	if err != nil {
		return nil, fmt.Errorf("sign: COSE_Sign1: %w", err)
	}
	return out, nil
}

// Verified is an event that passed SSP/1 §12 step 1.
type Verified struct {
	// Event is the decoded payload.
	Event *messages.Event
	// Kid is the signer's key id.
	Kid []byte
	// ID is eventid.Of(raw): BLAKE3-256 of the bytes exactly as received.
	ID messages.EventID
	// RowKey is Event.RowKey() when the decoder had it at hand (a
	// canonically encoded event: messages.DecodeEventRowKey), else nil.
	// It must not be modified.
	RowKey []byte
}

// Verify checks a received signed event against the trusted keyring and
// the local mesh id, in this order (SSP/1 §12 step 1): size limit, strict
// COSE_Sign1 parse, kid lookup, signature with external_aad = meshID
// (under the ZIP-215 rule, see ed25519.go and docs/verification.md), and
// only then decoding of the payload, the signer's site and its retirement
// cutoff. It never panics. VerifyBatch gives the same verdict on every
// input, for many events at a fraction of the cost.
//
// Errors: ErrTooLarge, ErrNoMeshID, ErrMalformedSignature, ErrUnknownKid,
// ErrBadSignature, then a payload decode error (matching
// messages.ErrMalformed, and messages.ErrEmptyRowKey where it applies),
// ErrSiteMismatch, ErrRetired.
func Verify(kr *Keyring, raw []byte, meshID []byte) (v *Verified, err error) {
	defer func() {
		// Defence in depth: go-cose sees only input our parser accepted,
		// but a panic on hostile input must never escape the apply path.
		if r := recover(); r != nil {
			v, err = nil, fmt.Errorf("%w: panic during verification: %v", ErrMalformedSignature, r)
		}
	}()
	env, key, err := locate(kr, raw, meshID)
	if err != nil {
		return nil, err
	}
	var c sigCheck
	prepareCheck(&c, key, env, meshID)
	if !c.single() {
		return nil, fmt.Errorf("%w: kid %x", ErrBadSignature, env.kid)
	}
	ve := new(verifiedEvent)
	if err := finish(ve, env, key, raw); err != nil {
		return nil, err
	}
	return &ve.Verified, nil
}

// locate runs the checks before the signature: size, mesh id, strict
// parse, kid lookup.
func locate(kr *Keyring, raw, meshID []byte) (envelope, entry, error) {
	if len(raw) > MaxSignedSize {
		return envelope{}, entry{}, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(raw), MaxSignedSize)
	}
	if len(meshID) == 0 {
		return envelope{}, entry{}, ErrNoMeshID
	}
	env, err := parseEnvelope(raw)
	if err != nil {
		return envelope{}, entry{}, err
	}
	key, ok := kr.lookup(env.kid)
	if !ok {
		return envelope{}, entry{}, fmt.Errorf("%w: %x", ErrUnknownKid, env.kid)
	}
	return env, key, nil
}

// prepareCheck decodes env's signature and hashes its challenge.
//
// RFC 9052 §4.4: the signature covers Sig_structure =
// ["Signature1", protected, external_aad, payload]. Our parser has already
// accepted exactly {1: -8, 4: kid} as the protected header, so the
// structure is written directly (go-cose would marshal it by reflection on
// every event); go-cose stays the signer and is this check's oracle in the
// tests. The structure is hashed here and not kept.
func prepareCheck(c *sigCheck, key entry, env envelope, meshID []byte) {
	buf := sigBufs.Get().(*[]byte)
	msg := appendSigStructure((*buf)[:0], env.rawProtected, meshID, env.payload)
	c.prepare(key.vk, msg, env.signature)
	if cap(msg) <= maxPooledSigStructure {
		*buf = msg
		sigBufs.Put(buf)
	}
}

// verifiedEvent is a Verified and its event in one allocation (VerifyBatch
// makes one for a whole batch).
type verifiedEvent struct {
	Verified
	event messages.Event
}

// finish runs the checks after the signature: only now is the payload
// decoded, then the signer's site and retirement cutoff are checked. It
// fills v (pointing v.Event at v.event); on an error v is not to be used.
//
// The event and the kid share one private copy of the payload and kid
// bytes (messages.DecodeEventOwned): the result never aliases raw, and
// nothing writes the copy.
func finish(v *verifiedEvent, env envelope, key entry, raw []byte) error {
	own := make([]byte, len(env.payload)+len(env.kid))
	n := copy(own, env.payload)
	copy(own[n:], env.kid)
	ev := &v.event // written only by a successful decode; v is unused on an error
	rowKey, err := messages.DecodeEventOwned(ev, own[:n:n])
	if err != nil {
		return fmt.Errorf("sign: signed payload: %w", err)
	}
	if ev.Site != key.Site {
		return fmt.Errorf("%w: event site %s, kid %x belongs to site %s", ErrSiteMismatch, ev.Site, env.kid, key.Site)
	}
	if key.Cutoff != 0 && ev.HLC > key.Cutoff {
		return fmt.Errorf("%w: event HLC %s, cutoff %s (kid %x)", ErrRetired, ev.HLC, key.Cutoff, env.kid)
	}
	v.Verified = Verified{Event: ev, Kid: own[n:len(own):len(own)], ID: eventid.Of(raw), RowKey: rowKey}
	return nil
}

// BatchSize is the batch the apply path verifies together. Larger batches
// cost less per signature (~0.25× a single check at 64, flattening
// beyond); smaller ones make a forgery cheaper to find: one forgery in a
// push costs its batch plus a bisection of about log₂ 64 = 6 halving
// checks, a few percent of a push of 1 000.
const BatchSize = 64

// BatchResult is one event's verdict from VerifyBatch: exactly what Verify
// returns for it.
type BatchResult struct {
	Verified *Verified
	Err      error
}

// VerifyBatch verifies raws together (SSP/1 §12 step 1) and returns, in
// input order, the verdict Verify gives each: the checks before the
// signature per event, then every well-formed signature in one cofactored
// batch equation with the coefficients of each signing key merged; when
// the batch fails, bisection finds the bad signatures. Callers split long
// inputs into batches of BatchSize. It never panics.
func VerifyBatch(kr *Keyring, raws [][]byte, meshID []byte) (out []BatchResult) {
	defer func() {
		if r := recover(); r != nil {
			// Defence in depth, as in Verify: fall back to one at a time,
			// each with its own recovery.
			out = make([]BatchResult, len(raws))
			for i, raw := range raws {
				out[i].Verified, out[i].Err = Verify(kr, raw, meshID)
			}
		}
	}()
	out = make([]BatchResult, len(raws))
	w := batchWorkPool.Get().(*batchWork)
	defer w.release(len(raws))
	items, checks, cands, idx, bad := w.reset(len(raws))
	for i, raw := range raws {
		env, key, err := locate(kr, raw, meshID)
		if err != nil {
			out[i].Err = err
			continue
		}
		items[i] = batchItem{env, key}
		prepareCheck(&checks[i], key, env, meshID)
		if !checks[i].ok {
			out[i].Err = fmt.Errorf("%w: kid %x", ErrBadSignature, env.kid)
			continue
		}
		cands = append(cands, &checks[i])
		idx = append(idx, i)
	}
	bad = bad[:len(cands)]
	if len(cands) > 0 {
		verifyAll(cands, bad)
	}
	good := 0
	for j := range idx {
		if !bad[j] {
			good++
		}
	}
	// The verified events in one allocation: they are used, and dropped,
	// together (one apply batch).
	vs := make([]verifiedEvent, good)
	for j, i := range idx {
		it := items[i]
		if bad[j] {
			out[i].Err = fmt.Errorf("%w: kid %x", ErrBadSignature, it.env.kid)
			continue
		}
		v := &vs[0]
		vs = vs[1:]
		if out[i].Err = finish(v, it.env, it.key, raws[i]); out[i].Err == nil {
			out[i].Verified = &v.Verified
		}
	}
	return out
}

// batchItem is one event of a VerifyBatch call between its checks.
type batchItem struct {
	env envelope
	key entry
}

// batchWork is VerifyBatch's per-call memory (~440 bytes per event),
// pooled: cleared before it goes back, so it pins no caller's bytes.
type batchWork struct {
	items  []batchItem
	checks []sigCheck
	cands  []*sigCheck
	idx    []int
	bad    []bool
}

var batchWorkPool = sync.Pool{New: func() any { return new(batchWork) }}

func (w *batchWork) reset(n int) ([]batchItem, []sigCheck, []*sigCheck, []int, []bool) {
	if cap(w.items) < n {
		w.items, w.checks = make([]batchItem, n), make([]sigCheck, n)
		w.cands, w.idx, w.bad = make([]*sigCheck, 0, n), make([]int, 0, n), make([]bool, n)
	}
	return w.items[:n], w.checks[:n], w.cands[:0], w.idx[:0], w.bad[:n]
}

// release clears w's first n entries and pools it (not after a batch
// larger than a pooled one should stay).
func (w *batchWork) release(n int) {
	clear(w.items[:n])
	clear(w.checks[:n])
	clear(w.cands[:n])
	clear(w.bad[:n])
	if n <= 4*BatchSize {
		batchWorkPool.Put(w)
	}
}

// ParseVerified decodes a signed event that was verified before (for
// example when rebuilding from the retained event log) without checking the
// signature again. The COSE structure and the event are still parsed
// strictly; it never panics.
func ParseVerified(raw []byte) (*messages.Event, error) {
	if len(raw) > MaxSignedSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(raw), MaxSignedSize)
	}
	env, err := parseEnvelope(raw)
	if err != nil {
		return nil, err
	}
	ev, err := messages.DecodeEvent(env.payload)
	if err != nil {
		return nil, fmt.Errorf("sign: signed payload: %w", err)
	}
	return ev, nil
}

// PeekKid returns the kid of a signed event without verifying it, for
// routing or diagnostics only; the result is unauthenticated.
func PeekKid(raw []byte) ([]byte, error) {
	if len(raw) > MaxSignedSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(raw), MaxSignedSize)
	}
	env, err := parseEnvelope(raw)
	if err != nil {
		return nil, err
	}
	return bytes.Clone(env.kid), nil
}

// sigBufs recycles Sig_structure buffers: one per verified event, dead
// once ed25519.Verify returns (it keeps nothing).
var sigBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledSigStructure caps the buffers kept in sigBufs, so one huge
// event does not pin its buffer.
const maxPooledSigStructure = 16 << 10

// appendSigStructure appends COSE_Sign1's Sig_structure (RFC 9052 §4.4)
// for an already-encoded protected header bstr to b.
func appendSigStructure(b, rawProtected, externalAAD, payload []byte) []byte {
	b = slices.Grow(b, 1+11+len(rawProtected)+9+len(externalAAD)+9+len(payload))
	b = append(b, 0x84, 0x6a)
	b = append(b, "Signature1"...)
	b = append(b, rawProtected...)
	// Always byte strings (AppendBytes would write null for a nil slice).
	b = messages.AppendBytes(b, nonNil(externalAAD))
	return messages.AppendBytes(b, nonNil(payload))
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
