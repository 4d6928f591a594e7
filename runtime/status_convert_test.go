package runtime

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/actors/reconcile"
	"github.com/syncmesh/syncmesh/actors/replicate"
	"github.com/syncmesh/syncmesh/messages"
)

// toPeerStatus copies every field of the replication layer's PeerStatus:
// the two structs have the same field names in the same order, and a
// status with every field set comes out equal field by field.
func TestToPeerStatusCopiesEveryField(t *testing.T) {
	from, to := reflect.TypeOf(replicate.PeerStatus{}), reflect.TypeOf(PeerStatus{})
	if from.NumField() != to.NumField() {
		t.Fatalf("replicate.PeerStatus has %d fields, runtime.PeerStatus %d", from.NumField(), to.NumField())
	}
	for i := 0; i < from.NumField(); i++ {
		if from.Field(i).Name != to.Field(i).Name {
			t.Fatalf("field %d: replicate.PeerStatus.%s, runtime.PeerStatus.%s", i, from.Field(i).Name, to.Field(i).Name)
		}
	}
	at := time.UnixMilli(1_800_000_000_000).UTC()
	in := replicate.PeerStatus{Peer: "b", Path: "p", Cursor: 3, Tail: 7, Retry: 2,
		Watermarks: map[GroupKey]messages.HLC{{Schema: "s", Table: "t"}: 9},
		LastPush:   at, LastErr: errors.New("push failed"),
		LastReconcile: reconcile.Status{At: at, Took: time.Second, Rounds: 1, BytesSent: 2, BytesReceived: 3,
			Missing: 4, Fetched: 5, Err: errors.New("partitioned")}}
	out := toPeerStatus(in)
	vin, vout := reflect.ValueOf(in), reflect.ValueOf(out)
	for i := 0; i < vin.NumField(); i++ {
		a, b := vin.Field(i), vout.Field(i)
		if a.IsZero() {
			t.Fatalf("the input leaves %s zero: the check cannot see it copied", from.Field(i).Name)
		}
		if b.Type() != a.Type() && b.Type().ConvertibleTo(a.Type()) {
			b = b.Convert(a.Type())
		}
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			t.Errorf("%s: got %+v, want %+v", from.Field(i).Name, b.Interface(), a.Interface())
		}
	}
	if out.LastReconcile.OK() || !ReconcileStatus(reconcile.Status{At: at}).OK() || (ReconcileStatus{}).OK() {
		t.Fatal("ReconcileStatus.OK differs from the reconciliation layer's")
	}
}
