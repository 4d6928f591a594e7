package messages

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// This file holds the wire formats of the delivery plane (docs/protocol.md, "Secure
// frames"): device addresses, the SecurePayload v1 frame carried inside a
// ratchet message, the ratchet envelope with its optional PQXDH initiation
// block, and the prekey bundle a device publishes. All of them are plain
// data; crypto/ratchet gives them meaning.
//
// Every decoder here is strict: besides the codec's own rules (see
// Unmarshal) it requires the input to be the canonical (Core Deterministic)
// encoding of what it decodes to, so two different byte strings never decode
// to the same value. The ratchet binds the encoded header into the AEAD's
// associated data; canonicality makes every bit flip of an envelope either a
// decode error or a different value.

// Size limits of the delivery-plane wire formats.
const (
	// MaxSecurePayloadSize is the largest encoded SecurePayload frame.
	MaxSecurePayloadSize = 1 << 20
	// MaxEnvelopeSize is the largest encoded envelope: a full payload, the
	// AEAD tag, the header and an initiation block.
	MaxEnvelopeSize = MaxSecurePayloadSize + 4096
	// MaxPrekeyBundleSize is the largest encoded prekey bundle.
	MaxPrekeyBundleSize = 4096
	// MaxUserIDLen is the longest DeviceAddress.User in bytes.
	MaxUserIDLen = 255
)

// Fixed sizes of keys carried on the wire.
const (
	// X25519KeySize is the size of an X25519 public key.
	X25519KeySize = 32
	// Ed25519PublicKeySize is the size of an Ed25519 public key.
	Ed25519PublicKeySize = 32
	// SignatureSize is the size of an Ed25519 signature.
	SignatureSize = 64
	// MLKEM768EncapsulationKeySize is the size of an ML-KEM-768 encapsulation key (FIPS 203).
	MLKEM768EncapsulationKeySize = 1184
	// MLKEM768CiphertextSize is the size of an ML-KEM-768 ciphertext (FIPS 203).
	MLKEM768CiphertextSize = 1088
	// AEADTagSize is the smallest valid ciphertext: an AES-GCM tag over an empty plaintext.
	AEADTagSize = 16
)

// Versions of the delivery-plane formats.
const (
	// SecurePayloadVersion is the only SecurePayload frame version.
	SecurePayloadVersion = 1
	// EnvelopeVersion is the envelope version whose header carries no
	// salt (docs/protocol.md, "Envelope version 2"). Receivers still
	// accept it; senders write it only under ratchet.Config.LegacyEnvelopes.
	EnvelopeVersion = 1
	// EnvelopeVersionSalted is the envelope version whose ratchet header
	// carries a 32-byte salt mixed into the message key and nonce, so a
	// rolled-back or cloned sender never reuses an AES-GCM (key, nonce)
	// pair for another plaintext (docs/protocol.md, "Envelope version 2").
	EnvelopeVersionSalted = 2
	// HeaderSaltSize is the size of a version-2 header's salt.
	HeaderSaltSize = 32
	// PrekeyBundleVersion is the only prekey bundle version.
	PrekeyBundleVersion = 1
)

// DeviceAddress names one device of one user: the unit a ratchet session
// and a pinned identity belong to. The device id is a uint32 (as in
// libsignal's DeviceId); the user id is a non-empty UTF-8 string of at most
// MaxUserIDLen bytes. Its CBOR form is {1: user, 2: device}.
type DeviceAddress struct {
	User   string `cbor:"1,keyasint"`
	Device uint32 `cbor:"2,keyasint"`
}

// Validate reports whether a is well formed.
func (a DeviceAddress) Validate() error {
	if a.User == "" || len(a.User) > MaxUserIDLen || !utf8.ValidString(a.User) {
		return fmt.Errorf("messages: device address user must be 1..%d bytes of UTF-8", MaxUserIDLen)
	}
	return nil
}

// String returns "user.device" (user quoted when it contains a dot or is not printable).
func (a DeviceAddress) String() string {
	u := a.User
	if strings.ContainsAny(u, ". \t\n\"") || !utf8.ValidString(u) {
		u = strconv.Quote(u)
	}
	return u + "." + strconv.FormatUint(uint64(a.Device), 10)
}

