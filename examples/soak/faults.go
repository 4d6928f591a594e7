package main

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// fault is one scheduled fault.
type fault struct {
	at   time.Duration
	kind string // kill, stop, setback, copy, restore
	node int
}

// schedule spreads the faults over the load: kills and stops at even
// intervals over random nodes, the clock set back on node-1 at 45 %, the
// copy of node-4 at 20 % and its restore at 60 %.
func schedule(o options, rng *mrand.Rand) []fault {
	var fs []fault
	d := o.duration
	for i := 0; i < o.kills; i++ {
		fs = append(fs, fault{at: d * time.Duration(2*i+1) / time.Duration(2*o.kills+2), kind: "kill", node: rng.IntN(5)})
	}
	for i := 0; i < o.stops; i++ {
		fs = append(fs, fault{at: d * time.Duration(3*i+2) / time.Duration(3*o.stops+2), kind: "stop", node: rng.IntN(5)})
	}
	fs = append(fs, fault{at: d * 45 / 100, kind: "setback", node: 1},
		fault{at: d * 20 / 100, kind: "copy", node: 4}, fault{at: d * 60 / 100, kind: "restore", node: 4})
	sort.SliceStable(fs, func(i, j int) bool { return fs[i].at < fs[j].at })
	return fs
}

func runFaultsScenario(o options) error {
	ctx := context.Background()
	names := []string{"node-0", "node-1", "node-2", "node-3", "node-4"}
	if err := prepare(ctx, o.dir, names, ""); err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	fmt.Printf("faults soak: 5 node processes over mutual TLS, %v of load (%.0f writes/s and %.0f messages/s per node on %d shared keys), %d SIGKILLs, %d SIGSTOPs (%v), one restart with the clock %v back, one restore from a copy; data in %s\n",
		o.duration, o.wps, o.mps, o.keys, o.kills, o.stops, o.stopFor, o.setback, o.dir)
	procs := make([]*proc, len(names))
	for i, n := range names {
		procs[i] = &proc{name: n, kind: "node", o: o, extra: []string{"-messaging"}}
		if err := procs[i].start(); err != nil {
			return err
		}
	}
	defer func() {
		for _, p := range procs {
			p.stop(20 * time.Second)
		}
	}()
	if err := waitUp(procs, 2*time.Minute); err != nil {
		return err
	}
	began := time.Now()
	rng := mrand.New(mrand.NewPCG(uint64(began.UnixNano()), 31))
	faults := schedule(o, rng)
	hist := &history{}
	hist.sample(procs, 0)
	nextSample := o.window / 4
	if nextSample < 2*time.Second {
		nextSample = 2 * time.Second
	}
	sampleEvery := nextSample
	copyDir := filepath.Join(o.dir, "copy-node-4")
	for len(faults) > 0 || time.Since(began) < o.duration {
		el := time.Since(began)
		if el >= nextSample {
			hist.sample(procs, el)
			nextSample += sampleEvery
		}
		for _, p := range procs {
			if err, gone := p.exited(); gone && !p.stoppedByUs() {
				return fmt.Errorf("%s exited unexpectedly: %v (stderr in %s)", p.name, err, filepath.Join(o.dir, p.name+".stderr"))
			}
		}
		if len(faults) == 0 || faults[0].at > el {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		f := faults[0]
		faults = faults[1:]
		p := procs[f.node]
		switch f.kind {
		case "kill":
			fmt.Printf("%6.1fs  SIGKILL %s, restart in 1 s\n", el.Seconds(), p.name)
			p.markStopped(true)
			p.kill()
			time.Sleep(time.Second)
			p.markStopped(false)
			if err := p.start(); err != nil {
				return err
			}
		case "stop":
			fmt.Printf("%6.1fs  SIGSTOP %s for %v\n", el.Seconds(), p.name, o.stopFor)
			p.signal(syscall.SIGSTOP)
			go func() {
				time.Sleep(o.stopFor)
				p.signal(syscall.SIGCONT)
			}()
		case "setback":
			fmt.Printf("%6.1fs  SIGKILL %s, restart with its wall clock %v back\n", el.Seconds(), p.name, o.setback)
			p.markStopped(true)
			p.kill()
			p.extra = append(p.extra, "-offset", (-o.setback).String())
			p.markStopped(false)
			if err := p.start(); err != nil {
				return err
			}
		case "copy", "restore":
			if err := copyOrRestore(f.kind, p, procs, copyDir, el); err != nil {
				return err
			}
		}
	}
	fmt.Printf("%6.1fs  load stops; waiting for the nodes to converge\n", time.Since(began).Seconds())
	for _, p := range procs {
		p.send("write off")
		p.send("send off")
	}
	settled, err := converged(procs, o.settle)
	hist.sample(procs, time.Since(began))
	if err != nil {
		hist.print()
		return err
	}
	fmt.Printf("converged %v after the load stopped\n", settled.Round(time.Millisecond))
	return faultsReport(o, procs, hist, began)
}

// copyOrRestore: "copy" takes a copy of the node's directory while it is
// down; "restore" puts the copy back and restarts it with Restored. The
// delivery plane is kept quiet around the node between the two (no one
// sends to it, it sends nothing): a restored device has forgotten what
// it received after the copy, so a copy re-sent to it would be new to
// it, which is what a restore means, not a fault of the runtime. Its
// table writes go on; before the restore it stops writing until every
// peer holds its events (a write no peer holds is lost with the
// restore).
func copyOrRestore(kind string, p *proc, procs []*proc, copyDir string, el time.Duration) error {
	if kind == "copy" {
		fmt.Printf("%6.1fs  %s: messages to and from it stop; when none is pending, SIGKILL, copy its directory, restart\n", el.Seconds(), p.name)
		for _, q := range procs {
			if q != p {
				q.send("exclude " + p.name)
				q.extra = append(q.extra, "-exclude", p.name)
			}
		}
		p.send("send off")
		p.extra = append(p.extra, "-nosend")
		time.Sleep(1500 * time.Millisecond) // status lines from before the commands
		if err := waitFor(2*time.Minute, func() bool { return nothingPendingWith(p, procs) }); err != nil {
			printStatus(procs)
			return fmt.Errorf("before the copy of %s: %w", p.name, err)
		}
		p.markStopped(true)
		p.kill()
		if out, err := exec.Command("cp", "-a", filepath.Join(p.o.dir, p.name), copyDir).CombinedOutput(); err != nil {
			return fmt.Errorf("copy: %v: %s", err, out)
		}
		p.markStopped(false)
		return p.start()
	}
	fmt.Printf("%6.1fs  %s: writes pause everywhere; when every peer holds its log, SIGKILL, restore the copy, restart with Restored, writes resume\n", el.Seconds(), p.name)
	for _, q := range procs {
		q.send("write off")
	}
	time.Sleep(1500 * time.Millisecond) // status lines from before the commands
	if err := waitFor(2*time.Minute, func() bool {
		st, ok := p.status()
		return ok && !st.Loading && st.Backlog == 0
	}); err != nil {
		printStatus(procs)
		return fmt.Errorf("before the restore of %s: %w", p.name, err)
	}
	p.markStopped(true)
	p.kill()
	dir := filepath.Join(p.o.dir, p.name)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if out, err := exec.Command("cp", "-a", copyDir, dir).CombinedOutput(); err != nil {
		return fmt.Errorf("restore: %v: %s", err, out)
	}
	p.extra = append(filterFlag(p.extra, "-nosend", false), "-restored")
	p.markStopped(false)
	if err := p.start(); err != nil {
		return err
	}
	// Later restarts are of the node's own directory, not a restore.
	p.extra = filterFlag(p.extra, "-restored", false)
	for _, q := range procs {
		q.send("write on")
		if q != p {
			q.send("exclude")
			q.extra = filterFlag(q.extra, "-exclude", true)
		}
	}
	p.send("send on")
	return nil
}

// nothingPendingWith reports that p has no message pending either way
// and no other node has one pending to p (the others were told to
// exclude p first).
func nothingPendingWith(p *proc, procs []*proc) bool {
	st, ok := p.status()
	if !ok || st.PendingSent != 0 || st.PendingRecv != 0 {
		return false
	}
	for _, q := range procs {
		if q == p {
			continue
		}
		qs, ok := q.status()
		if !ok || qs.PendingExcluded != 0 {
			return false
		}
	}
	return true
}

func filterFlag(args []string, flag string, withValue bool) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == flag {
			if withValue {
				i++
			}
			continue
		}
		out = append(out, args[i])
	}
	return out
}

