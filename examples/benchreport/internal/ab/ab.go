// Package ab is the benchmark report's measurement harness: arms (A, B,
// …) run interleaved in one process, repeated, each trial in a rotated
// order, and every figure and ratio is printed as min/median/max over the
// trials. On a shared, noisy machine two measurements taken one after the
// other drift apart by more than the effect they compare; interleaving
// makes both arms of a trial see the same load, and a ratio is taken per
// trial (paired) before it is summarized.
//
// One core means GOMAXPROCS=1 in a child process (Child), not
// runtime.GOMAXPROCS(1) in a process whose garbage collector and
// scheduler were sized for more.
package ab

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Arm is one side of a comparison. Run performs one timed trial and
// returns its figure (a rate: larger is better, or a cost, as the caller
// labels it). trial counts from 0.
type Arm struct {
	Name string
	Run  func(trial int) (float64, error)
}

// Order is the order the arms of trial t run in: a rotation by t, so over
// len(arms) trials every arm runs first (after a warm store, before a GC
// debt…) equally often.
func Order(arms, t int) []int {
	out := make([]int, arms)
	for i := range out {
		out[i] = (i + t) % arms
	}
	return out
}

// Samples holds the figures of every arm, per trial, in trial order.
type Samples struct {
	Names  []string
	Values [][]float64 // [arm][trial]
	// Warm holds the figures of the discarded warm-up rounds (RunWarm),
	// [arm][round]: printed, in no summary or ratio.
	Warm [][]float64
}

// Run performs trials rounds of every arm, interleaved in Order. It stops
// at the first error.
func Run(trials int, arms ...Arm) (*Samples, error) { return RunWarm(0, trials, arms...) }

// RunWarm is Run after warmup discarded rounds of every arm, interleaved
// the same way. A process that has just started pays costs once that no
// later trial pays (its heap growing into the collector's goal, memory the
// runtime returned to the system while another arm ran, files it never
// mapped): the first round measures those, not the arms. Arm.Run sees
// the rounds numbered from 0, warm-up rounds first (so trial t of the
// samples is the call with warmup+t); the warm-up figures are kept in
// Samples.Warm.
func RunWarm(warmup, trials int, arms ...Arm) (*Samples, error) {
	if trials < 1 {
		return nil, errors.New("ab: at least one trial")
	}
	if warmup < 0 {
		return nil, errors.New("ab: a negative warm-up")
	}
	if len(arms) == 0 {
		return nil, errors.New("ab: no arms")
	}
	s := &Samples{Names: make([]string, len(arms)), Values: make([][]float64, len(arms)), Warm: make([][]float64, len(arms))}
	for i, a := range arms {
		if slices.Contains(s.Names[:i], a.Name) {
			return nil, fmt.Errorf("ab: arm %q given twice", a.Name)
		}
		s.Names[i] = a.Name
		s.Values[i] = make([]float64, 0, trials)
	}
	for r := 0; r < warmup+trials; r++ {
		for _, i := range Order(len(arms), r) {
			v, err := arms[i].Run(r)
			if r < warmup {
				if err != nil {
					return nil, fmt.Errorf("ab: %s, warm-up round %d: %w", arms[i].Name, r, err)
				}
				s.Warm[i] = append(s.Warm[i], v)
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("ab: %s, trial %d: %w", arms[i].Name, r-warmup, err)
			}
			s.Values[i] = append(s.Values[i], v)
		}
	}
	return s, nil
}

// WarmOf returns the warm-up figures of the named arm (nil if none).
func (s *Samples) WarmOf(name string) []float64 {
	i := slices.Index(s.Names, name)
	if i < 0 || i >= len(s.Warm) {
		return nil
	}
	return s.Warm[i]
}

// Of returns the figures of the named arm (nil if there is none).
func (s *Samples) Of(name string) []float64 {
	i := slices.Index(s.Names, name)
	if i < 0 {
		return nil
	}
	return s.Values[i]
}

// Stats summarizes the named arm.
func (s *Samples) Stats(name string) Stats { return Summarize(s.Of(name)) }

// Ratio summarizes num/den taken per trial: the two arms of one trial ran
// back to back under the same load, so their quotient is the figure that
// holds still.
func (s *Samples) Ratio(num, den string) Stats { return Paired(s.Of(num), s.Of(den)) }

// Paired summarizes a[i]/b[i] over the trials both have.
func Paired(a, b []float64) Stats {
	n := min(len(a), len(b))
	r := make([]float64, n)
	for i := range r {
		r[i] = a[i] / b[i]
	}
	return Summarize(r)
}

// Stats is a summary of the trials of one figure.
type Stats struct {
	Min, Median, Max float64
	N                int
}

// Summarize returns min, median (the mean of the middle two for an even
// count) and max of xs; the zero Stats for none.
func Summarize(xs []float64) Stats {
	if len(xs) == 0 {
		return Stats{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Stats{Min: s[0], Median: med, Max: s[n-1], N: n}
}

// Format prints the summary as "median (min–max, n trials)" with verb
// (for example "%.0f" or "%.2f") for each number.
func (s Stats) Format(verb string) string {
	if s.N == 0 {
		return "n/a"
	}
	return fmt.Sprintf(verb+" (min "+verb+" max "+verb+", n=%d)", s.Median, s.Min, s.Max, s.N)
}

// String is Format("%.2f").
func (s Stats) String() string { return s.Format("%.2f") }

// Verdict is "ok" when the median meets a target (>= target when atLeast,
// <= otherwise) and "MISSED" when it does not: the report states the
// target beside the figure, it never hides one.
func (s Stats) Verdict(target float64, atLeast bool) string {
	ok := s.Median >= target
	if !atLeast {
		ok = s.Median <= target
	}
	op := ">="
	if !atLeast {
		op = "<="
	}
	if ok {
		return fmt.Sprintf("target %s %.2f: ok", op, target)
	}
	return fmt.Sprintf("target %s %.2f: MISSED", op, target)
}

// Table renders named summaries as aligned lines (for the report).
func Table(rows [][2]string) string {
	w := 0
	for _, r := range rows {
		w = max(w, len(r[0]))
	}
	var b strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&b, "  %-*s  %s\n", w, r[0], r[1])
	}
	return b.String()
}
