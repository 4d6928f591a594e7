// Command sspctl inspects and drives one syncmesh node directory from the
// command line: create a node, define tables, trust peers, sign events by
// hand, apply signed events, set eviction horizons, and dump a table with
// every cell's state and clock. It is a debugging tool for a mesh; every
// subcommand opens the node with runtime.Open and closes it before exiting.
// "sspctl tls ca" and "sspctl tls node" create a mesh CA and node
// certificates (runtime/meshtls), also those of runtime/hosting's cluster
// members (hosting.MemberTLS loads one; its name is the member's
// identity); "sspctl status|peers|watermarks|held|inbound|pending --addr"
// read a running node's admin endpoint (runtime.Config.MetricsAddr), and
// "sspctl reconcile|backup --addr" act through it with its admin token;
// "sspctl rotate-storage-key" re-seals a stopped node under a new key.
//
// Run "sspctl help" for the subcommands and "sspctl CMD --help" for the
// flags of each.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"
)

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1 // infrastructure or node error
	exitUsage = 2 // bad flags or input
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// env is what a subcommand runs with.
type env struct {
	ctx    context.Context
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	// lockTimeout bounds the wait for a node another process has open
	// (runtime.Config.LockTimeout).
	lockTimeout time.Duration
	// wall is the node's wall clock (runtime.Config.Wall); nil: time.Now.
	wall func() time.Time
}

// defaultLockTimeout is how long a command waits for the node's file lock
// before saying another process holds it.
const defaultLockTimeout = 5 * time.Second

// command is one subcommand: its flag set is built fresh per run.
type command struct {
	name    string
	summary string
	usage   string // argument synopsis after "sspctl NAME"
	flags   func(fs *flag.FlagSet) func(e env, fs *flag.FlagSet) error
}

func commands() []command {
	return []command{
		{"init", "create a node (keys, site id, mesh id) or print an existing one's identity", "--dir DIR [--mesh TEXT | --mesh-hex HEX]", initFlags},
		{"identity", "print the node's identity and the trust command for peers", "--dir DIR", identityFlags},
		{"define", "define a table, and/or add columns to it", "--dir DIR --schema S --table T --key id[,id2] [--columns a,b] [--add-column x[,y]]", defineFlags},
		{"add-column", "add value columns to a table, rebuilding them from the retained log", "--dir DIR --schema S --table T --column x[,y]", addColumnFlags},
		{"tables", "list the defined tables with their horizons", "--dir DIR", tablesFlags},
		{"trust", "trust a peer's signing key", "--dir DIR --kid HEX --site HEX --pubkey HEX [--cutoff HLC]", trustFlags},
		{"keys", "list the keyring (trusted signers, this node included)", "--dir DIR", keysFlags},
		{"horizon", "set (or show) a table's eviction horizon", "--dir DIR --schema S --table T [--hlc HLC]", horizonFlags},
		{"purge-held", "drop what is held for a site's table that is not defined here (events waiting for it, and their log entries)", "--dir DIR --site HEX --schema S --table T", purgeHeldFlags},
		{"sign", "sign JSON events with the node's key (does not apply them)", "--dir DIR [--in FILE|-] [--out FILE] [--hex]", signFlags},
		{"apply", "apply signed events from files and print each outcome", "--dir DIR [--hex] FILE...", applyFlags},
		{"status", "a running node's status from its admin endpoint", "--addr HOST:PORT [--json]", adminFlags("/admin/status", printStatus)},
		{"peers", "a running node's peers: cursor, backlog and lag in events and time, last error", "--addr HOST:PORT [--json]", adminFlags("/admin/peers", printPeers)},
		{"watermarks", "a running node's applied watermarks", "--addr HOST:PORT [--json]", adminFlags("/admin/watermarks", printWatermarks)},
		{"held", "a running node's groups held for a missing table: site, table, events, age of the oldest", "--addr HOST:PORT [--json]", adminFlags("/admin/held", printHeld)},
		{"inbound", "a running node's inbound progress: per sender how far its pushes reached and applied, per group the applied watermark", "--addr HOST:PORT [--json]", inboundFlags},
		{"pending", "a running node's received messages pending the application's commit: ids, senders, age, deliveries (a page)", "--addr HOST:PORT [--after SEQ] [--limit N] [--json]", pendingFlags},
		{"backup", "an online consistent copy of a running node's store (node.db) into FILE (admin token required)", "--addr HOST:PORT [--token-file FILE] FILE", backupFlags},
		{"reconcile", "reconcile a running node with one peer now (admin token required)", "--addr HOST:PORT --peer NAME [--token-file FILE] [--json]", reconcileFlags},
		{"rotate-storage-key", "replace a stopped node's storage key and re-seal every record under the new one (resumable)", "--dir DIR", rotateKeyFlags},
		{"tls ca", "create a mesh certificate authority (ca.pem, ca.key)", "--dir DIR [--name CN] [--days N]", tlsCAFlags},
		{"tls node", "issue a node certificate from the mesh CA, to serve and dial with mutual TLS", "--dir DIR --name NAME [--host 127.0.0.1,host] [--days N]", tlsNodeFlags},
		{"dump", "print a table as JSON: rows, existence, tombstones, cells with state and clock", "--dir DIR --schema S --table T [--all=false]", dumpFlags},
	}
}