// Compare orders addresses by user, then device.
func (a DeviceAddress) Compare(o DeviceAddress) int {
	if c := bytes.Compare([]byte(a.User), []byte(o.User)); c != 0 {
		return c
	}
	switch {
	case a.Device < o.Device:
		return -1
	case a.Device > o.Device:
		return 1
	}
	return 0
}

// LogicalMessageID is the sender-chosen 16-byte id tying together the copies
// (retries) of one application message (docs/protocol.md, commit boundary).
type LogicalMessageID [16]byte

// String returns a readable form of the LogicalMessageID.
func (id LogicalMessageID) String() string { return hex.EncodeToString(id[:]) }

// SessionID names one ratchet session: a hash of the PQXDH initiation that
// created it (crypto/ratchet.SessionIDOf).
type SessionID [32]byte

// String returns a readable form of the SessionID.
func (id SessionID) String() string { return hex.EncodeToString(id[:]) }

// IdentityKey is a device's public identity: an Ed25519 signing key and an
// X25519 Diffie-Hellman key. Both are pinned together.
type IdentityKey struct {
	Sign [Ed25519PublicKeySize]byte
	DH   [X25519KeySize]byte
}

// Bytes returns Sign || DH (64 bytes), the form bound into associated data.
func (k IdentityKey) Bytes() []byte {
	b := make([]byte, 0, len(k.Sign)+len(k.DH))
	b = append(b, k.Sign[:]...)
	return append(b, k.DH[:]...)
}

// String returns a readable form of the IdentityKey.
func (k IdentityKey) String() string { return hex.EncodeToString(k.Bytes()) }

// ---------------------------------------------------------------------------
// SecurePayload v1

// SecurePayloadType is the type octet of a SecurePayload v1 frame.
type SecurePayloadType uint8

// SecurePayload v1 frame types.
const (
	// PayloadApplicationMessage (0x01) carries {id, body}.
	PayloadApplicationMessage SecurePayloadType = 0x01
	// PayloadAck (0x02) carries {id}: the receiver finalized message id.
	PayloadAck SecurePayloadType = 0x02
	// PayloadHeld (0x03) carries {id, digest}: the receiver durably holds
	// message id, whose body has ApplicationMessageDigest digest, pending
	// its application's commit. It is not an ACK: the sender keeps the
	// message pending and only stops resending it on the short schedule
	// (docs/protocol.md, "Held receipt").
	PayloadHeld SecurePayloadType = 0x03
)

// HeldDigestSize is the size of a held receipt's body digest.
const HeldDigestSize = 32

// SecurePayload is a decoded SecurePayload v1 frame, the plaintext of a
// ratchet message. Its CBOR form is [1, type, body] where body is
// {"id": bstr .size 16, "body": bstr} for an application message,
// {"id": bstr .size 16} for an ack and {"id": bstr .size 16, "digest":
// bstr .size 32} for a held receipt.
type SecurePayload struct {
	Type SecurePayloadType
	ID   LogicalMessageID
	// Body is the application message body (nil for an ack or a held
	// receipt).
	Body []byte
	// Digest is a held receipt's ApplicationMessageDigest of the body it
	// holds (zero for the other types).
	Digest [HeldDigestSize]byte
}

type wirePayloadFrame struct {
	_    struct{} `cbor:",toarray"`
	V    uint64
	Type uint64
	Body cborRaw
}

type wireAppMessage struct {
	ID   []byte  `cbor:"id"`
	Body *[]byte `cbor:"body"`
}

type wireAck struct {
	ID []byte `cbor:"id"`
}

type wireHeld struct {
	ID     []byte `cbor:"id"`
	Digest []byte `cbor:"digest"`
}

// EncodeSecurePayload returns the canonical encoding of p.
func EncodeSecurePayload(p *SecurePayload) ([]byte, error) {
	var out []byte
	if p.Type != PayloadHeld && p.Digest != ([HeldDigestSize]byte{}) {
		return nil, fmt.Errorf("messages: encode secure payload: only a held receipt carries a digest")
	}
	switch p.Type {
	case PayloadApplicationMessage:
		out = appendSecurePayload(make([]byte, 0, 32+len(p.Body)), p.Type, &p.ID, p.Body, true)
	case PayloadAck:
		if p.Body != nil {
			return nil, fmt.Errorf("messages: encode secure payload: an ack carries no body")
		}
		out = appendSecurePayload(make([]byte, 0, 32), p.Type, &p.ID, nil, false)
	case PayloadHeld:
		if p.Body != nil {
			return nil, fmt.Errorf("messages: encode secure payload: a held receipt carries no body")
		}
		out = appendHeldPayload(make([]byte, 0, 72), &p.ID, &p.Digest)
	default:
		return nil, fmt.Errorf("messages: encode secure payload: unknown type 0x%02x", uint8(p.Type))
	}
	return bounded("secure payload", out, MaxSecurePayloadSize)
}

