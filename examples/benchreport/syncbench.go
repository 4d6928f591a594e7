package main

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/veraison/go-cose"

	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/examples/benchreport/internal/ab"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
)

type syncParams struct {
	Events, Writers, Batch, Sites, Trials, Preload int
	// Pushes is the number of pushes per trial and forgery arm (0:
	// pushesPerTrial).
	Pushes  int
	Profile string
	// StoreCache, when set, is a directory keeping preloaded stores by
	// size: the history is built once and copied for each run (building a
	// million events takes longer than measuring them).
	StoreCache string
	// Arms, when set, runs only these one-core arms (and the two-core
	// section only if it lists "scale"): a quicker run for profiling and
	// for alternating two builds. The report's figures need every arm.
	Arms []string
	// Trace prints every one-core trial on standard error.
	Trace bool
}

// pushSize and pushesPerTrial (the default of syncParams.Pushes) shape the
// forgery comparison: a push of 1 000 events, twenty pushes per arm and
// trial. One push is too short to time on a noisy machine, and five were
// too few as well: a trial of 5 000 events holds at most one collection
// of the one-core child's heap, so the arm it fell in paid it whole
// (-trace-trials: every slow push-one trial had the cycle, push-valid
// none; medians 1.11–1.32 where bisection adds ~3 %).
const (
	pushSize       = 1000
	pushesPerTrial = 20
)

// oneCoreArgs is what the one-core child needs: the store, the event files
// of each trial, the workload shape.
type oneCoreArgs struct {
	Store, Work            string
	Trials, Writers, Batch int
	Sites, Pushes          int
	Profile                string
	Arms                   []string
	Trace                  bool
}

type samplesOut struct {
	Names  []string
	Values [][]float64
}

type applyOnceArgs struct {
	Store, File           string
	Sites, Writers, Batch int
}

func init() {
	ab.Register("sync-1core", runOneCore)
	ab.Register("apply-once", runApplyOnce)
}

