package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
)

// errNoNode: --dir holds no node (run init first).
var errNoNode = errors.New("sspctl: no node in directory (run sspctl init)")

// nodeExists reports whether dir already holds a node's store. The file
// name is runtime's (Config.Dir documents node.db).
func nodeExists(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "node.db"))
	return err == nil
}

// withNode opens the existing node in dir, runs fn and closes the node.
// It refuses a directory without a node rather than letting runtime.Open
// create half a node there.
func withNode(e env, dir string, fn func(n *runtime.Node) error) error {
	if !nodeExists(dir) {
		return fmt.Errorf("%w: %s", errNoNode, dir)
	}
	return openAndRun(e, runtime.Config{Dir: dir}, fn)
}

func openAndRun(e env, cfg runtime.Config, fn func(n *runtime.Node) error) error {
	cfg.LockTimeout = e.lockTimeout
	cfg.Wall = e.wall
	n, err := runtime.Open(e.ctx, cfg)
	if errors.Is(err, runtime.ErrLocked) {
		// bbolt holds an exclusive file lock while a node is open.
		return fmt.Errorf("%s is locked by another process (an application or another sspctl has the node open); gave up after %s (inspect a running node with sspctl status|peers|watermarks --addr against its Config.MetricsAddr): %w",
			filepath.Join(cfg.Dir, "node.db"), e.lockTimeout, err)
	}
	if err != nil {
		return err
	}
	err = fn(n)
	if cerr := n.Close(); err == nil {
		err = cerr
	}
	return err
}

// ---- init / identity ----

func initFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "node directory (required); created if missing")
	mesh := fs.String("mesh", "", "mesh id as text (UTF-8 bytes); default: 16 random bytes")
	meshHex := fs.String("mesh-hex", "", "mesh id as hex (as printed by init/identity); exclusive with --mesh")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir"); err != nil {
			return err
		}
		if *mesh != "" && *meshHex != "" {
			return inputErr("--mesh and --mesh-hex are exclusive")
		}
		var id []byte
		switch {
		case *mesh != "":
			id = []byte(*mesh)
		case *meshHex != "":
			b, err := decodeHex("--mesh-hex", *meshHex)
			if err != nil {
				return err
			}
			if len(b) == 0 {
				return inputErr("--mesh-hex is empty")
			}
			id = b
		}
		existed := nodeExists(*dir)
		if !existed && id == nil {
			id = make([]byte, 16)
			if _, err := rand.Read(id); err != nil {
				return err
			}
		}
		// On an existing node a given mesh id must match (runtime.ErrMeshMismatch);
		// without one the stored id is used.
		return openAndRun(e, runtime.Config{Dir: *dir, MeshID: id}, func(n *runtime.Node) error {
			if existed {
				fmt.Fprintf(e.stdout, "existing node in %s (identity unchanged)\n", *dir)
			} else {
				fmt.Fprintf(e.stdout, "created node in %s\n", *dir)
			}
			printIdentity(e.stdout, n.Identity())
			return nil
		})
	}
}

func identityFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "node directory (required)")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir"); err != nil {
			return err
		}
		return withNode(e, *dir, func(n *runtime.Node) error {
			printIdentity(e.stdout, n.Identity())
			return nil
		})
	}
}

// printIdentity prints one "name value" pair a line, then the command
// lines a peer runs to join the same mesh and trust this node.
func printIdentity(w io.Writer, id runtime.Identity) {
	fmt.Fprintf(w, "site     %s\n", id.Site)
	fmt.Fprintf(w, "kid      %s\n", hex.EncodeToString(id.Kid))
	fmt.Fprintf(w, "pubkey   %s\n", hex.EncodeToString(id.PublicKey))
	fmt.Fprintf(w, "mesh     %s\n", hex.EncodeToString(id.MeshID))
	if printable(id.MeshID) {
		fmt.Fprintf(w, "mesh-text %q\n", id.MeshID)
	}
	fmt.Fprintf(w, "# on a peer, join the same mesh:\n")
	fmt.Fprintf(w, "sspctl init --dir PEER_DIR --mesh-hex %s\n", hex.EncodeToString(id.MeshID))
	fmt.Fprintf(w, "# on a peer, trust this node:\n")
	fmt.Fprintf(w, "sspctl trust --dir PEER_DIR --kid %s --site %s --pubkey %s\n",
		hex.EncodeToString(id.Kid), id.Site, hex.EncodeToString(id.PublicKey))
}

