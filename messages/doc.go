// Package messages holds syncmesh's plain data: SSP/1 events and hybrid
// logical clocks, the records the actors exchange, and the one CBOR codec
// (Core Deterministic Encoding) every other package encodes with.
//
// Decoders here are strict: an unknown version, trailing bytes, an oversize
// input, duplicate map keys, indefinite lengths, tags or a wrong type fail
// with an error that matches ErrMalformed under errors.Is, and nothing panics
// on hostile input.
package messages
