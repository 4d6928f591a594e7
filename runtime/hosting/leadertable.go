package hosting

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/asynkron/protoactor-go/cluster"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Routing with more members than Replicas. A partition's raft group runs
// only on its voters, so a member that is not one of them (and whose
// engine therefore knows no leader) learns the partition's leader from
// the leaders themselves: every replicated member publishes the
// partitions it leads, with their terms, in the cluster's gossip (the
// members' remote, under their mutual TLS). A member's identity lookup,
// its activator (which forwards requests it receives for another
// leader's unit) and its attribution of device-to-device requests
// (MemberOf) all read the same table, and so does a router-only member
// (no engine at all): it sends a unit's requests straight to the leader
// the table names, and a new leader's claim (a higher term) redirects
// the requests still waiting on the old one at once, instead of after
// the old member's lease or its dial failures (a take-over's tail). The
// table only routes: a member serves a unit only while its own engine
// says it leads (incarnation.check), so a stale entry costs a retry,
// never a stale answer.

// leadsKey is the gossip key of a member's published leads.
const leadsKey = "syncmesh.replication.leads"

// errBadLeads: a published leads value is malformed (it is ignored).
var errBadLeads = errors.New("hosting: malformed partition leads")

// maxLeads bounds a published leads value: the engine's partition limit.
const maxLeads = 1 << 16

// leadsVersion is the first byte of an encoded leads value.
const leadsVersion = 1

// encodeLeads encodes the partitions a member leads: a version byte,
// then (partition, term) pairs as uvarints, partitions ascending.
func encodeLeads(leads map[int]uint64) ([]byte, error) {
	if len(leads) > maxLeads {
		return nil, fmt.Errorf("%w: %d partitions", errBadLeads, len(leads))
	}
	ps := make([]int, 0, len(leads))
	for p, term := range leads {
		if p < 0 || p >= maxLeads || term == 0 {
			return nil, fmt.Errorf("%w: partition %d term %d", errBadLeads, p, term)
		}
		ps = append(ps, p)
	}
	slices.Sort(ps)
	b := []byte{leadsVersion}
	for _, p := range ps {
		b = binary.AppendUvarint(b, uint64(p))
		b = binary.AppendUvarint(b, leads[p])
	}
	return b, nil
}

// decodeLeads is encodeLeads' inverse; it refuses (errBadLeads) anything
// encodeLeads does not produce.
func decodeLeads(b []byte) (map[int]uint64, error) {
	if len(b) == 0 || b[0] != leadsVersion {
		return nil, fmt.Errorf("%w: version", errBadLeads)
	}
	b = b[1:]
	out := map[int]uint64{}
	last := -1
	for len(b) > 0 {
		p, n := binary.Uvarint(b)
		// Minimal encodings only: one value, one encoding.
		if n <= 0 || p >= maxLeads || int(p) <= last || n != uvarintLen(p) {
			return nil, fmt.Errorf("%w: partition", errBadLeads)
		}
		b = b[n:]
		term, n := binary.Uvarint(b)
		if n <= 0 || term == 0 || n != uvarintLen(term) {
			return nil, fmt.Errorf("%w: term of partition %d", errBadLeads, p)
		}
		b = b[n:]
		out[int(p)] = term
		last = int(p)
	}
	return out, nil
}

// uvarintLen is the length of x's (minimal) uvarint encoding.
func uvarintLen(x uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], x)
}

// leadClaim is a member's claim to lead a partition in a term.
type leadClaim struct {
	member string
	term   uint64
}

// chooseLeader decides a partition's leader as this member sees it: its
// own engine's leader (local, "" if it knows none) in the latest term
// its engine observed (localTerm), and the claims the members in its
// view published. The highest term wins (raft has one leader per term);
// at equal terms this member's engine beats a claim. A term without a
// known leader hides nothing: a member whose engine runs an election (or
// a group it lost its seat in, where its term may run ahead) still
// routes by the claims, and a stale claim costs a retry. "" means no
// leader is known.
func chooseLeader(local string, localTerm uint64, claims []leadClaim) string {
	best, bestTerm := local, localTerm
	if local == "" {
		bestTerm = 0
	}
	for _, c := range claims {
		switch {
		case c.member == "" || c.term < bestTerm:
		case c.term > bestTerm, best == "":
			best, bestTerm = c.member, c.term
		case best != local && c.member < best:
			// Two claims of one term cannot both hold; choose one the
			// same way everywhere (the engine's term fences the other).
			best = c.member
		}
	}
	return best
}

// publishLeads publishes the partitions this member leads (by its
// leadership decisions) in inc's gossip.
func (c *Cluster) publishLeads(inc *incarnation) {
	if inc == nil || inc.cl == nil || inc.cl.Gossip == nil {
		return
	}
	// One publisher at a time: a barrier's completion and a leadership
	// change must not overwrite each other's newer leads with older.
	c.pubMu.Lock()
	defer c.pubMu.Unlock()
	b, err := encodeLeads(c.lead.leads())
	if err != nil {
		c.h.log.Warn("hosting: publish partition leads", "err", err)
		return
	}
	inc.cl.Gossip.SetState(leadsKey, wrapperspb.Bytes(b))
	// Sent now, not at the gossip's next round: routers and non-voters
	// wait on it to reach a new leader.
	go inc.cl.Gossip.SendState()
}

// onLeads records the leads a member published (from the gossip's
// updates; called by protoactor's event stream: quick, no calls back).
func (inc *incarnation) onLeads(memberID string, v *anypb.Any) {
	var bv wrapperspb.BytesValue
	if v == nil || v.UnmarshalTo(&bv) != nil {
		return
	}
	leads, err := decodeLeads(bv.Value)
	if err != nil {
		inc.c.h.log.Warn("hosting: partition leads from a member ignored", "member", memberID, "err", err)
		return
	}
	inc.mu.Lock()
	if inc.leads == nil {
		inc.leads = map[string]map[int]uint64{}
	}
	same := maps.Equal(inc.leads[memberID], leads)
	inc.leads[memberID] = leads
	inc.mu.Unlock()
	if !same {
		// Requests waiting on a replaced leader (or backing off) go to
		// the new one at once, not at their next attempt.
		inc.c.lead.notify()
	}
}

// onGossip handles the gossip updates the member reads.
func (inc *incarnation) onGossip(u *cluster.GossipUpdate) {
	if u.Key == leadsKey {
		inc.onLeads(u.MemberID, u.Value)
	}
}

// claims lists the leads of partition p published by the members in the
// current view (a member that left claims nothing). Called with inc.mu
// held.
func (inc *incarnation) claimsLocked(p int) []leadClaim {
	var out []leadClaim
	for id, leads := range inc.leads {
		if !inc.ids[id] {
			continue
		}
		if term, ok := leads[p]; ok {
			out = append(out, leadClaim{member: memberIDOf(id), term: term})
		}
	}
	return out
}
