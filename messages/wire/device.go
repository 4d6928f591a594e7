package wire

import (
	"fmt"

	"github.com/asynkron/protoactor-go/remote"

	"github.com/syncmesh/syncmesh/messages"
)

// Registered names of the delivery plane's wire types.
const (
	// TypeDeviceEnvelope names a ratchet envelope from one device to
	// another (one way: the receiver's ACK is a message of its own).
	TypeDeviceEnvelope = "device.envelope"
	// TypeBundleRequest asks a device for a prekey bundle.
	TypeBundleRequest = "device.bundle_request"
	// TypeBundle answers a TypeBundleRequest.
	TypeBundle = "device.bundle"
)

// MaxDeviceEnvelope bounds a device envelope's ratchet bytes.
const MaxDeviceEnvelope = 1 << 20

func init() {
	for _, err := range []error{
		Register(TypeDeviceEnvelope, decodeDeviceEnvelope),
		Register(TypeBundleRequest, decodeBundleRequest),
		Register(TypeBundle, decodeBundle),
	} {
		if err != nil {
			panic(err) // static names; cannot fail
		}
	}
}

// DeviceEnvelope carries one ratchet envelope from device From to device
// To. From is what the sender claims; the ratchet session (keyed by it,
// with its pinned identity) is what authenticates it.
type DeviceEnvelope struct {
	_        struct{} `cbor:",toarray"`
	From     messages.DeviceAddress
	To       messages.DeviceAddress
	Envelope []byte
	// Size is the length of the CBOR it was decoded from; not encoded.
	Size int `cbor:"-"`
}

func (e *DeviceEnvelope) validate() error {
	if err := e.From.Validate(); err != nil {
		return fmt.Errorf("%w: from: %w", messages.ErrMalformed, err)
	}
	if err := e.To.Validate(); err != nil {
		return fmt.Errorf("%w: to: %w", messages.ErrMalformed, err)
	}
	if len(e.Envelope) == 0 || len(e.Envelope) > MaxDeviceEnvelope {
		return fmt.Errorf("%w: envelope of %d bytes", messages.ErrMalformed, len(e.Envelope))
	}
	return nil
}

// Serialize implements remote.RootSerializable.
func (e *DeviceEnvelope) Serialize() (remote.RootSerialized, error) {
	if e == nil {
		return nil, ErrNilMessage
	}
	if err := e.validate(); err != nil {
		return nil, err
	}
	b, err := messages.Marshal(e)
	if err != nil {
		return nil, err
	}
	return &Envelope{Type: TypeDeviceEnvelope, Cbor: b}, nil
}

func decodeDeviceEnvelope(b []byte) (*DeviceEnvelope, error) {
	var e DeviceEnvelope
	if err := messages.Unmarshal("device envelope", b, &e, MaxDeviceEnvelope+1024); err != nil {
		return nil, err
	}
	if err := e.validate(); err != nil {
		return nil, err
	}
	e.Size = len(b)
	return &e, nil
}

// BundleRequest asks the device To for a fresh prekey bundle.
type BundleRequest struct {
	_  struct{} `cbor:",toarray"`
	To messages.DeviceAddress
	// Size is the length of the CBOR it was decoded from; not encoded.
	Size int `cbor:"-"`
}

// Serialize implements remote.RootSerializable.
func (r *BundleRequest) Serialize() (remote.RootSerialized, error) {
	if r == nil {
		return nil, ErrNilMessage
	}
	if err := r.To.Validate(); err != nil {
		return nil, err
	}
	b, err := messages.Marshal(r)
	if err != nil {
		return nil, err
	}
	return &Envelope{Type: TypeBundleRequest, Cbor: b}, nil
}

func decodeBundleRequest(b []byte) (*BundleRequest, error) {
	var r BundleRequest
	if err := messages.Unmarshal("bundle request", b, &r, 1024); err != nil {
		return nil, err
	}
	if err := r.To.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", messages.ErrMalformed, err)
	}
	r.Size = len(b)
	return &r, nil
}

// Bundle carries a prekey bundle (its canonical encoding).
type Bundle struct {
	Bundle *messages.PrekeyBundle
	// Size is the length of the CBOR it was decoded from.
	Size int
}

// Serialize implements remote.RootSerializable.
func (b *Bundle) Serialize() (remote.RootSerialized, error) {
	if b == nil || b.Bundle == nil {
		return nil, ErrNilMessage
	}
	raw, err := messages.EncodePrekeyBundle(b.Bundle)
	if err != nil {
		return nil, err
	}
	return &Envelope{Type: TypeBundle, Cbor: raw}, nil
}

func decodeBundle(raw []byte) (*Bundle, error) {
	b, err := messages.DecodePrekeyBundle(raw)
	if err != nil {
		return nil, err
	}
	return &Bundle{Bundle: b, Size: len(raw)}, nil
}
