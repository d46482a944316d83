package tests

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// double is an upstream test double: a real HTTP server on 127.0.0.1 that
// records every request it receives and answers as its handler says. By
// default it acts like a minimal stateful MCP server: a POST without a
// session mints one (`<name>-<n>`) in Mcp-Session-Id; a request with a
// session it minted gets 200 with its name; DELETE ends the session (204);
// an unknown session gets 404.
type double struct {
	name    string
	addr    string
	srv     *http.Server
	minted  atomic.Int64
	handler atomic.Pointer[http.HandlerFunc]

	mu       sync.Mutex
	reqs     []recorded
	sessions map[string]bool
}

// recorded is one request as the double received it.
type recorded struct {
	method  string
	path    string
	host    string
	header  http.Header
	body    string
	arrived time.Time
}

// session returns the request's Mcp-Session-Id values.
func (r recorded) session() []string { return r.header.Values("Mcp-Session-Id") }

// startDouble starts a double called name.
func startDouble(t testing.TB, name string) *double {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &double{name: name, addr: ln.Addr().String(), sessions: map[string]bool{}}
	d.srv = &http.Server{Handler: http.HandlerFunc(d.serve)}
	go d.srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { d.srv.Close() })
	return d
}

// startDoubles starts n doubles named d1..dn.
func startDoubles(t testing.TB, n int) []*double {
	ds := make([]*double, n)
	for i := range ds {
		ds[i] = startDouble(t, fmt.Sprintf("d%d", i+1))
	}
	return ds
}

// Addr returns the double's address, host:port.
func (d *double) Addr() string { return d.addr }

// port returns the double's port.
func (d *double) port() string {
	_, port, _ := net.SplitHostPort(d.addr)
	return port
}

// handle replaces the double's behaviour; nil restores the default.
func (d *double) handle(h http.HandlerFunc) {
	if h == nil {
		d.handler.Store(nil)
		return
	}
	d.handler.Store(&h)
}

func (d *double) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	d.mu.Lock()
	d.reqs = append(d.reqs, recorded{method: r.Method, path: r.URL.Path, host: r.Host, header: r.Header.Clone(), body: string(body), arrived: time.Now()})
	d.mu.Unlock()
	if h := d.handler.Load(); h != nil {
		(*h)(w, r)
		return
	}
	d.serveMCP(w, r)
}

// serveMCP is the default behaviour: a minimal stateful MCP server, healthy
// at /health.
func (d *double) serveMCP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		return
	}
	id := r.Header.Get("Mcp-Session-Id")
	if id == "" {
		if r.Method != http.MethodPost {
			http.Error(w, "Bad Request: session required", http.StatusBadRequest)
			return
		}
		id = d.mint()
		w.Header().Set("Mcp-Session-Id", id)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":1,"result":{"server":%q}}`, d.name)
		return
	}
	d.mu.Lock()
	known := d.sessions[id]
	if r.Method == http.MethodDelete {
		delete(d.sessions, id)
	}
	d.mu.Unlock()
	switch {
	case !known:
		http.Error(w, "session not found", http.StatusNotFound)
	case r.Method == http.MethodDelete:
		w.WriteHeader(http.StatusNoContent)
	default:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":2,"result":{"server":%q}}`, d.name)
	}
}

// mint creates a new session ID, unique across doubles and tests, and remembers it.
func (d *double) mint() string {
	id := fmt.Sprintf("%s-%s-%d", d.name, d.port(), d.minted.Add(1))
	d.mu.Lock()
	d.sessions[id] = true
	d.mu.Unlock()
	return id
}

// requests returns a copy of the requests received so far.
func (d *double) requests() []recorded {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]recorded(nil), d.reqs...)
}

// sawSession counts the requests that carried session id.
func (d *double) sawSession(id string) int {
	n := 0
	for _, r := range d.requests() {
		for _, v := range r.session() {
			if v == id {
				n++
			}
		}
	}
	return n
}

// mcpRequests counts the requests received, health checks excluded.
func (d *double) mcpRequests() int {
	n := 0
	for _, r := range d.requests() {
		if r.path != "/health" {
			n++
		}
	}
	return n
}

// total counts the requests received.
func (d *double) total() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.reqs)
}

// ownerOf returns the double that minted session id.
func ownerOf(t testing.TB, ds []*double, id string) *double {
	t.Helper()
	for _, d := range ds {
		if strings.HasPrefix(id, d.name+"-"+d.port()+"-") {
			return d
		}
	}
	t.Fatalf("no double minted %q", id)
	return nil
}
