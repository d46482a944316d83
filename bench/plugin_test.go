package main

import (
	"context"
	"crypto/rand"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
)

// These benchmarks measure what the plugin adds to one proxied request, in
// process and without the network: the mcp_session handler (session check,
// table lookup, the response-writer wrapper) and the mcp_session selection
// policy, in front of a "next" handler that only selects and writes a 200
// header, as reverse_proxy would. Compare with BenchmarkStockRequest, the
// same next handler without the plugin.
//
//	go test -run '^$' -bench . -benchmem -cpu 1,2,4 ./bench/

// nopWriter is an http.ResponseWriter that discards everything.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}

// pluginFixture is a provisioned handler and policy sharing one table, the
// pool they select from, and sessions learned through the handler.
type pluginFixture struct {
	h    *caddymodule.Handler
	sel  *caddymodule.SessionSelection
	pool reverseproxy.UpstreamPool
	ids  []string
}

var fixtureSeq atomic.Int64

func newPluginFixture(b *testing.B, sessions int) *pluginFixture {
	// An empty config of the fixture's own, so that modules provisioned in
	// its context log as Caddy does by default (INFO: the plugin's
	// per-decision debug lines are off). Without a config, Caddy hands
	// modules a development logger at DEBUG level.
	base, err := caddy.ProvisionContext(new(caddy.Config))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(base)
	b.Cleanup(cancel)
	table := "bench-" + rand.Text() + string(rune('a'+fixtureSeq.Add(1)%26))
	f := &pluginFixture{
		h:   &caddymodule.Handler{Table: table, TableSettings: caddymodule.TableSettings{MaxSessions: max(sessions, 1)}},
		sel: &caddymodule.SessionSelection{Table: table},
		pool: reverseproxy.UpstreamPool{
			{Host: new(reverseproxy.Host), Dial: "10.0.0.1:8080"},
			{Host: new(reverseproxy.Host), Dial: "10.0.0.2:8080"},
			{Host: new(reverseproxy.Host), Dial: "10.0.0.3:8080"},
		},
	}
	if err := f.h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	if err := f.sel.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	// Learn the sessions the way Caddy does: a request without a session
	// whose response names one.
	for range sessions {
		id := rand.Text()
		next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			if f.sel.Select(f.pool, r, w) == nil {
				b.Fatal("no upstream")
			}
			w.Header().Set("Mcp-Session-Id", id)
			w.WriteHeader(http.StatusOK)
			return nil
		})
		if err := f.h.ServeHTTP(&nopWriter{h: http.Header{}}, benchRequest(""), next); err != nil {
			b.Fatal(err)
		}
		f.ids = append(f.ids, id)
	}
	return f
}

// benchRequest returns a POST carrying Caddy's request variables, as
// Caddy's server sets them up, and the session id if not empty.
func benchRequest(id string) *http.Request {
	r, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1/mcp", http.NoBody)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Accept", "application/json, text/event-stream")
	r.Header.Set("Mcp-Protocol-Version", protocolVersion)
	if id != "" {
		r.Header.Set("Mcp-Session-Id", id)
	}
	return r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
}

// pinnedNext is the stand-in for reverse_proxy: select, then answer 200.
func (f *pluginFixture) pinnedNext(b *testing.B, want string) caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if up := f.sel.Select(f.pool, r, w); up == nil || (want != "" && up.Dial != want) {
			b.Fatal("pinned request not sent to its upstream")
		}
		w.WriteHeader(http.StatusOK)
		return nil
	})
}

// BenchmarkPluginRequest is one pinned POST through the plugin: handler,
// policy and writer wrapper, with 1,000 live sessions.
func BenchmarkPluginRequest(b *testing.B) {
	f := newPluginFixture(b, 1000)
	next := f.pinnedNext(b, "")
	w := &nopWriter{h: http.Header{}}
	reqs := make([]*http.Request, len(f.ids))
	for i, id := range f.ids {
		reqs[i] = benchRequest(id)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := f.h.ServeHTTP(w, reqs[i%len(reqs)], next); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkStockRequest is the same request and next handler without the
// plugin: the baseline BenchmarkPluginRequest adds to.
func BenchmarkStockRequest(b *testing.B) {
	pool := reverseproxy.UpstreamPool{{Host: new(reverseproxy.Host), Dial: "10.0.0.1:8080"}}
	rr := new(reverseproxy.RoundRobinSelection)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		if rr.Select(pool, r, w) == nil {
			b.Fatal("no upstream")
		}
		w.WriteHeader(http.StatusOK)
		return nil
	})
	w := &nopWriter{h: http.Header{}}
	r := benchRequest(rand.Text())
	b.ReportAllocs()
	for b.Loop() {
		if err := next.ServeHTTP(w, r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPluginRequestParallel is BenchmarkPluginRequest from GOMAXPROCS
// goroutines at once, each on its own sessions: contention on the table's
// lock and counters shows as ns/op that does not fall with -cpu.
func BenchmarkPluginRequestParallel(b *testing.B) {
	f := newPluginFixture(b, 1000)
	next := f.pinnedNext(b, "")
	var worker atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		base := int(worker.Add(1)) * 97
		w := &nopWriter{h: http.Header{}}
		reqs := make([]*http.Request, 64)
		for i := range reqs {
			reqs[i] = benchRequest(f.ids[(base+i)%len(f.ids)])
		}
		i := 0
		for pb.Next() {
			if err := f.h.ServeHTTP(w, reqs[i%len(reqs)], next); err != nil {
				panic(err)
			}
			i++
		}
	})
}
