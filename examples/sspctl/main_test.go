package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/syncmesh/syncmesh/crypto/sign"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/meshtls"
)

type result struct {
	out, err string
	code     int
}

// sspctl runs the tool in-process: runtime.Node.Close releases the bbolt
// file, so commands may open the same directory one after another.
func sspctl(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return sspctlWith(t, nil, stdin, args...)
}

// sspctlWith runs the tool with the node's wall clock set to wall (nil:
// time.Now) and a short lock timeout.
func sspctlWith(t *testing.T, wall func() time.Time, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code := runEnv(env{ctx: ctx, stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb, lockTimeout: 200 * time.Millisecond, wall: wall}, args)
	return result{out.String(), errb.String(), code}
}

// inProcess is sspctl through run itself (the real entry point).
func inProcess(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, args, strings.NewReader(stdin), &out, &errb)
	return result{out.String(), errb.String(), code}
}

func mustRun(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	r := sspctl(t, stdin, args...)
	if r.code != 0 {
		t.Fatalf("sspctl %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, r.code, r.out, r.err)
	}
	return r.out
}

type ident struct{ site, kid, pubkey, mesh, trustLine string }

func parseIdent(t *testing.T, out string) ident {
	t.Helper()
	var id ident
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 {
			switch f[0] {
			case "site":
				id.site = f[1]
			case "kid":
				id.kid = f[1]
			case "pubkey":
				id.pubkey = f[1]
			case "mesh":
				id.mesh = f[1]
			}
		}
		if strings.HasPrefix(line, "sspctl trust ") {
			id.trustLine = line
		}
	}
	if len(id.site) != 32 || id.kid == "" || len(id.pubkey) != 64 || id.mesh == "" || id.trustLine == "" {
		t.Fatalf("identity not printed in full: %+v\n%s", id, out)
	}
	return id
}

// trustArgs turns the printed "sspctl trust --dir PEER_DIR ..." line into
// arguments for run, with PEER_DIR replaced.
func trustArgs(t *testing.T, line, dir string) []string {
	t.Helper()
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != "sspctl" || f[1] != "trust" {
		t.Fatalf("bad trust line %q", line)
	}
	args := f[1:]
	for i := range args {
		if args[i] == "PEER_DIR" {
			args[i] = dir
		}
	}
	return args
}

func TestInitPrintsIdentityAndKeepsIt(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "n")
	first := parseIdent(t, mustRun(t, "", "init", "--dir", dir, "--mesh", "m1"))
	if first.mesh != "6d31" {
		t.Fatalf("mesh %q, want hex of m1", first.mesh)
	}
	if !strings.Contains(first.trustLine, "--kid "+first.kid) || !strings.Contains(first.trustLine, "--site "+first.site) || !strings.Contains(first.trustLine, "--pubkey "+first.pubkey) {
		t.Fatalf("trust line does not carry the identity: %q", first.trustLine)
	}
	out := mustRun(t, "", "init", "--dir", dir)
	if !strings.Contains(out, "existing node") {
		t.Fatalf("second init did not say the node existed:\n%s", out)
	}
	if again := parseIdent(t, out); again != first {
		t.Fatalf("identity changed: %+v then %+v", first, again)
	}
	if again := parseIdent(t, mustRun(t, "", "identity", "--dir", dir)); again != first {
		t.Fatalf("identity command differs: %+v vs %+v", again, first)
	}
	// A different mesh on an existing node is refused, not silently applied.
	if r := sspctl(t, "", "init", "--dir", dir, "--mesh", "other"); r.code != exitError || !strings.Contains(r.err, "mesh") {
		t.Fatalf("init with another mesh: exit %d stderr %q", r.code, r.err)
	}
	// Without --mesh a fresh node gets a random 16-byte mesh id.
	rnd := parseIdent(t, mustRun(t, "", "init", "--dir", filepath.Join(t.TempDir(), "r")))
	if len(rnd.mesh) != 32 {
		t.Fatalf("random mesh id %q: want 16 bytes hex", rnd.mesh)
	}
}

// TestInitInProcess goes through run, the real entry point.
func TestInitInProcess(t *testing.T) {
	r := inProcess(t, "", "init", "--dir", filepath.Join(t.TempDir(), "n"), "--mesh-hex", "00ff")
	if r.code != 0 {
		t.Fatalf("init: %+v", r)
	}
	if id := parseIdent(t, r.out); id.mesh != "00ff" || !strings.Contains(r.out, "created node") {
		t.Fatalf("init output: %s", r.out)
	}
	if r := inProcess(t, "", "init", "--dir", t.TempDir(), "--mesh", "a", "--mesh-hex", "00"); r.code != exitUsage {
		t.Fatalf("--mesh with --mesh-hex: exit %d", r.code)
	}
}

