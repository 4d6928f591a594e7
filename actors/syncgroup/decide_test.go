package syncgroup

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// kinds lists the notice types of a decision, in order.
func kinds(ns []messages.Notice) string {
	s := ""
	for _, n := range ns {
		s += fmt.Sprintf("%T ", n)
	}
	return s
}

// Decide's table (SSP/1 §12 step 4, §13.5, §13.6; HLC reuse, retired keys):
// one row per condition, for the apply path and the release of a held
// group, which share it.
func TestDecideTable(t *testing.T) {
	def := persistence.TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a"}}
	ev := func(h messages.HLC, key messages.Columns) *messages.Event {
		return &messages.Event{Site: messages.SiteID{1}, HLC: h, Schema: "app", Table: "t", Key: key, Payload: messages.Columns{"a": messages.MustValue(1)}}
	}
	good := messages.Columns{"id": messages.MustValue(1)}
	bad := messages.Columns{"nope": messages.MustValue(1)}
	id, other := messages.EventID{1}, messages.EventID{2}
	for _, c := range []struct {
		name    string
		in      Input
		kind    messages.OutcomeKind
		reason  messages.Reason
		below   bool
		action  Action
		notices string
	}{
		{"duplicate", Input{Known: true, Defined: true, Def: def}, messages.Duplicate, 0, false, Nothing, ""},
		{"duplicate still held", Input{Known: true, StillHeld: true}, messages.Held, 0, false, Nothing, ""},
		{"duplicate of a retired key is not surfaced again", Input{Known: true, Cutoff: 9, Kid: []byte{7}}, messages.Duplicate, 0, false, Nothing, ""},
		{"table missing", Input{}, messages.Held, 0, false, Hold, "messages.GroupHeld "},
		{"table missing, signer over its held quota: rejected, nothing retained", Input{OverHeldQuota: "1024 held events"}, messages.Rejected, messages.ReasonHeldQuota, false, Nothing, "messages.EventRejected "},
		{"table missing, reused stamp", Input{Stamped: []messages.EventID{other}}, messages.Held, 0, false, Hold, "messages.Equivocation messages.GroupHeld "},
		{"key does not resolve", Input{Defined: true, Def: def, Event: ev(5, bad)}, messages.Dropped, messages.ReasonUnknownKeyColumn, false, Nothing, "messages.EventDropped "},
		{"below the horizon", Input{Defined: true, Def: def, Horizon: 6}, messages.Applied, 0, true, Nothing, ""},
		{"applied", Input{Defined: true, Def: def}, messages.Applied, 0, false, Materialize, ""},
		{"applied, own id at the stamp is no equivocation", Input{Defined: true, Def: def, Stamped: []messages.EventID{id}}, messages.Applied, 0, false, Materialize, ""},
		{"applied, reused stamp", Input{Defined: true, Def: def, Stamped: []messages.EventID{id, other}}, messages.Applied, 0, false, Materialize, "messages.Equivocation "},
		{"below the horizon, reused stamp: not retained, not checked", Input{Defined: true, Def: def, Horizon: 6, Stamped: []messages.EventID{other}}, messages.Applied, 0, true, Nothing, ""},
		{"retired key, applied", Input{Defined: true, Def: def, Cutoff: 9, Kid: []byte{7}}, messages.Applied, 0, false, Materialize, "messages.RetiredKeyEvent "},
		{"retired key, dropped", Input{Defined: true, Def: def, Event: ev(5, bad), Cutoff: 9}, messages.Dropped, messages.ReasonUnknownKeyColumn, false, Nothing, "messages.EventDropped messages.RetiredKeyEvent "},
		{"released", Input{Released: true, Known: true, Defined: true, Def: def, Stamped: []messages.EventID{other}, Cutoff: 9}, messages.Applied, 0, false, Materialize, ""},
		{"released, key does not resolve", Input{Released: true, Defined: true, Def: def, Event: ev(5, bad)}, messages.Dropped, messages.ReasonUnknownKeyColumn, false, Nothing, "messages.EventDropped "},
		{"released below the horizon", Input{Released: true, Defined: true, Def: def, Horizon: 6}, messages.Applied, 0, true, Nothing, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := c.in
			in.ID = id
			if in.Event == nil {
				in.Event = ev(5, good)
			}
			before := fmt.Sprintf("%+v", in)
			d := Decide(in)
			if d.Outcome.Kind != c.kind || d.Outcome.Reason != c.reason || d.Outcome.BelowHorizon != c.below || d.Action != c.action {
				t.Fatalf("decision %+v action %v, want %v/%v below=%v action %v", d.Outcome, d.Action, c.kind, c.reason, c.below, c.action)
			}
			// Only a new event is appended: a released one is in the log.
			if want := c.action != Nothing && !in.Released; d.Append != want {
				t.Fatalf("append = %v, want %v", d.Append, want)
			}
			if got := kinds(d.Notices); got != c.notices {
				t.Fatalf("notices %q, want %q", got, c.notices)
			}
			if d.Outcome.ID != id || d.Outcome.Site != in.Event.Site || d.Outcome.HLC != in.Event.HLC {
				t.Fatalf("outcome does not name the event: %+v", d.Outcome)
			}
			if after := fmt.Sprintf("%+v", in); after != before {
				t.Fatal("Decide changed its input")
			}
			if again := Decide(in); !reflect.DeepEqual(again, d) {
				t.Fatalf("Decide is not a function of its input: %+v vs %+v", again, d)
			}
		})
	}
}

