package runtime

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
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
	var none bool
	for !g.release(&none) { // holds nothing: only asks whether close began
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

// fakeServerStream counts the receives guardedStream asks of gRPC.
type fakeServerStream struct {
	grpc.ServerStream
	recvs int
	err   error // what each receive returns
}

func (f *fakeServerStream) RecvMsg(any) error { f.recvs++; return f.err }

func (f *fakeServerStream) SendMsg(any) error { return nil }

func (f *fakeServerStream) Context() context.Context { return context.Background() }

// disconnect is what protoactor's reader sends on its stream when the
// stopping endpoint manager reaches it.
var disconnect = &remote.RemoteMessage{MessageType: &remote.RemoteMessage_DisconnectRequest{DisconnectRequest: &remote.DisconnectRequest{}}}

// The stream side: a returned message holds the gate until the next
// RecvMsg; once Close began, RecvMsg receives nothing more and returns
// errRemoteClosing, and Close's wait ends with that call.
func TestGuardedStreamHoldsTheGateUntilItsNextReceive(t *testing.T) {
	r := &Remote{}
	f := &fakeServerStream{}
	gs := &guardedStream{ServerStream: f, r: r}
	var msg struct{} // not a protoactor message: passed through as it is
	if err := gs.RecvMsg(&msg); err != nil || !gs.held {
		t.Fatalf("first receive: err %v, held %v", err, gs.held)
	}
	closed := make(chan bool, 1)
	go func() { closed <- r.readers.close(time.Minute) }()
	select {
	case <-closed:
		t.Fatal("close returned while the stream held its last message")
	case <-time.After(20 * time.Millisecond):
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		_ = gs.SendMsg(disconnect) // the stopping manager reached the stream
	}()
	if err := gs.RecvMsg(&msg); !errors.Is(err, errRemoteClosing) {
		t.Fatalf("receive after close began: %v, want errRemoteClosing", err)
	}
	if f.recvs != 1 {
		t.Fatalf("gRPC asked for %d messages, want 1 (none once closing)", f.recvs)
	}
	if ok := <-closed; !ok || gs.held {
		t.Fatalf("close: %v, stream still held: %v", ok, gs.held)
	}
}

// Once Close began, a stream's receive error (its peer left, or the remote
// is closing) is returned only after protoactor's stopping endpoint manager
// reached the stream (its reader sends a DisconnectRequest): the reader
// closes its disconnect channel when its stream ends, and the manager's
// stop sends on it without synchronization. Not closing, an error holds
// the gate until the handler returned, so Close's Shutdown waits for it.
func TestClosingStreamEndsOnlyAfterTheManagerReachedIt(t *testing.T) {
	r := &Remote{}
	f := &fakeServerStream{err: io.EOF}
	gs := &guardedStream{ServerStream: f, r: r}
	var msg struct{}
	if err := gs.RecvMsg(&msg); !errors.Is(err, io.EOF) || !gs.held {
		t.Fatalf("an error before closing: %v, held %v; want EOF, held until the handler returns", err, gs.held)
	}
	r.readers.release(&gs.held) // the handler returned (guardStream)
	if !r.readers.close(time.Minute) {
		t.Fatal("close waited on a stream that returned")
	}
	ended := make(chan error, 1)
	go func() { ended <- gs.RecvMsg(&msg) }()
	select {
	case err := <-ended:
		t.Fatalf("a closing stream ended before the manager reached it: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := gs.SendMsg(disconnect); err != nil {
		t.Fatal(err)
	}
	if err := <-ended; !errors.Is(err, errRemoteClosing) {
		t.Fatalf("after the manager reached it: %v, want errRemoteClosing", err)
	}
}
