package messages

// PeekEnvelope reads, from the front of an envelope in its canonical
// encoding, what a receiver needs before it decrypts: the session id and
// whether the initiation slot is filled. It validates nothing else, copies
// nothing and allocates nothing; ok is false for anything it does not
// recognise (another version, a non-canonical head, a short input), and
// the caller then decodes the envelope (DecodeEnvelope). It is a routing
// hint, never a replacement for DecodeEnvelope: whenever DecodeEnvelope
// accepts b, PeekEnvelope reports ok with the same session and initiation
// (FuzzPeekEnvelope), so a receiver that decodes strictly afterwards — as
// the ratchet does on every envelope — need not decode it twice.
func PeekEnvelope(b []byte) (session SessionID, initiation bool, ok bool) {
	// [1, [session, dh, pn, n], initiation / null, ciphertext] or
	// [2, [session, dh, pn, n, salt], initiation / null, ciphertext]
	if len(b) < 2 || b[0] != 0x84 || EnvelopeVersionSalted >= 24 || (b[1] != EnvelopeVersion && b[1] != EnvelopeVersionSalted) {
		return session, false, false
	}
	salted := b[1] == EnvelopeVersionSalted
	hdr := byte(0x84)
	if salted {
		hdr = 0x85
	}
	p := b[2:]
	if len(p) < 1+2+32+2+32 || p[0] != hdr || p[1] != 0x58 || p[2] != 32 {
		return session, false, false
	}
	copy(session[:], p[3:35])
	p = p[35:]
	if p[0] != 0x58 || p[1] != 32 {
		return session, false, false
	}
	p = p[34:]
	for range 2 { // pn, n: unsigned integers
		n := uintHeadLen(p)
		if n == 0 {
			return session, false, false
		}
		p = p[n:]
	}
	if salted {
		if len(p) < 2+HeaderSaltSize || p[0] != 0x58 || p[1] != HeaderSaltSize {
			return session, false, false
		}
		p = p[2+HeaderSaltSize:]
	}
	if len(p) == 0 {
		return session, false, false
	}
	return session, p[0] != 0xf6, true
}

// uintHeadLen is the length of the CBOR unsigned integer at the front of
// p, or 0 when p does not start with one.
func uintHeadLen(p []byte) int {
	if len(p) == 0 || p[0]>>5 != 0 {
		return 0
	}
	n := 0
	switch ai := p[0] & 0x1f; {
	case ai < 24:
		n = 1
	case ai == 24:
		n = 2
	case ai == 25:
		n = 3
	case ai == 26:
		n = 5
	case ai == 27:
		n = 9
	default:
		return 0
	}
	if len(p) < n {
		return 0
	}
	return n
}
