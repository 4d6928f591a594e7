package runtime_test

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/syncmesh/syncmesh/runtime"
)

// A key decoded from JSON (float64) names the same row as the integer the
// application wrote; nil and fractional components are refused.
func ExampleNormalizeKey() {
	var fromJSON map[string]any
	_ = json.Unmarshal([]byte(`{"id": 42, "shard": "eu"}`), &fromJSON)
	k, err := runtime.NormalizeKey(fromJSON)
	fmt.Printf("%T %v %v\n", k["id"], k["id"], err)

	_, err = runtime.NormalizeKey(map[string]any{"id": nil})
	fmt.Println(errors.Is(err, runtime.ErrInvalidKey), err)
	_, err = runtime.NormalizeKey(map[string]any{"id": 1.5})
	fmt.Println(errors.Is(err, runtime.ErrInvalidKey))
	// Output:
	// int64 42 <nil>
	// true runtime: key column "id": nil is not a key value
	// true
}
