package hosting_test

import (
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/runtime/hosting/internal/etcdtest"
	"github.com/syncmesh/syncmesh/runtime/hosting/internal/membercerts"
)

// outageTTL is the members' lease TTL in the outage test.
const outageTTL = 3 * time.Second

// outageSlack is the allowance on top of TTL + outage for a unit's
// unavailability: reconnecting, re-activating units, the driver's retry
// pacing, on a shared 2-core machine. Generous on purpose: the check is
// that the unavailability does not grow with a rejoin schedule.
const outageSlack = 8 * time.Second

// TestClusterEtcdOutage runs two hosting members and a router-only
// driver (separate processes, mutual TLS) on a real etcd with load on
// every unit, and makes etcd unavailable three times:
//
//	short: killed and restarted at once (shorter than the lease TTL);
//	long:  killed for 8 s (longer than the TTL), restarted on the same
//	       data directory and ports: the leases survive;
//	pause: SIGSTOPped for 6 s: on SIGCONT etcd expires every lease.
//
// For each it prints every unit's unavailability (the longest gap between
// two acknowledged replies across the outage) against the outage length
// and checks it is at most TTL + outage + outageSlack. Through the two
// restarts no member fences itself: a member whose registration lapsed is
// suspended (units closed, nothing served past ValidUntil) and resumes
// under the same member id once etcd accepts its renewal. After the
// pause the leases are gone and members rejoin under new ids. Throughout,
// from the replies alone, no two activations of a unit overlap (no unit
// is served by two members at once), and at the end every acknowledged
// event and committed message is there.
//
// Wall time ≈ 55 s.
func TestClusterEtcdOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and 3 processes")
	}
	etcd := etcdtest.StartServer(t)
	exe := buildEtcdCluster(t)
	root, tmp, certs := t.TempDir(), t.TempDir(), t.TempDir()
	if err := membercerts.Write(certs, "member0", "member1", "driverA"); err != nil {
		t.Fatal(err)
	}
	common := []string{"-etcd", etcd.Endpoint, "-root", root, "-ttl", outageTTL.String(), "-certs", certs}
	var members []*child
	for i := 0; i < 2; i++ {
		name := fmt.Sprintf("member%d", i)
		c := startChild(t, exe, name, append([]string{"-mode", "member", "-name", name}, common...)...)
		ev := c.wait(t, "joined", 30*time.Second)
		t.Logf("%s joined as %s (id %s)", name, ev.Member, ev.ID)
		members = append(members, c)
	}
	recs := filepath.Join(tmp, "a.jsonl")
	drv := startChild(t, exe, "driverA", append([]string{"-mode", "driver", "-name", "driverA", "-tag", "a", "-members", "2", "-out", recs}, common...)...)
	ready := drv.wait(t, "ready", 90*time.Second)
	units := make([]string, 0, len(ready.Where))
	for u := range ready.Where {
		units = append(units, u)
	}
	sort.Strings(units)
	time.Sleep(2 * time.Second) // load running

	type outage struct {
		name       string
		start, end time.Time
	}
	var outages []outage
	// served waits until every unit answered after at.
	served := func(at time.Time) {
		deadline := time.Now().Add(45 * time.Second)
		for {
			last := map[string]int64{}
			for _, r := range readRecords(t, recs) {
				last[r.Unit] = max(last[r.Unit], r.ServedAt)
			}
			var missing []string
			for _, u := range units {
				if last[u] <= at.UnixNano() {
					missing = append(missing, u)
				}
			}
			if len(missing) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("units not served within 45 s after etcd returned: %v; driver stderr:\n%s", missing, drv.stderrText())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	restart := func(name string, down time.Duration) {
		start := time.Now()
		etcd.Kill()
		time.Sleep(down)
		etcd.Restart()
		end := time.Now()
		outages = append(outages, outage{name, start, end})
		t.Logf("%s: etcd killed, back after %v", name, end.Sub(start).Round(time.Millisecond))
		served(end)
		time.Sleep(time.Second)
	}
	restart("short", 0)
	restart("long", 8*time.Second)
	// Through both restarts every member kept its registration.
	for _, c := range append(members, drv) {
		c.mu.Lock()
		for _, ev := range c.all {
			if ev.Ev == "fenced" {
				t.Errorf("%s fenced itself through an etcd restart (its lease survived): %s", c.name, ev.Reason)
			}
		}
		c.mu.Unlock()
	}

	start := time.Now()
	etcd.Pause()
	time.Sleep(6 * time.Second)
	etcd.Resume()
	end := time.Now()
	if err := etcd.WaitHealthy(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	outages = append(outages, outage{"pause", start, end})
	t.Logf("pause: etcd SIGSTOPped for %v", end.Sub(start).Round(time.Millisecond))
	served(end)
	time.Sleep(time.Second)

	if _, err := io.WriteString(drv.stdin, "stop\n"); err != nil {
		t.Fatal(err)
	}
	rep := drv.wait(t, "report", 90*time.Second).Report
	if rep == nil {
		t.Fatal("driver: no report")
	}
	if len(rep.Lost) > 0 || len(rep.Errors) > 0 || rep.EventsAcked == 0 || rep.Committed == 0 {
		// Reported after the measurements below.
		t.Errorf("driver report: %+v", rep)
	} else {
		t.Logf("driver: %d acknowledged events and %d committed messages all there", rep.EventsAcked, rep.Committed)
	}
	for _, m := range members {
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range append(members, drv) {
		c.mu.Lock()
		var evs []string
		for _, ev := range c.all {
			if ev.Ev != "ready" && ev.Ev != "report" {
				evs = append(evs, fmt.Sprintf("%s %s", time.Unix(0, ev.At).Format("15:04:05.000"), ev.Ev))
			}
		}
		c.mu.Unlock()
		t.Logf("%s membership: %s", c.name, strings.Join(evs, ", "))
	}

	all := readRecords(t, recs)
	checkActivations(t, all)
	byUnit := map[string][]int64{}
	for _, r := range all {
		byUnit[r.Unit] = append(byUnit[r.Unit], r.ServedAt)
	}
	for _, o := range outages {
		length := o.end.Sub(o.start)
		var worst time.Duration
		var worstUnit string
		var gaps []string
		for _, u := range units {
			ts := byUnit[u]
			sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
			var g time.Duration
			for i := 1; i < len(ts); i++ {
				if ts[i] >= o.start.UnixNano() && ts[i-1] <= o.end.UnixNano() {
					g = max(g, time.Duration(ts[i]-ts[i-1]))
				}
			}
			gaps = append(gaps, fmt.Sprintf("%s %v", u, g.Round(10*time.Millisecond)))
			if g > worst {
				worst, worstUnit = g, u
			}
		}
		t.Logf("%s outage %v (TTL %v): unavailability per unit: %s", o.name, length.Round(time.Millisecond), outageTTL, strings.Join(gaps, ", "))
		fmt.Printf("etcd outage %-5s %6v: worst unit unavailability %6v (%s); bound TTL+outage+slack %v\n",
			o.name, length.Round(time.Millisecond), worst.Round(time.Millisecond), worstUnit, (outageTTL + length + outageSlack).Round(time.Millisecond))
		if worst > outageTTL+length+outageSlack {
			t.Errorf("%s outage of %v: %s unavailable for %v, want ≤ TTL %v + outage + %v", o.name, length.Round(time.Millisecond), worstUnit, worst.Round(time.Millisecond), outageTTL, outageSlack)
		}
	}
}
