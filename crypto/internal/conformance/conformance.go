// Package conformance counts the verdicts of public test vectors that the
// crypto packages' conformance tests run through the project's own code,
// and logs the one line per vector set that `make conformance` collects.
// Only tests import it.
package conformance

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// Tally counts one vector set's verdicts.
type Tally struct {
	// Set names the vector set in the report line.
	Set string
	// Run counts the vectors run, Met those that gave the verdict expected
	// of this project, Departures those whose expected verdict is not
	// upstream's (each stated beside its vector).
	Run, Met, Departures int
}

// Check records one vector: the verdict the project gave (got) against the
// one expected of it (want); departure says why want is not upstream's
// verdict ("" when it is).
func (c *Tally) Check(t testing.TB, id string, got, want bool, departure string) {
	t.Helper()
	c.Run++
	if departure != "" {
		c.Departures++
	}
	if got != want {
		t.Errorf("%s %s: verdict %v, expected %v %s", c.Set, id, Verdict(got), Verdict(want), departure)
		return
	}
	c.Met++
}

// Verdict names a verdict in messages: "accept" or "reject".
func Verdict(accept bool) string {
	if accept {
		return "accept"
	}
	return "reject"
}

// Report logs the set's line (make conformance greps "conformance:") and
// fails when no vector ran or fewer than the data holds.
func (c *Tally) Report(t testing.TB, wantRun int) {
	t.Helper()
	t.Logf("conformance: %-30s %4d vectors run, %4d expected verdicts met, %3d stated departures from upstream's verdict",
		c.Set, c.Run, c.Met, c.Departures)
	if c.Run == 0 || c.Run != wantRun {
		t.Errorf("%s: %d vectors run, the data holds %d", c.Set, c.Run, wantRun)
	}
}

// File reads testdata/conformance/name of the calling package.
func File(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "conformance", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Read decodes the JSON file testdata/conformance/name into v.
func Read(t testing.TB, name string, v any) {
	t.Helper()
	if err := json.Unmarshal(File(t, name), v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}
