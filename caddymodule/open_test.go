package caddymodule

import (
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"
)

// TestProbe: the probe that tells a slow upstream from a frozen one. A
// process that answers (an HTTP server, over TCP or a unix socket; a TLS
// server, which answers a plain request too; one that closes the
// connection) is alive. A listener whose process never accepts nor reads,
// as a process stopped with SIGSTOP, is not, and neither is an address
// where nothing listens, nor one that does not parse.
func TestProbe(t *testing.T) {
	httpSrv := httptest.NewServer(http.NotFoundHandler())
	defer httpSrv.Close()
	tlsSrv := httptest.NewTLSServer(http.NotFoundHandler())
	defer tlsSrv.Close()

	sock := filepath.Join(t.TempDir(), "mcp.sock")
	unixLn, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	unixSrv := &http.Server{Handler: http.NotFoundHandler()}
	go unixSrv.Serve(unixLn) //nolint:errcheck
	defer unixSrv.Close()

	closer, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	go func() {
		for {
			c, err := closer.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()

	frozen, err := net.Listen("tcp", "127.0.0.1:0") // the kernel completes connections; nothing accepts them
	if err != nil {
		t.Fatal(err)
	}
	defer frozen.Close()

	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	goneAddr := gone.Addr().String()
	gone.Close()

	for _, tc := range []struct {
		name, addr string
		alive      bool
	}{
		{"HTTP server", httpSrv.Listener.Addr().String(), true},
		{"HTTP server, network named", "tcp/" + httpSrv.Listener.Addr().String(), true},
		{"TLS server", tlsSrv.Listener.Addr().String(), true},
		{"HTTP server on a unix socket", "unix/" + sock, true},
		{"closes the connection", closer.Addr().String(), true},
		{"frozen", frozen.Addr().String(), false},
		{"nothing listens", goneAddr, false},
		{"no address", "", false},
		{"not an address", "tcp/[::1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			if got := probe(tc.addr, 300*time.Millisecond); got != tc.alive {
				t.Errorf("probe(%q) = %v; want %v", tc.addr, got, tc.alive)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("probe(%q) took %v; want it within its timeout", tc.addr, took)
			}
		})
	}
}