// DecodeSecurePayload strictly decodes one SecurePayload v1 frame. Errors
// match ErrMalformed (and ErrUnsupportedVersion, ErrTooLarge or
// ErrTrailingBytes where they apply).
func DecodeSecurePayload(b []byte) (*SecurePayload, error) {
	if p, ok := readSecurePayload(b); ok {
		return p, nil
	}
	return decodeSecurePayload(b)
}

// decodeSecurePayload is DecodeSecurePayload by the reflective decoder.
func decodeSecurePayload(b []byte) (*SecurePayload, error) {
	const what = "secure payload"
	var w wirePayloadFrame
	if err := Unmarshal(what, b, &w, MaxSecurePayloadSize); err != nil {
		return nil, err
	}
	if err := checkVersion(what, w.V, SecurePayloadVersion); err != nil {
		return nil, err
	}
	if w.Type > 0xff {
		return nil, decodeErr(what, ErrMalformed, fmt.Errorf("type %d", w.Type))
	}
	p := &SecurePayload{}
	switch SecurePayloadType(w.Type) {
	case PayloadApplicationMessage:
		var m wireAppMessage
		if err := Unmarshal(what, w.Body, &m, 0); err != nil {
			return nil, err
		}
		if len(m.ID) != len(p.ID) || m.Body == nil {
			return nil, decodeErr(what, ErrMalformed, fmt.Errorf("application message needs a 16-byte id and a body"))
		}
		p.Type = PayloadApplicationMessage
		copy(p.ID[:], m.ID)
		p.Body = *m.Body
		if p.Body == nil {
			p.Body = []byte{}
		}
	case PayloadAck:
		var m wireAck
		if err := Unmarshal(what, w.Body, &m, 0); err != nil {
			return nil, err
		}
		if len(m.ID) != len(p.ID) {
			return nil, decodeErr(what, ErrMalformed, fmt.Errorf("ack needs a 16-byte id"))
		}
		p.Type = PayloadAck
		copy(p.ID[:], m.ID)
	case PayloadHeld:
		var m wireHeld
		if err := Unmarshal(what, w.Body, &m, 0); err != nil {
			return nil, err
		}
		if len(m.ID) != len(p.ID) || len(m.Digest) != len(p.Digest) {
			return nil, decodeErr(what, ErrMalformed, fmt.Errorf("held receipt needs a 16-byte id and a 32-byte digest"))
		}
		p.Type = PayloadHeld
		copy(p.ID[:], m.ID)
		copy(p.Digest[:], m.Digest)
	default:
		return nil, decodeErr(what, ErrMalformed, fmt.Errorf("unknown type %d", w.Type))
	}
	if err := requireCanonical(what, b, func() ([]byte, error) { return EncodeSecurePayload(p) }); err != nil {
		return nil, err
	}
	return p, nil
}

// bounded returns the encoding b of what, or ErrTooLarge past limit
// bytes: an encoder refuses what its decoder would.
func bounded(what string, b []byte, limit int) ([]byte, error) {
	if len(b) > limit {
		return nil, fmt.Errorf("messages: encode %s: %d bytes: %w", what, len(b), ErrTooLarge)
	}
	return b, nil
}

// checkVersion refuses a decoded frame of what whose version is not want.
func checkVersion(what string, got, want uint64) error {
	if got != want {
		return decodeErr(what, ErrUnsupportedVersion, fmt.Errorf("version %d", got))
	}
	return nil
}

// requireCanonical re-encodes the decoded value and rejects input that is
// not byte-for-byte that encoding.
func requireCanonical(what string, in []byte, enc func() ([]byte, error)) error {
	out, err := enc()
	if err != nil {
		return decodeErr(what, ErrMalformed, err)
	}
	if !bytes.Equal(in, out) {
		return decodeErr(what, ErrMalformed, fmt.Errorf("not the canonical encoding"))
	}
	return nil
}

