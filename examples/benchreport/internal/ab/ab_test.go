package ab

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	Register("echo-procs", func(arg json.RawMessage) (any, error) {
		var in struct{ X int }
		if err := json.Unmarshal(arg, &in); err != nil {
			return nil, err
		}
		return map[string]int{"x": in.X * 2, "procs": runtime.GOMAXPROCS(0)}, nil
	})
	Register("fail", func(json.RawMessage) (any, error) { return nil, errors.New("boom") })
	Main() // a child runs its function and exits here
	os.Exit(m.Run())
}

func TestOrderRotatesSoEveryArmRunsFirstEquallyOften(t *testing.T) {
	first := map[int]int{}
	for tr := 0; tr < 6; tr++ {
		o := Order(3, tr)
		s := slices.Clone(o)
		slices.Sort(s)
		if !slices.Equal(s, []int{0, 1, 2}) {
			t.Fatalf("trial %d: order %v is not a permutation", tr, o)
		}
		first[o[0]]++
	}
	for arm := 0; arm < 3; arm++ {
		if first[arm] != 2 {
			t.Fatalf("arm %d first in %d of 6 trials, want 2: %v", arm, first[arm], first)
		}
	}
}

func TestRunInterleavesArmsWithinEachTrial(t *testing.T) {
	var log []string
	arm := func(name string, v float64) Arm {
		return Arm{Name: name, Run: func(tr int) (float64, error) {
			log = append(log, name+string(rune('0'+tr)))
			return v * float64(tr+1), nil
		}}
	}
	s, err := Run(3, arm("a", 1), arm("b", 10))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a0", "b0", "b1", "a1", "a2", "b2"}
	if !slices.Equal(log, want) {
		t.Fatalf("run order %v, want %v (every trial runs every arm before the next trial starts)", log, want)
	}
	if got := s.Of("a"); !slices.Equal(got, []float64{1, 2, 3}) {
		t.Fatalf("a = %v", got)
	}
	if got := s.Of("b"); !slices.Equal(got, []float64{10, 20, 30}) {
		t.Fatalf("b = %v", got)
	}
	if r := s.Ratio("b", "a"); r.Min != 10 || r.Median != 10 || r.Max != 10 || r.N != 3 {
		t.Fatalf("paired ratio b/a = %+v, want 10 in every trial", r)
	}
	if s.Of("c") != nil {
		t.Fatal("unknown arm has samples")
	}
}

func TestRunStopsAtTheFirstErrorAndRefusesBadInput(t *testing.T) {
	calls := 0
	boom := errors.New("boom")
	_, err := Run(5, Arm{Name: "x", Run: func(tr int) (float64, error) {
		calls++
		if tr == 1 {
			return 0, boom
		}
		return 1, nil
	}})
	if !errors.Is(err, boom) || calls != 2 {
		t.Fatalf("err %v after %d calls, want boom after 2", err, calls)
	}
	if _, err := Run(0, Arm{Name: "x"}); err == nil {
		t.Fatal("zero trials accepted")
	}
	if _, err := Run(1); err == nil {
		t.Fatal("no arms accepted")
	}
	one := func(int) (float64, error) { return 1, nil }
	if _, err := Run(1, Arm{Name: "x", Run: one}, Arm{Name: "x", Run: one}); err == nil {
		t.Fatal("duplicate arm names accepted")
	}
}

func TestSummarize(t *testing.T) {
	for _, c := range []struct {
		in               []float64
		min, median, max float64
	}{
		{[]float64{5}, 5, 5, 5},
		{[]float64{3, 1, 2}, 1, 2, 3},
		{[]float64{4, 1, 3, 2}, 1, 2.5, 4},
		{[]float64{9, 1, 1, 1, 100}, 1, 1, 100},
	} {
		in := slices.Clone(c.in)
		s := Summarize(in)
		if s.Min != c.min || s.Median != c.median || s.Max != c.max || s.N != len(c.in) {
			t.Fatalf("Summarize(%v) = %+v, want %v/%v/%v", c.in, s, c.min, c.median, c.max)
		}
		if !slices.Equal(in, c.in) {
			t.Fatal("Summarize reordered its input")
		}
	}
	if s := Summarize(nil); s.N != 0 || s.Format("%.1f") != "n/a" {
		t.Fatalf("empty summary %+v", s)
	}
	if got := (Stats{Min: 1, Median: 2, Max: 3, N: 3}).Format("%.1f"); got != "2.0 (min 1.0 max 3.0, n=3)" {
		t.Fatalf("Format = %q", got)
	}
}

