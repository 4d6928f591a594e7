package messages

import "slices"

// Building blocks for hand-written Core Deterministic encoders of records
// on hot paths (the codec's reflective Marshal costs microseconds per
// record). An encoder built from them must produce exactly what Marshal
// produces for the same value; its package proves that with a test.

// AppendMapHeader appends the head of a map of n pairs.
func AppendMapHeader(b []byte, n int) []byte { return appendHead(b, 5, uint64(n)) }

// AppendUint appends an unsigned integer.
func AppendUint(b []byte, v uint64) []byte { return appendHead(b, 0, v) }

// AppendBytes appends a byte string; nil appends null, as Marshal encodes
// a nil slice.
func AppendBytes(b, v []byte) []byte {
	if v == nil {
		return append(b, 0xf6)
	}
	return append(appendHead(b, 2, uint64(len(v))), v...)
}

// AppendText appends a text string.
func AppendText(b []byte, s string) []byte {
	return append(appendHead(b, 3, uint64(len(s))), s...)
}

// AppendBool appends a boolean.
func AppendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 0xf5)
	}
	return append(b, 0xf4)
}

// AppendNull appends null.
func AppendNull(b []byte) []byte { return append(b, 0xf6) }

// SortedKeys returns m's keys in deterministic map-key order for text
// keys: shorter first, then bytewise (RFC 8949 §4.2.1).
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, CompareShortlex[string])
	return keys
}