// syncReport prints the apply path against the crypto ceilings, the
// forgery costs and the two-core scaling, every ratio interleaved.
func syncReport(p syncParams) error {
	ctx := context.Background()
	work, err := os.MkdirTemp("", "syncmesh-bench-sync-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	peers := benchPeers(p.Sites)
	store := filepath.Join(work, "store")
	fmt.Printf("== sync plane: ApplySignedBatch into bbolt (fsync on, durable before the outcome): %d events per trial, %d sites, %d rows, %d callers of ApplySignedBatch(%d); %d interleaved trials, figures median (min max)\n",
		p.Events, p.Sites, benchRows, p.Writers, p.Batch, p.Trials)
	start := time.Now()
	if err := cachedPreload(ctx, p.StoreCache, store, peers, p.Preload, p.Batch); err != nil {
		return err
	}
	fmt.Printf("  store history: %d events on the same %d rows as the measured ones (untimed, %.1f s)\n", p.Preload, benchRows, time.Since(start).Seconds())
	if p.Pushes <= 0 {
		p.Pushes = pushesPerTrial
	}
	epoch := 1
	write := func(name string, n int, forge func(i int) bool) error {
		raws, err := makeEventsAt(peers, n, epoch)
		epoch++
		if err != nil {
			return err
		}
		for i := range raws {
			if forge != nil && forge(i) {
				raws[i] = forged(raws[i])
			}
		}
		return writeEvents(eventFile(work, name), raws)
	}
	// The one-core child's first rounds are a discarded warm-up
	// (oneCoreWarmup): they need events of their own.
	for t := 0; t < p.Trials+oneCoreWarmup; t++ {
		steps := []struct {
			name  string
			n     int
			forge func(int) bool
		}{
			{fmt.Sprintf("one-%d", t), p.Events, nil},
			{fmt.Sprintf("push-valid-%d", t), pushSize * p.Pushes, nil},
			{fmt.Sprintf("push-one-%d", t), pushSize * p.Pushes, func(i int) bool { return i%pushSize == pushSize/2 }},
			{fmt.Sprintf("push-every-%d", t), pushSize * p.Pushes, func(i int) bool { return i%pushSize%sign.BatchSize == sign.BatchSize/3 }},
			{fmt.Sprintf("scale1-%d", t), p.Events, nil},
			{fmt.Sprintf("scale2-%d", t), p.Events, nil},
		}
		for _, s := range steps {
			if err := write(s.name, s.n, s.forge); err != nil {
				return err
			}
		}
	}
	var one samplesOut
	if err := ab.Child(ctx, ab.Proc{MaxProcs: 1}, "sync-1core", oneCoreArgs{Store: store, Work: work, Pushes: p.Pushes, Trials: p.Trials, Writers: p.Writers, Batch: p.Batch, Sites: p.Sites, Profile: p.Profile, Arms: p.Arms, Trace: p.Trace}, &one); err != nil {
		return err
	}
	s := &ab.Samples{Names: one.Names, Values: one.Values}
	fmt.Printf("one core (a GOMAXPROCS=1 child; every arm below interleaved in it):\n")
	fmt.Print(ab.Table([][2]string{
		{"bare crypto/ed25519.Verify (Sig_structure prebuilt)", s.Stats("ed25519").Format("%.0f") + " ev/s"},
		{"bare go-cose decode+verify", s.Stats("go-cose").Format("%.0f") + " ev/s"},
		{"sign.Verify (one at a time, ZIP-215)", s.Stats("single").Format("%.0f") + " ev/s"},
		{fmt.Sprintf("sign.VerifyBatch (batches of %d)", sign.BatchSize), s.Stats("batch").Format("%.0f") + " ev/s"},
		{"apply (ApplySignedBatch, durable)", s.Stats("apply").Format("%.0f") + " ev/s"},
		{"apply in the discarded warm-up rounds (in no ratio)", s.Stats(warmArm("apply")).Format("%.0f") + " ev/s, CPU " + s.Stats(cpuArm(warmArm("apply"))).Format("%.1f") + " µs per event"},
	}))
	applyBare := s.Ratio("apply", "ed25519")
	fmt.Print(ab.Table([][2]string{
		{"CPU per event (the child's user+system time), apply", s.Stats(cpuArm("apply")).Format("%.1f") + " µs"},
		{"CPU per event, bare ed25519", s.Stats(cpuArm("ed25519")).Format("%.1f") + " µs"},
		{"CPU(bare ed25519) / CPU(apply) per event (what the rate ratio is when neither waits)", s.Ratio(cpuArm("ed25519"), cpuArm("apply")).String()},
		{"apply / bare ed25519", applyBare.String() + "   " + applyBare.Verdict(1.6, true) + "; stretch " + applyBare.Verdict(2.0, true)},
		{"apply / bare go-cose", s.Ratio("apply", "go-cose").String()},
		{"batch verify / bare ed25519 (the crypto ceiling)", s.Ratio("batch", "ed25519").String()},
	}))
	// Pushes: rates are events/s, so cost(x)/cost(valid) = rate(valid)/rate(x).
	oneForged := s.Ratio("push-valid", "push-one")
	everyForged := s.Ratio("push-valid", "push-every")
	everyVerify := s.Ratio("vsingle-every", "vbatch-every")
	if len(s.Of("push-valid")) == 0 {
		// -sync-arms left the pushes out: no verdict on what did not run.
		return scaleReport(ctx, p, store, work)
	}
	fmt.Printf("pushes of %d (ApplySignedBatch, one core, %d pushes per trial and arm):\n", pushSize, p.Pushes)
	fmt.Print(ab.Table([][2]string{
		{"cost(one forged among 1000) / cost(all valid)", oneForged.String() + "   " + oneForged.Verdict(1.3, false)},
		{fmt.Sprintf("cost(a forgery in every sub-batch of %d) / cost(all valid)", sign.BatchSize), everyForged.String()},
		{"verification with a forgery in every sub-batch: batch+bisection / per-signature", everyVerify.String() + "   " + everyVerify.Verdict(1.0, false)},
	}))
	return scaleReport(ctx, p, store, work)
}

// scaleReport prints the two-core scaling (unless -sync-arms leaves it out).
func scaleReport(ctx context.Context, p syncParams, store, work string) error {
	if len(p.Arms) > 0 && !slices.Contains(p.Arms, "scale") {
		return nil
	}
	var bpe, busy1, busy2, cpu1, cpu2 []float64
	scale, err := ab.Run(p.Trials,
		ab.Arm{Name: "1", Run: func(t int) (float64, error) {
			return applyOnce(ctx, 1, store, eventFile(work, fmt.Sprintf("scale1-%d", t)), p, &bpe, &busy1, &cpu1)
		}},
		ab.Arm{Name: "2", Run: func(t int) (float64, error) {
			return applyOnce(ctx, 2, store, eventFile(work, fmt.Sprintf("scale2-%d", t)), p, &bpe, &busy2, &cpu2)
		}},
	)
	if err != nil {
		return err
	}
	sc := scale.Ratio("2", "1")
	fmt.Printf("two cores (children with GOMAXPROCS=1 and =2 alternating, each applying fresh events to the same store):\n")
	fmt.Print(ab.Table([][2]string{
		{"apply, GOMAXPROCS=1", scale.Stats("1").Format("%.0f") + " ev/s"},
		{"apply, GOMAXPROCS=2", scale.Stats("2").Format("%.0f") + " ev/s"},
		{"apply(2) / apply(1)", sc.String() + "   " + sc.Verdict(1.5, true)},
		{"single writer in a transaction, fraction of the run, GOMAXPROCS=1", ab.Summarize(busy1).String()},
		{"single writer in a transaction, fraction of the run, GOMAXPROCS=2", ab.Summarize(busy2).String()},
		{"CPU per event (the child's user+system time), GOMAXPROCS=1", ab.Summarize(cpu1).Format("%.1f") + " µs"},
		{"CPU per event, GOMAXPROCS=2", ab.Summarize(cpu2).Format("%.1f") + " µs"},
		{fmt.Sprintf("bytes written per applied event (store of %d+ events)", p.Preload), ab.Summarize(bpe).Format("%.0f") + " B"},
	}))
	return nil
}

// applyOnceOut is an apply-once child's report: its rate, the bytes it
// wrote to storage per applied event (/proc/self/io write_bytes), and the
// fraction of the run the single writer spent in transactions (the sum of
// syncmesh_storage_tx_seconds{plane="sync",kind="update"} over the wall
// time: near 1 with two cores, verification overlaps the writer and the
// writer is the bound; with one core the figure includes the time the
// verifier held the core in the middle of a transaction).
type applyOnceOut struct {
	Rate, BytesPerEvent, WriterBusy float64
	// CPUPerEvent is the child's user+system CPU time over the applying,
	// per event, in µs.
	CPUPerEvent float64
}

func applyOnce(ctx context.Context, procs int, store, file string, p syncParams, bpe, busy, cpu *[]float64) (float64, error) {
	var out applyOnceOut
	err := ab.Child(ctx, ab.Proc{MaxProcs: procs}, "apply-once", applyOnceArgs{Store: store, File: file, Sites: p.Sites, Writers: p.Writers, Batch: p.Batch}, &out)
	*bpe = append(*bpe, out.BytesPerEvent)
	*busy = append(*busy, out.WriterBusy)
	*cpu = append(*cpu, out.CPUPerEvent)
	return out.Rate, err
}

// writerSeconds is the time the node's sync writer spent in transactions
// so far (the sum of its update latency histogram).
func writerSeconds(n *runtime.Node) (float64, error) {
	mfs, err := n.Gatherer().Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != "syncmesh_storage_tx_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["plane"] == "sync" && labels["kind"] == "update" {
				return m.GetHistogram().GetSampleSum(), nil
			}
		}
	}
	return 0, nil
}

