package caddymodule

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
)

// BenchmarkHandles measures the mcp_session handler per 2026-07-28
// tools/call, next handler excluded (it answers a small JSON result, as
// the upstream a policy picked): without any handle rule; with a rule, for
// a call of another tool, for a call carrying a known handle (pinned: one
// table lookup), and for a call of the minting tool (its result read, a
// new handle learned each time). Against the first, the others say what a
// rule costs.
func BenchmarkHandles(b *testing.B) {
	ctx := newContext(b)
	plain := &Handler{Table: "bench/handles-none"}
	ruled := &Handler{Table: "bench/handles", Handles: []HandleRule{{Tool: "open_counter", From: "/handle", Header: "Mcp-Param-Handle"}}}
	for _, h := range []*Handler{plain, ruled} {
		if err := h.Provision(ctx); err != nil {
			b.Fatal(err)
		}
	}
	startApp(b, ctx)
	for _, h := range []*Handler{plain, ruled} {
		h.setLogger(zap.NewNop())
	}
	const known = "KNOWN-HANDLE-7QH2M"
	ruled.handles.table.Learn(known, "10.0.0.1:8080")
	up := &reverseproxy.Upstream{Dial: "10.0.0.1:8080"}
	minted, buf := int64(0), []byte(nil) // each result names a new handle, written without allocating
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		exchangeOf(r).selected = up // as the selection policy records its pick
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		minted++
		buf = append(strconv.AppendInt(append(buf[:0], `{"jsonrpc":"2.0","id":7,"result":{"content":[],"structuredContent":{"handle":"H`...), minted, 10),
			`","server":"s1"}}}`...)
		_, err := w.Write(buf)
		return err
	})
	run := func(b *testing.B, h *Handler, header map[string]string) {
		w := &discardWriter{h: http.Header{}}
		eachRequest(b, func() *http.Request { return caddyRequest(benchBody, header) }, func(r *http.Request) {
			if err := h.ServeHTTP(w, r, next); err != nil {
				b.Fatal(err)
			}
		})
	}
	call := func(tool string, more ...string) map[string]string {
		m := map[string]string{"Mcp-Protocol-Version": ModernProtocolVersion, "Mcp-Method": "tools/call", "Mcp-Name": tool}
		for i := 0; i+1 < len(more); i += 2 {
			m[more[i]] = more[i+1]
		}
		return m
	}
	b.Run("no-rules", func(b *testing.B) { run(b, plain, call("render_chart")) })
	b.Run("rule-other-tool", func(b *testing.B) { run(b, ruled, call("render_chart")) })
	b.Run("rule-pinned", func(b *testing.B) { run(b, ruled, call("count", "Mcp-Param-Handle", known)) })
	b.Run("rule-minting", func(b *testing.B) { run(b, ruled, call("open_counter")) })
}