func topUsage(w io.Writer) {
	fmt.Fprintf(w, "sspctl: inspect and drive a syncmesh node directory.\n\nUsage: sspctl COMMAND [flags]\n\nCommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-18s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun \"sspctl COMMAND --help\" for a command's flags.\n"+
		"HLCs are written physical_ms.logical (e.g. 1700000000000.3) or as the raw packed integer.\n"+
		"Exit status: 0 ok, 1 node or I/O error, 2 bad flags or input.\n"+
		"A node is opened by one process at a time: a command gives up after %s if another holds it.\n", defaultLockTimeout)
}

// run is the whole tool, callable in-process by tests.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return runEnv(env{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr, lockTimeout: defaultLockTimeout}, args)
}

// runEnv runs one command line in e (tests set the lock timeout and the
// wall clock).
func runEnv(e env, args []string) int {
	stdout, stderr := e.stdout, e.stderr
	if len(args) == 0 {
		topUsage(stderr)
		return exitUsage
	}
	name := args[0]
	if name == "tls" && len(args) > 1 && !strings.HasPrefix(args[1], "-") {
		// Two-word commands: "tls ca", "tls node".
		name, args = "tls "+args[1], args[1:]
	}
	switch name {
	case "-h", "-help", "--help", "help":
		if len(args) > 1 && name == "help" {
			return runEnv(e, []string{args[1], "--help"})
		}
		topUsage(stdout)
		return exitOK
	}
	var cmd *command
	for _, c := range commands() {
		if c.name == name {
			cmd = &c
			break
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "sspctl: unknown command %q\n\n", name)
		topUsage(stderr)
		return exitUsage
	}
	fs := flag.NewFlagSet("sspctl "+cmd.name, flag.ContinueOnError)
	var help bytes.Buffer
	fs.SetOutput(&help)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "sspctl %s: %s\n\nUsage: sspctl %s %s\n\nFlags:\n", cmd.name, cmd.summary, cmd.name, cmd.usage)
		fs.PrintDefaults()
	}
	body := cmd.flags(fs)
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			_, _ = stdout.Write(help.Bytes())
			return exitOK
		}
		_, _ = stderr.Write(help.Bytes())
		return exitUsage
	}
	if err := body(e, fs); err != nil {
		fmt.Fprintf(stderr, "sspctl %s: %v\n", cmd.name, err)
		if errors.Is(err, errInput) {
			return exitUsage
		}
		return exitError
	}
	return exitOK
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// require reports the first empty required flag.
func require(fs *flag.FlagSet, names ...string) error {
	for _, n := range names {
		if f := fs.Lookup(n); f == nil || f.Value.String() == "" {
			return inputErr("--%s is required", n)
		}
	}
	return nil
}