func TestCommandsRefuseMissingNode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "none")
	r := inProcess(t, "", "tables", "--dir", dir)
	if r.code != exitError || !strings.Contains(r.err, "no node") {
		t.Fatalf("tables on missing node: exit %d stderr %q", r.code, r.err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a command on a missing node created %s (err %v)", dir, err)
	}
	if r := inProcess(t, "", "tables"); r.code != exitUsage || !strings.Contains(r.err, "--dir is required") {
		t.Fatalf("missing --dir: exit %d stderr %q", r.code, r.err)
	}
	if r := inProcess(t, "", "frobnicate"); r.code != exitUsage {
		t.Fatalf("unknown command: exit %d", r.code)
	}
}

// mesh sets up nodes A and B in one mesh, with the same table, B trusting A.
func mesh(t *testing.T) (dirA, dirB string, a ident) {
	t.Helper()
	root := t.TempDir()
	dirA, dirB = filepath.Join(root, "a"), filepath.Join(root, "b")
	a = parseIdent(t, mustRun(t, "", "init", "--dir", dirA, "--mesh", "test-mesh"))
	b := parseIdent(t, mustRun(t, "", "init", "--dir", dirB, "--mesh-hex", a.mesh))
	if b.mesh != a.mesh || b.site == a.site {
		t.Fatalf("B: %+v, A: %+v", b, a)
	}
	for _, d := range []string{dirA, dirB} {
		mustRun(t, "", "define", "--dir", d, "--schema", "app", "--table", "t", "--key", "id", "--columns", "a,b,c")
	}
	mustRun(t, "", trustArgs(t, a.trustLine, dirB)...)
	keys := mustRun(t, "", "keys", "--dir", dirB)
	if !strings.Contains(keys, "kid="+a.kid+" site="+a.site+" pubkey="+a.pubkey+" cutoff=none") {
		t.Fatalf("B's keyring lacks A:\n%s", keys)
	}
	return dirA, dirB, a
}

var outcomeRE = regexp.MustCompile(`^(\S+) id=(\S+) outcome=(\S+) reason=(\S+)`)

type outcomeLine struct{ where, id, kind, reason, line string }

func outcomes(t *testing.T, out string) []outcomeLine {
	t.Helper()
	var res []outcomeLine
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		m := outcomeRE.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("unparsable outcome line %q", line)
		}
		res = append(res, outcomeLine{m[1], m[2], m[3], m[4], line})
	}
	return res
}

type dumpDoc struct {
	Horizon string `json:"horizon"`
	Rows    []struct {
		Key       map[string]any                        `json:"key"`
		Exists    bool                                  `json:"exists"`
		Existence *clockJSON                            `json:"existence"`
		Tomb      *clockJSON                            `json:"tomb"`
		Cells     map[string]map[string]json.RawMessage `json:"cells"`
	} `json:"rows"`
}