// ---------------------------------------------------------------------------
// Envelope

// RatchetHeader is the cleartext Double Ratchet header (Signal Double
// Ratchet §3.2: dh, pn, n) plus the id of the session it belongs to. Its
// CBOR form is [session bstr .size 32, dh bstr .size 32, pn uint, n uint]
// in an envelope of version 1 and [session, dh, pn, n, salt bstr .size 32]
// in one of version 2: Salt set makes the envelope version 2.
type RatchetHeader struct {
	Session SessionID
	DH      [X25519KeySize]byte
	PN      uint32
	N       uint32
	// Salt is the per-message salt of a version-2 envelope (nil: version
	// 1). The ratchet mixes it into the message key and nonce.
	Salt *[HeaderSaltSize]byte
}

// PrekeyInitiation is the PQXDH initial-message block (PQXDH §3.3): the
// initiator's identity, its ephemeral key, the ids of the prekeys it used,
// the ML-KEM-768 ciphertext, both device addresses and the initiator's
// Ed25519 signature over all of it. Its CBOR form (version 2) is
// [2, ik_sign, ik_dh, ephemeral, spk_id, kem_id, otpk_id / null, kem_ct,
// from, to, sig]. Version 1 (the same first seven fields without version,
// addresses or signature) is refused with ErrUnsupportedVersion: it bound
// neither address and did not prove the signing key.
type PrekeyInitiation struct {
	Identity        IdentityKey
	Ephemeral       [X25519KeySize]byte
	SignedPrekeyID  uint32
	KEMPrekeyID     uint32
	OneTimePrekeyID *uint32 // nil when no one-time prekey was used
	KEMCiphertext   []byte  // MLKEM768CiphertextSize bytes
	// From is the initiator's device address and To the responder's: the
	// responder requires From to be the sender its transport authenticated.
	From, To DeviceAddress
	// Signature is Identity.Sign's Ed25519 signature over
	// PrekeyInitiationSigningBytes.
	Signature [SignatureSize]byte
}

// PrekeyInitiationVersion is the only initiation version accepted.
const PrekeyInitiationVersion = 2

// Envelope is one ratchet message on the wire. Its CBOR form is
// [version, header, initiation / null, ciphertext], version 1 or 2 (2 when
// the header carries a salt). An envelope whose Initiation
// is set is a prekey envelope: it can establish the session it names.
type Envelope struct {
	Header     RatchetHeader
	Initiation *PrekeyInitiation
	Ciphertext []byte
}

type wireHeader struct {
	_       struct{} `cbor:",toarray"`
	Session []byte
	DH      []byte
	PN      uint32
	N       uint32
}

// wireHeaderSalted is the header of a version-2 envelope.
type wireHeaderSalted struct {
	_       struct{} `cbor:",toarray"`
	Session []byte
	DH      []byte
	PN      uint32
	N       uint32
	Salt    []byte
}

type wireInitiation struct {
	_         struct{} `cbor:",toarray"`
	V         uint64
	IKSign    []byte
	IKDH      []byte
	Ephemeral []byte
	SPKID     uint32
	KEMID     uint32
	OTPKID    *uint32
	KEMCT     []byte
	From      DeviceAddress
	To        DeviceAddress
	Sig       []byte
}

// wireInitiationBody is wireInitiation without the signature: what the
// signature covers.
type wireInitiationBody struct {
	_         struct{} `cbor:",toarray"`
	V         uint64
	IKSign    []byte
	IKDH      []byte
	Ephemeral []byte
	SPKID     uint32
	KEMID     uint32
	OTPKID    *uint32
	KEMCT     []byte
	From      DeviceAddress
	To        DeviceAddress
}

// wireInitiationV1 is the version-1 form, decoded only to name its version.
type wireInitiationV1 struct {
	_         struct{} `cbor:",toarray"`
	IKSign    []byte
	IKDH      []byte
	Ephemeral []byte
	SPKID     uint32
	KEMID     uint32
	OTPKID    *uint32
	KEMCT     []byte
}

type wireEnvelope struct {
	_          struct{} `cbor:",toarray"`
	V          uint64
	Header     cborRaw
	Initiation cborRaw
	Ciphertext []byte
}

