// Command jetstream is the peer make bench measures syncmesh's delivery
// plane against: an embedded NATS JetStream server (nats-server v2.12,
// file storage) with one durable pull consumer (explicit ack), in one
// process, the client connected in-process. It publishes -n messages of
// -size bytes (sync: one Publish at a time, each waiting for its PubAck;
// async: PublishAsync with at most -inflight unacknowledged), while the
// consumer fetches up to 64 at a time and acks each one the ordinary way
// (Msg.Ack). It prints one JSON line: how long until every message was
// published, delivered and its ack recorded by the server.
//
// It lives in its own Go module so that syncmesh's module graph does not
// carry nats-server; examples/benchreport builds it and runs it as a
// child process, one trial per process, interleaved with syncmesh's.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// result is the line printed on stdout.
type result struct {
	Messages int     `json:"messages"`
	Seconds  float64 `json:"seconds"`
	Rate     float64 `json:"rate"`
	// CPUSeconds is the process's user+system CPU over the timed part.
	CPUSeconds float64 `json:"cpu_seconds"`
}

func cpuTime() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func main() {
	dir := flag.String("dir", "", "JetStream store directory (default: a temporary one, removed after)")
	n := flag.Int("n", 2000, "messages")
	size := flag.Int("size", 256, "message body bytes")
	syncMode := flag.String("sync", "always", "file store sync: always (SyncAlways, fsync per write) or default (nats-server's default sync interval)")
	publish := flag.String("publish", "sync", "sync (Publish, one at a time) or async (PublishAsync, -inflight at most)")
	inflight := flag.Int("inflight", 64, "async publish: unacknowledged publishes at most")
	batch := flag.Int("batch", 64, "consumer: messages per pull at most")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Parse()
	res, err := run(*dir, *n, *size, *syncMode, *publish, *inflight, *batch, *timeout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "jetstream:", err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
}

func run(dir string, n, size int, syncMode, publish string, inflight, batch int, timeout time.Duration) (result, error) {
	if dir == "" {
		tmp, err := os.MkdirTemp("", "syncmesh-jetstream-")
		if err != nil {
			return result{}, err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true, DontListen: true}
	switch syncMode {
	case "always":
		opts.SyncAlways = true
	case "default":
	default:
		return result{}, fmt.Errorf("-sync %q: want always or default", syncMode)
	}
	if publish != "sync" && publish != "async" {
		return result{}, fmt.Errorf("-publish %q: want sync or async", publish)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return result{}, err
	}
	srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(10 * time.Second) {
		return result{}, errors.New("server not ready")
	}
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		return result{}, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(inflight))
	if err != nil {
		return result{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}, Storage: jetstream.FileStorage}); err != nil {
		return result{}, err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "BENCH", jetstream.ConsumerConfig{Durable: "work", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return result{}, err
	}
	body := make([]byte, size)
	var received atomic.Int64
	allReceived := make(chan struct{})
	if n == 0 {
		close(allReceived) // a baseline run: setup only
	}
	var failed atomic.Pointer[error]
	start, cpu0 := time.Now(), cpuTime()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if err := m.Ack(); err != nil {
			failed.CompareAndSwap(nil, &err)
		}
		if received.Add(1) == int64(n) {
			close(allReceived)
		}
	}, jetstream.PullMaxMessages(batch))
	if err != nil {
		return result{}, err
	}
	defer cc.Stop()
	switch publish {
	case "sync":
		for i := 0; i < n; i++ {
			if _, err := js.Publish(ctx, "bench.m", body); err != nil {
				return result{}, fmt.Errorf("publish %d: %w", i, err)
			}
		}
	case "async":
		futures := make([]jetstream.PubAckFuture, 0, n)
		for i := 0; i < n; i++ {
			// At -inflight unacknowledged, wait (not the default 200 ms
			// stall, which a loaded machine exceeds) for a slot.
			f, err := js.PublishAsync("bench.m", body, jetstream.WithStallWait(timeout))
			if err != nil {
				return result{}, fmt.Errorf("publish %d: %w", i, err)
			}
			futures = append(futures, f)
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			return result{}, ctx.Err()
		}
		for i, f := range futures {
			select {
			case err := <-f.Err():
				return result{}, fmt.Errorf("publish %d: %w", i, err)
			default:
			}
		}
	}
	select {
	case <-allReceived:
	case <-ctx.Done():
		return result{}, fmt.Errorf("%d of %d received: %w", received.Load(), n, ctx.Err())
	}
	// Acks are fire and forget: done when the server recorded every one.
	for {
		if p := failed.Load(); p != nil {
			return result{}, *p
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return result{}, err
		}
		if info.NumAckPending == 0 && info.AckFloor.Stream >= uint64(n) {
			break
		}
		time.Sleep(200 * time.Microsecond)
	}
	el := time.Since(start)
	return result{Messages: n, Seconds: el.Seconds(), Rate: float64(n) / el.Seconds(), CPUSeconds: cpuTime() - cpu0}, nil
}
