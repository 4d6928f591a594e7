package messages

// Hand-written encoders of the delivery plane's fixed frames: the
// SecurePayload frame, the ratchet header and the envelope. Each message
// costs about ten of these encodings (every decoder re-encodes to check
// that its input was canonical, and the ratchet encodes each header for
// the AEAD associated data), and the reflective CBOR encoder spent more on
// them than AES-GCM. They write exactly the Core Deterministic encoding
// the wire structs would get (heads by appendHead) (RFC 8949 §4.2.1: shortest heads, map keys
// in bytewise order of their encodings); TestSecureAppendMatchesCBOR
// compares them with it over random and edge-sized values.

func appendBstr(dst, b []byte) []byte {
	return append(appendHead(dst, 2, uint64(len(b))), b...)
}

// appendRatchetHeader appends the encoding of wireHeader: [session bstr,
// dh bstr, pn uint, n uint].
func appendRatchetHeader(dst []byte, h *RatchetHeader) []byte {
	dst = append(dst, 0x84)
	dst = appendBstr(dst, h.Session[:])
	dst = appendBstr(dst, h.DH[:])
	dst = appendHead(dst, 0, uint64(h.PN))
	return appendHead(dst, 0, uint64(h.N))
}

// ratchetHeaderSize is the largest encoded ratchet header.
const ratchetHeaderSize = 1 + 2*(2+32) + 2*5

// appendSecurePayload appends the frame [1, type, body] with body
// {"id": bstr} (an ack) or {"id": bstr, "body": bstr} (an application
// message): "id" (0x62…) sorts before "body" (0x64…).
func appendSecurePayload(dst []byte, t SecurePayloadType, id *LogicalMessageID, body []byte, app bool) []byte {
	dst = append(dst, 0x83)
	dst = appendHead(dst, 0, SecurePayloadVersion)
	dst = appendHead(dst, 0, uint64(t))
	if app {
		dst = append(dst, 0xa2)
	} else {
		dst = append(dst, 0xa1)
	}
	dst = append(dst, 0x62, 'i', 'd')
	dst = appendBstr(dst, id[:])
	if app {
		dst = append(dst, 0x64, 'b', 'o', 'd', 'y')
		dst = appendBstr(dst, body)
	}
	return dst
}

// appendEnvelope appends the encoding of wireEnvelope: [1, header,
// initiation or null, ciphertext bstr]; initiation is the encoded
// initiation (nil: none).
func appendEnvelope(dst []byte, h *RatchetHeader, initiation, ciphertext []byte) []byte {
	dst = append(dst, 0x84)
	dst = appendHead(dst, 0, EnvelopeVersion)
	dst = appendRatchetHeader(dst, h)
	if initiation != nil {
		dst = append(dst, initiation...)
	} else {
		dst = append(dst, 0xf6)
	}
	return appendBstr(dst, ciphertext)
}
