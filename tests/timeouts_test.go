package tests

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/quic-go/quic-go/http3"
)

// Server timeouts (docs/behaviour.md, "Streaming"): Caddy's `servers {
// timeouts { write ... } }` bounds the writing of each response, counted
// from the request; the plugin's streams and the answers of calls still in
// progress outlive it, every other response keeps it.

// streamRun is what one client saw of the plugin's kinds of streams.
type streamRun struct {
	progress    int32 // progress notifications of the SSE tool call
	sseErr      error // the SSE tool call's error, nil if it got its result
	jsonErr     error // the JSON tool call's error
	getEvent    bool  // a notification crossed the GET stream after the timeout
	listenEvent bool  // one crossed the 2026-07-28 subscriptions/listen stream
}

// String reports the run in one line.
func (r streamRun) String() string {
	return fmt.Sprintf("SSE call: %d/10 progress, error %v; JSON call: error %v; GET stream event: %v; listen stream event: %v",
		r.progress, r.sseErr, r.jsonErr, r.getEvent, r.listenEvent)
}

// whole reports whether every stream survived and delivered.
func (r streamRun) whole() bool {
	return r.progress == 10 && r.sseErr == nil && r.jsonErr == nil && r.getEvent && r.listenEvent
}

// cut reports whether every stream was cut: nothing of it survived.
func (r streamRun) cut() bool {
	return r.progress < 10 && r.sseErr != nil && r.jsonErr != nil && !r.getEvent && !r.listenEvent
}

// toolAdded counts add_tool calls, so that each adds a tool of its own.
var toolAdded atomic.Int64

// addTool calls add_tool through url with a session of its own (version
// "" for the go-sdk client's default), so that the server notifies every
// session listening for tool list changes.
func addTool(ctx context.Context, url string, hc *http.Client) error {
	cs, err := connectNoStream(ctx, url, hc)
	if err != nil {
		return err
	}
	defer cs.Close()
	_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "add_tool", Arguments: map[string]any{"name": fmt.Sprintf("t%d", toolAdded.Add(1))}})
	return err
}

// waitEvent reports whether a time arrives on c within limit.
func waitEvent(c <-chan time.Time, limit time.Duration) bool {
	select {
	case <-c:
		return true
	case <-time.After(limit):
		return false
	}
}

// runStreams drives, with go-sdk clients over hc, at once: a GET stream
// (sse), a tool call answered with SSE that sends 10 progress
// notifications over 5 s (sse), a 3 s tool call answered with JSON (json),
// and a 2026-07-28 subscriptions/listen stream (modern). Once the calls are
// done, more than 3 s after the streams opened, a tool is added on sse and
// on modern, whose list change must cross the GET and the listen stream.
func runStreams(t *testing.T, hc *http.Client, sse, json, modern string) streamRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	var run streamRun
	changed, listened := make(chan time.Time, 16), make(chan time.Time, 16)
	getOpts := &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- time.Now() }}
	getter, err := mcp.NewClient(&mcp.Implementation{Name: "timeouts-get", Version: "v0"}, getOpts).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: sse, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connect with a GET stream: %v", err)
	}
	defer getter.Close()
	listener, err := connectListening(ctx, modern, hc, listened)
	if err != nil {
		t.Fatalf("connect with a listen stream: %v", err)
	}
	defer listener.Close()
	opened := time.Now()

	var wg sync.WaitGroup
	wg.Go(func() {
		opts := &mcp.ClientOptions{ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
			atomic.AddInt32(&run.progress, 1)
		}}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "timeouts-sse", Version: "v0"}, opts).
			Connect(ctx, &mcp.StreamableClientTransport{Endpoint: sse, HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
		if err != nil {
			run.sseErr = err
			return
		}
		defer cs.Close()
		params := &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"milliseconds": 5000, "steps": 10}}
		params.SetProgressToken("p")
		run.sseErr = toolDone(cs.CallTool(ctx, params))
	})
	wg.Go(func() {
		cs, err := connectNoStream(ctx, json, hc)
		if err != nil {
			run.jsonErr = err
			return
		}
		defer cs.Close()
		run.jsonErr = toolDone(cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"milliseconds": 3000}}))
	})
	wg.Wait()
	time.Sleep(time.Until(opened.Add(3 * time.Second)))
	if err := addTool(ctx, sse, hc); err != nil {
		t.Fatalf("add_tool: %v", err)
	}
	run.getEvent = waitEvent(changed, 3*time.Second)
	if err := addTool(ctx, modern, hc); err != nil {
		t.Fatalf("add_tool (2026-07-28): %v", err)
	}
	run.listenEvent = waitEvent(listened, 3*time.Second)
	return run
}

