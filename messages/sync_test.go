package messages

import (
	"bytes"
	"errors"
	"testing"
)

func samplePush() *SyncPush {
	return &SyncPush{
		V: SyncVersion, From: "node-a", Log: bytes.Repeat([]byte{7}, 16),
		After: 10, Through: 20, Tail: 40,
		Events: []PushedEvent{{Seq: 3, Raw: []byte{1, 2}}, {Seq: 11, Raw: []byte{3}}, {Seq: 20, Raw: []byte{4}}},
		Claims: []WatermarkClaim{{Group: Group{Site: SiteID{1}, Schema: "s", Table: "t"}, HLC: 99, Seq: 18}},
	}
}

func TestSyncPushRoundTrip(t *testing.T) {
	p := samplePush()
	b, err := EncodeSyncPush(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeSyncPush(b)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := EncodeSyncPush(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, b2) || got.Claims[0].Group.Site != (SiteID{1}) || got.Events[1].Seq != 11 {
		t.Fatalf("round trip changed the push: %+v", got)
	}
}

func TestSyncPushRejectsProtocolViolations(t *testing.T) {
	cases := map[string]func(p *SyncPush){
		"version":          func(p *SyncPush) { p.V = 2 },
		"empty from":       func(p *SyncPush) { p.From = "" },
		"short log id":     func(p *SyncPush) { p.Log = p.Log[:8] },
		"through < after":  func(p *SyncPush) { p.Through = 5 },
		"tail < through":   func(p *SyncPush) { p.Tail = 19 },
		"unordered events": func(p *SyncPush) { p.Events[0].Seq = 12 },
		"event past range": func(p *SyncPush) { p.Events[2].Seq = 21 },
		"zero seq":         func(p *SyncPush) { p.Events[0].Seq = 0 },
		"empty raw":        func(p *SyncPush) { p.Events[1].Raw = nil },
		"claim past range": func(p *SyncPush) { p.Claims[0].Seq = 21 },
		"claim no table":   func(p *SyncPush) { p.Claims[0].Group.Table = "" },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			p := samplePush()
			mutate(p)
			raw, err := Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			_, err = DecodeSyncPush(raw)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrSyncInvalid) && !errors.Is(err, ErrUnsupportedVersion) {
				t.Fatalf("untyped error %v", err)
			}
		})
	}
}

