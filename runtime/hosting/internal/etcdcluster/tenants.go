package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/syncmesh/syncmesh/messages"
	"github.com/syncmesh/syncmesh/runtime"
	"github.com/syncmesh/syncmesh/runtime/hosting"
)

// TenantReport is what -mode tenants measured.
type TenantReport struct {
	// Refused maps each of tenant A's attempts on tenant B's units to the
	// error it got; NotForbidden lists those not refused with
	// hosting.ErrForbidden.
	Refused      map[string]string
	NotForbidden []string
	// BIntact: B's pending message, processed record and pending sent
	// message are as before A's attempts.
	BIntact bool
	BState  string
	// The creation flood: units A created and refused past its quota,
	// and the data root's disk use (allocated bytes) before, at the
	// flood's height and after deleting its units.
	Created, OverQuota           int
	DiskBefore, DiskFlood, After int64
	Errors                       []string
}

// tenants runs, as a router-only member, tenant A's attempts on tenant
// B's units across the hosting members, then a creation flood.
func tenants(o opts) error {
	c, prov, err := open(o, true)
	if err != nil {
		return err
	}
	defer prov.Close()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for len(c.Members()) < o.members+o.routers {
		if ctx.Err() != nil {
			return fmt.Errorf("members: %v", c.Members())
		}
		time.Sleep(50 * time.Millisecond)
	}
	rep := &TenantReport{Refused: map[string]string{}}
	cl := hosting.Client{P: c}
	a := hosting.WithPrincipal(ctx, hosting.Principal{Tenant: "tenant-a"})
	b := hosting.WithPrincipal(ctx, hosting.Principal{Tenant: "tenant-b"})
	b1, b2, a1 := messages.DeviceAddress{User: "b1", Device: 1}, messages.DeviceAddress{User: "b2", Device: 1}, messages.DeviceAddress{User: "a1", Device: 1}
	for _, u := range []struct {
		ctx      context.Context
		kind, id string
	}{{b, hosting.KindDevice, "b1.1"}, {b, hosting.KindDevice, "b2.1"}, {b, hosting.KindGroup, "bgroup"}, {a, hosting.KindDevice, "a1.1"}} {
		if _, err := retry(u.ctx, func() error { _, err := cl.Create(u.ctx, u.kind, u.id); return err }); err != nil {
			return fmt.Errorf("create %s: %w", u.id, err)
		}
	}
	id := messages.LogicalMessageID{7}
	if _, err := retry(b, func() error { _, err := cl.Send(b, b2, b1, id, []byte("b's secret")); return err }); err != nil {
		return fmt.Errorf("b2 → b1: %w", err)
	}
	state := func() string {
		pend, err1 := cl.Pending(b, b1)
		_, processed, err2 := cl.Processed(b, b1, b2, id)
		sent, err3 := cl.PendingSent(b, b2)
		if err := errors.Join(err1, err2, err3); err != nil {
			return "error: " + err.Error()
		}
		body := ""
		if len(pend) == 1 {
			body = string(pend[0].Body)
		}
		return fmt.Sprintf("pending=%d body=%q processed=%v sent=%d", len(pend), body, processed, len(sent))
	}
	before := state()
	stolen := b2
	attempts := map[string]func() error{
		"read pending":      func() error { _, err := cl.Pending(a, b1); return err },
		"read pending sent": func() error { _, err := cl.PendingSent(a, b2); return err },
		"processed lookup":  func() error { _, _, err := cl.Processed(a, b1, b2, id); return err },
		"commit":            func() error { _, err := cl.Commit(a, b1, b2, id); return err },
		"discard":           func() error { _, err := cl.Discard(a, b1, b2, id, runtime.DiscardMalformed); return err },
		"send as b1":        func() error { _, err := cl.Send(a, b1, a1, messages.LogicalMessageID{8}, []byte("as b1")); return err },
		"create b's unit":   func() error { _, err := cl.Create(a, hosting.KindDevice, "b1.1"); return err },
		"delete b's unit":   func() error { return cl.Delete(a, hosting.KindDevice, "b1.1") },
		"b's group":         func() error { _, _, _, err := cl.Digest(a, "bgroup"); return err },
		// Delivery as b2 from this member, naming another member in the
		// Caller field: the receiver takes the caller from this
		// member's certificate, and b2 is not placed here.
		"deliver as b2": func() error {
			_, err := c.Request(a, hosting.KindDevice, "b1.1", &hosting.Request{Op: hosting.OpDeliver, Peer: &stolen, Envelope: []byte("please wire 100 EUR to mallory"), Caller: c.MemberOf(hosting.KindDevice, "b2.1")})
			return err
		},
		"bundle as b2": func() error {
			_, err := c.Request(a, hosting.KindDevice, "b1.1", &hosting.Request{Op: hosting.OpBundle, Peer: &stolen})
			return err
		},
	}
	for name, f := range attempts {
		err := f()
		rep.Refused[name] = fmt.Sprint(err)
		if !errors.Is(err, hosting.ErrForbidden) {
			rep.NotForbidden = append(rep.NotForbidden, name)
		}
	}
	rep.BState = state()
	rep.BIntact = rep.BState == before && before == `pending=1 body="b's secret" processed=false sent=1`

	// The creation flood (members run with -quota).
	rep.DiskBefore = diskUse(o.root)
	var made []string
	for i := 0; i < o.quota+10; i++ {
		u := fmt.Sprintf("flood%03d", i)
		_, err := retry(a, func() error { _, err := cl.Create(a, hosting.KindGroup, u); return err })
		switch {
		case err == nil:
			made = append(made, u)
		case errors.Is(err, hosting.ErrQuota):
			rep.OverQuota++
		default:
			rep.Errors = append(rep.Errors, err.Error())
		}
	}
	rep.Created = len(made)
	rep.DiskFlood = diskUse(o.root)
	for _, u := range made {
		if _, err := retry(a, func() error { return cl.Delete(a, hosting.KindGroup, u) }); err != nil {
			rep.Errors = append(rep.Errors, err.Error())
		}
	}
	rep.After = diskUse(o.root)
	emit(Event{Ev: "tenants", Tenant: rep, At: time.Now().UnixNano()})
	return nil
}

// retry repeats f while its unit is unavailable (every operation is
// idempotent).
func retry(ctx context.Context, f func() error) (int, error) {
	for n := 1; ; n++ {
		err := f()
		if err == nil || !errors.Is(err, hosting.ErrUnavailable) || ctx.Err() != nil {
			return n, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// diskUse is the allocated size of the files under root.
func diskUse(root string) int64 {
	var n int64
	_ = filepath.Walk(root, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}
