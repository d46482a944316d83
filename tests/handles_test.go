package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
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

	// Header and body disagreeing: pinned by the header, refused by the
	// server (MCP 2026-07-28 transports, §Server Validation).
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	ex := send(t, hc, http.MethodPost, ps[0].url(), map[string][]string{
		"Content-Type": {"application/json"}, "Accept": {"application/json, text/event-stream"},
		"Mcp-Protocol-Version": {modernVersion}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {"count"},
		"Mcp-Param-Handle": {plugin[0].handle},
	}, countBody("another-handle"))
	if ex.status != http.StatusBadRequest || rpcErrorCode(ex.body) != -32020 {
		t.Errorf("Mcp-Param-Handle and the body's handle differ: %d %s; want the server's 400 -32020", ex.status, ex.body)
	}
}

// openCounters opens n counters through url, with a first count call each
// answered by the minting server; it fails t otherwise.
func openCounters(t *testing.T, ctx context.Context, url string, hc *http.Client, n int) ([]*mcp.ClientSession, []handleReport) {
	t.Helper()
	css, reps := make([]*mcp.ClientSession, n), make([]handleReport, n)
	for i := range n {
		cs, rep, err := openCounter(ctx, url, hc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		countCalls(ctx, cs, &rep, 1)
		if rep.ok() != 1 {
			t.Fatalf("first count call of a handle minted by %s: answered by %v: %v", rep.minter, rep.servers, rep.errs)
		}
		css[i], reps[i] = cs, rep
	}
	return css, reps
}

// TestHandlesOfAKilledUpstream kills one of 3 sessionless servers: the
// calls carrying its handles get another server's answer to an unknown
// handle through a site with unknown_handle forward, and the proxy's 404
// through one with unknown_handle reject; either way the handle is
// forgotten. Handles of the other servers keep reaching them. A handle
// never minted is refused by the reject site, balanced by the other.
func TestHandlesOfAKilledUpstream(t *testing.T) {
	backends := startEraBackends(t, "hk-", "modern", 3)
	ups := upstreams(backends)
	ps := startProxies(t, handleSite("handles-fwd", ups), handleSite("handles-rej", ups, "unknown_handle reject"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	const n = 9
	fwdCS, fwd := openCounters(t, ctx, ps[0].url(), hc, n)
	rejCS, rej := openCounters(t, ctx, ps[1].url(), hc, n)

	victim := backends[0]
	victim.Kill()
	<-victim.Done()
	waitClosesRead(t, victim.Addr())

	check := func(site string, css []*mcp.ClientSession, reps []handleReport, wantGone func(handleReport) string) {
		gone := 0
		for i := range reps {
			before := len(reps[i].servers)
			countCalls(ctx, css[i], &reps[i], 1)
			got, errText := reps[i].servers[before], strings.Join(reps[i].errs, "; ")
			switch {
			case reps[i].minter != victim.Name() && got != reps[i].minter:
				t.Errorf("%s: a handle of live %s was answered by %q after %s died: %s", site, reps[i].minter, got, victim.Name(), errText)
			case reps[i].minter == victim.Name():
				gone++
				if want := wantGone(reps[i]); !strings.Contains(errText, want) {
					t.Errorf("%s: a handle of killed %s: %q, want an error containing %q", site, victim.Name(), errText, want)
				}
			}
		}
		if gone == 0 {
			t.Fatalf("%s: no handle was minted by %s; the balancing spread %d handles over fewer servers", site, victim.Name(), n)
		}
	}
	// forward: another server answers the handle it does not hold.
	check("unknown_handle forward", fwdCS, fwd, func(handleReport) string { return "holds no counter" })
	// reject: the proxy answers 404 without contacting an upstream (the
	// go-sdk client reports the status; no go-sdk server answers a
	// tools/call with 404).
	check("unknown_handle reject", rejCS, rej, func(handleReport) string { return "Not Found" })

	families, _ := scrape(t)
	for _, table := range []string{"handles-fwd_handles", "handles-rej_handles"} {
		if got := metricValue(families, "caddy_mcp_upstream_gone_total", map[string]string{"table": table}); got < 1 {
			t.Errorf("caddy_mcp_upstream_gone_total{table=%q} = %v, want the killed server's handles", table, got)
		}
	}

	// A handle never minted: balanced by one site, refused by the other.
	for i, want := range []int{http.StatusOK, http.StatusNotFound} {
		ex := sendWithHost(t, hc, http.MethodPost, ps[i].url(), ps[i].addr, map[string][]string{
			"Content-Type": {"application/json"}, "Accept": {"application/json, text/event-stream"},
			"Mcp-Protocol-Version": {modernVersion}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {"count"},
			"Mcp-Param-Handle": {"never-minted"},
		}, countBody("never-minted"))
		if ex.status != want {
			t.Errorf("site %d: a never-minted handle got %d %s, want %d", i, ex.status, ex.body, want)
		}
	}
}

// countBody is a 2026-07-28 tools/call of count with handle.
func countBody(handle string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"count","arguments":{"handle":"` + handle + `"},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
}

// countRequest sends one raw 2026-07-28 count call carrying handle in
// Mcp-Param-Handle through url.
func countRequest(t *testing.T, hc *http.Client, url, handle string) exchange {
	t.Helper()
	return send(t, hc, http.MethodPost, url, map[string][]string{
		"Content-Type": {"application/json"}, "Accept": {"application/json, text/event-stream"},
		"Mcp-Protocol-Version": {modernVersion}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {"count"},
		"Mcp-Param-Handle": {handle},
	}, countBody(handle))
}

// TestHandlesOfAnUnavailableUpstream: while a server fails its active
// health checks, within unhealthy_grace, the calls carrying its handles get
// the proxy's 503 with Retry-After and the handles are kept: once it passes
// again, they reach it and find their counters. The other server's handles
// keep working meanwhile.
func TestHandlesOfAnUnavailableUpstream(t *testing.T) {
	dir := t.TempDir()
	down := func(name string) string { return filepath.Join(dir, name+".down") }
	backends := launchFleet(t, 2, "hu-", whoamiTimeout, func(name, addrFile string) *exec.Cmd {
		return exec.Command(whoamiBin, "-name", name, "-listen", "127.0.0.1:0", "-addr-file", addrFile, "-era", "modern", "-down-file", down(name))
	})
	p := startProxy(t, handleSite("handles-unavail", upstreams(backends), "health_uri /healthz", "health_interval 250ms", "unhealthy_grace 1m", "fallback round_robin"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	css, reps := openCounters(t, ctx, p.url(), hc, 4)
	byServer := map[string]int{}
	for i, r := range reps {
		byServer[r.minter] = i
	}
	sick, healthy := backends[0].Name(), backends[1].Name()
	si, ok1 := byServer[sick]
	hi, ok2 := byServer[healthy]
	if !ok1 || !ok2 {
		t.Fatalf("round robin minted the 4 handles on %v; want both servers", byServer)
	}

	if err := os.WriteFile(down(sick), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var ex exchange
	if !testproc.Until(10*time.Second, func() bool {
		ex = countRequest(t, hc, p.url(), reps[si].handle)
		return ex.status == http.StatusServiceUnavailable
	}) {
		t.Fatalf("a handle of %s, failing health checks: %d %s; want 503", sick, ex.status, ex.body)
	}
	checkUnavailable(t, ex)
	countCalls(ctx, css[hi], &reps[hi], 1)
	if reps[hi].ok() != 2 {
		t.Errorf("a handle of healthy %s while %s is down: answered by %v: %v", healthy, sick, reps[hi].servers, reps[hi].errs)
	}

	if err := os.Remove(down(sick)); err != nil {
		t.Fatal(err)
	}
	if !testproc.Until(10*time.Second, func() bool {
		ex = countRequest(t, hc, p.url(), reps[si].handle)
		return ex.status == http.StatusOK
	}) {
		t.Fatalf("a handle of %s, passing health checks again: %d %s; want 200", sick, ex.status, ex.body)
	}
	countCalls(ctx, css[si], &reps[si], 1)
	if last := reps[si].servers[len(reps[si].servers)-1]; last != sick {
		t.Errorf("the kept handle of %s, back in service: answered by %q: %v", sick, last, reps[si].errs)
	}
}

// TestHandlesAdminLookupAndEvict: the admin API finds a handle in the
// handle table, with the upstream that minted it, and evicts it; the next
// call carrying it is then an unknown handle (refused by unknown_handle
// reject), while a handle left alone goes on working.
func TestHandlesAdminLookupAndEvict(t *testing.T) {
	backends := startEraBackends(t, "ha-", "modern", 2)
	p := startProxy(t, handleSite("handles-admin", upstreams(backends), "unknown_handle reject"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	_, reps := openCounters(t, ctx, p.url(), hc, 2)
	addr := map[string]string{}
	for _, b := range backends {
		addr[b.Name()] = b.Addr()
	}

	body := func(h string) string { return `{"table":"handles-admin_handles","session_id":"` + h + `"}` }
	code, out := adminRaw(t, http.MethodPost, "/mcp_sessions/lookup", body(reps[0].handle))
	var st struct {
		Upstream string `json:"upstream"`
	}
	if err := json.Unmarshal([]byte(out), &st); code != http.StatusOK || err != nil || st.Upstream != addr[reps[0].minter] {
		t.Fatalf("lookup of a handle minted by %s (%s): %d %s", reps[0].minter, addr[reps[0].minter], code, out)
	}
	if code, out := adminRaw(t, http.MethodPost, "/mcp_sessions/evict", body(reps[0].handle)); code != http.StatusOK {
		t.Fatalf("evict: %d %s", code, out)
	}
	if ex := countRequest(t, hc, p.url(), reps[0].handle); ex.status != http.StatusNotFound {
		t.Errorf("the evicted handle: %d %s, want the proxy's 404", ex.status, ex.body)
	}
	if ex := countRequest(t, hc, p.url(), reps[1].handle); ex.status != http.StatusOK || !strings.Contains(ex.body, reps[1].minter) {
		t.Errorf("a handle left alone: %d %s, want its server %s", ex.status, ex.body, reps[1].minter)
	}
	if code, out := adminRaw(t, http.MethodPost, "/mcp_sessions/lookup", body(reps[0].handle)); code != http.StatusNotFound {
		t.Errorf("lookup of the evicted handle: %d %s, want 404", code, out)
	}
}

// handleTableRoutes routes /<table>/mcp of a replica to an mcp_proxy over
// ups with that table and the counters' handle rule, for each table.
func handleTableRoutes(ups string, tables ...string) string {
	var b strings.Builder
	for _, table := range tables {
		fmt.Fprintf(&b, "handle_path /%s/* {\n\t\t%s\n\t}\n\t", table, handleSite(table, ups))
	}
	return b.String()
}

// crossReplicaCounts opens a counter through one replica's url per client
// and makes each count call through the other's, with a client of its own
// there; it returns the calls the minting server answered, of all.
func crossReplicaCounts(t *testing.T, mint, use string, clients, calls int) (ok, all int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	reps := make([]handleReport, clients)
	errs := make([]error, clients)
	var wg sync.WaitGroup
	for i := range reps {
		wg.Go(func() {
			minter, rep, err := openCounter(ctx, mint, hc)
			if err != nil {
				errs[i] = err
				return
			}
			minter.Close()
			user, _, err := openCounter(ctx, use, hc) // lists the tools there
			if err != nil {
				errs[i] = err
				return
			}
			defer user.Close()
			countCalls(ctx, user, &rep, calls)
			reps[i] = rep
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return handleTotals(reps)
}

// TestHandlesAcrossReplicasOnOneRedis: two Caddy replicas keep the handle
// table in one Redis. Each client opens its counter through c1 and counts
// through c2, which never saw the minting call: every call reaches the
// minting server. The same through a handle table in memory (the negative
// control, same replicas, same run): c2 does not know the handles, and
// balances most calls to servers that do not hold them.
func TestHandlesAcrossReplicasOnOneRedis(t *testing.T) {
	srv := redistest.Start(t)
	bs := startEraBackends(t, "hr-", "modern", 3)
	global := "mcp_sessions hshared_handles {\n\t\t" + redisStore(srv.Addr, sharedTimeout) + "\n\t}\n\t" + storeLog
	rs := startStoreReplicas(t, 2, global, handleTableRoutes(upstreams(bs), "hshared", "hlocal"))
	const clients, calls = 10, 10

	ok, all := crossReplicaCounts(t, tableURL(rs[0], "hshared"), tableURL(rs[1], "hshared"), clients, calls)
	if ok != clients*calls || all != clients*calls {
		t.Errorf("handle table in Redis: %d of %d count calls through c2 reached the server that minted the handle through c1", ok, clients*calls)
	}
	lok, lall := crossReplicaCounts(t, tableURL(rs[0], "hlocal"), tableURL(rs[1], "hlocal"), clients, calls)
	t.Logf("through c2, handles minted through c1: Redis table %d of %d calls reached the minting server; memory table %d of %d", ok, all, lok, lall)
	if lok > lall/2 {
		t.Errorf("negative control: with the handle table in memory, %d of %d calls through c2 reached the minting server; want most to miss", lok, lall)
	}
}

// TestProxyCommandPinsHandles: `caddy mcp-proxy --handle` in front of the
// 3 sessionless servers pins 10 clients × 10 count calls to the servers
// that minted their handles.
func TestProxyCommandPinsHandles(t *testing.T) {
	bs := startEraBackends(t, "hc-", "modern", 3)
	addr := freeAddr(t)
	args := []string{"mcp-proxy", "--from", addr, "--admin", "off", "--status", "off", "--handle", "open_counter /handle Mcp-Param-Handle"}
	for _, b := range bs {
		args = append(args, "--to", b.Addr())
	}
	runProxyCommand(t, "mcp-proxy-handles", addr, args...)
	const clients, calls = 10, 10
	if ok, all := handleTotals(runHandleClients(t, "http://"+addr+"/mcp", clients, calls)); ok != clients*calls || all != clients*calls {
		t.Errorf("caddy mcp-proxy --handle: %d of %d count calls reached the minting server", ok, clients*calls)
	}
}