// forged returns raw with one bit of its signature's S flipped: the
// envelope still parses, the signature fails.
func forged(raw []byte) []byte {
	out := append([]byte(nil), raw...)
	out[len(out)-20] ^= 0x04
	return out
}

func runApplyOnce(arg json.RawMessage) (any, error) {
	var a applyOnceArgs
	if err := json.Unmarshal(arg, &a); err != nil {
		return nil, err
	}
	raws, err := readEvents(a.File)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	n, err := openApplyNode(ctx, a.Store, benchPeers(a.Sites))
	if err != nil {
		return nil, err
	}
	defer n.Close()
	goruntime.GC()
	io0, err := ab.ReadIO(0)
	if err != nil {
		return nil, err
	}
	w0, err := writerSeconds(n)
	if err != nil {
		return nil, err
	}
	c0 := cpuTime()
	rate, err := applyAll(ctx, n, raws, a.Writers, a.Batch)
	if err != nil {
		return nil, err
	}
	cpuPerEvent := (cpuTime() - c0) * 1e6 / float64(len(raws))
	w1, err := writerSeconds(n)
	if err != nil {
		return nil, err
	}
	io1, err := ab.ReadIO(0)
	if err != nil {
		return nil, err
	}
	wall := float64(len(raws)) / rate
	return applyOnceOut{Rate: rate, BytesPerEvent: float64(io1.WriteBytes-io0.WriteBytes) / float64(len(raws)), WriterBusy: (w1 - w0) / wall, CPUPerEvent: cpuPerEvent}, nil
}

