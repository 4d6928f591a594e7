package bolt

import (
	"github.com/syncmesh/syncmesh/messages"
)

// Hand-written encoders and readers of the commit-boundary records. Every
// message writes a pending inbound, a processed and an outbound record
// and reads each back once or twice (the peer actor's state, the delete
// that needs its sequence, the committer's oldest-outbound stat): the
// reflective codec was several microseconds and allocations each time,
// inside the committer's transaction. The encoders write exactly what
// messages.Marshal writes (TestInboundRecordEncodersMatchCodec); the
// readers accept exactly what the encoders write and leave any other
// shape to the strict decoders, which decide (FuzzInboundRecordReaders
// holds the two equal), so a damaged record is still ErrCorrupt.

// appendInt appends a signed integer: a uint's head, with major type 1
// (value -1-n) for a negative one.
func appendInt(b []byte, v int64) []byte {
	if v >= 0 {
		return messages.AppendUint(b, uint64(v))
	}
	at := len(b)
	b = messages.AppendUint(b, uint64(-1-v))
	b[at] |= 1 << 5
	return b
}

// int reads what appendInt writes (shortest heads only).
func (r *cborReader) int() int64 {
	if r.err != nil || len(r.b) == 0 {
		r.fail("int")
		return 0
	}
	switch r.b[0] >> 5 {
	case 0:
		n := r.head(0)
		if n > 1<<63-1 {
			r.fail("int range")
			return 0
		}
		return int64(n)
	case 1:
		n := r.head(1)
		if n > 1<<63-1 {
			r.fail("int range")
			return 0
		}
		return -1 - int64(n)
	}
	r.fail("int")
	return 0
}

func encodePendingIn(r *pendingInRecord) []byte {
	n := 4
	if r.Deliveries != nil {
		n = 5
	}
	b := make([]byte, 0, 40+len(r.Frame))
	b = messages.AppendMapHeader(b, n)
	b = messages.AppendUint(messages.AppendUint(b, 1), r.V)
	b = messages.AppendUint(messages.AppendUint(b, 2), r.Seq)
	b = appendInt(messages.AppendUint(b, 3), r.ReceivedAt)
	b = messages.AppendBytes(messages.AppendUint(b, 4), r.Frame)
	if r.Deliveries != nil {
		b = messages.AppendUint(messages.AppendUint(b, 5), uint64(*r.Deliveries))
	}
	return b
}

// readPendingInRecord is decodePendingIn with a fast path for the shape
// encodePendingIn writes. Frame aliases v (the caller opens it into a
// copy, or keeps only the sequence).
func readPendingInRecord(v []byte) (pendingInRecord, error) {
	if r, ok := readCanonicalPendingIn(v); ok {
		return r, nil
	}
	return decodePendingIn(v)
}

func readCanonicalPendingIn(v []byte) (pendingInRecord, bool) {
	var rec pendingInRecord
	if len(v) > maxRecordSize {
		return rec, false
	}
	r := cborReader{b: v}
	n := r.mapLen()
	if (n != 4 && n != 5) || r.uint() != 1 {
		return rec, false
	}
	if rec.V = r.uint(); rec.V != recordVersion || r.uint() != 2 {
		return rec, false
	}
	if rec.Seq = r.uint(); rec.Seq == 0 || r.uint() != 3 {
		return rec, false
	}
	rec.ReceivedAt = r.int()
	if r.uint() != 4 {
		return rec, false
	}
	if r.null() {
		return rec, false
	}
	rec.Frame = r.bytes()
	if n == 5 {
		if r.uint() != 5 {
			return rec, false
		}
		d := r.uint()
		if d > 1<<32-1 {
			return rec, false
		}
		n := uint32(d)
		rec.Deliveries = &n
	}
	return rec, r.err == nil && len(r.b) == 0 && rec.Frame != nil
}

func encodeOutbound(r *outboundRecord) []byte {
	b := make([]byte, 0, 48+len(r.Body))
	b = messages.AppendMapHeader(b, 6)
	b = messages.AppendUint(messages.AppendUint(b, 1), r.V)
	b = messages.AppendUint(messages.AppendUint(b, 2), r.Seq)
	b = appendInt(messages.AppendUint(b, 3), r.CreatedAt)
	b = messages.AppendUint(messages.AppendUint(b, 4), uint64(r.Attempts))
	b = appendInt(messages.AppendUint(b, 5), r.LastAttemptAt)
	return messages.AppendBytes(messages.AppendUint(b, 6), r.Body)
}

