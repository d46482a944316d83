package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/journal"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// caddyRequest returns a POST prepared as Caddy's server prepares one: with
// a replacer (whose providers hold the {http.*} placeholders) and the
// request variables Caddy sets in its context.
func caddyRequest(body string, header map[string]string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	for k, v := range header {
		r.Header.Set(k, v)
	}
	repl := caddy.NewReplacer()
	repl.Map(func(string) (any, bool) { return nil, false }) // Caddy's {http.*} provider
	ctx := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
	ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{
		caddyhttp.TrustedProxyVarKey: false, caddyhttp.ClientIPVarKey: "192.0.2.1",
	})
	return r.WithContext(ctx)
}

// eachRequest calls fn b.N times, each with a new request from mk, timing
// fn only. Requests are made in batches with the timer stopped, so that
// neither their making nor a large live heap of them weighs on fn.
func eachRequest(b *testing.B, mk func() *http.Request, fn func(*http.Request)) {
	const batch = 32
	rs := make([]*http.Request, batch)
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += batch {
		b.StopTimer()
		n := min(batch, b.N-done)
		for i := range n {
			rs[i] = mk()
		}
		b.StartTimer()
		for _, r := range rs[:n] {
			fn(r)
		}
	}
}

// discardWriter is a ResponseWriter that keeps nothing.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}

// BenchmarkHandlerServeHTTP measures the whole mcp_session handler per
// request, next handler excluded: a pinned request of a live session, a
// sessionless modern request, and an initialize (its wait for headers
// bounded by initialize_timeout).
func BenchmarkHandlerServeHTTP(b *testing.B) {
	ctx := newContext(b)
	h := &Handler{Table: "bench/serve"}
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	startApp(b, ctx)
	h.setLogger(zap.NewNop())
	h.table.Learn(testSessionID, "10.0.0.1:8080")
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		w.WriteHeader(http.StatusOK)
		return nil
	})
	run := func(b *testing.B, header map[string]string, body ...string) {
		w := &discardWriter{h: http.Header{}}
		req := `{}`
		if len(body) > 0 {
			req = body[0]
		}
		eachRequest(b, func() *http.Request { return caddyRequest(req, header) }, func(r *http.Request) {
			if err := h.ServeHTTP(w, r, next); err != nil {
				b.Fatal(err)
			}
		})
	}
	b.Run("pinned", func(b *testing.B) { run(b, map[string]string{HeaderSessionID: testSessionID}) })
	b.Run("modern", func(b *testing.B) {
		run(b, map[string]string{"Mcp-Protocol-Version": ModernProtocolVersion, "Mcp-Method": "tools/call", "Mcp-Name": "render"})
	})
	b.Run("initialize", func(b *testing.B) { run(b, map[string]string{"Content-Type": "application/json"}, testInitBody) })
	b.Run("pinned-journal", func(b *testing.B) {
		jh := &Handler{Table: "bench/serve-journal", TableSettings: TableSettings{Journal: JournalOn}}
		if err := jh.Provision(ctx); err != nil {
			b.Fatal(err)
		}
		jh.setLogger(zap.NewNop())
		jh.table.Learn(testSessionID, "10.0.0.1:8080")
		limits := journal.Limits{}.WithDefaults() // the app, started already, configures new tables' journals at its next start
		jh.table.SetJournal(journal.NewMemory(limits), limits)
		json := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			_, err := w.Write([]byte(`{"jsonrpc":"2.0","id":1,"result":{}}`))
			return err
		})
		w := &discardWriter{h: http.Header{}}
		eachRequest(b, func() *http.Request { return caddyRequest(`{}`, map[string]string{HeaderSessionID: testSessionID}) }, func(r *http.Request) {
			if err := jh.ServeHTTP(w, r, json); err != nil {
				b.Fatal(err)
			}
		})
	})
}

// benchBody is a tools/call as the MCP Go SDK client sends it at 2026-07-28 (312 bytes).
const benchBody = `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"render_chart","arguments":{"title":"Q3","series":[1,2,3,5,8,13]},` +
	`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"bench","version":"v1"},` +
	`"io.modelcontextprotocol/clientCapabilities":{}}}}`

// BenchmarkMatchMCP measures an `mcp` matcher on a fresh request: on the
// headers of a 2026-07-28 tools/call, and reading and checking its body
// (312 bytes, the shape the MCP Go SDK client sends). Creating the request
// is not timed.
func BenchmarkMatchMCP(b *testing.B) {
	body := benchBody
	header := map[string]string{"Mcp-Protocol-Version": ModernProtocolVersion, "Mcp-Method": "tools/call", "Mcp-Name": "render_chart"}
	run := func(b *testing.B, m *MatchMCP) {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
		if err := m.Provision(ctx); err != nil {
			b.Fatal(err)
		}
		eachRequest(b, func() *http.Request { return caddyRequest(body, header) }, func(r *http.Request) {
			if !m.Match(r) {
				b.Fatal("no match")
			}
		})
	}
	b.Run("headers", func(b *testing.B) {
		run(b, &MatchMCP{Methods: []string{"tools/call"}, Names: []string{"render_*"}})
	})
	b.Run("body", func(b *testing.B) {
		run(b, &MatchMCP{Methods: []string{"tools/call"}, Names: []string{"render_*"}, Body: true})
	})
	b.Run("body-second-matcher", func(b *testing.B) { // the body was read by an earlier matcher
		m := &MatchMCP{Methods: []string{"tools/call"}, Names: []string{"render_*"}, Body: true}
		first := &MatchMCP{Names: []string{"export_*"}, Body: true}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
		if err := first.Provision(ctx); err != nil {
			b.Fatal(err)
		}
		if err := m.Provision(ctx); err != nil {
			b.Fatal(err)
		}
		mk := func() *http.Request {
			r := caddyRequest(body, header)
			first.Match(r)
			return r
		}
		eachRequest(b, mk, func(r *http.Request) {
			if !m.Match(r) {
				b.Fatal("no match")
			}
		})
	})
}

// BenchmarkParseRPC measures parsing the body of BenchmarkMatchMCP alone:
// validation by encoding/json, then the scan for id, method, name and the
// _meta protocol version.
func BenchmarkParseRPC(b *testing.B) {
	body := []byte(benchBody)
	b.ReportAllocs()
	for b.Loop() {
		if _, f := parseRPC(body); f != nil {
			b.Fatal(f)
		}
	}
}
