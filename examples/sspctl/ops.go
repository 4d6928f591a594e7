package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"time"

	"github.com/syncmesh/syncmesh/runtime"
)

// ---- pending / inbound (a running node's admin endpoint) ----

func pendingFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	addr := fs.String("addr", "", "the running node's metrics and admin address, host:port (Config.MetricsAddr) (required)")
	after := fs.Uint64("after", 0, "list the messages received after this sequence (the previous page's next cursor)")
	limit := fs.Int("limit", runtime.MaxPendingReportPage, fmt.Sprintf("at most this many messages (1..%d)", runtime.MaxPendingReportPage))
	raw := fs.Bool("json", false, "print the endpoint's JSON as is")
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this long")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "addr"); err != nil {
			return err
		}
		if *limit < 1 || *limit > runtime.MaxPendingReportPage {
			return inputErr("--limit %d: out of range (1..%d)", *limit, runtime.MaxPendingReportPage)
		}
		body, err := adminGet(e.ctx, *addr, fmt.Sprintf("/admin/pending?after=%d&limit=%d", *after, *limit), *timeout)
		if err != nil {
			return err
		}
		if *raw {
			_, err := e.stdout.Write(body)
			return err
		}
		var p runtime.PendingReportPage
		if err := json.Unmarshal(body, &p); err != nil {
			return err
		}
		for _, m := range p.Messages {
			fmt.Fprintf(e.stdout, "seq=%d sender=%s id=%s age=%.0fs deliveries=%d received=%s\n",
				m.Sequence, m.Sender, m.ID, m.AgeSeconds, m.Deliveries, m.ReceivedAt.UTC().Format(time.RFC3339))
		}
		fmt.Fprintf(e.stdout, "pending=%d shown=%d", p.Total, len(p.Messages))
		if p.More {
			fmt.Fprintf(e.stdout, " more: sspctl pending --addr %s --after %d", *addr, p.Next)
		}
		fmt.Fprintln(e.stdout)
		return nil
	}
}

// inboundFlags reads what a running node applied from each sender: the
// senders' push progress (/admin/inbound) and the applied watermark of
// every group (/admin/watermarks, SSP/1 §14.2).
func inboundFlags(fs *flag.FlagSet) func(env, *flag.FlagSet) error {
	addr := fs.String("addr", "", "the running node's metrics and admin address, host:port (Config.MetricsAddr) (required)")
	raw := fs.Bool("json", false, "print the endpoints' JSON as is (inbound, then watermarks)")
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this long")
	return func(e env, fs *flag.FlagSet) error {
		if err := require(fs, "addr"); err != nil {
			return err
		}
		in, err := adminGet(e.ctx, *addr, "/admin/inbound", *timeout)
		if err != nil {
			return err
		}
		wm, err := adminGet(e.ctx, *addr, "/admin/watermarks", *timeout)
		if err != nil {
			return err
		}
		if *raw {
			_, err := fmt.Fprintf(e.stdout, "%s%s", in, wm)
			return err
		}
		var senders []runtime.InboundReport
		if err := json.Unmarshal(in, &senders); err != nil {
			return err
		}
		var groups []runtime.WatermarkReport
		if err := json.Unmarshal(wm, &groups); err != nil {
			return err
		}
		if len(senders) == 0 {
			fmt.Fprintln(e.stdout, "no sender pushed to this node since it opened")
		}
		for _, s := range senders {
			at := ""
			if !s.At.IsZero() {
				at = " at=" + s.At.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(e.stdout, "from=%s through=%d tail=%d applied=%d gaps=%d%s\n", s.From, s.Through, s.Tail, s.Applied, s.Gaps, at)
		}
		for _, g := range groups {
			fmt.Fprintf(e.stdout, "group site=%s table=%s.%s applied_through=%s\n", g.Site, g.Schema, g.Table, g.HLC)
		}
		return nil
	}
}
