package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/syncmesh/syncmesh/messages"
)

// errInput marks a user input (flag, JSON event, HLC, hex) that the tool
// cannot use; commands exit with status 2 on it.
var errInput = errors.New("sspctl: invalid input")

func inputErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errInput, fmt.Sprintf(format, args...))
}

// parseHLC parses an HLC given as "physical.logical" (the form messages.HLC
// prints) or as the raw packed unsigned integer physical_ms<<16|logical.
func parseHLC(s string) (messages.HLC, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, inputErr("empty HLC")
	}
	if p, l, ok := strings.Cut(s, "."); ok {
		phys, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return 0, inputErr("HLC %q: physical part: %v", s, err)
		}
		logical, err := strconv.ParseUint(l, 10, 16)
		if err != nil {
			return 0, inputErr("HLC %q: logical part must be 0..65535", s)
		}
		h, err := messages.NewHLC(phys, uint16(logical))
		if err != nil {
			return 0, inputErr("HLC %q: %v", s, err)
		}
		return h, nil
	}
	raw, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, inputErr("HLC %q: want physical.logical or a raw unsigned integer", s)
	}
	return messages.HLC(raw), nil
}

// decodeHex decodes a hex string, tolerating surrounding space and an
// optional 0x prefix.
func decodeHex(what, s string) ([]byte, error) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "0x")
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, inputErr("%s: not hex: %v", what, err)
	}
	return b, nil
}

// jsonToGo converts a JSON value decoded with UseNumber into what
// messages.NewValue encodes: integral numbers become int64 (or uint64 above
// MaxInt64), other numbers float64, {"$bytes":"hex"} a byte string, arrays
// and objects recursively.
func jsonToGo(v any) (any, error) {
	switch x := v.(type) {
	case nil, bool, string:
		return x, nil
	case json.Number:
		return jsonNumber(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			g, err := jsonToGo(e)
			if err != nil {
				return nil, err
			}
			out[i] = g
		}
		return out, nil
	case map[string]any:
		if b, ok := x["$bytes"]; ok && len(x) == 1 {
			s, ok := b.(string)
			if !ok {
				return nil, inputErr(`{"$bytes": ...} wants a hex string`)
			}
			return decodeHex("$bytes", s)
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			g, err := jsonToGo(e)
			if err != nil {
				return nil, err
			}
			out[k] = g
		}
		return out, nil
	}
	return nil, inputErr("unsupported JSON value %T", v)
}

func jsonNumber(n json.Number) (any, error) {
	s := n.String()
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return i, nil
	}
	if u, err := strconv.ParseUint(s, 10, 64); err == nil {
		return u, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return nil, inputErr("number %s: %v", s, err)
	}
	// 1.0 and 1e3 are integral: encode them as integers.
	if f == math.Trunc(f) && f >= -(1<<63) && f < 1<<63 {
		return int64(f), nil
	}
	return f, nil
}

// jsonColumns turns a JSON object into messages.Columns.
func jsonColumns(what string, raw json.RawMessage) (messages.Columns, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, inputErr("%s: want a JSON object: %v", what, err)
	}
	if m == nil {
		return nil, inputErr("%s: want a JSON object, got null", what)
	}
	out := make(messages.Columns, len(m))
	for k, v := range m {
		g, err := jsonToGo(v)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", what, k, err)
		}
		val, err := messages.NewValue(g)
		if err != nil {
			return nil, inputErr("%s.%s: %v", what, k, err)
		}
		out[k] = val
	}
	return out, nil
}

// goToJSON turns a decoded CBOR value (messages.Value.Interface) into a
// JSON-marshalable value: byte strings become {"$bytes":"hex"} (the form
// sign accepts), maps get string keys, non-finite floats become strings.
func goToJSON(v any) any {
	switch x := v.(type) {
	case []byte:
		return map[string]string{"$bytes": hex.EncodeToString(x)}
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return strconv.FormatFloat(x, 'g', -1, 64)
		}
		return x
	case float32:
		return goToJSON(float64(x))
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = goToJSON(e)
		}
		return out
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[fmt.Sprint(k)] = goToJSON(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = goToJSON(e)
		}
		return out
	}
	return v
}

// valueJSON decodes one stored value for display.
func valueJSON(v messages.Value) (any, error) {
	g, err := v.Interface()
	if err != nil {
		return nil, err
	}
	return goToJSON(g), nil
}

// columnsJSON decodes a row key for display.
func columnsJSON(c messages.Columns) (map[string]any, error) {
	out := make(map[string]any, len(c))
	names := c.Names()
	sort.Strings(names)
	for _, k := range names {
		j, err := valueJSON(c[k])
		if err != nil {
			return nil, fmt.Errorf("column %q: %w", k, err)
		}
		out[k] = j
	}
	return out, nil
}

// clockJSON is a clock as dump prints it; nil (JSON null) for the zero clock.
type clockJSON struct {
	HLC  string `json:"hlc"`
	Site string `json:"site"`
}

func clockOut(c messages.Clock) *clockJSON {
	if c.IsZero() {
		return nil
	}
	return &clockJSON{HLC: c.HLC.String(), Site: c.Site.String()}
}