func dumpOf(t *testing.T, dir string, extra ...string) dumpDoc {
	t.Helper()
	out := mustRun(t, "", append([]string{"dump", "--dir", dir, "--schema", "app", "--table", "t"}, extra...)...)
	var d dumpDoc
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("dump is not JSON: %v\n%s", err, out)
	}
	return d
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSignOnAApplyOnBDump(t *testing.T) {
	t.Parallel()
	dirA, dirB, a := mesh(t)
	in := writeFile(t, "e.json", `{"schema":"app","table":"t","key":{"id":1},"payload":{"a":"x","b":null}}`)
	cose := filepath.Join(t.TempDir(), "e.cose")
	mustRun(t, "", "sign", "--dir", dirA, "--in", in, "--out", cose)
	raw, err := os.ReadFile(cose)
	if err != nil || len(raw) == 0 || raw[0] != 0xd2 { // COSE_Sign1 tag 18
		t.Fatalf("signed output: %x, %v", raw, err)
	}
	// sign does not apply: A's table is still empty.
	if d := dumpOf(t, dirA); len(d.Rows) != 0 {
		t.Fatalf("sign applied the event on A: %+v", d.Rows)
	}

	o := outcomes(t, mustRun(t, "", "apply", "--dir", dirB, cose))
	if len(o) != 1 || o[0].kind != "applied" || o[0].reason != "none" || o[0].where != cose || len(o[0].id) != 64 {
		t.Fatalf("apply on B: %+v", o)
	}
	// At least once: the same bytes again are a duplicate.
	if o2 := outcomes(t, mustRun(t, "", "apply", "--dir", dirB, cose)); o2[0].kind != "duplicate" || o2[0].id != o[0].id {
		t.Fatalf("re-apply: %+v", o2)
	}

	d := dumpOf(t, dirB)
	if len(d.Rows) != 1 {
		t.Fatalf("B rows: %+v", d.Rows)
	}
	row := d.Rows[0]
	if row.Key["id"] != float64(1) || !row.Exists || row.Tomb != nil || row.Existence == nil || row.Existence.Site != a.site {
		t.Fatalf("row: %+v", row)
	}
	hlc := row.Existence.HLC
	wantClock := `{"hlc":"` + hlc + `","site":"` + a.site + `"}`
	cell := func(col, field string) string {
		t.Helper()
		v, ok := row.Cells[col][field]
		if !ok {
			return "<absent>"
		}
		var c bytes.Buffer
		if err := json.Compact(&c, v); err != nil {
			t.Fatal(err)
		}
		return c.String()
	}
	if cell("a", "state") != `"written"` || cell("a", "value") != `"x"` || cell("a", "clock") != wantClock {
		t.Fatalf("cell a: %v", row.Cells["a"])
	}
	// An explicit null is a clocked write, present as JSON null.
	if cell("b", "state") != `"written"` || cell("b", "value") != "null" || cell("b", "clock") != wantClock {
		t.Fatalf("cell b: %v", row.Cells["b"])
	}
	// Never written: no value field at all, no clock (SSP/1 §13.6).
	if cell("c", "state") != `"unmaterialized"` || cell("c", "value") != "<absent>" || cell("c", "clock") != "null" {
		t.Fatalf("cell c: %v", row.Cells["c"])
	}

	// A delete ("delete": true), signed as hex: the row is tombstoned,
	// still dumped by default, hidden with --all=false.
	del := mustRun(t, `{"schema":"app","table":"t","key":{"id":1},"delete":true}`, "sign", "--dir", dirA, "--hex")
	if o := outcomes(t, mustRun(t, del, "apply", "--dir", dirB, "--hex", "-")); o[0].kind != "applied" {
		t.Fatalf("delete: %+v", o)
	}
	d = dumpOf(t, dirB)
	if len(d.Rows) != 1 || d.Rows[0].Exists || d.Rows[0].Tomb == nil || d.Rows[0].Tomb.HLC <= hlc && len(d.Rows[0].Tomb.HLC) == len(hlc) {
		t.Fatalf("after delete: %+v", d.Rows)
	}
	if st := string(d.Rows[0].Cells["a"]["state"]); st != `"cleared"` || string(d.Rows[0].Cells["a"]["value"]) != "null" {
		t.Fatalf("cell a after delete: %v", d.Rows[0].Cells["a"])
	}
	if live := dumpOf(t, dirB, "--all=false"); len(live.Rows) != 0 {
		t.Fatalf("--all=false shows tombstoned rows: %+v", live.Rows)
	}
}

func TestApplyDropsUntrustedAndGarbage(t *testing.T) {
	t.Parallel()
	dirA, dirB, _ := mesh(t)
	// C is in the same mesh but B does not trust it.
	dirC := filepath.Join(t.TempDir(), "c")
	mustRun(t, "", "init", "--dir", dirC, "--mesh", "test-mesh")
	untrusted := mustRun(t, `{"schema":"app","table":"t","key":{"id":9},"payload":{"a":"forged"}}`, "sign", "--dir", dirC, "--hex")
	good := mustRun(t, `{"schema":"app","table":"t","key":{"id":2},"payload":{"a":"ok"}}`, "sign", "--dir", dirA, "--hex")
	file := writeFile(t, "in.hex", "# a comment\n\n"+untrusted+"zz not hex\ndeadbeef\n"+good)

	r := sspctl(t, "", "apply", "--dir", dirB, "--hex", file)
	if r.code != 0 {
		t.Fatalf("apply exit %d (dropped events are not errors): %s", r.code, r.err)
	}
	o := outcomes(t, r.out)
	if len(o) != 4 {
		t.Fatalf("want 4 outcomes, got %d:\n%s", len(o), r.out)
	}
	if o[0].where != file+":3" || o[0].kind != "dropped" || o[0].reason != "signature" {
		t.Fatalf("untrusted: %+v", o[0])
	}
	if o[1].where != file+":4" || o[1].kind != "dropped" || o[1].reason != "malformed" || o[1].id != "-" {
		t.Fatalf("bad hex: %+v", o[1])
	}
	if o[2].where != file+":5" || o[2].kind != "dropped" || (o[2].reason != "signature" && o[2].reason != "malformed") {
		t.Fatalf("garbage bytes: %+v", o[2])
	}
	if o[3].where != file+":6" || o[3].kind != "applied" {
		t.Fatalf("line after garbage: %+v", o[3])
	}
	d := dumpOf(t, dirB)
	if len(d.Rows) != 1 || d.Rows[0].Key["id"] != float64(2) {
		t.Fatalf("B rows: %+v", d.Rows)
	}

	// A missing file is an infrastructure error: non-zero exit, the other
	// files still applied.
	again := writeFile(t, "g.hex", good)
	r = sspctl(t, "", "apply", "--dir", dirB, "--hex", filepath.Join(t.TempDir(), "missing"), again)
	if r.code != exitError || !strings.Contains(r.out, "outcome=duplicate") {
		t.Fatalf("missing file: exit %d out %q err %q", r.code, r.out, r.err)
	}
}