func printable(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, r := range string(b) {
		if r == unicode.ReplacementChar || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// ---- define / add-column / tables ----

func defineFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "node directory (required)")
	schema := fs.String("schema", "", "schema name (required)")
	table := fs.String("table", "", "table name (required)")
	key := fs.String("key", "", "comma-separated key columns; defines the table (idempotent for the same definition)")
	cols := fs.String("columns", "", "comma-separated value columns of the new table")
	add := fs.String("add-column", "", "comma-separated value columns to add (runtime.AddColumn), after defining if --key is given")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir", "schema", "table"); err != nil {
			return err
		}
		if *key == "" && *add == "" {
			return inputErr("give --key (define) and/or --add-column")
		}
		if *key == "" && *cols != "" {
			return inputErr("--columns needs --key")
		}
		return withNode(e, *dir, func(n *runtime.Node) error {
			if *key != "" {
				def := runtime.TableDef{Schema: *schema, Table: *table, KeyColumns: splitList(*key), Columns: splitList(*cols)}
				if err := n.DefineTable(e.ctx, def); err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "defined %s.%s key=%s columns=%s\n", *schema, *table, strings.Join(def.KeyColumns, ","), strings.Join(def.Columns, ","))
			}
			return addColumns(e, n, *schema, *table, splitList(*add))
		})
	}
}

func addColumns(e env, n *runtime.Node, schema, table string, cols []string) error {
	for _, c := range cols {
		if err := n.AddColumn(e.ctx, schema, table, c); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "added column %s.%s.%s\n", schema, table, c)
	}
	return nil
}

func addColumnFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "node directory (required)")
	schema := fs.String("schema", "", "schema name (required)")
	table := fs.String("table", "", "table name (required)")
	col := fs.String("column", "", "comma-separated value columns to add (required)")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir", "schema", "table", "column"); err != nil {
			return err
		}
		return withNode(e, *dir, func(n *runtime.Node) error {
			return addColumns(e, n, *schema, *table, splitList(*col))
		})
	}
}

func tablesFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "node directory (required)")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir"); err != nil {
			return err
		}
		return withNode(e, *dir, func(n *runtime.Node) error {
			defs, err := n.Tables(e.ctx)
			if err != nil {
				return err
			}
			for _, d := range defs {
				h, err := n.Horizon(e.ctx, d.Schema, d.Table)
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "%s.%s key=%s columns=%s horizon=%s\n", d.Schema, d.Table,
					strings.Join(d.KeyColumns, ","), strings.Join(d.Columns, ","), h)
			}
			return nil
		})
	}
}

// ---- trust / keys ----

func trustFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "node directory (required)")
	kid := fs.String("kid", "", "peer key id, hex (as printed by the peer's init); empty: derived from --pubkey")
	site := fs.String("site", "", "peer site id, 32 hex digits (required)")
	pub := fs.String("pubkey", "", "peer Ed25519 public key, 64 hex digits (required)")
	cutoff := fs.String("cutoff", "", "retirement cutoff HLC (physical.logical or raw): the peer's events above it fail verification; default none")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir", "site", "pubkey"); err != nil {
			return err
		}
		var k runtime.PeerKey
		var err error
		if *kid != "" {
			if k.Kid, err = decodeHex("--kid", *kid); err != nil {
				return err
			}
		}
		if k.Site, err = messages.ParseSiteID(strings.TrimSpace(*site)); err != nil {
			return inputErr("--site: %v", err)
		}
		if k.PublicKey, err = decodeHex("--pubkey", *pub); err != nil {
			return err
		}
		if len(k.PublicKey) != 32 {
			return inputErr("--pubkey: want 32 bytes (64 hex digits), got %d", len(k.PublicKey))
		}
		if *cutoff != "" {
			if k.Cutoff, err = parseHLC(*cutoff); err != nil {
				return err
			}
		}
		return withNode(e, *dir, func(n *runtime.Node) error {
			if err := n.Trust(e.ctx, k); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "trusted site %s\n", k.Site)
			return nil
		})
	}
}

func keysFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "node directory (required)")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir"); err != nil {
			return err
		}
		return withNode(e, *dir, func(n *runtime.Node) error {
			self := n.Identity()
			for _, k := range n.TrustedKeys() {
				cut := "none"
				if k.Cutoff != 0 {
					cut = k.Cutoff.String()
				}
				tag := ""
				if bytes.Equal(k.Kid, self.Kid) {
					tag = " (self)"
				}
				fmt.Fprintf(e.stdout, "kid=%s site=%s pubkey=%s cutoff=%s%s\n",
					hex.EncodeToString(k.Kid), k.Site, hex.EncodeToString(k.PublicKey), cut, tag)
			}
			return nil
		})
	}
}

// ---- horizon ----

func horizonFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "node directory (required)")
	schema := fs.String("schema", "", "schema name (required)")
	table := fs.String("table", "", "table name (required)")
	hlc := fs.String("hlc", "", "new eviction horizon (physical.logical or raw); empty: print the current one")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir", "schema", "table"); err != nil {
			return err
		}
		var h messages.HLC
		if *hlc != "" {
			var err error
			if h, err = parseHLC(*hlc); err != nil {
				return err
			}
		}
		return withNode(e, *dir, func(n *runtime.Node) error {
			if *hlc == "" {
				cur, err := n.Horizon(e.ctx, *schema, *table)
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "horizon %s.%s %s\n", *schema, *table, cur)
				return nil
			}
			// SSP/1 §13.4–13.5: events below the horizon apply as no-ops and
			// the retained log below it is reclaimed.
			reclaimed, err := n.SetHorizon(e.ctx, *schema, *table, h)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "horizon %s.%s %s reclaimed=%d\n", *schema, *table, h, reclaimed)
			return nil
		})
	}
}

// ---- purge-held ----

func purgeHeldFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "node directory (required)")
	site := fs.String("site", "", "the signing site whose held events to drop, hex (required)")
	schema := fs.String("schema", "", "schema name (required)")
	table := fs.String("table", "", "table name (required)")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir", "site", "schema", "table"); err != nil {
			return err
		}
		s, err := messages.ParseSiteID(strings.TrimSpace(*site))
		if err != nil {
			return err
		}
		return withNode(e, *dir, func(n *runtime.Node) error {
			// SSP/1 §13.6: held events wait for a table; for one that will
			// never exist the operator drops them (a peer may offer them
			// again, within the signer's held quota).
			removed, err := n.PurgeHeld(e.ctx, runtime.GroupKey{Site: s, Schema: *schema, Table: *table})
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "purged %d held events of %s %s.%s\n", removed, s, *schema, *table)
			return nil
		})
	}
}

// ---- sign ----

func signFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "node directory (required)")
	in := fs.String("in", "-", `JSON event file, "-" for stdin; one or more objects like {"schema":"app","table":"t","key":{"id":1},"payload":{"a":"x","b":null}} (payload null or "delete":true: delete; optional "hlc", default a fresh one from the node's durable clock; {"$bytes":"hex"} for byte strings)`)
	out := fs.String("out", "", "output file; default stdout")
	asHex := fs.Bool("hex", false, "write each signed event as hex on its own line (required for more than one event); default raw COSE bytes")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir"); err != nil {
			return err
		}
		var r io.Reader = e.stdin
		if *in != "-" && *in != "" {
			f, err := os.Open(*in)
			if err != nil {
				return err
			}
			defer f.Close()
			r = f
		}
		evs, err := parseEvents(r)
		if err != nil {
			return err
		}
		if len(evs) > 1 && !*asHex {
			return inputErr("%d events: raw output holds one event; use --hex", len(evs))
		}
		var signed [][]byte
		err = withNode(e, *dir, func(n *runtime.Node) error {
			for i := range evs {
				// An event without an HLC gets a fresh one from the node's
				// durable clock, which records it: the node never issues it
				// again, across restarts too (SSP/1 §13.5). An HLC given in
				// the input is used as is.
				raw, err := n.Sign(&evs[i])
				if err != nil {
					return inputErr("sign %s.%s: %v", evs[i].Schema, evs[i].Table, err)
				}
				signed = append(signed, raw)
			}
			return nil
		})
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		for _, s := range signed {
			if *asHex {
				fmt.Fprintf(&buf, "%s\n", hex.EncodeToString(s))
			} else {
				buf.Write(s)
			}
		}
		if *out == "" || *out == "-" {
			_, err = e.stdout.Write(buf.Bytes())
			return err
		}
		return os.WriteFile(*out, buf.Bytes(), 0o644)
	}
}

// ---- apply ----

func applyFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "node directory (required)")
	asHex := fs.Bool("hex", false, `files hold hex, one signed event a line (blank lines and # comments skipped); default: each file is one raw COSE_Sign1 event. "-" reads stdin`)
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir"); err != nil {
			return err
		}
		files := fs.Args()
		if len(files) == 0 {
			return inputErr("no input files")
		}
		return withNode(e, *dir, func(n *runtime.Node) error {
			var failed error
			for _, name := range files {
				if err := applyFile(e, n, name, *asHex); err != nil {
					// Infrastructure failure: report it, go on with the
					// other files, exit non-zero at the end.
					fmt.Fprintf(e.stderr, "sspctl apply: %s: %v\n", name, err)
					failed = errors.Join(failed, err)
				}
			}
			if failed != nil {
				return fmt.Errorf("some inputs failed: %w", failed)
			}
			return nil
		})
	}
}

func readInput(e env, name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(e.stdin)
	}
	return os.ReadFile(name)
}

