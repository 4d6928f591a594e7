package hosting

import (
	"context"
	"errors"
	"testing"
)

// The operation table serves exactly the group operations on groups and
// the device operations on devices, as the switch it replaced did: every
// other pairing and every unknown operation is ErrBadRequest, before the
// node is touched (the unit here has none). OpInfo and OpCreate are
// answered by every unit (OpCreate's work is done by admit before).
func TestDispatchTableRoutesByKind(t *testing.T) {
	h := &host{}
	for op := Op(0); op < 40; op++ {
		wantKind := ""
		switch {
		case op >= OpDefineTable && op <= OpChanges:
			wantKind = KindGroup
		case op >= OpSend && op <= OpPrune:
			wantKind = KindDevice
		}
		if got := handlers[op].kind; got != wantKind {
			t.Errorf("op %d: handler kind %q, want %q", op, got, wantKind)
		}
		for _, kind := range []string{KindGroup, KindDevice} {
			if op == OpInfo || op == OpCreate || kind == wantKind {
				continue
			}
			_, err := h.dispatch(context.Background(), &unit{key: unitKey{kind: kind, identity: "x"}}, &Request{Op: op})
			if !errors.Is(err, ErrBadRequest) {
				t.Errorf("op %d on a %s: %v, want ErrBadRequest", op, kind, err)
			}
		}
	}
	if rep, err := h.dispatch(context.Background(), &unit{key: unitKey{kind: KindGroup}}, &Request{Op: OpInfo}); err != nil || rep == nil {
		t.Errorf("OpInfo: %v %v", rep, err)
	}
}
