package sealed

import (
	"github.com/syncmesh/syncmesh/messages"
)

// vectorKey is the fixed key of the frozen vectors: bytes 0x00..0x1f.
func vectorKey() Key {
	var k Key
	for i := range k {
		k[i] = byte(i)
	}
	return k
}

// vectorNonce is the fixed nonce of a vector: 12 bytes starting at start.
func vectorNonce(start byte) [NonceSize]byte {
	var n [NonceSize]byte
	for i := range n {
		n[i] = start + byte(i)
	}
	return n
}

type vector struct {
	name      string
	typ       messages.RecordType
	parts     [][]byte // identity parts
	identity  []byte
	nonce     byte
	plaintext []byte
	sealed    string // frozen hex; any format change breaks it
}

// vectors returns the frozen vectors, one per record type.
func vectors() []vector {
	b := func(s string) []byte { return []byte(s) }
	eventID := make([]byte, 32)
	for i := range eventID {
		eventID[i] = 0xe0 ^ byte(i)
	}
	digestStored := append([]byte{1}, make([]byte, 32)...)
	for i := 1; i < len(digestStored); i++ {
		digestStored[i] = byte(i * 7)
	}
	return []vector{
		{"event", recEvent, [][]byte{eventID}, EventIdentity(eventID), 0x10, b("cose-sign1-event-bytes"),
			"0135444b58101112131415161718191a1b1e91eb7364ba53d4a4442578791c0727fa32377a7eb1978e61d8b5db87ddfbbc0608f83d348d"},
		{"node-key", recNodeKey, [][]byte{b("node")}, NodeKeyIdentity(), 0x20, b("ed25519-private-key-seed-32bytes"),
			"0135444b58202122232425262728292a2bb75e944559a923236a0e2bb8a06c91d4bb2c95b1f4e5068a41c55e7030fe3b7a7b48b1401006553c419e8aab6ac70117"},
		{"session", recSession, [][]byte{b("bob"), b("phone")}, SessionIdentity(b("bob"), b("phone")), 0x30, b("ratchet-state"),
			"0135444b58303132333435363738393a3bc15445a3810a3e2e5947ef98776234eaf8fa6d91ada983c86b87e90aef"},
		{"prekey", recPrekey, [][]byte{{0, 0, 0, 42}}, PrekeyIdentity([]byte{0, 0, 0, 42}), 0x40, b("prekey-private"),
			"0135444b58404142434445464748494a4b92cbcb484345aa73bfad6157ef01214bf85f4b8557217fa1fd83f65c79e7"},
		{"identity", recIdentity, [][]byte{b("device")}, DeviceIdentity(), 0x50, b("device-identity-keys"),
			"0135444b58505152535455565758595a5bf642401d8735948f38d35311a495faf8884a8498ff92702d85a52f166100457cb3c634e8"},
		{"outbound-body", recOutboundBody, [][]byte{b("carol"), b("laptop"), b("msg-0001")}, MessageIdentity(b("carol"), b("laptop"), b("msg-0001")), 0x60, b("hello carol"),
			"0135444b58606162636465666768696a6b82bef739d460e00e0e79956e9d360d9ef1b871eeb97b945c5fa644"},
		{"pending-frame", recPendingFrame, [][]byte{b("alice"), b("tablet"), b("msg-0002")}, MessageIdentity(b("alice"), b("tablet"), b("msg-0002")), 0x70, b("secure-payload-application-message-frame"),
			"0135444b58707172737475767778797a7b64e2d952c1acb14425535abdb0249cb6dd47a9e467fa38d3cae0142921c4655f087357b7b9b95b5b747fef83c38b681a2a3b46fd9e88c106"},
		{"processed-digest", recProcessedDigest, [][]byte{b("alice"), b("tablet"), b("msg-0002")}, MessageIdentity(b("alice"), b("tablet"), b("msg-0002")), 0x80, digestStored,
			"0135444b58808182838485868788898a8b61a2600e5d31cba0a6b4537d1228c84cd729cb7a862397ab855236757237ef2dc9aff2cd3149fd0ec623ab0cbb4957df3a"},
	}
}

// Record type numbers of the vectors: the values persistence assigns
// (persistence.RecordEvent, …), repeated here because this package imports
// nothing above messages; the vectors freeze them.
const (
	recEvent           messages.RecordType = 1
	recNodeKey         messages.RecordType = 2
	recSession         messages.RecordType = 3
	recPrekey          messages.RecordType = 4
	recIdentity        messages.RecordType = 5
	recOutboundBody    messages.RecordType = 6
	recPendingFrame    messages.RecordType = 11
	recProcessedDigest messages.RecordType = 12
)
