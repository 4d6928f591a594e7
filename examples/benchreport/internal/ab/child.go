package ab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Environment of a child process: which registered function to run and
// its JSON argument.
const (
	envChild = "SYNCMESH_BENCH_CHILD"
	envArgs  = "SYNCMESH_BENCH_ARGS"
	// EnvProfileDir, when set in the parent's environment, makes every
	// child write a CPU profile of its run there (<name>-<pid>.pprof):
	// how the joiners and fresh-store children spend their time.
	EnvProfileDir = "SYNCMESH_BENCH_PROFILE_DIR"
)

// ChildFunc runs in a child process: it decodes its argument from arg and
// returns a JSON-encodable result. It must not write to stdout (the result
// travels there).
type ChildFunc func(arg json.RawMessage) (any, error)

var (
	regMu    sync.Mutex
	registry = map[string]ChildFunc{}
)

// Register names fn so a child process can run it. Call it from init or
// before Main.
func Register(name string, fn ChildFunc) {
	regMu.Lock()
	defer regMu.Unlock()
	registry[name] = fn
}

// Main must be the first call of the program's main: in a child process it
// runs the registered function, writes its result as JSON to stdout and
// exits; in the parent it returns.
func Main() {
	name := os.Getenv(envChild)
	if name == "" {
		return
	}
	regMu.Lock()
	fn := registry[name]
	regMu.Unlock()
	if fn == nil {
		fmt.Fprintf(os.Stderr, "ab child: no function %q\n", name)
		os.Exit(2)
	}
	stop := startChildProfile(name)
	out, err := fn(json.RawMessage(os.Getenv(envArgs)))
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "ab child %s: %v\n", name, err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintf(os.Stderr, "ab child %s: encode result: %v\n", name, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Proc configures a child process.
type Proc struct {
	// MaxProcs is the child's GOMAXPROCS (0: inherited).
	MaxProcs int
	// Env is added to the child's environment (KEY=VALUE).
	Env []string
}

// Child runs the function registered as name in a child process of this
// executable with arg, and decodes its result into out. The child's
// stderr is passed through.
func Child(ctx context.Context, p Proc, name string, arg, out any) error {
	a, err := json.Marshal(arg)
	if err != nil {
		return fmt.Errorf("ab: child %s: encode argument: %w", name, err)
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("ab: child %s: %w", name, err)
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), envChild+"="+name, envArgs+"="+string(a))
	if p.MaxProcs > 0 {
		cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(p.MaxProcs))
	}
	cmd.Env = append(cmd.Env, p.Env...)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ab: child %s: %w", name, err)
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		return fmt.Errorf("ab: child %s: decode result: %w", name, err)
	}
	return nil
}

// IO is a process's storage I/O counters from /proc/<pid>/io.
type IO struct {
	// WriteBytes is what the process caused to be sent to the storage
	// layer (write_bytes): page-cache writeback of its files, fsync'd or
	// not, not socket traffic.
	WriteBytes int64
	// WChar is every byte passed to write-like system calls (sockets too).
	WChar int64
}

// ReadIO reads /proc/<pid>/io (pid 0: this process).
func ReadIO(pid int) (IO, error) {
	path := "/proc/self/io"
	if pid > 0 {
		path = fmt.Sprintf("/proc/%d/io", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return IO{}, err
	}
	return parseIO(b)
}

func parseIO(b []byte) (IO, error) {
	var io IO
	var seen int
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "write_bytes":
			io.WriteBytes, seen = n, seen|1
		case "wchar":
			io.WChar, seen = n, seen|2
		}
	}
	if seen != 3 {
		return IO{}, errors.New("ab: /proc io without write_bytes and wchar")
	}
	return io, nil
}

// HeapPeak samples the live heap (runtime/metrics, cheap: no stop the
// world) every interval until Stop and keeps the largest value.
type HeapPeak struct {
	peak atomic.Uint64
	stop chan struct{}
	done chan struct{}
}

const heapMetric = "/memory/classes/heap/objects:bytes"

// StartHeapPeak starts a sampler.
func StartHeapPeak(interval time.Duration) *HeapPeak {
	h := &HeapPeak{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		s := []metrics.Sample{{Name: heapMetric}}
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			metrics.Read(s)
			if s[0].Value.Kind() == metrics.KindUint64 {
				if v := s[0].Value.Uint64(); v > h.peak.Load() {
					h.peak.Store(v)
				}
			}
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
	return h
}

// Stop ends sampling and returns the peak in bytes.
func (h *HeapPeak) Stop() uint64 {
	close(h.stop)
	<-h.done
	return h.peak.Load()
}

// startChildProfile starts a CPU profile of this child when
// EnvProfileDir is set (and the function profiles nothing itself).
func startChildProfile(name string) (stop func()) {
	dir := os.Getenv(EnvProfileDir)
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.pprof", name, os.Getpid())))
	if err != nil {
		fmt.Fprintf(os.Stderr, "ab child %s: profile: %v\n", name, err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return func() {} // the function profiles itself (-cpuprofile)
	}
	// The allocations go beside it (.allocs): what the child's garbage
	// collector share comes from.
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		if a, err := os.Create(f.Name() + ".allocs"); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(a, 0)
			a.Close()
		}
	}
}
