package session

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncmesh/syncmesh/crypto/ratchet"
	"github.com/syncmesh/syncmesh/messages"
)

// Per-sender budgets for decrypt attempts. A decrypt
// is the expensive step before anything is authenticated: an initiation
// costs several DH and a KEM decapsulation, a header far ahead a run of
// KDF steps. Every attempt takes a token from its sender's bucket and a
// success gives it back, so honest traffic never runs dry; a sender whose
// envelopes keep failing is refused without any cryptography
// (ErrDecryptBudget) until its bucket refills. The buckets live in the
// Manager, not in the peer actor: an address this device holds nothing
// for keeps no actor (peer.go), and its budget must outlive that.

// Defaults of Config.FailedDecryptBurst and FailedDecryptRate.
const (
	DefaultFailedDecryptBurst = 32
	DefaultFailedDecryptRate  = 1.0
	// maxBudgets bounds the senders whose budget is tracked at once.
	maxBudgets = 4096
)

// DecryptCounters counts the decrypt work a Manager did, for tests and
// metrics: Attempts (every call into the ratchet's Decrypt),
// Initiations (attempts carrying an initiation for a session the record
// does not hold: the DH/KEM-heavy case), Failures, and Refused (envelopes
// refused by the budget, with no cryptography). Work is the operations
// every attempt computed (DH, KEM, KDF steps, signature checks: the prekey
// store's load included) and FailedWork the part of it spent on attempts
// that failed — what a flood of forgeries costs.
type DecryptCounters struct {
	Attempts, Initiations, Failures, Refused uint64
	Work, FailedWork                         ratchet.Work
}

type budgets struct {
	rate  float64
	burst int

	mu      sync.Mutex
	buckets map[messages.DeviceAddress]*budget

	attempts, initiations, failures, refused atomic.Uint64

	workMu           sync.Mutex
	work, failedWork ratchet.Work
}

// addWork counts one attempt's work.
func (b *budgets) addWork(w ratchet.Work, failed bool) {
	b.workMu.Lock()
	b.work.Add(w)
	if failed {
		b.failedWork.Add(w)
	}
	b.workMu.Unlock()
}

type budget struct {
	tokens float64
	at     time.Time
}

// take takes one token of peer's budget at now; false: refused.
func (b *budgets) take(peer messages.DeviceAddress, now time.Time) bool {
	if b.burst <= 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buckets == nil {
		b.buckets = map[messages.DeviceAddress]*budget{}
	}
	k := b.buckets[peer]
	if k == nil {
		if len(b.buckets) >= maxBudgets {
			// Forget the senders whose budget is full again: they lose
			// nothing. If none is, refuse the newcomer.
			for a, o := range b.buckets {
				if o.tokens+now.Sub(o.at).Seconds()*b.rate >= float64(b.burst) {
					delete(b.buckets, a)
				}
			}
			if len(b.buckets) >= maxBudgets {
				return false
			}
		}
		k = &budget{tokens: float64(b.burst), at: now}
		b.buckets[peer] = k
	}
	if d := now.Sub(k.at); d > 0 {
		k.tokens = min(float64(b.burst), k.tokens+d.Seconds()*b.rate)
		k.at = now
	}
	if k.tokens < 1 {
		return false
	}
	k.tokens--
	return true
}

// refund gives back the token of a successful attempt.
func (b *budgets) refund(peer messages.DeviceAddress) {
	if b.burst <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if k := b.buckets[peer]; k != nil {
		k.tokens = min(float64(b.burst), k.tokens+1)
		if k.tokens >= float64(b.burst) {
			delete(b.buckets, peer) // full: nothing to remember
		}
	}
}

func budgetError(peer messages.DeviceAddress) error {
	return fmt.Errorf("%w: %s", ErrDecryptBudget, peer)
}

// DecryptCounters returns the decrypt work done so far.
func (m *Manager) DecryptCounters() DecryptCounters {
	b := &m.budgets
	b.workMu.Lock()
	defer b.workMu.Unlock()
	return DecryptCounters{Attempts: b.attempts.Load(), Initiations: b.initiations.Load(),
		Failures: b.failures.Load(), Refused: b.refused.Load(), Work: b.work, FailedWork: b.failedWork}
}