func TestPairedTakesTheRatioPerTrialNotOfMedians(t *testing.T) {
	// Load doubles in trial 2 for both arms: per-trial ratios hold at 2,
	// the ratio of medians of independent runs would not.
	a := []float64{200, 100, 200}
	b := []float64{100, 50, 100}
	if r := Paired(a, b); r.Min != 2 || r.Max != 2 {
		t.Fatalf("paired %+v", r)
	}
	if r := Paired([]float64{1, 2, 3}, []float64{1}); r.N != 1 {
		t.Fatalf("paired over unequal lengths used %d trials, want 1", r.N)
	}
}

func TestVerdict(t *testing.T) {
	s := Stats{Min: 1, Median: 1.6, Max: 2, N: 5}
	if !strings.HasSuffix(s.Verdict(1.6, true), "ok") || !strings.HasSuffix(s.Verdict(1.7, true), "MISSED") {
		t.Fatal("at-least verdicts")
	}
	if !strings.HasSuffix(s.Verdict(1.6, false), "ok") || !strings.HasSuffix(s.Verdict(1.5, false), "MISSED") {
		t.Fatal("at-most verdicts")
	}
}

func TestParseIO(t *testing.T) {
	io, err := parseIO([]byte("rchar: 1\nwchar: 22\nsyscr: 3\nsyscw: 4\nread_bytes: 5\nwrite_bytes: 4096\ncancelled_write_bytes: 0\n"))
	if err != nil || io.WriteBytes != 4096 || io.WChar != 22 {
		t.Fatalf("parseIO = %+v, %v", io, err)
	}
	if _, err := parseIO([]byte("rchar: 1\n")); err == nil {
		t.Fatal("io without write_bytes accepted")
	}
	if _, err := ReadIO(0); err != nil {
		t.Fatalf("/proc/self/io: %v (the catch-up section reads it)", err)
	}
}

func TestChildRunsWithItsOwnGOMAXPROCS(t *testing.T) {
	var out struct{ X, Procs int }
	if err := Child(context.Background(), Proc{MaxProcs: 1}, "echo-procs", map[string]int{"X": 21}, &out); err != nil {
		t.Fatal(err)
	}
	if out.X != 42 || out.Procs != 1 {
		t.Fatalf("child answered %+v, want x=42 procs=1", out)
	}
	if err := Child(context.Background(), Proc{}, "fail", nil, &out); err == nil {
		t.Fatal("a failing child reported success")
	}
	if err := Child(context.Background(), Proc{}, "missing", nil, &out); err == nil {
		t.Fatal("an unregistered child reported success")
	}
}

func TestHeapPeakSeesAnAllocation(t *testing.T) {
	h := StartHeapPeak(time.Millisecond)
	big := make([]byte, 64<<20)
	for i := range big {
		big[i] = byte(i)
	}
	time.Sleep(20 * time.Millisecond)
	peak := h.Stop()
	runtime.KeepAlive(big)
	if peak < 64<<20 {
		t.Fatalf("peak %d B, below the 64 MiB held", peak)
	}
}

func TestRunWarmDiscardsItsFirstRoundsInTheSameOrder(t *testing.T) {
	var log []string
	arm := func(name string, v float64) Arm {
		return Arm{Name: name, Run: func(r int) (float64, error) {
			log = append(log, name+string(rune('0'+r)))
			return v * float64(r+1), nil
		}}
	}
	s, err := RunWarm(1, 2, arm("a", 1), arm("b", 10))
	if err != nil {
		t.Fatal(err)
	}
	// Round 0 is the warm-up, rounds 1 and 2 the trials, each rotated as Run rotates them.
	want := []string{"a0", "b0", "b1", "a1", "a2", "b2"}
	if !slices.Equal(log, want) {
		t.Fatalf("run order %v, want %v", log, want)
	}
	if got := s.Of("a"); !slices.Equal(got, []float64{2, 3}) {
		t.Fatalf("a = %v, want the two trials after the warm-up round", got)
	}
	if got := s.WarmOf("b"); !slices.Equal(got, []float64{10}) {
		t.Fatalf("warm-up of b = %v, want [10]", got)
	}
	if st := s.Stats("b"); st.N != 2 || st.Min != 20 {
		t.Fatalf("b's summary %+v counts the warm-up round", st)
	}
	if _, err := RunWarm(-1, 1, arm("a", 1)); err == nil {
		t.Fatal("negative warm-up accepted")
	}
	boom := errors.New("boom")
	_, err = RunWarm(1, 1, Arm{Name: "x", Run: func(int) (float64, error) { return 0, boom }})
	if !errors.Is(err, boom) {
		t.Fatalf("a failing warm-up round: %v, want boom", err)
	}
}
