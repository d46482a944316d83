package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// modernVersion is the first MCP protocol version without sessions.
const modernVersion = "2026-07-28"

// handleSite is an mcp_proxy site with one handle rule for the whoami
// servers' counters, in table, plus extra option lines.
func handleSite(table, ups string, extra ...string) string {
	body := fmt.Sprintf("mcp_proxy %s {\n\t\ttable %s\n\t\thandle open_counter /handle Mcp-Param-Handle\n", ups, table)
	for _, line := range extra {
		body += "\t\t" + line + "\n"
	}
	return body + "\t}"
}

// handleReport is what one handle client saw.
type handleReport struct {
	handle  string   // the counter's handle
	minter  string   // the server that minted it
	servers []string // the server that answered each count call, "" for a failed call
	errs    []string // why each failed count call failed
}

// ok counts the count calls the minting server answered.
func (r handleReport) ok() int {
	n := 0
	for _, s := range r.servers {
		if s != "" && s == r.minter {
			n++
		}
	}
	return n
}

// openCounter connects a 2026-07-28 go-sdk client to url, lists the tools
// (so that the client knows count's x-mcp-header parameter), and opens a
// counter.
func openCounter(ctx context.Context, url string, hc *http.Client) (*mcp.ClientSession, handleReport, error) {
	cs, err := connect(ctx, url, hc, modernVersion)
	if err != nil {
		return nil, handleReport{}, fmt.Errorf("connect: %w", err)
	}
	if cs.ID() != "" {
		cs.Close()
		return nil, handleReport{}, fmt.Errorf("a 2026-07-28 client got session %q", cs.ID())
	}
	if _, err := cs.ListTools(ctx, nil); err != nil {
		cs.Close()
		return nil, handleReport{}, fmt.Errorf("tools/list: %w", err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "open_counter"})
	var c counterResult
	if err == nil {
		c, err = counterOf(res)
	}
	if err != nil {
		cs.Close()
		return nil, handleReport{}, fmt.Errorf("open_counter: %w", err)
	}
	return cs, handleReport{handle: c.Handle, minter: c.Server}, nil
}

// counterResult is the structured result of open_counter and count.
type counterResult struct {
	Handle string `json:"handle"`
	Server string `json:"server"`
	Count  int    `json:"count"`
}

// counterOf reads a counter tool's result.
func counterOf(res *mcp.CallToolResult) (counterResult, error) {
	var c counterResult
	if res.IsError {
		msg := ""
		if len(res.Content) > 0 {
			if tc, ok := res.Content[0].(*mcp.TextContent); ok {
				msg = tc.Text
			}
		}
		return c, fmt.Errorf("tool error: %s", msg)
	}
	b, err := json.Marshal(res.StructuredContent)
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	return c, err
}

// countCalls calls count with rep's handle n times, recording who answered.
func countCalls(ctx context.Context, cs *mcp.ClientSession, rep *handleReport, n int) {
	for range n {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "count", Arguments: map[string]any{"handle": rep.handle}})
		var c counterResult
		if err == nil {
			c, err = counterOf(res)
		}
		if err != nil {
			rep.servers, rep.errs = append(rep.servers, ""), append(rep.errs, err.Error())
			continue
		}
		rep.servers = append(rep.servers, c.Server)
	}
}

// runHandleClients runs n concurrent 2026-07-28 clients through url, each
// opening a counter and counting on it calls times.
func runHandleClients(t *testing.T, url string, n, calls int) []handleReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	reps := make([]handleReport, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range reps {
		wg.Go(func() {
			cs, rep, err := openCounter(ctx, url, hc)
			if err != nil {
				errs[i] = err
				return
			}
			defer cs.Close()
			countCalls(ctx, cs, &rep, calls)
			reps[i] = rep
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("client: %v", err)
		}
	}
	return reps
}

// handleTotals sums what the clients saw: count calls answered by the
// minting server, and all count calls.
func handleTotals(reps []handleReport) (ok, all int) {
	for _, r := range reps {
		ok += r.ok()
		all += len(r.servers)
	}
	return ok, all
}

// TestHandlesPinCallsToTheMintingServer is the 2026-07-28 handle case
// (docs/handles.md): 3 sessionless go-sdk servers keep counters in memory,
// open_counter mints a handle in structuredContent, and count takes it in
// a parameter marked x-mcp-header, which the go-sdk client mirrors into
// Mcp-Param-Handle. Through mcp_proxy with a handle rule, 30 clients × 10
// count calls all reach the server that minted their handle; through stock
// round robin in the same run, most of them reach another server, which
// does not know the handle.
func TestHandlesPinCallsToTheMintingServer(t *testing.T) {
	backends := startEraBackends(t, "hd-", "modern", 3)
	ps := startProxies(t, handleSite("handles-pin", upstreams(backends)), stockRoundRobin(backends))
	const clients, calls = 30, 10

	plugin := runHandleClients(t, ps[0].url(), clients, calls)
	if ok, all := handleTotals(plugin); ok != clients*calls || all != clients*calls {
		for _, r := range plugin {
			if r.ok() != calls {
				t.Errorf("handle minted by %s: count answered by %v: %v", r.minter, r.servers, r.errs)
			}
		}
		t.Fatalf("through mcp_proxy with a handle rule: %d of %d count calls reached the minting server", ok, clients*calls)
	}
	stock := runHandleClients(t, ps[1].url(), clients, calls)
	ok, all := handleTotals(stock)
	t.Logf("through mcp_proxy: %d of %d calls reached the minting server; through stock round robin: %d of %d", clients*calls, clients*calls, ok, all)
	if ok > all/2 {
		t.Errorf("negative control: stock round robin sent %d of %d count calls to the minting server; want most to break", ok, all)
	}

	families, _ := scrape(t)
	table := map[string]string{"table": "handles-pin_handles"}
	if got := metricValue(families, "caddy_mcp_requests_pinned_total", table); got != clients*calls {
		t.Errorf("caddy_mcp_requests_pinned_total of the handle table = %v, want %d", got, clients*calls)
	}
	if got := metricValue(families, "caddy_mcp_sessions_learned_total", table); got != clients {
		t.Errorf("caddy_mcp_sessions_learned_total of the handle table = %v, want %d", got, clients)
	}
}