func TestHorizonBelowIsAppliedAndWritesNothing(t *testing.T) {
	t.Parallel()
	dirA, dirB, _ := mesh(t)
	// An event at an explicit old HLC, applied before the horizon: retained.
	old := mustRun(t, `{"schema":"app","table":"t","key":{"id":2},"payload":{"a":"old"},"hlc":"1500.0"}`, "sign", "--dir", dirA, "--hex")
	if o := outcomes(t, mustRun(t, old, "apply", "--dir", dirB, "--hex", "-")); o[0].kind != "applied" || strings.Contains(o[0].line, "below_horizon") || !strings.Contains(o[0].line, "hlc=1500.0") {
		t.Fatalf("old event: %+v", o)
	}
	out := mustRun(t, "", "horizon", "--dir", dirB, "--schema", "app", "--table", "t", "--hlc", "2000.0")
	if !strings.Contains(out, "reclaimed=1") {
		t.Fatalf("horizon: %q, want one reclaimed log entry", out)
	}
	if out := mustRun(t, "", "horizon", "--dir", dirB, "--schema", "app", "--table", "t"); !strings.Contains(out, "2000.0") {
		t.Fatalf("horizon read back: %q", out)
	}
	if out := mustRun(t, "", "tables", "--dir", dirB); !strings.Contains(out, "app.t key=id columns=a,b,c horizon=2000.0") {
		t.Fatalf("tables: %q", out)
	}

	below := mustRun(t, `{"schema":"app","table":"t","key":{"id":3},"payload":{"a":"gone"},"hlc":131006469}`, "sign", "--dir", dirA, "--hex") // raw 1999<<16|5: 1999.5
	o := outcomes(t, mustRun(t, below, "apply", "--dir", dirB, "--hex", "-"))
	if o[0].kind != "applied" || !strings.Contains(o[0].line, "below_horizon=true") {
		t.Fatalf("below horizon: %+v", o)
	}
	d := dumpOf(t, dirB)
	if d.Horizon != "2000.0" || len(d.Rows) != 1 || d.Rows[0].Key["id"] != float64(2) {
		t.Fatalf("dump after below-horizon event: %+v", d)
	}
}

func TestAddColumnAndDefineVariant(t *testing.T) {
	t.Parallel()
	_, dirB, _ := mesh(t)
	mustRun(t, "", "define", "--dir", dirB, "--schema", "app", "--table", "t", "--add-column", "d")
	mustRun(t, "", "add-column", "--dir", dirB, "--schema", "app", "--table", "t", "--column", "e")
	if out := mustRun(t, "", "tables", "--dir", dirB); !strings.Contains(out, "columns=a,b,c,d,e ") {
		t.Fatalf("tables: %q", out)
	}
	// Redefining differently is an error from runtime, reported, exit 1.
	if r := sspctl(t, "", "define", "--dir", dirB, "--schema", "app", "--table", "t", "--key", "other"); r.code != exitError {
		t.Fatalf("conflicting define: exit %d", r.code)
	}
}

func TestHelpDocumentsEveryFlag(t *testing.T) {
	top := inProcess(t, "", "--help")
	if top.code != 0 {
		t.Fatalf("--help exit %d", top.code)
	}
	for _, c := range commands() {
		if !strings.Contains(top.out, c.name) {
			t.Errorf("top help lacks %s", c.name)
		}
		r := inProcess(t, "", c.name, "--help")
		if r.code != 0 {
			t.Errorf("%s --help: exit %d", c.name, r.code)
			continue
		}
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		c.flags(fs)
		n := 0
		fs.VisitAll(func(f *flag.Flag) {
			n++
			if !strings.Contains(r.out, "-"+f.Name) || !strings.Contains(r.out, f.Usage) {
				t.Errorf("%s --help does not document -%s:\n%s", c.name, f.Name, r.out)
			}
		})
		if n == 0 || !strings.Contains(r.out, "-dir") && !strings.Contains(r.out, "-addr") {
			t.Errorf("%s has no flags?", c.name)
		}
	}
	if r := inProcess(t, "", "help", "dump"); r.code != 0 || !strings.Contains(r.out, "-all") {
		t.Fatalf("help dump: %+v", r)
	}
}

