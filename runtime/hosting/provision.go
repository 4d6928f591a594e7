package hosting

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Provisioning. A unit exists only once created (OpCreate): its owner
// file names the tenant owning it, beside its node's files, and a marker
// per unit under Root/tenants/<hex(tenant)>/ counts it against the
// tenant's quota. Both live in the shared root, so every member sees the
// same units and the same counts; creations and deletions are serialized
// across members (and processes) by an flock on Root/tenants.lock. None
// of this is in the nodes' bbolt files: their layout is unchanged.
//
// With replication (ClusterConfig.Replicas ≥ 2) the owner file is
// written, and the unit removed, through the unit's partition log by the
// partition's leader, so every replica holds it; the quota markers are
// slots of a replicated record per tenant, tenants/<hex(tenant)> in the
// partition that path hashes to, taken and given back through that
// partition's leader (whichever member it is): the count and the slot
// are one log entry, so the quota holds across members, take-overs and
// members rebuilt after losing their disk.

// ownerFile names the tenant owning a unit, in the unit's directory.
const ownerFile = "hosting.owner"

// DefaultTenantQuota is the number of units a tenant may own when
// Config.TenantQuota is zero.
const DefaultTenantQuota = 1000

// MaxTenant bounds a tenant name.
const MaxTenant = 128

func validTenant(t string) error {
	if t == "" || len(t) > MaxTenant || strings.ContainsAny(t, "\x00\n") {
		return fmt.Errorf("%w: tenant must be 1..%d bytes without NUL or newline", ErrForbidden, MaxTenant)
	}
	return nil
}

