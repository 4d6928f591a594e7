package main

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestChatCrashAndRedelivery builds the example and runs it end to end:
// bob's process receives alice's message, is SIGKILLed before its
// application commits, restarts, gets the same message again with the
// same sequence and receive time, and commits it; alice's pending list
// holds the message until bob's ACK; a "spam:" message is discarded and
// acknowledged. The parent checks each step itself (and exits non-zero
// otherwise); the test checks them again from the output.
func TestChatCrashAndRedelivery(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "chat")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, tc := range []struct {
		name string
		args []string
		mode string
	}{
		{"mutual TLS", nil, "(mutual TLS)"},
		{"plaintext", []string{"-plaintext"}, "(plaintext gRPC (-plaintext))"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command(bin, append([]string{"-dir", t.TempDir(), "-timeout", "60s"}, tc.args...)...).CombinedOutput()
			s := string(out)
			if err != nil {
				t.Fatalf("chat: %v\n%s", err, s)
			}
			if !strings.Contains(s, tc.mode) {
				t.Fatalf("output lacks %q:\n%s", tc.mode, s)
			}
			checkChatOutput(t, s)
		})
	}
}

func checkChatOutput(t *testing.T, s string) {
	t.Helper()
	find := func(re string) []string {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(s)
		if m == nil {
			t.Fatalf("output lacks /%s/:\n%s", re, s)
		}
		return m
	}
	sent := find(`\[alice\] sent id=([0-9a-f]{32}) seq=(\d+) body="hello bob"`)
	id := sent[1]
	first := find(`\[bob#1\] delivered id=` + id + ` seq=(\d+) received_at=(\S+) body="hello bob"`)
	find(`\[bob#1\] stopping before the commit of id=` + id)
	find(`\[parent\] bob#1 \(pid \d+\) exited: signal: killed`)
	if strings.Contains(s, "[bob#1] COMMITTED") || strings.Contains(s, "[bob#1] DISCARDED") {
		t.Fatalf("bob#1 finalized something before it was killed:\n%s", s)
	}
	// After the kill, before bob restarts: alice's one pending message.
	find(`\[bob#1\] ready; received messages pending the application's commit: 0`)
	find(`\[bob#2\] ready; received messages pending the application's commit: 1`)
	afterKill := s[strings.Index(s, "exited: signal: killed"):strings.Index(s, "[bob#2] ready")]
	if !regexp.MustCompile(`\[alice\] pending sent messages: 1\n\[alice\]   id=` + id + ` seq=` + sent[2]).MatchString(afterKill) {
		t.Fatalf("alice's pending list after the kill does not hold %s:\n%s", id, afterKill)
	}
	again := find(`\[bob#2\] delivered id=` + id + ` seq=(\d+) received_at=(\S+) body="hello bob"`)
	if again[1] != first[1] || again[2] != first[2] {
		t.Fatalf("redelivered as seq %s at %s, first delivered as seq %s at %s", again[1], again[2], first[1], first[2])
	}
	committed := regexp.MustCompile(`\[bob#2\] COMMITTED id=`+id+` seq=`+first[1]+` ack_sent=true`).FindAllStringIndex(s, -1)
	if len(committed) != 1 {
		t.Fatalf("%d COMMITTED lines for %s, want 1:\n%s", len(committed), id, s)
	}
	if !regexp.MustCompile(`\[alice\] pending sent messages: 0`).MatchString(s[committed[0][1]:]) {
		t.Fatalf("alice's pending list never emptied after the commit:\n%s", s)
	}
	spam := find(`\[alice\] sent id=([0-9a-f]{32}) seq=\d+ body="spam: buy now"`)
	discarded := find(`\[bob#2\] DISCARDED id=` + spam[1] + ` seq=\d+ ack_sent=true finalized_at=\S+ reason=rejected by policy`)
	tail := s[strings.Index(s, discarded[0]):]
	if !strings.Contains(tail, "[alice] pending sent messages: 0") {
		t.Fatalf("alice's pending list never emptied after the discard:\n%s", s)
	}
	find(`chat: ok`)
}