// signedHLCs decodes the HLC of every hex line sign printed.
func signedHLCs(t *testing.T, out string) []messages.HLC {
	t.Helper()
	var hs []messages.HLC
	for _, line := range strings.Fields(out) {
		raw, err := hex.DecodeString(line)
		if err != nil {
			t.Fatalf("sign output line %q: %v", line, err)
		}
		ev, err := sign.ParseVerified(raw)
		if err != nil {
			t.Fatalf("sign output: %v", err)
		}
		hs = append(hs, ev.HLC)
	}
	return hs
}

// TestSignIssuesFreshHLCsFromTheNodeClock: sign takes HLCs from the node's
// durable clock, so they strictly increase within a run, across runs
// (close and reopen) with a wall clock that never moves, and the node
// never issues one of them again (SSP/1 §13.5: no HLC reuse).
func TestSignIssuesFreshHLCsFromTheNodeClock(t *testing.T) {
	t.Parallel()
	frozen := time.UnixMilli(1_700_000_000_000)
	wall := func() time.Time { return frozen }
	dir := filepath.Join(t.TempDir(), "n")
	must := func(stdin string, args ...string) string {
		t.Helper()
		r := sspctlWith(t, wall, stdin, args...)
		if r.code != 0 {
			t.Fatalf("sspctl %v: exit %d\n%s%s", args, r.code, r.out, r.err)
		}
		return r.out
	}
	must("", "init", "--dir", dir, "--mesh", "m")
	must("", "define", "--dir", dir, "--schema", "app", "--table", "t", "--key", "id", "--columns", "a")
	ev := `{"schema":"app","table":"t","key":{"id":1},"payload":{"a":1}}`
	first := signedHLCs(t, must(ev+ev, "sign", "--dir", dir, "--hex"))
	second := signedHLCs(t, must(ev, "sign", "--dir", dir, "--hex")) // after close + reopen
	all := append(first, second...)
	if len(all) != 3 {
		t.Fatalf("signed %d events, want 3", len(all))
	}
	for i, h := range all {
		if h.Physical() < uint64(frozen.UnixMilli()) {
			t.Fatalf("HLC %v below the wall clock", h)
		}
		if i > 0 && h <= all[i-1] {
			t.Fatalf("HLCs not strictly increasing: %v", all)
		}
	}
	// An HLC given in the input is used as is.
	if got := signedHLCs(t, must(`{"schema":"app","table":"t","key":{"id":1},"payload":{"a":2},"hlc":"5.1"}`, "sign", "--dir", dir, "--hex")); len(got) != 1 || got[0] != messages.HLC(5<<16|1) {
		t.Fatalf("explicit hlc: %v", got)
	}
	// The node recorded what sign issued: a local write after a restart
	// gets a later HLC, though the wall clock still has not moved.
	n, err := runtime.Open(context.Background(), runtime.Config{Dir: dir, Wall: wall})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	o, err := n.Upsert(context.Background(), "app", "t", map[string]any{"id": 2}, map[string]any{"a": 3})
	if err != nil || o.Kind != messages.Applied {
		t.Fatalf("upsert: %v %v", o, err)
	}
	if last := all[len(all)-1]; o.HLC <= last {
		t.Fatalf("local write got HLC %v, not above the signed %v", o.HLC, last)
	}
}

// TestLockHeldIsReported: a node another process (here: an open
// runtime.Node) holds is a clear error after the lock timeout, not a hang.
func TestLockHeldIsReported(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "n")
	mustRun(t, "", "init", "--dir", dir, "--mesh", "m")
	n, err := runtime.Open(context.Background(), runtime.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	r := sspctl(t, "", "tables", "--dir", dir)
	if r.code != exitError || !strings.Contains(r.err, "locked by another process") {
		t.Fatalf("locked node: exit %d stderr %q", r.code, r.err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "", "tables", "--dir", dir)
}

func TestParseHLC(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want messages.HLC
		ok   bool
	}{
		{"1700000000000.3", messages.HLC(1700000000000<<16 | 3), true},
		{"0.0", 0, true},
		{"131072000", messages.HLC(2000 << 16), true},
		{" 5.65535 ", messages.HLC(5<<16 | 65535), true},
		{"5.65536", 0, false},
		{"281474976710656.0", 0, false}, // 2^48: too wide
		{"", 0, false},
		{"x.1", 0, false},
		{"-1", 0, false},
	} {
		got, err := parseHLC(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseHLC(%q) = %v, %v", tc.in, got, err)
		}
		if !tc.ok && !errors.Is(err, errInput) {
			t.Errorf("parseHLC(%q) error %v is not errInput", tc.in, err)
		}
	}
}

