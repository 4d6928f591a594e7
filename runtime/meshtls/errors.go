package meshtls

import "errors"

// Errors (match with errors.Is).
var (
	// ErrInvalidName: a node name that cannot be a DNS SAN (1..253 bytes
	// of letters, digits, '-' and '.', no leading or trailing '.' or '-').
	ErrInvalidName = errors.New("meshtls: invalid node name")
	// ErrNoNodeName: a certificate without a syncmesh node URI SAN.
	ErrNoNodeName = errors.New("meshtls: certificate names no syncmesh node")
	// ErrBadPEM: a file that does not hold the expected PEM block.
	ErrBadPEM = errors.New("meshtls: bad PEM")
)