// EncodeRatchetHeader returns the canonical encoding of h: the bytes the
// ratchet binds into the AEAD associated data.
func EncodeRatchetHeader(h *RatchetHeader) ([]byte, error) {
	return appendRatchetHeader(make([]byte, 0, ratchetHeaderSize), h), nil
}

func checkInitiation(in *PrekeyInitiation) error {
	if len(in.KEMCiphertext) != MLKEM768CiphertextSize {
		return fmt.Errorf("messages: encode prekey initiation: KEM ciphertext must be %d bytes", MLKEM768CiphertextSize)
	}
	if err := in.From.Validate(); err != nil {
		return fmt.Errorf("messages: encode prekey initiation: from: %w", err)
	}
	if err := in.To.Validate(); err != nil {
		return fmt.Errorf("messages: encode prekey initiation: to: %w", err)
	}
	return nil
}

// EncodePrekeyInitiation returns the canonical encoding of in. The session
// id of the session it creates is a hash of these bytes.
func EncodePrekeyInitiation(in *PrekeyInitiation) ([]byte, error) {
	if err := checkInitiation(in); err != nil {
		return nil, err
	}
	w := wireInitiation{
		V:      PrekeyInitiationVersion,
		IKSign: in.Identity.Sign[:], IKDH: in.Identity.DH[:], Ephemeral: in.Ephemeral[:],
		SPKID: in.SignedPrekeyID, KEMID: in.KEMPrekeyID, OTPKID: in.OneTimePrekeyID, KEMCT: in.KEMCiphertext,
		From: in.From, To: in.To, Sig: in.Signature[:],
	}
	return Marshal(&w)
}

// PrekeyInitiationSigningBytes returns the canonical encoding of in
// without its signature: the bytes the initiator signs (behind a context
// string, crypto/ratchet).
func PrekeyInitiationSigningBytes(in *PrekeyInitiation) ([]byte, error) {
	if err := checkInitiation(in); err != nil {
		return nil, err
	}
	w := wireInitiationBody{
		V:      PrekeyInitiationVersion,
		IKSign: in.Identity.Sign[:], IKDH: in.Identity.DH[:], Ephemeral: in.Ephemeral[:],
		SPKID: in.SignedPrekeyID, KEMID: in.KEMPrekeyID, OTPKID: in.OneTimePrekeyID, KEMCT: in.KEMCiphertext,
		From: in.From, To: in.To,
	}
	return Marshal(&w)
}

// EncodeEnvelope returns the canonical encoding of e.
func EncodeEnvelope(e *Envelope) ([]byte, error) {
	if len(e.Ciphertext) < AEADTagSize {
		return nil, fmt.Errorf("messages: encode envelope: ciphertext shorter than an AEAD tag")
	}
	var ib []byte
	if e.Initiation != nil {
		var err error
		if ib, err = EncodePrekeyInitiation(e.Initiation); err != nil {
			return nil, err
		}
	}
	b := appendEnvelope(make([]byte, 0, 2+ratchetHeaderSize+len(ib)+1+5+len(e.Ciphertext)), &e.Header, ib, e.Ciphertext)
	return bounded("envelope", b, MaxEnvelopeSize)
}

// DecodeEnvelope strictly decodes one envelope.
func DecodeEnvelope(b []byte) (*Envelope, error) {
	if e, ok := readEnvelope(b); ok {
		return e, nil
	}
	return decodeEnvelope(b)
}

