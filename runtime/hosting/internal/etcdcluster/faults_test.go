package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/syncmesh/syncmesh/runtime/hosting"
)

// TestSetReplicas: 0 and 1 change nothing; a factor above 1 sets
// ClusterConfig.Replicas where hosting has it and is refused where it
// does not (a replicated run must not silently test one copy).
func TestSetReplicas(t *testing.T) {
	for _, n := range []int{0, 1} {
		var cc hosting.ClusterConfig
		if err := setReplicas(&cc, n); err != nil || !reflect.ValueOf(cc).IsZero() {
			t.Fatalf("replicas %d: err %v, config changed: %v", n, err, !reflect.ValueOf(cc).IsZero())
		}
	}
	var cc hosting.ClusterConfig
	err := setReplicas(&cc, 3)
	if f := reflect.ValueOf(cc).FieldByName("Replicas"); f.IsValid() {
		if err != nil || f.Int() != 3 {
			t.Fatalf("hosting has Replicas: err %v, Replicas %d", err, f.Int())
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), "no Replicas field") {
		t.Fatalf("hosting has no Replicas, yet setReplicas(3) = %v", err)
	}
}