// ownerOf returns the tenant owning the unit; ErrNotProvisioned when it
// was never created or was deleted.
func ownerOf(root, kind, identity string) (string, error) {
	b, err := os.ReadFile(filepath.Join(unitDir(root, kind, identity), ownerFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%w: %s %q", ErrNotProvisioned, kind, identity)
	}
	if err != nil {
		return "", fmt.Errorf("hosting: read owner of %s %q: %w", kind, identity, err)
	}
	return strings.TrimSuffix(string(b), "\n"), nil
}

func tenantDir(root, tenant string) string {
	return filepath.Join(root, "tenants", hex.EncodeToString([]byte(tenant)))
}

func markerName(kind, identity string) string {
	return kind + "." + hex.EncodeToString([]byte(identity))
}

// quotaRecord is a tenant's replicated quota record: its path among the
// replicated files (the directory tenantDir names).
func quotaRecord(tenant string) string {
	return "tenants/" + hex.EncodeToString([]byte(tenant))
}

// quotaSlot names a unit's slot in its tenant's replicated record: a
// digest of the identity, so the name fits a file name whatever the
// identity's length (MaxIdentity).
func quotaSlot(kind, identity string) string {
	d := sha256.Sum256([]byte(identity))
	return kind + "." + hex.EncodeToString(d[:])
}

// provisionLock holds the root's provisioning lock until the returned
// function is called.
func provisionLock(root string) (func(), error) {
	if err := os.MkdirAll(filepath.Join(root, "tenants"), 0o700); err != nil {
		return nil, fmt.Errorf("hosting: provisioning lock: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(root, "tenants.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("hosting: provisioning lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("hosting: provisioning lock: %w", err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); _ = f.Close() }, nil
}

// provision creates the unit for tenant, within quota units per tenant.
// The owner creating it again is a no-op (created false); another tenant
// gets ErrForbidden. Nothing is written when it fails.
func provision(ctx context.Context, repl replicaSet, root, kind, identity, tenant string, quota int, sync bool) (created bool, err error) {
	if err := validTenant(tenant); err != nil {
		return false, err
	}
	unlock, err := provisionLock(root)
	if err != nil {
		return false, err
	}
	defer unlock()
	owner, err := ownerOf(root, kind, identity)
	switch {
	case err == nil && owner == tenant:
		return false, nil
	case err == nil:
		return false, fmt.Errorf("%w: %s %q belongs to another tenant", ErrForbidden, kind, identity)
	case !errors.Is(err, ErrNotProvisioned):
		return false, err
	}
	if repl != nil {
		return provisionReplicated(ctx, repl, kind, identity, tenant, quota)
	}
	td := tenantDir(root, tenant)
	ents, err := os.ReadDir(td)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("hosting: count units of tenant: %w", err)
	}
	marker := filepath.Join(td, markerName(kind, identity))
	if _, serr := os.Stat(marker); serr != nil && len(ents) >= quota {
		return false, fmt.Errorf("%w: tenant %q owns %d units, quota %d", ErrQuota, tenant, len(ents), quota)
	}
	dir := unitDir(root, kind, identity)
	// A directory left by an interrupted deletion holds nothing of a
	// provisioned unit (its owner file went first): start afresh.
	if err := os.RemoveAll(dir); err != nil {
		return false, fmt.Errorf("hosting: create %s %q: %w", kind, identity, err)
	}
	// The marker first: a crash before the owner file leaves a counted
	// unit that does not exist, never an uncounted one.
	if err := os.MkdirAll(td, 0o700); err != nil {
		return false, fmt.Errorf("hosting: create %s %q: %w", kind, identity, err)
	}
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		return false, fmt.Errorf("hosting: create %s %q: %w", kind, identity, err)
	}
	if err := writeFileAtomic(dir, ownerFile, []byte(tenant+"\n"), sync); err != nil {
		_ = os.Remove(marker)
		return false, fmt.Errorf("hosting: create %s %q: %w", kind, identity, err)
	}
	return true, nil
}

// provisionReplicated is provision's replicated half, once the unit was
// found unowned (this member leads the unit's partition: its copy of the
// owner file is current).
func provisionReplicated(ctx context.Context, repl replicaSet, kind, identity, tenant string, quota int) (bool, error) {
	path := unitPath(kind, identity)
	if err := repl.removeUnit(ctx, path); err != nil {
		return false, fmt.Errorf("hosting: create %s %q: %w", kind, identity, err)
	}
	// The slot first: a crash before the owner file leaves a counted
	// unit that does not exist, never an uncounted one.
	slot := quotaSlot(kind, identity)
	if err := repl.reserve(ctx, quotaRecord(tenant), slot, quota); err != nil {
		return false, fmt.Errorf("hosting: create %s %q: tenant %q, quota %d: %w", kind, identity, tenant, quota, err)
	}
	if err := repl.writeFile(ctx, path, ownerFile, []byte(tenant+"\n")); err != nil {
		if rerr := repl.release(ctx, quotaRecord(tenant), slot); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return false, fmt.Errorf("hosting: create %s %q: %w", kind, identity, err)
	}
	return true, nil
}

// unprovision deletes the unit's files and its quota marker (the unit
// must be closed on this member). Deleting a unit that does not exist is
// a no-op.
func unprovision(ctx context.Context, repl replicaSet, root, kind, identity string) error {
	unlock, err := provisionLock(root)
	if err != nil {
		return err
	}
	defer unlock()
	owner, err := ownerOf(root, kind, identity)
	if errors.Is(err, ErrNotProvisioned) {
		return nil
	}
	if err != nil {
		return err
	}
	dir := unitDir(root, kind, identity)
	if repl != nil {
		// One log entry removes every file of the unit on every replica.
		if err := repl.removeUnit(ctx, unitPath(kind, identity)); err != nil {
			return fmt.Errorf("hosting: delete %s %q: %w", kind, identity, err)
		}
	} else {
		// The owner file first: from then on the unit does not exist,
		// even if removing the rest is interrupted.
		if err := os.Remove(filepath.Join(dir, ownerFile)); err != nil {
			return fmt.Errorf("hosting: delete %s %q: %w", kind, identity, err)
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("hosting: delete %s %q: %w", kind, identity, err)
		}
	}
	if repl != nil {
		if err := repl.release(ctx, quotaRecord(owner), quotaSlot(kind, identity)); err != nil {
			return fmt.Errorf("hosting: delete %s %q: its quota slot: %w", kind, identity, err)
		}
		return nil
	}
	if err := os.Remove(filepath.Join(tenantDir(root, owner), markerName(kind, identity))); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("hosting: delete %s %q: %w", kind, identity, err)
	}
	return nil
}

// writeFileAtomic writes dir/name through a temporary file and a rename
// (and fsyncs when sync), creating dir.
func writeFileAtomic(dir, name string, b []byte, sync bool) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	path := filepath.Join(dir, name)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil && sync {
		if d, derr := os.Open(dir); derr == nil {
			err = d.Sync()
			_ = d.Close()
		}
	}
	return err
}
