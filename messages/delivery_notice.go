package messages

// UndecryptableEnvelope: an envelope from From could not be decrypted
// (issue 13, item 10), with Reason from a closed set ("malformed",
// "decrypt", "identity_changed", "budget"). From is what the transport
// authenticated; nothing of the envelope was kept.
type UndecryptableEnvelope struct {
	From   DeviceAddress
	Reason string
	Err    string
}

func (UndecryptableEnvelope) notice() {}
