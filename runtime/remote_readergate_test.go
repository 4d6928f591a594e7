package runtime

import (
	"sync"
	"testing"
	"time"
)

// The gate's rule: once close began no hold is granted, and close returns
// only after every granted hold was released (or its timeout passed).
func TestReaderGateClosesAfterEveryHoldEnds(t *testing.T) {
	var g readerGate
	var a, b bool
	if !g.hold(&a) || !g.hold(&b) {
		t.Fatal("hold refused before close")
	}
	closed := make(chan bool, 1)
	go func() { closed <- g.close(time.Minute) }()
	for !g.isClosing() {
		time.Sleep(time.Millisecond)
	}
	var c bool
	if g.hold(&c) || c {
		t.Fatal("hold granted after close began")
	}
	g.release(&a)
	g.release(&a) // a second release of the same hold changes nothing
	select {
	case <-closed:
		t.Fatal("close returned while a stream still held the gate")
	case <-time.After(20 * time.Millisecond):
	}
	g.release(&b)
	if ok := <-closed; !ok {
		t.Fatal("close reported a hold left after every release")
	}
}

func TestReaderGateCloseGivesUpAfterItsTimeout(t *testing.T) {
	var g readerGate
	var a bool
	g.hold(&a)
	if g.close(10 * time.Millisecond) {
		t.Fatal("close reported no hold while one was never released")
	}
}

// Under -race: holds and releases racing a close leave no race, and
// close returns once the streams stop.
func TestReaderGateUnderConcurrentStreams(t *testing.T) {
	var g readerGate
	var wg sync.WaitGroup
	flag := false // stands for protoactor's unsynchronized suspended flag
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held bool
			for {
				g.release(&held)
				if !g.hold(&held) {
					return
				}
				_ = flag // read while holding, as the reader does
			}
		}()
	}
	time.Sleep(5 * time.Millisecond)
	if !g.close(time.Minute) {
		t.Fatal("close timed out")
	}
	flag = true // Shutdown's write: after every read
	wg.Wait()
}