func TestParseEventValues(t *testing.T) {
	p, err := parseEvent([]byte(`{"schema":"s","table":"t","key":{"id":1,"k":"x"},"payload":{"i":-3,"f":1.5,"g":2.0,"big":18446744073709551615,"b":{"$bytes":"00ff"},"t":true,"n":null,"l":[1,"a"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"i": int64(-3), "f": 1.5, "g": int64(2), "big": uint64(18446744073709551615), "b": []byte{0, 0xff}, "t": true, "n": nil, "l": []any{int64(1), "a"}}
	for k, v := range want {
		if !p.Payload[k].Equal(messages.MustValue(v)) {
			t.Errorf("payload %s = %x, want encoding of %#v", k, p.Payload[k], v)
		}
	}
	if p.Delete || p.HLC != 0 {
		t.Fatalf("parsed %+v", p)
	}
	for _, bad := range []string{
		`{"table":"t","key":{"id":1},"payload":{}}`,
		`{"schema":"s","table":"t","key":{},"payload":{}}`,
		`{"schema":"s","table":"t","key":null,"payload":{}}`,
		`{"schema":"s","table":"t","key":{"id":1}}`,
		`{"schema":"s","table":"t","key":{"id":1},"payload":{"a":1},"delete":true}`,
		`{"schema":"s","table":"t","key":{"id":1},"payload":{},"extra":1}`,
		`{"schema":"s","table":"t","key":{"id":{"$bytes":"zz"}},"payload":{}}`,
		`{"schema":"s","table":"t","key":{"id":1},"payload":{},"hlc":"nope"}`,
		`{"schema":"s","table":"t","key":{"id":1},"payload":{},"hlc":"0.0"}`,
	} {
		if _, err := parseEvent([]byte(bad)); !errors.Is(err, errInput) {
			t.Errorf("parseEvent(%s): err %v, want errInput", bad, err)
		}
	}
	d, err := parseEvent([]byte(`{"schema":"s","table":"t","key":{"id":1},"payload":null,"hlc":"7.1"}`))
	if err != nil || !d.Delete || d.Payload != nil || d.HLC != messages.HLC(7<<16|1) {
		t.Fatalf("delete: %+v %v", d, err)
	}
}

func FuzzParseHLC(f *testing.F) {
	for _, s := range []string{"1.2", "131072000", "", "5.65536", "281474976710655.65535", "a.b", ".", "1."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := parseHLC(s)
		if err != nil {
			return
		}
		// Round trip through the printed form.
		if h2, err := parseHLC(h.String()); err != nil || h2 != h {
			t.Fatalf("%q -> %v -> %v, %v", s, h, h2, err)
		}
	})
}

func FuzzParseEvent(f *testing.F) {
	for _, s := range []string{
		`{"schema":"app","table":"t","key":{"id":1},"payload":{"a":"x","b":null}}`,
		`{"schema":"app","table":"t","key":{"id":1},"delete":true,"hlc":"5.1"}`,
		`{"schema":"app","table":"t","key":{"id":{"$bytes":"00"}},"payload":{"n":[1,{"x":1e400}]}}`,
		`{}`, `null`, `[`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parseEvent(b)
		if err != nil {
			if !errors.Is(err, errInput) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if len(p.Key) == 0 || p.Delete == (p.Payload != nil) {
			t.Fatalf("inconsistent event %+v", p)
		}
	})
}

// tls ca and tls node write a CA and a node certificate that meshtls loads
// into a working mutual-TLS configuration naming the node.
func TestTLSCAAndNode(t *testing.T) {
	dir := t.TempDir()
	if r := inProcess(t, "", "tls", "node", "--dir", dir, "--name", "a"); r.code != exitError || !strings.Contains(r.err, "no CA") {
		t.Fatalf("node before ca: %+v", r)
	}
	mustRun(t, "", "tls", "ca", "--dir", dir)
	if r := inProcess(t, "", "tls", "ca", "--dir", dir); r.code != exitError {
		t.Fatalf("second ca replaced the first: %+v", r)
	}
	out := mustRun(t, "", "tls", "node", "--dir", dir, "--name", "node-a", "--host", "127.0.0.1,a.internal")
	if !strings.Contains(out, "uri=syncmesh://node/node-a") || !strings.Contains(out, "pin-sha256=") {
		t.Fatalf("tls node output: %q", out)
	}
	if r := inProcess(t, "", "tls", "node", "--dir", dir, "--name", "b@remote"); r.code != exitUsage {
		t.Fatalf("invalid name: %+v", r)
	}
	server, client, err := meshtls.LoadNodeTLS(dir, "node-a")
	if err != nil || server.ClientAuth != tls.RequireAndVerifyClientCert || len(client.Certificates) != 1 {
		t.Fatalf("load: %v", err)
	}
	leaf, err := x509.ParseCertificate(client.Certificates[0].Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if name, err := meshtls.NodeName(leaf); err != nil || name != "node-a" || !slices.Contains(leaf.DNSNames, "a.internal") || len(leaf.IPAddresses) != 1 {
		t.Fatalf("certificate: %q %v %v %v", name, err, leaf.DNSNames, leaf.IPAddresses)
	}
}

// status, peers and watermarks read a running node's admin endpoint (the
// node's directory is locked by it, so --dir commands cannot).
func TestAdminCommandsAgainstARunningNode(t *testing.T) {
	ctx := context.Background()
	a, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("m"), Name: "a", SyncInterval: -1, MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("m"), Name: "b", SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	def := runtime.TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"v"}}
	for _, n := range []*runtime.Node{a, b} {
		if err := n.DefineTable(ctx, def); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 7 {
		if _, err := a.Upsert(ctx, "app", "t", map[string]any{"id": i}, map[string]any{"v": i}); err != nil {
			t.Fatal(err)
		}
	}
	net := runtime.NewNetwork(1)
	net.Register("b", b)
	if err := a.AddPeer("b", net.Transport("a"), ""); err != nil {
		t.Fatal(err)
	}
	addr := a.MetricsAddr()
	if out := mustRun(t, "", "status", "--addr", addr); !strings.Contains(out, "name=a") || !strings.Contains(out, "last_seq=7") || !strings.Contains(out, "backlog_events=7") {
		t.Fatalf("status: %q", out)
	}
	if out := mustRun(t, "", "peers", "--addr", addr); !strings.Contains(out, "peer=b") || !strings.Contains(out, "behind=7 events") || !strings.Contains(out, "no watermark yet") {
		t.Fatalf("peers: %q", out)
	}
	if out := mustRun(t, "", "watermarks", "--addr", addr); !strings.Contains(out, "table=app.t") {
		t.Fatalf("watermarks: %q", out)
	}
	if out := mustRun(t, "", "held", "--addr", addr); !strings.Contains(out, "nothing held") {
		t.Fatalf("held: %q", out)
	}
	if out := mustRun(t, "", "status", "--addr", addr); !strings.Contains(out, "held_groups=0") || !strings.Contains(out, "log_rotated=false") {
		t.Fatalf("status without held groups or restore state: %q", out)
	}
	if out := mustRun(t, "", "peers", "--addr", addr, "--json"); !strings.Contains(out, `"lag_events": 7`) {
		t.Fatalf("peers --json: %q", out)
	}
	if r := inProcess(t, "", "status", "--addr", "127.0.0.1:1", "--timeout", "2s"); r.code != exitError {
		t.Fatalf("status against nothing: %+v", r)
	}
	if r := inProcess(t, "", "status"); r.code != exitUsage {
		t.Fatalf("status without --addr: %+v", r)
	}
}

func TestPurgeHeldDropsEventsForAMissingTable(t *testing.T) {
	t.Parallel()
	dirA, dirB, a := mesh(t)
	mustRun(t, "", "define", "--dir", dirA, "--schema", "app", "--table", "u", "--key", "id", "--columns", "a")
	ev := mustRun(t, `{"schema":"app","table":"u","key":{"id":1},"payload":{"a":"x"}}`, "sign", "--dir", dirA, "--hex")
	// B has no table app.u: the event is held (SSP/1 §13.6).
	if o := outcomes(t, mustRun(t, ev, "apply", "--dir", dirB, "--hex", "-")); len(o) != 1 || o[0].kind != "held" {
		t.Fatalf("apply on B: %+v", o)
	}
	args := []string{"purge-held", "--dir", dirB, "--site", a.site, "--schema", "app", "--table", "u"}
	if out := mustRun(t, "", args...); !strings.Contains(out, "purged 1 held events") {
		t.Fatalf("purge-held: %q", out)
	}
	if out := mustRun(t, "", args...); !strings.Contains(out, "purged 0 held events") {
		t.Fatalf("second purge-held: %q", out)
	}
	// The event is gone, not just released: offered again, it is new.
	if o := outcomes(t, mustRun(t, ev, "apply", "--dir", dirB, "--hex", "-")); len(o) != 1 || o[0].kind != "held" {
		t.Fatalf("apply after the purge: %+v", o)
	}
	if r := sspctl(t, "", "purge-held", "--dir", dirB, "--site", "zz", "--schema", "app", "--table", "u"); r.code == 0 {
		t.Fatalf("purge-held with a bad site: exit 0\n%s", r.out)
	}
}

// reconcile runs one reconciliation through a running node's admin
// endpoint (POST with the token), and peers shows it afterwards.
func TestReconcileCommandAgainstARunningNode(t *testing.T) {
	ctx := context.Background()
	const token = "0123456789abcdef-admin"
	a, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("m"), Name: "a", SyncInterval: -1, ReconcileInterval: -1, MetricsAddr: "127.0.0.1:0", AdminToken: token})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("m"), Name: "b", SyncInterval: -1, ReconcileInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	def := runtime.TableDef{Schema: "app", Table: "t", KeyColumns: []string{"id"}, Columns: []string{"v"}}
	for _, n := range []*runtime.Node{a, b} {
		if err := n.DefineTable(ctx, def); err != nil {
			t.Fatal(err)
		}
	}
	id := b.Identity()
	if err := a.Trust(ctx, runtime.PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := b.Upsert(ctx, "app", "t", map[string]any{"id": i}, map[string]any{"v": i}); err != nil {
			t.Fatal(err)
		}
	}
	net := runtime.NewNetwork(1)
	net.Register("a", a)
	net.Register("b", b)
	if err := a.AddPeer("b", net.Transport("a"), ""); err != nil {
		t.Fatal(err)
	}
	addr := a.MetricsAddr()
	t.Setenv(tokenEnv, "")
	if r := inProcess(t, "", "reconcile", "--addr", addr, "--peer", "b"); r.code != exitUsage || !strings.Contains(r.err, "token") {
		t.Fatalf("reconcile without a token: %+v", r)
	}
	bad := filepath.Join(t.TempDir(), "bad")
	if err := os.WriteFile(bad, []byte("wrong-token-wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := inProcess(t, "", "reconcile", "--addr", addr, "--peer", "b", "--token-file", bad); r.code != exitError || !strings.Contains(r.err, "401") {
		t.Fatalf("reconcile with a wrong token: %+v", r)
	}
	good := filepath.Join(t.TempDir(), "good")
	if err := os.WriteFile(good, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, "", "reconcile", "--addr", addr, "--peer", "b", "--token-file", good)
	if !strings.Contains(out, "peer=b result=ok") || !strings.Contains(out, "events_missing=4 events_fetched=4") {
		t.Fatalf("reconcile: %q", out)
	}
	t.Setenv(tokenEnv, token)
	if out := mustRun(t, "", "reconcile", "--addr", addr, "--peer", "b"); !strings.Contains(out, "events_missing=0 events_fetched=0") {
		t.Fatalf("second reconcile (token from the environment): %q", out)
	}
	if r := inProcess(t, "", "reconcile", "--addr", addr, "--peer", "nobody"); r.code != exitError || !strings.Contains(r.err, "404") {
		t.Fatalf("reconcile with an unknown peer: %+v", r)
	}
	if out := mustRun(t, "", "peers", "--addr", addr); !strings.Contains(out, "result=ok fetched=0") || !strings.Contains(out, "last_reconcile=") {
		t.Fatalf("peers after reconciling: %q", out)
	}
}

// held lists, from a running node's admin endpoint, the groups whose
// events wait for a table the node has not defined, and status counts them.
func TestHeldCommandAgainstARunningNode(t *testing.T) {
	ctx := context.Background()
	a, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("m"), Name: "a", SyncInterval: -1, MetricsAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	c, err := runtime.Open(ctx, runtime.Config{InMemory: true, MeshID: []byte("m"), Name: "c", SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// c writes to app.x, which a has not defined.
	if err := c.DefineTable(ctx, runtime.TableDef{Schema: "app", Table: "x", KeyColumns: []string{"id"}, Columns: []string{"v"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := c.Upsert(ctx, "app", "x", map[string]any{"id": i}, map[string]any{"v": i}); err != nil {
			t.Fatal(err)
		}
	}
	id := c.Identity()
	if err := a.Trust(ctx, runtime.PeerKey{Kid: id.Kid, Site: id.Site, PublicKey: id.PublicKey}); err != nil {
		t.Fatal(err)
	}
	if err := a.AcceptPeer("c", runtime.PeerSite(id.Site)); err != nil {
		t.Fatal(err)
	}
	net := runtime.NewNetwork(1)
	net.Register("a", a)
	if err := c.AddPeer("a", net.Transport("c"), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SyncNow(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	addr := a.MetricsAddr()
	if out := mustRun(t, "", "held", "--addr", addr); !strings.Contains(out, "missing_table=app.x events=2") || !strings.Contains(out, "site="+id.Site.String()) {
		t.Fatalf("held: %q", out)
	}
	if out := mustRun(t, "", "status", "--addr", addr); !strings.Contains(out, "held_groups=1") {
		t.Fatalf("status: %q", out)
	}
	if out := mustRun(t, "", "held", "--addr", addr, "--json"); !strings.Contains(out, `"missing_table": "app.x"`) {
		t.Fatalf("held --json: %q", out)
	}
}