// toolDone returns why a tool call did not return "done".
func toolDone(res *mcp.CallToolResult, err error) error {
	switch {
	case err != nil:
		return err
	case res.IsError || len(res.Content) == 0:
		return fmt.Errorf("tool error: %+v", res.Content)
	}
	if text, ok := res.Content[0].(*mcp.TextContent); !ok || text.Text != "done" {
		return fmt.Errorf("result %+v, want done", res.Content[0])
	}
	return nil
}

// slowJSON answers a POST of tool `late` with its JSON result after 3 s,
// and one of tool `dribble` with half of it at once and the rest 3 s
// later: a JSON answer still in progress, and a response slow to write.
func slowJSON(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	result := `{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"done"}]}}`
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(result)))
	if strings.Contains(string(body), `"late"`) {
		time.Sleep(3 * time.Second)
		io.WriteString(w, result) //nolint:errcheck
		return
	}
	io.WriteString(w, result[:20]) //nolint:errcheck
	http.NewResponseController(w).Flush()
	time.Sleep(3 * time.Second)
	io.WriteString(w, result[20:]) //nolint:errcheck
}

// postTool sends a sessionless tools/call of tool to url and returns the
// status and body the client read, or the error that cut them.
func postTool(hc *http.Client, url, tool string) (int, string, error) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(
		fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":%q}}`, tool)))
	req.Header = mcpPOSTHeaders("")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// streamSites are the URLs of the sites of TestStreamsOutliveWriteTimeout:
// mcp_proxy and stock reverse_proxy in front of the SSE, JSON and
// 2026-07-28 servers, and mcp_proxy in front of the slowJSON double.
type streamSites struct {
	plugin, stock [3]string
	double        string
}

// checkStreams runs runStreams through the plugin and, at once, through
// stock reverse_proxy, and then the slowJSON double's two answers through
// the plugin, all over hc; limits names the server's timeouts.
func checkStreams(t *testing.T, hc *http.Client, sites streamSites, limits string) {
	var plugin, stock streamRun
	var wg sync.WaitGroup
	wg.Go(func() { plugin = runStreams(t, hc, sites.plugin[0], sites.plugin[1], sites.plugin[2]) })
	wg.Go(func() { stock = runStreams(t, hc, sites.stock[0], sites.stock[1], sites.stock[2]) })
	wg.Wait()
	t.Logf("mcp_proxy: %s", plugin)
	t.Logf("stock reverse_proxy (control): %s", stock)
	if !plugin.whole() {
		t.Errorf("through mcp_proxy with %s, a stream was cut: %s", limits, plugin)
	}
	if !stock.cut() {
		t.Errorf("stock reverse_proxy with %s left a stream whole: the test does not exercise the timeout: %s", limits, stock)
	}

	status, body, err := postTool(hc, sites.double, "late")
	t.Logf("JSON answer after 3 s: %d %q %v", status, body, err)
	if err != nil || status != http.StatusOK || !strings.Contains(body, "done") {
		t.Errorf("a JSON answer whose headers came after 3 s: %d %q %v; want it whole", status, body, err)
	}
	status, body, err = postTool(hc, sites.double, "dribble")
	t.Logf("JSON answer written over 3 s: %d %q %v", status, body, err)
	if err == nil {
		t.Errorf("a JSON answer written over 3 s came whole (%d %q) with %s; want it cut: the limit must stay on responses that are not streams", status, body, limits)
	}
}

// TestStreamsOutliveWriteTimeout (docs/behaviour.md, "Server timeouts"):
// Caddy with `servers { timeouts { write 2s } }` in front of real go-sdk
// servers (one answering POSTs with SSE, one with JSON, one of protocol
// 2026-07-28), over HTTP/1.1, h2c and HTTP/3, and with `write_idle 1s
// 2000` (a minimum rate of 2000 bytes a second) over HTTP/1.1. Through
// mcp_proxy, go-sdk clients get every progress notification and the result
// of a 5 s SSE tool call, the result of a 3 s JSON tool call, and a
// notification on a GET stream and on a subscriptions/listen stream open
// for more than 3 s. Negative control in the same run: stock reverse_proxy
// cuts every one of them. A response that is not a stream keeps the limit:
// a JSON answer whose body is written over 3 s is cut through the plugin
// too, while one whose headers come after 3 s (a call still in progress)
// is answered whole.
func TestStreamsOutliveWriteTimeout(t *testing.T) {
	sse, json := startBackends(t, 1, false), startBackends(t, 1, true)
	modern := startEraBackends(t, "m", "modern", 1)
	d := startDoubles(t, 1)
	d[0].handle(slowJSON)
	bodies := []string{"mcp_proxy " + upstreams(sse), "mcp_proxy " + upstreams(json), "mcp_proxy " + upstreams(modern),
		stockRoundRobin(sse), stockRoundRobin(json), stockRoundRobin(modern), "mcp_proxy " + upstreams(d)}
	plainSites := func(t *testing.T, limits string) streamSites {
		ps := startProxiesWith(t, "timeouts {\n\t\t\t"+limits+"\n\t\t}", bodies...)
		return streamSites{plugin: [3]string{ps[0].url(), ps[1].url(), ps[2].url()},
			stock: [3]string{ps[3].url(), ps[4].url(), ps[5].url()}, double: ps[6].url()}
	}
	for _, tc := range []struct {
		name, limits string
		h2c          bool
	}{
		{name: "write/HTTP1.1", limits: "write 2s"},
		{name: "write/h2c", limits: "write 2s", h2c: true},
		{name: "write_idle-min_rate/HTTP1.1", limits: "write_idle 1s 2000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sites := plainSites(t, tc.limits)
			hc := newHTTPClient()
			if tc.h2c {
				hc = newH2CClient()
			}
			defer hc.CloseIdleConnections()
			checkStreams(t, hc, sites, tc.limits)
		})
	}
	t.Run("write/HTTP3", func(t *testing.T) {
		port := mustFreePort()
		var routes strings.Builder
		var sites streamSites
		for i, body := range bodies {
			fmt.Fprintf(&routes, "handle /r%d/* {\n\t\t%s\n\t}\n\t", i, body)
			url := fmt.Sprintf("https://127.0.0.1:%d/r%d/mcp", port, i)
			switch {
			case i < 3:
				sites.plugin[i] = url
			case i < 6:
				sites.stock[i-3] = url
			default:
				sites.double = url
			}
		}
		loadCaddyfile(t, tlsSiteConfigWith(t, port, "timeouts {\n\t\t\twrite 2s\n\t\t}", routes.String()))
		tlsConf := &tls.Config{ServerName: "localhost", InsecureSkipVerify: true} //nolint:gosec // Caddy's internal CA, loopback test
		h3 := &http3.Transport{TLSClientConfig: tlsConf}
		defer h3.Close()
		hc := &http.Client{Transport: hostRewriter{host: fmt.Sprintf("localhost:%d", port), next: h3}}
		waitForHTTP3(t, &http.Client{Transport: h3, Timeout: 10 * time.Second}, sites.plugin[0])
		checkStreams(t, hc, sites, "write 2s")
	})
}