// The equivocation notice names the site and both events; the retired-key
// notice the key, its cutoff and the outcome.
func TestDecideNoticesNameTheEvidence(t *testing.T) {
	e := &messages.Event{Site: messages.SiteID{4}, HLC: 8, Schema: "app", Table: "t", Key: messages.Columns{"id": messages.MustValue(1)}}
	def := persistence.TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}}
	d := Decide(Input{ID: messages.EventID{9}, Event: e, Defined: true, Def: def, Stamped: []messages.EventID{{3}, {9}}, Kid: []byte{1, 2}, Cutoff: 10})
	want := []messages.Notice{
		messages.Equivocation{Site: e.Site, HLC: 8, Schema: "app", Table: "t", Retained: messages.EventID{3}, Arrived: messages.EventID{9}},
		messages.RetiredKeyEvent{Site: e.Site, Kid: []byte{1, 2}, Cutoff: 10, HLC: 8, Schema: "app", Table: "t", EventID: messages.EventID{9}, Outcome: messages.Applied},
	}
	if !reflect.DeepEqual(d.Notices, want) {
		t.Fatalf("notices\n got %+v\nwant %+v", d.Notices, want)
	}
}

// A held event, released once its table exists, is decided exactly as the
// same event arriving after the table was defined (SSP/1 §13.6: holding
// only delays it): same outcome, same action; only the log append and the
// notices surfaced when it was held (GroupHeld, equivocation, retired key)
// are not repeated.
func TestDecideReleasedAsIfArrivedAfterTheTable(t *testing.T) {
	def := persistence.TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"a"}}
	keys := []messages.Columns{{"id": messages.MustValue(1)}, {"nope": messages.MustValue(1)}, {"id": messages.MustValue(1), "x": messages.MustValue(2)}}
	for _, key := range keys {
		for _, del := range []bool{false, true} {
			for _, h := range []messages.HLC{0, 5, 6, 9} {
				e := &messages.Event{Site: messages.SiteID{1}, HLC: 6, Schema: "app", Table: "t", Key: key, Delete: del}
				late := Decide(Input{ID: messages.EventID{1}, Event: e, Defined: true, Def: def, Horizon: h})
				rel := Decide(Input{ID: messages.EventID{1}, Event: e, Released: true, Defined: true, Def: def, Horizon: h})
				if late.Outcome != rel.Outcome || late.Action != rel.Action {
					t.Fatalf("key %v delete=%v horizon %d: released %+v/%v, arrived late %+v/%v", key, del, h, rel.Outcome, rel.Action, late.Outcome, late.Action)
				}
				if rel.Append || (late.Action != Nothing) != late.Append {
					t.Fatalf("appends: released %v, late %v with action %v", rel.Append, late.Append, late.Action)
				}
			}
		}
	}
}