// readOutboundRecord is decodeOutbound with a fast path for the shape
// encodeOutbound writes. Body aliases v.
func readOutboundRecord(v []byte) (outboundRecord, error) {
	if r, ok := readCanonicalOutbound(v); ok {
		return r, nil
	}
	return decodeOutbound(v)
}

func readCanonicalOutbound(v []byte) (outboundRecord, bool) {
	var rec outboundRecord
	if len(v) > maxRecordSize {
		return rec, false
	}
	r := cborReader{b: v}
	if r.mapLen() != 6 || r.uint() != 1 {
		return rec, false
	}
	if rec.V = r.uint(); rec.V != recordVersion || r.uint() != 2 {
		return rec, false
	}
	if rec.Seq = r.uint(); rec.Seq == 0 || r.uint() != 3 {
		return rec, false
	}
	rec.CreatedAt = r.int()
	if r.uint() != 4 {
		return rec, false
	}
	a := r.uint()
	if a > 1<<32-1 || r.uint() != 5 {
		return rec, false
	}
	rec.Attempts = uint32(a)
	rec.LastAttemptAt = r.int()
	if r.uint() != 6 || r.null() {
		return rec, false
	}
	rec.Body = r.bytes()
	return rec, r.err == nil && len(r.b) == 0 && rec.Body != nil
}

// encodeProcessedEntry writes the sealed plaintext of a processed record.
func encodeProcessedEntry(e *processedEntry) []byte {
	n := 2
	if len(e.Digest) > 0 {
		n++
	}
	if e.Reason != 0 {
		n++
	}
	if e.Legacy {
		n++
	}
	b := make([]byte, 0, 16+len(e.Digest))
	b = messages.AppendMapHeader(b, n)
	b = messages.AppendUint(messages.AppendUint(b, 1), uint64(e.Kind))
	b = appendInt(messages.AppendUint(b, 2), e.FinalizedAt)
	if len(e.Digest) > 0 {
		b = messages.AppendBytes(messages.AppendUint(b, 3), e.Digest)
	}
	if e.Reason != 0 {
		b = messages.AppendUint(messages.AppendUint(b, 4), uint64(e.Reason))
	}
	if e.Legacy {
		b = messages.AppendBool(messages.AppendUint(b, 5), true)
	}
	return b
}

func encodeProcessedRecord(r *processedRecord) []byte {
	b := make([]byte, 0, 8+len(r.Entry))
	b = messages.AppendMapHeader(b, 2)
	b = messages.AppendUint(messages.AppendUint(b, 1), r.V)
	return messages.AppendBytes(messages.AppendUint(b, 2), r.Entry)
}

// readProcessedRecord is decodeProcessed with a fast path for the shape
// encodeProcessedRecord writes. Entry aliases v.
func readProcessedRecord(v []byte) (processedRecord, error) {
	if r, ok := readCanonicalProcessed(v); ok {
		return r, nil
	}
	return decodeProcessed(v)
}

func readCanonicalProcessed(v []byte) (processedRecord, bool) {
	if len(v) > maxRecordSize {
		return processedRecord{}, false
	}
	r := cborReader{b: v}
	if r.mapLen() != 2 || r.uint() != 1 || r.uint() != processedRecordVersion || r.uint() != 2 || r.null() {
		return processedRecord{}, false
	}
	rec := processedRecord{V: processedRecordVersion, Entry: r.bytes()}
	return rec, r.err == nil && len(r.b) == 0 && rec.Entry != nil
}

// scanFew is scan (sync.go) with chunks that start at one entry and
// double up to scanChunk: the committer reads only the first pending
// outbound entry after every send and ACK (its oldest-outbound stat), and
// scan's first chunk copied up to 256 index entries and allocated room for
// 256 every time. Entries are still copied before fn sees them, so fn
// may write.
func scanFew(b *wbucket, start, prefix []byte, fn func(k, v []byte) (bool, error)) error {
	return scanChunks(b, start, prefix, 1, fn)
}