// sigInput is one event's bare Ed25519 input: what crypto/ed25519.Verify
// checks, with the Sig_structure already built.
type sigInput struct {
	pub      ed25519.PublicKey
	msg, sig []byte
}

func bareInputs(raws [][]byte, pubs map[string]ed25519.PublicKey) ([]sigInput, error) {
	out := make([]sigInput, len(raws))
	for i, raw := range raws {
		var m cose.Sign1Message
		if err := m.UnmarshalCBOR(raw); err != nil {
			return nil, err
		}
		kid, _ := m.Headers.Protected[cose.HeaderLabelKeyID].([]byte)
		msg, err := cbor.Marshal([]any{"Signature1", m.Headers.RawProtected, mesh, m.Payload})
		if err != nil {
			return nil, err
		}
		out[i] = sigInput{pub: pubs[string(kid)], msg: msg, sig: m.Signature}
		if !ed25519.Verify(out[i].pub, msg, m.Signature) {
			return nil, fmt.Errorf("event %d: bare input does not verify", i)
		}
	}
	return out, nil
}

func runOneCore(arg json.RawMessage) (any, error) {
	var a oneCoreArgs
	if err := json.Unmarshal(arg, &a); err != nil {
		return nil, err
	}
	ctx := context.Background()
	peers := benchPeers(a.Sites)
	keys := make([]sign.Key, len(peers))
	pubs := map[string]ed25519.PublicKey{}
	verifiers := map[string]cose.Verifier{}
	for i, p := range peers {
		keys[i] = p.signer.Key()
		pubs[string(p.signer.Kid())] = p.signer.PublicKey()
		v, err := cose.NewVerifier(cose.AlgorithmEdDSA, p.signer.PublicKey())
		if err != nil {
			return nil, err
		}
		verifiers[string(p.signer.Kid())] = v
	}
	kr, err := sign.NewKeyring(keys...)
	if err != nil {
		return nil, err
	}
	n, err := openApplyNode(ctx, a.Store, peers)
	if err != nil {
		return nil, err
	}
	defer n.Close()
	load := func(name string, t int) ([][]byte, error) {
		return readEvents(eventFile(a.Work, fmt.Sprintf("%s-%d", name, t)))
	}
	type trialData struct {
		one, valid, oneF, every [][]byte
		bare                    []sigInput
	}
	data := make([]trialData, oneCoreWarmup+a.Trials)
	for t := range data {
		d := &data[t]
		for _, x := range []struct {
			dst  *[][]byte
			name string
		}{{&d.one, "one"}, {&d.valid, "push-valid"}, {&d.oneF, "push-one"}, {&d.every, "push-every"}} {
			if *x.dst, err = load(x.name, t); err != nil {
				return nil, err
			}
		}
		if d.bare, err = bareInputs(d.one, pubs); err != nil {
			return nil, err
		}
	}
	rate := func(n int, start time.Time) float64 { return float64(n) / time.Since(start).Seconds() }
	pushes := func(raws [][]byte, wantBad int) (float64, error) {
		start := time.Now()
		bad := 0
		for i := 0; i < len(raws); i += pushSize {
			outs, err := n.ApplySignedBatch(ctx, raws[i:min(i+pushSize, len(raws))])
			if err != nil {
				return 0, err
			}
			for j, o := range outs {
				switch {
				case o.Kind == messages.Dropped && o.Reason == messages.ReasonSignature:
					bad++
				case o.Kind != messages.Applied:
					return 0, fmt.Errorf("push event %d: %v", i+j, o)
				}
			}
		}
		if bad != wantBad {
			return 0, fmt.Errorf("pushes dropped %d forged events, want %d", bad, wantBad)
		}
		return rate(len(raws), start), nil
	}
	verifyBatches := func(raws [][]byte, wantBad int) (float64, error) {
		start := time.Now()
		bad := 0
		for i := 0; i < len(raws); i += sign.BatchSize {
			for _, r := range sign.VerifyBatch(kr, raws[i:min(i+sign.BatchSize, len(raws))], mesh) {
				if r.Err != nil {
					bad++
				}
			}
		}
		if bad != wantBad {
			return 0, fmt.Errorf("batch verification found %d bad signatures, want %d", bad, wantBad)
		}
		return rate(len(raws), start), nil
	}
	verifySingles := func(raws [][]byte, wantBad int) (float64, error) {
		start := time.Now()
		bad := 0
		for _, raw := range raws {
			if _, err := sign.Verify(kr, raw, mesh); err != nil {
				bad++
			}
		}
		if bad != wantBad {
			return 0, fmt.Errorf("single verification found %d bad signatures, want %d", bad, wantBad)
		}
		return rate(len(raws), start), nil
	}
	everyBad := a.Pushes * ((pushSize + sign.BatchSize - 1) / sign.BatchSize)
	arms := []ab.Arm{
		{Name: "ed25519", Run: func(t int) (float64, error) {
			start := time.Now()
			for _, in := range data[t].bare {
				if !ed25519.Verify(in.pub, in.msg, in.sig) {
					return 0, fmt.Errorf("bare verify failed")
				}
			}
			return rate(len(data[t].bare), start), nil
		}},
		{Name: "go-cose", Run: func(t int) (float64, error) {
			start := time.Now()
			for _, raw := range data[t].one {
				var m cose.Sign1Message
				if err := m.UnmarshalCBOR(raw); err != nil {
					return 0, err
				}
				kid, _ := m.Headers.Protected[cose.HeaderLabelKeyID].([]byte)
				if err := m.Verify(mesh, verifiers[string(kid)]); err != nil {
					return 0, err
				}
			}
			return rate(len(data[t].one), start), nil
		}},
		{Name: "single", Run: func(t int) (float64, error) { return verifySingles(data[t].one, 0) }},
		{Name: "batch", Run: func(t int) (float64, error) { return verifyBatches(data[t].one, 0) }},
		{Name: "apply", Run: func(t int) (float64, error) { return applyAll(ctx, n, data[t].one, a.Writers, a.Batch) }},
		{Name: "push-valid", Run: func(t int) (float64, error) { return pushes(data[t].valid, 0) }},
		{Name: "push-one", Run: func(t int) (float64, error) { return pushes(data[t].oneF, a.Pushes) }},
		{Name: "push-every", Run: func(t int) (float64, error) { return pushes(data[t].every, everyBad) }},
		{Name: "vbatch-every", Run: func(t int) (float64, error) { return verifyBatches(data[t].every, everyBad) }},
		{Name: "vsingle-every", Run: func(t int) (float64, error) { return verifySingles(data[t].every, everyBad) }},
	}
	if len(a.Arms) > 0 {
		arms = slices.DeleteFunc(arms, func(arm ab.Arm) bool { return !slices.Contains(a.Arms, arm.Name) })
	}
	cpu := withCPU(arms, a.Trace)
	stop, err := startProfile(a.Profile)
	if err != nil {
		return nil, err
	}
	s, err := ab.RunWarm(oneCoreWarmup, a.Trials, arms...)
	stop()
	if err != nil {
		return nil, err
	}
	out := samplesOut{Names: s.Names, Values: s.Values}
	for _, name := range s.Names {
		// The CPU series counts every round: the warm-up's go with it.
		c := cpu[name][min(oneCoreWarmup, len(cpu[name])):]
		warmCPU := cpu[name][:min(oneCoreWarmup, len(cpu[name]))]
		out.Names, out.Values = append(out.Names, cpuArm(name)), append(out.Values, c)
		if w := s.WarmOf(name); len(w) > 0 {
			out.Names, out.Values = append(out.Names, warmArm(name), cpuArm(warmArm(name))), append(out.Values, w, warmCPU)
		}
	}
	return out, nil
}

