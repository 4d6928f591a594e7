// Package etcdtest starts a real etcd server for tests, on free loopback
// ports with a temporary data directory, and stops it when the test ends.
package etcdtest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Start starts an etcd server on free loopback ports with a temporary
// data directory and stops it when the test ends. Without an etcd binary
// the test is skipped, except under CI (CI=true), where it fails: `make
// test` installs Debian's etcd-server first (the Makefile's etcd target).
func Start(t testing.TB) string {
	return StartServer(t).Endpoint
}

// Server is a running etcd that a test can kill and restart (on the same
// ports and data directory: its leases survive) or pause.
type Server struct {
	// Endpoint is the client URL.
	Endpoint string

	t       testing.TB
	args    []string
	bin     string
	logPath string
	cmd     *exec.Cmd
	exited  chan struct{}
}

// StartServer is Start, returning the server.
func StartServer(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("etcd not found under CI (make test installs Debian's etcd-server): %v", err)
		}
		t.Skipf("etcd not installed (apt-get install -y etcd-server, or run make test): %v", err)
	}
	free := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	cport, pport := free(), free()
	client := fmt.Sprintf("http://127.0.0.1:%d", cport)
	peer := fmt.Sprintf("http://127.0.0.1:%d", pport)
	dir := t.TempDir()
	s := &Server{Endpoint: client, t: t, bin: bin, logPath: filepath.Join(dir, "etcd.log"),
		args: []string{"--name", "n", "--data-dir", filepath.Join(dir, "data"),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "n=" + peer, "--logger", "zap", "--log-level", "warn"}}
	s.run()
	t.Cleanup(func() {
		_ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGCONT)
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(5 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	})
	return s
}

// run starts the process and waits until it is healthy.
func (s *Server) run() {
	t := s.t
	t.Helper()
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start etcd: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	if err := s.WaitHealthy(15 * time.Second); err != nil {
		select {
		case <-exited:
			log, _ := os.ReadFile(s.logPath)
			t.Fatalf("etcd exited:\n%s", log)
		default:
		}
		log, _ := os.ReadFile(s.logPath)
		t.Fatalf("%v\n%s", err, log)
	}
}

// WaitHealthy waits until etcd reports itself healthy.
func (s *Server) WaitHealthy(d time.Duration) error {
	c := http.Client{Timeout: time.Second}
	var err error
	for deadline := time.Now().Add(d); ; {
		var resp *http.Response
		resp, err = c.Get(s.Endpoint + "/health")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if bytes.Contains(b, []byte(`"health":"true"`)) {
				return nil
			}
		}
		select {
		case <-s.exited:
			return fmt.Errorf("etcd exited")
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd not healthy after %v: %v", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill kills the process (SIGKILL) and waits for it to exit.
func (s *Server) Kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// Restart starts it again on the same ports and data directory (after
// Kill) and waits until it is healthy.
func (s *Server) Restart() {
	s.t.Helper()
	s.run()
}

// Pause stops the process (SIGSTOP); Resume continues it.
func (s *Server) Pause() { _ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGSTOP) }

// Resume continues a paused process (SIGCONT).
func (s *Server) Resume() { _ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGCONT) }