// decodeEnvelope is DecodeEnvelope by the reflective decoder.
func decodeEnvelope(b []byte) (*Envelope, error) {
	const what = "envelope"
	var w wireEnvelope
	if err := Unmarshal(what, b, &w, MaxEnvelopeSize); err != nil {
		return nil, err
	}
	if w.V != EnvelopeVersionSalted {
		if err := checkVersion(what, w.V, EnvelopeVersion); err != nil {
			return nil, err
		}
	}
	if w.Header == nil || w.Initiation == nil {
		return nil, decodeErr(what, ErrMalformed, fmt.Errorf("missing header or initiation slot"))
	}
	e := &Envelope{}
	var h wireHeaderSalted
	if w.V == EnvelopeVersionSalted {
		if err := Unmarshal(what+" header", w.Header, &h, 0); err != nil {
			return nil, err
		}
		if len(h.Salt) != HeaderSaltSize {
			return nil, decodeErr(what, ErrMalformed, fmt.Errorf("header: salt must be %d bytes", HeaderSaltSize))
		}
		e.Header.Salt = new([HeaderSaltSize]byte)
		copy(e.Header.Salt[:], h.Salt)
	} else {
		var h1 wireHeader
		if err := Unmarshal(what+" header", w.Header, &h1, 0); err != nil {
			return nil, err
		}
		h.Session, h.DH, h.PN, h.N = h1.Session, h1.DH, h1.PN, h1.N
	}
	if len(h.Session) != len(e.Header.Session) || len(h.DH) != X25519KeySize {
		return nil, decodeErr(what, ErrMalformed, fmt.Errorf("header: session id must be 32 bytes and dh 32 bytes"))
	}
	copy(e.Header.Session[:], h.Session)
	copy(e.Header.DH[:], h.DH)
	e.Header.PN, e.Header.N = h.PN, h.N
	if !Value(w.Initiation).IsNull() {
		in, err := decodeInitiation(what+" initiation", w.Initiation)
		if err != nil {
			return nil, err
		}
		e.Initiation = in
	}
	if len(w.Ciphertext) < AEADTagSize {
		return nil, decodeErr(what, ErrMalformed, fmt.Errorf("ciphertext shorter than an AEAD tag"))
	}
	e.Ciphertext = w.Ciphertext
	if err := requireCanonical(what, b, func() ([]byte, error) { return EncodeEnvelope(e) }); err != nil {
		return nil, err
	}
	return e, nil
}

func decodeInitiation(what string, b []byte) (*PrekeyInitiation, error) {
	var wi wireInitiation
	if err := Unmarshal(what, b, &wi, MaxPrekeyBundleSize); err != nil {
		var v1 wireInitiationV1
		if Unmarshal(what, b, &v1, MaxPrekeyBundleSize) == nil {
			return nil, decodeErr(what, ErrUnsupportedVersion, fmt.Errorf("version 1 (no addresses, no signature)"))
		}
		return nil, err
	}
	if err := checkVersion(what, wi.V, PrekeyInitiationVersion); err != nil {
		return nil, err
	}
	if len(wi.IKSign) != Ed25519PublicKeySize || len(wi.IKDH) != X25519KeySize ||
		len(wi.Ephemeral) != X25519KeySize || len(wi.KEMCT) != MLKEM768CiphertextSize || len(wi.Sig) != SignatureSize {
		return nil, decodeErr(what, ErrMalformed, fmt.Errorf("wrong key, ciphertext or signature size"))
	}
	if wi.From.Validate() != nil || wi.To.Validate() != nil {
		return nil, decodeErr(what, ErrMalformed, fmt.Errorf("bad device address"))
	}
	in := &PrekeyInitiation{SignedPrekeyID: wi.SPKID, KEMPrekeyID: wi.KEMID, OneTimePrekeyID: wi.OTPKID, KEMCiphertext: wi.KEMCT,
		From: wi.From, To: wi.To}
	copy(in.Identity.Sign[:], wi.IKSign)
	copy(in.Identity.DH[:], wi.IKDH)
	copy(in.Ephemeral[:], wi.Ephemeral)
	copy(in.Signature[:], wi.Sig)
	return in, nil
}

// DecodePrekeyInitiation strictly decodes one initiation block encoded by
// EncodePrekeyInitiation (as stored with a pending session).
func DecodePrekeyInitiation(b []byte) (*PrekeyInitiation, error) {
	const what = "prekey initiation"
	in, err := decodeInitiation(what, b)
	if err != nil {
		return nil, err
	}
	if err := requireCanonical(what, b, func() ([]byte, error) { return EncodePrekeyInitiation(in) }); err != nil {
		return nil, err
	}
	return in, nil
}

// ---------------------------------------------------------------------------
// Prekey bundle

// SignedPrekey is a medium-term X25519 prekey signed by the identity key.
type SignedPrekey struct {
	ID        uint32
	Public    [X25519KeySize]byte
	Signature [SignatureSize]byte
}

// KEMPrekey is a signed ML-KEM-768 encapsulation key (PQXDH's "last-resort"
// post-quantum prekey).
type KEMPrekey struct {
	ID        uint32
	Public    []byte // MLKEM768EncapsulationKeySize bytes
	Signature [SignatureSize]byte
}

