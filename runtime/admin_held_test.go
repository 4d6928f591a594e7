package runtime

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/messages"
)

// TestAdminListsHeldGroupsAndRestoreState: events held for a table this
// node has not defined are listed at /admin/held with the missing table,
// their count and the age of the oldest; /admin/status counts the held
// groups and reports the restore check; the metric
// syncmesh_sync_held_groups counts them (one series, however many groups).
// On the base commit /admin/held answered 404 and neither the status nor
// the metrics said anything of held groups or of a restore.
func TestAdminListsHeldGroupsAndRestoreState(t *testing.T) {
	n := openTestNode(t, Config{Name: "r", SyncInterval: -1, MetricsAddr: "127.0.0.1:0"})
	p := newPeer(t, 1)
	n.trust(p)
	written := n.wall.MS() - 30_000 // written 30 s before now
	for i := range 3 {
		if out := n.apply(p.upsert(hlcAt(written, uint16(i+1)), i, map[string]any{"a": "waiting"})); out.Kind != messages.Held {
			t.Fatalf("missing table: %v", out)
		}
	}
	held := adminGet[[]HeldReport](t, n.Node, "/admin/held")
	if len(held) != 1 {
		t.Fatalf("held groups %+v, want one", held)
	}
	h := held[0]
	if h.MissingTable != "app.t" || h.Events != 3 || h.Site != p.signer.Site().String() || h.AgeSeconds < 29 || h.OldestHLC == "" {
		t.Fatalf("held report %+v: want app.t, 3 events, site %s, age >= 30 s", h, p.signer.Site())
	}
	st := adminGet[Status](t, n.Node, "/admin/status")
	if st.HeldGroups != 1 {
		t.Fatalf("status held_groups %d, want 1", st.HeldGroups)
	}
	if want := n.RestoreStatus(); st.Restore.Suspected != want.Suspected || st.Restore.Held != want.Held || st.Restore.LogRotated != want.LogRotated {
		t.Fatalf("status restore %+v, node %+v", st.Restore, want)
	}
	_, raw := adminDo(t, http.MethodGet, "http://"+n.MetricsAddr()+"/admin/status", "")
	if !strings.Contains(string(raw), `"restore":`) || !strings.Contains(string(raw), `"log_rotated":`) {
		t.Fatalf("/admin/status has no restore state: %s", raw)
	}
	_, metrics := adminDo(t, http.MethodGet, "http://"+n.MetricsAddr()+"/metrics", "")
	if !strings.Contains(string(metrics), "\nsyncmesh_sync_held_groups 1\n") {
		t.Fatalf("metrics: no syncmesh_sync_held_groups 1")
	}

	// Defining the table releases them: nothing held any more.
	n.define(defT)
	// The release is asynchronous: wait for it (generous deadline).
	for range 600 {
		if r, total, err := n.HeldReports(n.ctx); err == nil && total == 0 && len(r) == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("held groups still listed 30 s after DefineTable")
}