func TestSyncPushRejectsBadSiteLength(t *testing.T) {
	type badGroup struct {
		_      struct{} `cbor:",toarray"`
		Site   []byte
		Schema string
		Table  string
	}
	type badClaim struct {
		_     struct{} `cbor:",toarray"`
		Group badGroup
		HLC   HLC
		Seq   uint64
	}
	p := samplePush()
	raw, err := Marshal(map[string]any{
		"v": p.V, "from": p.From, "log": p.Log, "after": p.After, "through": p.Through, "tail": p.Tail,
		"events": p.Events, "claims": []badClaim{{Group: badGroup{Site: []byte{1, 2, 3}, Schema: "s", Table: "t"}, HLC: 1, Seq: 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeSyncPush(raw); !errors.Is(err, ErrMalformed) {
		t.Fatalf("3-byte site id: got %v, want ErrMalformed", err)
	}
}

func TestPushResultRoundTrip(t *testing.T) {
	r := &PushResult{V: SyncVersion, Applied: 3, Held: []Group{{Site: SiteID{2}, Schema: "s", Table: "t"}}, Retry: []uint64{4, 9}, Rejected: 1,
		Watermarks: []GroupWatermark{{Group: Group{Site: SiteID{2}, Schema: "s", Table: "u"}, HLC: 5}}}
	b, err := EncodePushResult(r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodePushResult(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Applied != 3 || len(got.Retry) != 2 || got.Watermarks[0].HLC != 5 || got.Held[0].Site != (SiteID{2}) {
		t.Fatalf("round trip: %+v", got)
	}
	bad := *r
	bad.Rejected = 3
	raw, _ := Marshal(&bad)
	if _, err := DecodePushResult(raw); !errors.Is(err, ErrSyncInvalid) {
		t.Fatalf("rejected > retry: %v", err)
	}
}

func sampleProbe() *SyncPush {
	return &SyncPush{V: SyncVersion, From: "node-a", Log: bytes.Repeat([]byte{7}, 16), After: 10, Through: 10, Tail: 40,
		Offer: []OfferRange{{Site: SiteID{1}, From: 5, To: 9, Count: 3, Digest: bytes.Repeat([]byte{1}, OfferDigestSize)}}}
}

// A probe carries nothing but its ranges, each well formed, describing at
// most one push's events; at and past each limit on decode.
func TestSyncProbeLimitsAtAndPastTheEdge(t *testing.T) {
	b, err := EncodeSyncPush(sampleProbe())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeSyncPush(b); err != nil || len(got.Offer) != 1 || got.Offer[0].Count != 3 {
		t.Fatalf("probe round trip: %+v, %v", got, err)
	}
	atLimit := sampleProbe()
	atLimit.Offer = nil
	for i := 0; i < MaxOfferRanges; i++ {
		atLimit.Offer = append(atLimit.Offer, OfferRange{Site: SiteID{byte(i)}, From: 1, To: 1, Count: MaxPushEvents / MaxOfferRanges, Digest: make([]byte, OfferDigestSize)})
	}
	if _, err := EncodeSyncPush(atLimit); err != nil {
		t.Fatalf("%d ranges describing %d events refused: %v", MaxOfferRanges, MaxPushEvents, err)
	}
	cases := map[string]func(p *SyncPush){
		"too many ranges": func(p *SyncPush) {
			for len(p.Offer) <= MaxOfferRanges {
				p.Offer = append(p.Offer, p.Offer[0])
			}
		},
		"too many events": func(p *SyncPush) {
			p.Offer = append(p.Offer, OfferRange{From: 1, To: 2, Count: MaxPushEvents - 2, Digest: p.Offer[0].Digest})
		},
		"zero count":   func(p *SyncPush) { p.Offer[0].Count = 0 },
		"from > to":    func(p *SyncPush) { p.Offer[0].From = 10 },
		"short digest": func(p *SyncPush) { p.Offer[0].Digest = p.Offer[0].Digest[:8] },
		"with events":  func(p *SyncPush) { p.Through = 11; p.Events = []PushedEvent{{Seq: 11, Raw: []byte{1}}} },
		"with a range": func(p *SyncPush) { p.Through = 12 },
		"with claims":  func(p *SyncPush) { p.Claims = samplePush().Claims[:1]; p.Claims[0].Seq = 1 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			p := sampleProbe()
			mutate(p)
			raw, err := Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := DecodeSyncPush(raw); !errors.Is(err, ErrSyncInvalid) {
				t.Fatalf("got %v, want ErrSyncInvalid", err)
			}
		})
	}
	r := &PushResult{V: SyncVersion, Verdicts: []uint64{VerdictSend, VerdictHave, VerdictBusy}, Probe: true}
	rb, err := EncodePushResult(r)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodePushResult(rb); err != nil || len(got.Verdicts) != 3 || !got.Probe {
		t.Fatalf("verdicts round trip: %+v, %v", got, err)
	}
	for _, bad := range [][]uint64{{0}, {VerdictBusy + 1}, make([]uint64, MaxOfferRanges+1)} {
		raw, _ := Marshal(&PushResult{V: SyncVersion, Verdicts: bad})
		if _, err := DecodePushResult(raw); !errors.Is(err, ErrSyncInvalid) {
			t.Fatalf("verdicts %v: got %v, want ErrSyncInvalid", bad[:1], err)
		}
	}
}

func FuzzDecodeSyncPush(f *testing.F) {
	b, _ := EncodeSyncPush(samplePush())
	f.Add(b)
	b, _ = EncodeSyncPush(sampleProbe())
	f.Add(b)
	f.Add([]byte{0xa0})
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := DecodeSyncPush(data)
		if err != nil {
			return
		}
		again, err := EncodeSyncPush(p)
		if err != nil {
			t.Fatalf("decoded push does not re-encode: %v", err)
		}
		if _, err := DecodeSyncPush(again); err != nil {
			t.Fatalf("re-encoded push does not decode: %v", err)
		}
	})
}

func FuzzDecodePushResult(f *testing.F) {
	b, _ := EncodePushResult(&PushResult{V: SyncVersion, Retry: []uint64{1}, Rejected: 1})
	f.Add(b)
	b, _ = EncodePushResult(&PushResult{V: SyncVersion, Verdicts: []uint64{VerdictSend, VerdictBusy}, Probe: true})
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodePushResult(data)
		if err != nil {
			return
		}
		if _, err := EncodePushResult(r); err != nil {
			t.Fatalf("decoded result does not re-encode: %v", err)
		}
	})
}