// applyFile applies one file's events. Dropped, rejected or held events
// are outcomes, printed like any other; only I/O and node errors return.
func applyFile(e env, n *runtime.Node, name string, asHex bool) error {
	data, err := readInput(e, name)
	if err != nil {
		return err
	}
	if !asHex {
		return applyOne(e, n, name, data)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		where := fmt.Sprintf("%s:%d", name, line)
		raw, err := hex.DecodeString(text)
		if err != nil {
			// Never reached the node: reported as the drop it would be
			// (a malformed signed event), not as an infrastructure error.
			fmt.Fprintf(e.stdout, "%s id=- outcome=dropped reason=malformed detail=%q\n", where, "not submitted: line is not hex: "+err.Error())
			continue
		}
		if err := applyOne(e, n, where, raw); err != nil {
			return err
		}
	}
	return sc.Err()
}

func applyOne(e env, n *runtime.Node, where string, raw []byte) error {
	o, err := n.ApplySigned(e.ctx, raw)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	fmt.Fprintln(e.stdout, formatOutcome(where, o))
	return nil
}

// formatOutcome prints one outcome on one line of key=value pairs.
func formatOutcome(where string, o messages.Outcome) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s id=%s outcome=%s reason=%s", where, o.ID, o.Kind, o.Reason)
	if o.BelowHorizon {
		b.WriteString(" below_horizon=true")
	}
	if o.Schema != "" {
		fmt.Fprintf(&b, " table=%s.%s site=%s hlc=%s", o.Schema, o.Table, o.Site, o.HLC)
	}
	fmt.Fprintf(&b, " detail=%q", o.Detail)
	return b.String()
}

// ---- dump ----

// dumpTable is dump's JSON document.
type dumpTable struct {
	Schema     string    `json:"schema"`
	Table      string    `json:"table"`
	KeyColumns []string  `json:"key_columns"`
	Columns    []string  `json:"columns"`
	Horizon    string    `json:"horizon"`
	Rows       []dumpRow `json:"rows"`
}

type dumpRow struct {
	Key       map[string]any      `json:"key"`
	Exists    bool                `json:"exists"`
	Existence *clockJSON          `json:"existence"`
	Tomb      *clockJSON          `json:"tomb"`
	Cells     map[string]dumpCell `json:"cells"`
}

// dumpCell: Value is a pointer to the raw JSON so that an unmaterialized
// cell has no "value" field at all while a null is "value": null (§13.6).
type dumpCell struct {
	State string           `json:"state"`
	Value *json.RawMessage `json:"value,omitempty"`
	Clock *clockJSON       `json:"clock"`
}

func dumpFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	dir := fs.String("dir", "", "node directory (required)")
	schema := fs.String("schema", "", "schema name (required)")
	table := fs.String("table", "", "table name (required)")
	all := fs.Bool("all", true, "include tombstoned rows (default true: dump is a debugging tool; --all=false shows live rows only)")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "dir", "schema", "table"); err != nil {
			return err
		}
		return withNode(e, *dir, func(n *runtime.Node) error {
			doc, err := dump(e.ctx, n, *schema, *table, *all)
			if err != nil {
				return err
			}
			enc := json.NewEncoder(e.stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(doc)
		})
	}
}

func dump(ctx context.Context, n *runtime.Node, schema, table string, all bool) (*dumpTable, error) {
	doc := &dumpTable{Schema: schema, Table: table, Rows: []dumpRow{}}
	defs, err := n.Tables(ctx)
	if err != nil {
		return nil, err
	}
	for _, d := range defs {
		if d.Schema == schema && d.Table == table {
			doc.KeyColumns, doc.Columns = d.KeyColumns, d.Columns
		}
	}
	h, err := n.Horizon(ctx, schema, table)
	if err != nil {
		return nil, err
	}
	doc.Horizon = h.String()
	for r, err := range n.Rows(ctx, schema, table, runtime.ScanOptions{IncludeDeleted: all}) {
		if err != nil {
			return nil, err
		}
		dr, err := dumpOne(r)
		if err != nil {
			return nil, err
		}
		doc.Rows = append(doc.Rows, dr)
	}
	return doc, nil
}

func dumpOne(r runtime.Row) (dumpRow, error) {
	key, err := columnsJSON(r.Key)
	if err != nil {
		return dumpRow{}, fmt.Errorf("row key: %w", err)
	}
	dr := dumpRow{Key: key, Exists: r.Exists, Existence: clockOut(r.Existence), Tomb: clockOut(r.Tomb), Cells: map[string]dumpCell{}}
	for name, c := range r.Cells {
		dc := dumpCell{State: c.State.String(), Clock: clockOut(c.Clock)}
		if c.State != runtime.Unmaterialized {
			v, err := valueJSON(c.Value)
			if err != nil {
				return dumpRow{}, fmt.Errorf("cell %s: %w", name, err)
			}
			b, err := json.Marshal(v)
			if err != nil {
				return dumpRow{}, fmt.Errorf("cell %s: %w", name, err)
			}
			raw := json.RawMessage(b)
			dc.Value = &raw
		}
		dr.Cells[name] = dc
	}
	return dr, nil
}
