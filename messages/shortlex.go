package messages

import "cmp"

// CompareShortlex is Core Deterministic Encoding's order of text map keys
// (RFC 8949 §4.2.1): shorter first, then bytewise. It is the one
// definition every encoder and strict decoder of the module uses (event
// keys and payloads here, stored rows in persistence/bolt), so what one
// writes the other accepts. It works on strings and byte slices alike
// without converting either.
func CompareShortlex[T ~string | ~[]byte](a, b T) int {
	if len(a) != len(b) {
		return cmp.Compare(len(a), len(b))
	}
	for i := 0; i < len(a); i++ {
		if a[i] != b[i] {
			return cmp.Compare(a[i], b[i])
		}
	}
	return 0
}

// LessShortlex reports whether a sorts before b in CompareShortlex order.
func LessShortlex[T ~string | ~[]byte](a, b T) bool { return CompareShortlex(a, b) < 0 }
