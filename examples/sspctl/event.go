package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"

	"github.com/syncmesh/syncmesh/messages"
)

// jsonEvent is the input form of sign:
//
//	{"schema":"app","table":"t","key":{"id":1},"payload":{"a":"x","b":null},"hlc":"1700000000000.0"}
//
// payload null, or "delete": true (with payload absent or null), is a
// delete; an upsert needs a payload object ({} is allowed). hlc is
// optional, as "physical.logical" or a raw unsigned integer; without it
// (HLC 0) runtime.Node.Sign assigns a fresh one.
type jsonEvent struct {
	Schema  string          `json:"schema"`
	Table   string          `json:"table"`
	Key     json.RawMessage `json:"key"`
	Payload json.RawMessage `json:"payload"`
	Delete  bool            `json:"delete"`
	HLC     json.RawMessage `json:"hlc"`
}

// parseEvents reads a stream of JSON event objects (one or more, separated
// by whitespace).
func parseEvents(r io.Reader) ([]messages.Event, error) {
	dec := json.NewDecoder(r)
	var out []messages.Event
	for {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, inputErr("event %d: %v", len(out)+1, err)
		}
		p, err := parseEvent(raw)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, inputErr("no event in input")
	}
	return out, nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// parseEvent converts one JSON event object.
func parseEvent(raw []byte) (messages.Event, error) {
	var je jsonEvent
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&je); err != nil {
		return messages.Event{}, inputErr("event: %v", err)
	}
	if je.Schema == "" || je.Table == "" {
		return messages.Event{}, inputErr(`event: "schema" and "table" are required`)
	}
	if len(je.Key) == 0 || isNull(je.Key) {
		return messages.Event{}, inputErr(`event: "key" must be a non-empty object`)
	}
	key, err := jsonColumns("key", je.Key)
	if err != nil {
		return messages.Event{}, err
	}
	if len(key) == 0 {
		return messages.Event{}, inputErr(`event: "key" must be a non-empty object`)
	}
	p := messages.Event{Schema: je.Schema, Table: je.Table, Key: key}
	switch {
	case je.Delete:
		if len(je.Payload) != 0 && !isNull(je.Payload) {
			return messages.Event{}, inputErr(`event: "delete": true carries no payload`)
		}
		p.Delete = true
	case len(je.Payload) == 0:
		return messages.Event{}, inputErr(`event: "payload" is required: an object for an upsert ({} allowed), null for a delete`)
	case isNull(je.Payload):
		p.Delete = true
	default:
		if p.Payload, err = jsonColumns("payload", je.Payload); err != nil {
			return messages.Event{}, err
		}
	}
	if len(je.HLC) != 0 && !isNull(je.HLC) {
		var s string
		if err := json.Unmarshal(je.HLC, &s); err != nil {
			// A bare JSON number: the raw packed form.
			s = strings.TrimSpace(string(je.HLC))
		}
		if p.HLC, err = parseHLC(s); err != nil {
			return messages.Event{}, err
		}
		if p.HLC == 0 {
			// Zero means "assign one" to runtime.Node.Sign.
			return messages.Event{}, inputErr(`event: "hlc" 0 is not an HLC; omit it for a fresh one`)
		}
	}
	return p, nil
}