// oneCoreWarmup is the one-core child's discarded rounds (ab.RunWarm):
// every arm, interleaved as in a trial. Measured without them, the first
// apply trial took 0.5–1.1 minor page faults per event against ~0.01 from
// the third apply on, and 20–60 % more CPU per event (the child's heap,
// held at ~200–300 MB by every arm's inputs, growing into the collector's
// goal; memory the runtime returned while the first bare-verify arm ran;
// a store file copied in compact, whose first commits extend it instead
// of reusing freed pages). With one discarded round the second apply
// still faulted 0.5 per event in one run of three; with two, once the
// push arms held twenty pushes, a run's median fell to 1.59 with the
// warm-up rounds at 34–43 µs per event. An untimed apply alone before the
// rounds (40 000 events, two collections) did not remove it, nor did
// loading one round's inputs at a time (every round then faulted
// 0.3–0.9 per event: the smaller heap was returned and re-touched).
const oneCoreWarmup = 3

// warmArm names the discarded warm-up figures of an arm.
func warmArm(name string) string { return "warm:" + name }

// cpuArm names the CPU-per-event series of an arm.
func cpuArm(name string) string { return "cpu:" + name }

// withCPU wraps every arm to record the process's CPU time (user +
// system, every goroutine) per event of each trial, in µs: the figure
// that load on the machine moves least (a wall-clock rate also counts
// the time the process waited for a core). With trace, each trial is
// also printed on standard error with the collections and minor page
// faults it took.
func withCPU(arms []ab.Arm, trace bool) map[string][]float64 {
	cpu := map[string][]float64{}
	for i := range arms {
		name, run := arms[i].Name, arms[i].Run
		arms[i].Run = func(t int) (float64, error) {
			var gc0 uint64
			var f0 int64
			if trace {
				_, _, gc0, _ = gcSample()
				f0 = selfRusage().Minflt
			}
			c0, w0 := cpuTime(), time.Now()
			rate, err := run(t)
			if events := rate * time.Since(w0).Seconds(); err == nil && events > 0 {
				perEvent := (cpuTime() - c0) * 1e6 / events
				cpu[name] = append(cpu[name], perEvent)
				if trace {
					_, _, gc1, _ := gcSample()
					fmt.Fprintf(os.Stderr, "round %d %-14s %8.0f ev/s  CPU %5.1f µs/event  GC cycles %d  minor faults %.2f/event\n",
						t, name, rate, perEvent, gc1-gc0, float64(selfRusage().Minflt-f0)/events)
				}
			}
			return rate, err
		}
	}
	return cpu
}

// cachedPreload preloads dir with history events, through cache when it
// is set: a store of that size (sites and batch included in the name)
// found there is copied, else built there first and then copied.
func cachedPreload(ctx context.Context, cache, dir string, peers []*peer, history, batch int) error {
	if cache == "" {
		return preloadStore(ctx, dir, peers, history, batch)
	}
	src := filepath.Join(cache, fmt.Sprintf("store-%d-sites%d-batch%d", history, len(peers), batch))
	if _, err := os.Stat(filepath.Join(src, ".complete")); err != nil {
		_ = os.RemoveAll(src)
		if err := preloadStore(ctx, src, peers, history, batch); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(src, ".complete"), nil, 0o600); err != nil {
			return err
		}
	}
	return copyDir(src, dir)
}

// copyDir copies the regular files of src (one level: a node's
// directory) into dst, skipping the cache's completion marker.
func copyDir(src, dst string) error {
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || e.Name() == ".complete" {
			continue
		}
		if err := copyFile(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies src to dst and syncs it: left dirty in the page cache,
// the copy would be written back by the measured run's first fsync.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