func waitFor(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("condition not met within %v", timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

func waitUp(procs []*proc, timeout time.Duration) error {
	return waitFor(timeout, func() bool {
		for _, p := range procs {
			if _, ok := p.status(); !ok {
				return false
			}
		}
		return true
	})
}

func (p *proc) markStopped(b bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killing = b
}

func (p *proc) stoppedByUs() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.killing
}

// history keeps samples of every node's status over time.
type history struct {
	at   []time.Duration
	rows [][]status
}

func (h *history) sample(procs []*proc, at time.Duration) {
	var row []status
	for _, p := range procs {
		st, ok := p.status()
		if !ok {
			st = status{Node: p.name, Err: "down"}
		}
		row = append(row, st)
	}
	h.at = append(h.at, at)
	h.rows = append(h.rows, row)
}

func (h *history) print() {
	fmt.Println("RSS MiB / database MiB / pending sent+received over time:")
	if len(h.rows) == 0 {
		return
	}
	fmt.Printf("  %8s", "t")
	for _, st := range h.rows[0] {
		fmt.Printf("  %-22s", st.Node)
	}
	fmt.Println()
	for i, row := range h.rows {
		fmt.Printf("  %7.0fs", h.at[i].Seconds())
		for _, st := range row {
			if st.Err == "down" {
				fmt.Printf("  %-22s", "(down/stopped)")
				continue
			}
			fmt.Printf("  %-22s", fmt.Sprintf("%.0f/%.1f/%d+%d", mib(st.RSS), mib(st.DB), st.PendingSent, st.PendingRecv))
		}
		fmt.Println()
	}
}

// faultsReport collects the final reports and the children's logs and
// prints the checks; it fails on a correctness check.
func faultsReport(o options, procs []*proc, hist *history, began time.Time) error {
	var finals []status
	for _, p := range procs {
		f, err := p.finalReport(5 * time.Minute)
		if err != nil {
			return err
		}
		finals = append(finals, f)
	}
	hist.print()
	var problems []string
	fmt.Println("final state per node:")
	for _, f := range finals {
		fmt.Printf("  %-7s events %d, event set %s, rows %d digest %s; acknowledged writes checked %d, missing %d %s; messages to it %d, not finalized %d; pending sent %d received %d; writes failed since its last start %d\n",
			f.Node, f.EventCount, short(f.EventSet), f.Rows, short(f.Digest), f.AckedChecked, f.AckedMissing, f.MissingExamples, f.MsgsChecked, f.MsgsUnfinalized, f.PendingSent, f.PendingRecv, f.WriteFails)
		if f.Err != "" {
			problems = append(problems, f.Node+": "+f.Err)
		}
		if f.AckedMissing != 0 {
			problems = append(problems, fmt.Sprintf("%s misses %d acknowledged writes", f.Node, f.AckedMissing))
		}
		if f.MsgsUnfinalized != 0 {
			problems = append(problems, fmt.Sprintf("%s did not finalize %d messages sent to it", f.Node, f.MsgsUnfinalized))
		}
		if f.EventSet != finals[0].EventSet || f.Digest != finals[0].Digest {
			problems = append(problems, fmt.Sprintf("%s's rows or event set differ from %s's", f.Node, finals[0].Node))
		}
		if f.PendingSent != 0 || f.PendingRecv != 0 {
			problems = append(problems, fmt.Sprintf("%s still has messages pending", f.Node))
		}
	}
	acked := 0
	for _, f := range finals[:1] {
		acked = f.AckedChecked
	}
	// The applications' logs: every hand-off, commit and discard.
	type key struct{ to, from, id string }
	finalized := map[key]int{} // commits and discards that answered COMMITTED/DISCARDED
	finalAt := map[key]bool{}
	afterFinal, handoffs, copies, already := 0, 0, 0, 0
	type sample struct {
		at  time.Duration
		lat float64
	}
	var lats []sample
	firstSeen := map[key]bool{}
	for _, p := range procs {
		forLines(filepath.Join(o.dir, p.name+".recv"), func(f []string) {
			if len(f) < 4 {
				return
			}
			k := key{p.name, f[2], f[3]}
			ms, _ := strconv.ParseInt(f[1], 10, 64)
			switch f[0] {
			case "D":
				handoffs++
				if finalAt[k] {
					afterFinal++
				}
				if firstSeen[k] {
					copies++
					return
				}
				firstSeen[k] = true
				if len(f) >= 5 {
					l, _ := strconv.ParseFloat(f[4], 64)
					lats = append(lats, sample{time.UnixMilli(ms).Sub(began), l})
				}
			case "F":
				if len(f) < 5 {
					return
				}
				if f[4] == "committed" || f[4] == "discarded" {
					finalized[k]++
					finalAt[k] = true
				} else {
					already++
				}
			}
		})
	}
	sent := 0
	for _, p := range procs {
		forLines(filepath.Join(o.dir, p.name+".sent"), func([]string) { sent++ })
	}
	twice := 0
	for _, c := range finalized {
		if c > 1 {
			twice++
		}
	}
	fmt.Printf("messages: %d sent, %d finalized by their receiver's application (logged), %d hand-offs (%d copies of a message handed before), %d commits answered ALREADY_*\n",
		sent, len(finalized), handoffs, copies, already)
	fmt.Printf("CHECK acknowledged writes missing: %d of %d\n", sumMissing(finals), acked)
	fmt.Printf("CHECK identical rows and event sets on all nodes: %v\n", sameAll(finals))
	fmt.Printf("CHECK messages finalized more than once: %d; not finalized: %d\n", twice, sumUnfinalized(finals))
	fmt.Printf("CHECK deliveries after finalization: %d\n", afterFinal)
	if twice != 0 {
		problems = append(problems, fmt.Sprintf("%d messages finalized more than once", twice))
	}
	if afterFinal != 0 {
		problems = append(problems, fmt.Sprintf("%d hand-offs after the message was finalized", afterFinal))
	}
	// send → handler latency per window.
	windows := map[int][]float64{}
	last := 0
	for _, s := range lats {
		w := int(s.at / o.window)
		windows[w] = append(windows[w], s.lat)
		last = max(last, w)
	}
	fmt.Printf("send → handler latency per %v window (first hand-off of each message; ms):\n", o.window)
	first := 0.0
	worst := 0.0
	for w := 0; w <= last; w++ {
		v := windows[w]
		if len(v) == 0 {
			continue
		}
		p99 := pct(v, 0.99)
		if first == 0 {
			first = max(p99, 1)
		}
		worst = max(worst, p99/first)
		fmt.Printf("  %3d  n=%-6d p50 %8.1f  p99 %9.1f  max %9.1f  (p99 %.1f× the first window's)\n", w, len(v), pct(v, 0.5), p99, pct(v, 1), p99/first)
	}
	fmt.Printf("CHECK worst window p99 / first window p99: %.1f× (target ≤ 10×)\n", worst)
	fmt.Print("pending messages per node, peak (sent/received): ")
	var parts []string
	for _, p := range procs {
		p.mu.Lock()
		parts = append(parts, fmt.Sprintf("%s %d/%d", p.name, p.peak.PendingSent, p.peak.PendingRecv))
		p.mu.Unlock()
	}
	fmt.Println(strings.Join(parts, ", "))
	if len(problems) > 0 {
		return fmt.Errorf("faults soak failed:\n  %s", strings.Join(problems, "\n  "))
	}
	fmt.Println("faults soak: all correctness checks passed")
	return nil
}

func sumMissing(fs []status) int {
	n := 0
	for _, f := range fs {
		n += f.AckedMissing
	}
	return n
}

func sumUnfinalized(fs []status) int {
	n := 0
	for _, f := range fs {
		n += f.MsgsUnfinalized
	}
	return n
}

func sameAll(fs []status) bool {
	for _, f := range fs {
		if f.EventSet != fs[0].EventSet || f.Digest != fs[0].Digest {
			return false
		}
	}
	return true
}