// OneTimePrekey is a single-use X25519 prekey.
type OneTimePrekey struct {
	ID     uint32
	Public [X25519KeySize]byte
}

// PrekeyBundle is what a device publishes so that others can start a
// session with it offline (PQXDH §3.2). Its CBOR form is
// [1, ik_sign, ik_dh, [spk_id, spk, spk_sig], [kem_id, kem_pk, kem_sig], [otpk_id, otpk] / null].
type PrekeyBundle struct {
	Identity      IdentityKey
	SignedPrekey  SignedPrekey
	KEMPrekey     KEMPrekey
	OneTimePrekey *OneTimePrekey // nil when the device has none to hand out
}

type wireSPK struct {
	_   struct{} `cbor:",toarray"`
	ID  uint32
	Pub []byte
	Sig []byte
}

type wireOTPK struct {
	_   struct{} `cbor:",toarray"`
	ID  uint32
	Pub []byte
}

type wireBundle struct {
	_      struct{} `cbor:",toarray"`
	V      uint64
	IKSign []byte
	IKDH   []byte
	SPK    wireSPK
	KEM    wireSPK
	OTPK   *wireOTPK
}

// EncodePrekeyBundle returns the canonical encoding of b.
func EncodePrekeyBundle(b *PrekeyBundle) ([]byte, error) {
	if len(b.KEMPrekey.Public) != MLKEM768EncapsulationKeySize {
		return nil, fmt.Errorf("messages: encode prekey bundle: KEM prekey must be %d bytes", MLKEM768EncapsulationKeySize)
	}
	w := wireBundle{
		V: PrekeyBundleVersion, IKSign: b.Identity.Sign[:], IKDH: b.Identity.DH[:],
		SPK: wireSPK{ID: b.SignedPrekey.ID, Pub: b.SignedPrekey.Public[:], Sig: b.SignedPrekey.Signature[:]},
		KEM: wireSPK{ID: b.KEMPrekey.ID, Pub: b.KEMPrekey.Public, Sig: b.KEMPrekey.Signature[:]},
	}
	if o := b.OneTimePrekey; o != nil {
		w.OTPK = &wireOTPK{ID: o.ID, Pub: o.Public[:]}
	}
	out, err := Marshal(&w)
	if err != nil {
		return nil, err
	}
	return bounded("prekey bundle", out, MaxPrekeyBundleSize)
}

// DecodePrekeyBundle strictly decodes one prekey bundle. It checks shapes
// only; crypto/ratchet.VerifyBundle checks the signatures.
func DecodePrekeyBundle(in []byte) (*PrekeyBundle, error) {
	const what = "prekey bundle"
	var w wireBundle
	if err := Unmarshal(what, in, &w, MaxPrekeyBundleSize); err != nil {
		return nil, err
	}
	if err := checkVersion(what, w.V, PrekeyBundleVersion); err != nil {
		return nil, err
	}
	if len(w.IKSign) != Ed25519PublicKeySize || len(w.IKDH) != X25519KeySize ||
		len(w.SPK.Pub) != X25519KeySize || len(w.SPK.Sig) != SignatureSize ||
		len(w.KEM.Pub) != MLKEM768EncapsulationKeySize || len(w.KEM.Sig) != SignatureSize ||
		(w.OTPK != nil && len(w.OTPK.Pub) != X25519KeySize) {
		return nil, decodeErr(what, ErrMalformed, fmt.Errorf("wrong key or signature size"))
	}
	b := &PrekeyBundle{}
	copy(b.Identity.Sign[:], w.IKSign)
	copy(b.Identity.DH[:], w.IKDH)
	b.SignedPrekey.ID = w.SPK.ID
	copy(b.SignedPrekey.Public[:], w.SPK.Pub)
	copy(b.SignedPrekey.Signature[:], w.SPK.Sig)
	b.KEMPrekey.ID = w.KEM.ID
	b.KEMPrekey.Public = w.KEM.Pub
	copy(b.KEMPrekey.Signature[:], w.KEM.Sig)
	if w.OTPK != nil {
		b.OneTimePrekey = &OneTimePrekey{ID: w.OTPK.ID}
		copy(b.OneTimePrekey.Public[:], w.OTPK.Pub)
	}
	if err := requireCanonical(what, in, func() ([]byte, error) { return EncodePrekeyBundle(b) }); err != nil {
		return nil, err
	}
	return b, nil
}
