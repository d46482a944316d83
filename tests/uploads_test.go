package tests

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// uploadCounter is an upstream that reads every request's body and answers
// its length and SHA-256. It holds each request, once it has its headers,
// until release is closed, so that the uploads are in flight together.
type uploadCounter struct {
	arrived atomic.Int32
	release chan struct{}
	srv     *http.Server
	addr    string
}

// startUploadCounter starts an uploadCounter on a port of its own.
func startUploadCounter(t *testing.T) *uploadCounter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &uploadCounter{release: make(chan struct{}), addr: ln.Addr().String()}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = u.srv.Serve(ln) }()
	t.Cleanup(func() { _ = u.srv.Close() })
	return u
}

// ServeHTTP counts the request, waits for release (30 s at most), then
// reads the body and answers "<length> <sha256>".
func (u *uploadCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.arrived.Add(1)
	select {
	case <-u.release:
	case <-time.After(30 * time.Second):
	}
	sum := sha256.New()
	n, err := io.Copy(sum, r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, "%d %s", n, hex.EncodeToString(sum.Sum(nil)))
}

// TestLargeUploadsWithoutSession: 32 clients at once POST 4 MiB each
// without Mcp-Session-Id (half with a Content-Length, half chunked) through
// Caddy with the plugin to an upstream that reads and hashes them. Every
// upload arrives whole and byte-exact, while the proxy holds at most
// 128 KiB of request bodies (caddy_mcp_body_memory_bytes, sampled while
// the upstream holds all 32 in flight), and meanwhile a go-sdk client opens
// a session and calls a tool. Reading each sessionless POST whole to find
// an initialize held 4 MiB per upload: 128 MiB for these 32.
func TestLargeUploadsWithoutSession(t *testing.T) {
	const (
		clients = 32
		size    = 4 << 20
		bound   = 128 << 10
	)
	servers := startBackends(t, 2, true)
	counter := startUploadCounter(t)
	p := startProxy(t, fmt.Sprintf("mcp_proxy /mcp %s\n\tmcp_proxy /upload %s", upstreams(servers), counter.addr))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	before, _ := scrape(t)
	refused := metricValue(before, "caddy_mcp_body_memory_refused_total", nil)

	hc := &http.Client{Transport: &http.Transport{MaxConnsPerHost: clients, MaxIdleConnsPerHost: clients}}
	defer hc.CloseIdleConnections()
	answers := make([]string, clients)
	wants := make([]string, clients)
	var wg sync.WaitGroup
	for i := range clients {
		body := make([]byte, size)
		rng := rand.NewChaCha8([32]byte{byte(i)})
		_, _ = rng.Read(body)
		sum := sha256.Sum256(body)
		wants[i] = fmt.Sprintf("%d %s", size, hex.EncodeToString(sum[:]))
		var r io.Reader = bytes.NewReader(body)
		if i%2 == 1 {
			r = io.MultiReader(r) // no known length: sent chunked
		}
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.addr+"/upload", r)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := hc.Do(req)
			if err != nil {
				answers[i] = err.Error()
				return
			}
			defer resp.Body.Close()
			got, _ := io.ReadAll(resp.Body)
			answers[i] = string(got)
			if resp.StatusCode != http.StatusOK {
				answers[i] = resp.Status + ": " + answers[i]
			}
		})
	}

	peak, samples := 0.0, 0
	sample := func() {
		families, _ := scrape(t)
		v := metricValue(families, "caddy_mcp_body_memory_bytes", nil)
		if v < 0 {
			t.Fatal("caddy_mcp_body_memory_bytes is not exported")
		}
		peak, samples = max(peak, v), samples+1
	}
	for deadline := time.Now().Add(30 * time.Second); counter.arrived.Load() < clients && time.Now().Before(deadline); {
		sample()
		time.Sleep(5 * time.Millisecond)
	}
	arrived := counter.arrived.Load()
	for range 10 { // all in flight: the upstream has their headers and reads nothing yet
		sample()
		time.Sleep(10 * time.Millisecond)
	}

	cs, err := connect(ctx, p.url(), newHTTPClient())
	if err != nil {
		t.Fatalf("opening a session during the uploads: %v", err)
	}
	defer cs.Close()
	if id, err := whoami(ctx, cs); err != nil || id.Server == "" {
		t.Errorf("calling a tool during the uploads: %+v, %v", id, err)
	}
	sample()
	close(counter.release)
	wg.Wait()

	t.Logf("%d of %d uploads in flight at the upstream at once; the proxy held at most %.0f bytes of request bodies (%d samples)", arrived, clients, peak, samples)
	if arrived != clients {
		t.Errorf("%d of %d uploads reached the upstream together", arrived, clients)
	}
	for i := range clients {
		if answers[i] != wants[i] {
			t.Errorf("upload %d: the upstream answered %q, want %q", i, answers[i], wants[i])
		}
	}
	if peak > bound {
		t.Errorf("the proxy held %.0f bytes of request bodies during the uploads, want at most %d", peak, bound)
	}
	if families, _ := scrape(t); metricValue(families, "caddy_mcp_body_memory_refused_total", nil) != refused {
		t.Error("requests were refused for body memory")
	}
}
