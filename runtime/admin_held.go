package runtime

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncmesh/syncmesh/actors/promreg"
	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/persistence"
)

// MaxHeldReports bounds HeldReports (and /admin/held): the first groups in
// the store's order. Status.HeldGroups still counts every held group.
const MaxHeldReports = 1000

// HeldReport is one group whose events wait at this node for a table it
// has not defined (SSP/1 §13.3), as /admin/held reports it.
type HeldReport struct {
	// Site is the origin site of the held events.
	Site string `json:"site"`
	// MissingTable is the table the events wait for, "schema.table":
	// DefineTable releases them; PurgeHeld drops them.
	MissingTable string `json:"missing_table"`
	Schema       string `json:"schema"`
	Table        string `json:"table"`
	// Events is how many events of the group are held.
	Events int `json:"events"`
	// OldestHLC is the HLC of the group's first held event, and AgeSeconds
	// how long before now it was written: a lower bound on how long the
	// group has waited here.
	OldestHLC  string  `json:"oldest_hlc"`
	AgeSeconds float64 `json:"age_seconds"`
}

// RestoreReport is the restore check of the node's last Open, as
// /admin/status reports it (RestoreStatus).
type RestoreReport struct {
	// Suspected: the Open looked like a restore of node.db (its clock mark
	// was below the clock mark file's, or the file was missing).
	Suspected bool   `json:"suspected"`
	Reason    string `json:"reason,omitempty"`
	// Held: local writes wait for a first reconciliation (Config.Restored).
	Held bool `json:"writes_held"`
	// LogRotated: the Open gave the log a new id; peers take it as new.
	LogRotated bool `json:"log_rotated"`
}

func (n *Node) restoreReport() RestoreReport {
	st := n.RestoreStatus()
	return RestoreReport{Suspected: st.Suspected, Reason: st.Reason, Held: st.Held, LogRotated: st.LogRotated}
}

// HeldReports lists the groups held for a missing table, with the number
// of events each holds and the age of its oldest (at most MaxHeldReports
// groups), and how many groups are held in all.
func (n *Node) HeldReports(ctx context.Context) (reports []HeldReport, total int, err error) {
	if n.isClosed() {
		return nil, 0, ErrClosed
	}
	now := n.cfg.Wall()
	reports = []HeldReport{}
	err = n.store.View(ctx, func(tx persistence.SyncReader) error {
		groups, err := tx.HeldGroups()
		if err != nil {
			return err
		}
		total = len(groups)
		for _, g := range groups[:min(len(groups), MaxHeldReports)] {
			seqs, err := tx.HeldEvents(g)
			if err != nil {
				return err
			}
			r := HeldReport{Site: g.Site.String(), MissingTable: g.Schema + "." + g.Table, Schema: g.Schema, Table: g.Table, Events: len(seqs)}
			if len(seqs) > 0 {
				var oldest messages.HLC
				if err := tx.EventsAfter(seqs[0]-1, 1, func(e persistence.StoredEvent) (bool, error) {
					if e.Seq == seqs[0] {
						oldest = e.HLC
					}
					return false, nil
				}); err != nil {
					return err
				}
				if oldest != 0 {
					r.OldestHLC = oldest.String()
					written := time.UnixMilli(int64(oldest.Physical()))
					r.AgeSeconds = max(0, now.Sub(written).Seconds())
				}
			}
			reports = append(reports, r)
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return reports, total, nil
}

// registerHeldMetric registers syncmesh_sync_held_groups: one unlabelled
// series (bounded whatever the peers send), read from the store at scrape
// time; /admin/held and sspctl held list the groups.
func (n *Node) registerHeldMetric() error {
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "syncmesh_sync_held_groups",
		Help: "Groups whose events wait for a table this node has not defined (SSP/1 §13.3); /admin/held lists them with their missing table and age. NaN when the store cannot be read."},
		func() float64 {
			if n.isClosed() {
				return math.NaN()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var held int
			if err := n.store.View(ctx, func(tx persistence.SyncReader) error {
				gs, err := tx.HeldGroups()
				held = len(gs)
				return err
			}); err != nil {
				return math.NaN()
			}
			return float64(held)
		})
	if _, err := promreg.Register(n.registerer, prometheus.Collector(g)); err != nil {
		return fmt.Errorf("runtime: metrics: %w", err)
	}
	return nil
}
