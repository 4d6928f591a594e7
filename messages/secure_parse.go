package messages

import "math"

// Hand-written readers of the delivery plane's two per-message frames in
// their canonical encoding: an envelope without an initiation and a
// SecurePayload frame. The strict decoders (DecodeEnvelope,
// DecodeSecurePayload) try them first; they accept only input that is
// byte for byte what the hand-written encoders (secure_append.go) write,
// head by head in shortest form, so what they return is what the
// reflective decoder would and the input is its canonical encoding. Any
// other input — an initiation, a wrong head, a size past a limit — goes
// to the reflective decoder, which gives the typed error.
// FuzzEnvelopeReaderMatchesTheDecoder and
// FuzzSecurePayloadReaderMatchesTheDecoder check both claims.

// readEnvelope reads [1, [session, dh, pn, n], null, ciphertext] and
// [2, [session, dh, pn, n, salt], null, ciphertext].
func readEnvelope(b []byte) (*Envelope, bool) {
	if len(b) > MaxEnvelopeSize {
		return nil, false
	}
	r := canonReader{b: b}
	if r.head(4) != 4 {
		return nil, false
	}
	fields := uint64(4)
	switch r.head(0) {
	case EnvelopeVersion:
	case EnvelopeVersionSalted:
		fields = 5
	default:
		return nil, false
	}
	if r.head(4) != fields {
		return nil, false
	}
	e := &Envelope{}
	session := r.take(r.head(2))
	dh := r.take(r.head(2))
	pn, n := r.head(0), r.head(0)
	if r.bad || len(session) != len(e.Header.Session) || len(dh) != len(e.Header.DH) || pn > math.MaxUint32 || n > math.MaxUint32 {
		return nil, false
	}
	if fields == 5 {
		salt := r.take(r.head(2))
		if r.bad || len(salt) != HeaderSaltSize {
			return nil, false
		}
		e.Header.Salt = new([HeaderSaltSize]byte)
		copy(e.Header.Salt[:], salt)
	}
	r.literal([]byte{0xf6})
	ct := r.take(r.head(2))
	if r.bad || len(r.b) != 0 || len(ct) < AEADTagSize {
		return nil, false
	}
	copy(e.Header.Session[:], session)
	copy(e.Header.DH[:], dh)
	e.Header.PN, e.Header.N = uint32(pn), uint32(n)
	e.Ciphertext = append([]byte(nil), ct...)
	return e, true
}

// readSecurePayload reads [1, type, {"id": id}] (an ack) or [1, type,
// {"id": id, "body": body}] (an application message).
func readSecurePayload(b []byte) (*SecurePayload, bool) {
	if len(b) > MaxSecurePayloadSize {
		return nil, false
	}
	r := canonReader{b: b}
	if r.head(4) != 3 || r.head(0) != SecurePayloadVersion {
		return nil, false
	}
	p := &SecurePayload{}
	t := r.head(0)
	fields := r.head(5)
	switch {
	case t == uint64(PayloadApplicationMessage) && fields == 2:
		p.Type = PayloadApplicationMessage
	case t == uint64(PayloadAck) && fields == 1:
		p.Type = PayloadAck
	default:
		return nil, false
	}
	r.literal([]byte{0x62, 'i', 'd'})
	id := r.take(r.head(2))
	if r.bad || len(id) != len(p.ID) {
		return nil, false
	}
	copy(p.ID[:], id)
	if p.Type == PayloadApplicationMessage {
		r.literal([]byte{0x64, 'b', 'o', 'd', 'y'})
		body := r.take(r.head(2))
		if r.bad {
			return nil, false
		}
		p.Body = append([]byte{}, body...)
	}
	if r.bad || len(r.b) != 0 {
		return nil, false
	}
	return p, true
}
