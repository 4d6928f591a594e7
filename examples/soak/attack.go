package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// runMeasured is one run of the hostile scenario: three honest nodes
// under write load and a fourth process, attacking or not.
type runMeasured struct {
	name               string
	writeP50, writeP99 float64 // ms, honest Upsert latency
	lagP50, lagP99     float64 // ms, another node's row seen after its write
	writes, lags       int
	finals             []status
	hostile            status
	converge           time.Duration
}

func runHostileScenario(o options) error {
	fmt.Printf("hostile soak: 3 honest node processes and 1 hostile process (valid certificate, trusted keys) over mutual TLS; %v per run, %.0f writes/s per honest node on %d shared keys; attacks in turn, %v each: %s\n",
		o.duration, o.wps, o.keys, o.phase, strings.Join(attacks, ", "))
	var runs []runMeasured
	for _, attack := range []bool{false, true} {
		r, err := hostileRun(o, attack)
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	c, a := runs[0], runs[1]
	fmt.Println("results (honest nodes; write latency: Upsert, ms; lag: another node's write seen, ms):")
	for _, r := range runs {
		fmt.Printf("  %-8s writes %6d  write p50 %7.1f p99 %8.1f   lag samples %6d  lag p50 %8.1f p99 %9.1f   converged %v after the load\n",
			r.name, r.writes, r.writeP50, r.writeP99, r.lags, r.lagP50, r.lagP99, r.converge.Round(time.Millisecond))
	}
	fmt.Printf("RATIO honest write latency p50 under attack / control: %.2f× (target ≤ 1.5×)\n", a.writeP50/max(c.writeP50, 0.001))
	fmt.Printf("RATIO lag p50 under attack / control: %.2f× (target ≤ 2×); p99: %.2f×\n", a.lagP50/max(c.lagP50, 0.001), a.lagP99/max(c.lagP99, 0.001))
	fmt.Printf("attacks run: %s\n", a.hostile.AttackLog)
	var problems []string
	for _, r := range runs {
		for _, f := range r.finals {
			fmt.Printf("  %-8s %-9s events %d, event set %s, rows %d digest %s; acknowledged writes checked %d, missing %d %s; notices %d (reported missed %d); peak RSS %.0f MiB\n",
				r.name, f.Node, f.EventCount, short(f.EventSet), f.Rows, short(f.Digest), f.AckedChecked, f.AckedMissing, f.MissingExamples, f.Notices, f.Missed, mib(f.RSS))
			if f.Err != "" {
				problems = append(problems, r.name+" "+f.Node+": "+f.Err)
			}
			if f.AckedMissing != 0 {
				problems = append(problems, fmt.Sprintf("%s: %s misses %d acknowledged writes", r.name, f.Node, f.AckedMissing))
			}
		}
		if !sameAll(r.finals) {
			problems = append(problems, r.name+": the honest nodes' rows or event sets differ")
		}
		fmt.Printf("CHECK %s: equal digests and event sets after quiescence: %v; acknowledged honest writes missing: %d\n", r.name, sameAll(r.finals), sumMissing(r.finals))
	}
	if len(problems) > 0 {
		return fmt.Errorf("hostile soak failed:\n  %s", strings.Join(problems, "\n  "))
	}
	fmt.Println("hostile soak: all correctness checks passed")
	return nil
}

func hostileRun(o options, attack bool) (runMeasured, error) {
	r := runMeasured{name: "control"}
	if attack {
		r.name = "attack"
	}
	o.dir = filepath.Join(o.dir, r.name)
	honest := []string{"honest-0", "honest-1", "honest-2"}
	if err := prepare(context.Background(), o.dir, append(append([]string(nil), honest...), "hostile"), "hostile"); err != nil {
		return r, fmt.Errorf("prepare: %w", err)
	}
	var procs []*proc
	for _, n := range honest {
		procs = append(procs, &proc{name: n, kind: "node", o: o, extra: []string{"-slow-notice", "1ms"}})
	}
	ho := &proc{name: "hostile", kind: "hostile", o: o}
	if attack {
		ho.extra = []string{"-attack"}
	}
	all := append(append([]*proc(nil), procs...), ho)
	for _, p := range all {
		if err := p.start(); err != nil {
			return r, err
		}
	}
	defer func() {
		for _, p := range all {
			p.stop(20 * time.Second)
		}
	}()
	if err := waitUp(all, 2*time.Minute); err != nil {
		return r, err
	}
	fmt.Printf("%s run: started\n", r.name)
	began := time.Now()
	lastAttack := ""
	for time.Since(began) < o.duration {
		for _, p := range all {
			if err, gone := p.exited(); gone {
				return r, fmt.Errorf("%s exited: %v (stderr in %s)", p.name, err, filepath.Join(o.dir, p.name+".stderr"))
			}
		}
		if st, ok := ho.status(); ok && st.Attack != lastAttack {
			lastAttack = st.Attack
			fmt.Printf("  %6.1fs  attack: %s\n", time.Since(began).Seconds(), st.Attack)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ended := time.Now()
	for _, p := range procs {
		p.send("write off")
	}
	var err error
	if r.hostile, err = ho.finalReport(time.Minute); err != nil {
		return r, err
	}
	if r.converge, err = converged(procs, o.settle); err != nil {
		return r, err
	}
	for _, p := range procs {
		f, err := p.finalReport(5 * time.Minute)
		if err != nil {
			return r, err
		}
		p.mu.Lock()
		f.RSS = p.peak.RSS
		p.mu.Unlock()
		r.finals = append(r.finals, f)
	}
	// Latency and lag over the load period (the first 2 s left out: the
	// nodes connecting).
	from := began.Add(2 * time.Second)
	var wl, lag []float64
	for _, n := range honest {
		forLines(filepath.Join(o.dir, n+".writes"), func(f []string) {
			if len(f) < 3 || !within(f[0], from, ended) {
				return
			}
			us, _ := strconv.ParseFloat(f[1], 64)
			wl = append(wl, us/1000)
		})
		forLines(filepath.Join(o.dir, n+".lag"), func(f []string) {
			if len(f) < 2 || !within(f[0], from, ended) {
				return
			}
			ms, _ := strconv.ParseFloat(f[1], 64)
			lag = append(lag, ms)
		})
	}
	r.writes, r.lags = len(wl), len(lag)
	r.writeP50, r.writeP99 = pct(wl, 0.5), pct(wl, 0.99)
	r.lagP50, r.lagP99 = pct(lag, 0.5), pct(lag, 0.99)
	return r, nil
}

func within(ms string, from, to time.Time) bool {
	v, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return false
	}
	t := time.UnixMilli(v)
	return !t.Before(from) && t.Before(to)
}
