// Package redistest runs a real redis-server for tests, on a free port with
// persistence off, and a TCP relay in front of it that can blackhole or slow
// the traffic, the way a network fault would.
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
	"github.com/redis/go-redis/v9"
)

// startTimeout bounds a redis-server's start.
const startTimeout = 10 * time.Second

// Server is a redis-server process started by a test.
type Server struct {
	// Addr is the server's host:port.
	Addr string
	t    testing.TB
	dir  string
	args []string // more redis-server arguments
	proc *testproc.Proc
}

// Start starts redis-server on a free port of 127.0.0.1 with persistence
// off, and kills it when the test ends. It skips the test when
// redis-server is not installed, unless MCP_INTEROP_REQUIRED=1, which makes
// it fail.
func Start(t testing.TB) *Server {
	t.Helper()
	return startWith(t)
}

// startWith is Start with more redis-server arguments.
func startWith(t testing.TB, args ...string) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("MCP_INTEROP_REQUIRED") == "1" {
			t.Fatalf("redis-server is not installed (.ci/install-deps installs it): %v", err)
		}
		t.Skipf("redis-server is not installed: %v", err)
	}
	port, err := testproc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, dir: t.TempDir(), Addr: "127.0.0.1:" + strconv.Itoa(port), args: args}
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

// Restart starts the server again on the same port, empty, after Stop.
func (s *Server) Restart() {
	s.t.Helper()
	_, port, _ := net.SplitHostPort(s.Addr)
	args := append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--protected-mode", "no", "--loglevel", "warning"}, s.args...)
	cmd := exec.Command("redis-server", args...)
	p, err := testproc.Start("redis-server", s.Addr, cmd, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	s.proc = p
	if err := p.Wait(startTimeout, testproc.Listening(), s.answers); err != nil {
		s.t.Fatal(err)
	}
}

// answers holds once the server answers PING.
func (s *Server) answers(*testproc.Proc) (bool, error) { return s.Do("PING") == "PONG", nil }

// Stop kills the server, as a crash would; it loses everything.
func (s *Server) Stop() { s.proc.Kill() }

// Do sends one command, whose arguments contain no spaces, and returns the
// first line of the reply without its type byte ("" on error).
func (s *Server) Do(args ...string) string {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return ""
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || len(line) < 3 {
		return ""
	}
	return strings.TrimSpace(line[1:])
}

// ReplicaOf makes the server a replica of master and waits until it has
// synced (master_link_status:up), at most startTimeout.
func (s *Server) ReplicaOf(master *Server) {
	s.t.Helper()
	master.Do("CONFIG", "SET", "repl-diskless-sync-delay", "0") // the default waits 5 s for more replicas
	host, port, _ := net.SplitHostPort(master.Addr)
	if r := s.Do("REPLICAOF", host, port); r != "OK" {
		s.t.Fatalf("REPLICAOF %s: %q", master.Addr, r)
	}
	if !testproc.Until(startTimeout, func() bool { return s.Info("replication", "master_link_status") == "up" }) {
		s.t.Fatalf("%s did not sync with its master %s within %s", s.Addr, master.Addr, startTimeout)
	}
}

// Info returns field of section of the server's INFO ("" when absent or
// on error).
func (s *Server) Info(section, field string) string {
	rc := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := rc.Info(ctx, section).Result()
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// Keys returns the keys of the server that match pattern (KEYS), nil on
// error.
func (s *Server) Keys(pattern string) []string {
	rc := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys, _ := rc.Keys(ctx, pattern).Result()
	return keys
}
