package actortest

import (
	"testing"
	"time"
)

func TestClockAdvances(t *testing.T) {
	start := time.UnixMilli(1000)
	c := NewClock(start)
	c.Advance(time.Second)
	if got := c.Now(); !got.Equal(start.Add(time.Second)) {
		t.Fatalf("Now = %v", got)
	}
	c.Advance(-2 * time.Second)
	if got := c.Now(); !got.Equal(start.Add(-time.Second)) {
		t.Fatalf("Now after going back = %v", got)
	}
	if System(t) == nil {
		t.Fatal("no system")
	}
}
