package tests

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Stream helpers: SSE reading and writing, streaming and timeout runs,
// keep-alive sweeps, listens, frozen upstreams and floods.

// startFloodServer starts a go-sdk whoami server that closes sessions idle
// for 2 s, so that it keeps little of a flood in memory: what is measured
// is the proxy's table, not the flood's upstream.
func startFloodServer(t testing.TB) *testproc.Proc {
	t.Helper()
	return launchFleet(t, 1, "flood", whoamiTimeout, func(name, addrFile string) *exec.Cmd {
		return exec.Command(whoamiBin, "-name", name, "-listen", "127.0.0.1:0", "-addr-file", addrFile, "-json", "-session-timeout", "2s")
	})[0]
}

// floodResult is what a flood of initialize requests got.
type floodResult struct {
	learned  int64 // 200 with an Mcp-Session-Id
	failed   int64
	firstErr atomic.Value
	took     time.Duration
}

// flood sends n initialize requests to addr's path from workers
// keep-alive connections of one client, with the extra header lines hdr
// ("Name: value\r\n" each; may be empty). done, when not nil, counts the
// requests answered so far. Requests are bytes written once and responses
// are read with net/http's parser, which costs this process far less than
// net/http's client.
func flood(addr, path string, n, workers int, hdr string, done *atomic.Int64) *floodResult {
	return floodFrom("", addr, path, n, workers, hdr, done)
}

// floodFrom is flood with connections from the loopback address src
// (127.0.0.2, …; the system's choice when empty): another client machine.
func floodFrom(src, addr, path string, n, workers int, hdr string, done *atomic.Int64) *floodResult {
	var dialer net.Dialer
	if src != "" {
		dialer.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	req := []byte(fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\n%sContent-Length: %d\r\n\r\n%s", path, addr, hdr, len(initBody), initBody))
	res := &floodResult{}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			var conn net.Conn
			var br *bufio.Reader
			defer func() {
				if conn != nil {
					conn.Close()
				}
			}()
			for next.Add(1) <= int64(n) {
				if conn == nil {
					c, err := dialer.Dial("tcp", addr)
					if err != nil {
						res.fail(err)
						continue
					}
					conn, br = c, bufio.NewReader(c)
				}
				if err := floodOne(conn, br, req, res); err != nil {
					conn.Close()
					conn = nil
				}
				if done != nil {
					done.Add(1)
				}
			}
		})
	}
	wg.Wait()
	res.took = time.Since(start)
	return res
}

// floodOne sends one initialize request on conn and reads its response.
// An error means the connection is no longer usable.
func floodOne(conn net.Conn, br *bufio.Reader, req []byte, res *floodResult) error {
	if _, err := conn.Write(req); err != nil {
		res.fail(err)
		return err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		res.fail(err)
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Mcp-Session-Id") == "" {
		res.fail(fmt.Errorf("initialize: %s", resp.Status))
	} else {
		atomic.AddInt64(&res.learned, 1)
	}
	return err
}

func (r *floodResult) fail(err error) {
	atomic.AddInt64(&r.failed, 1)
	r.firstErr.CompareAndSwap(nil, err)
}

// openUnused sends one initialize request to url with the extra header
// hdr, and returns the session it opens ("" on failure), which it does not use.
func openUnused(hc *http.Client, url string, hdr http.Header) string {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(initBody))
	req.Header = mcpPOSTHeaders("")
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := hc.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Header.Get("Mcp-Session-Id")
}

// processCPU returns the CPU time this process has used (user and system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// noStream is connectNoStream with connect's signature.
func noStream(ctx context.Context, url string, hc *http.Client, _ ...string) (*mcp.ClientSession, error) {
	return connectNoStream(ctx, url, hc)
}

// callEvery calls whoami on cs every interval until stop, and returns the
// first failure or call answered by another server than owner.
func callEvery(ctx context.Context, cs *mcp.ClientSession, owner string, interval time.Duration, stop <-chan struct{}, calls *atomic.Int64) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return nil
		case <-tick.C:
		}
		id, err := whoami(ctx, cs)
		if err != nil || id.Server != owner {
			return fmt.Errorf("session %s during the flood: %+v, %v; want it on %s", cs.ID(), id, err, owner)
		}
		calls.Add(1)
	}
}

// waitStreams waits until each session's GET stream is open through the
// proxy, as the admin API reports it.
func waitStreams(t *testing.T, table string, sessions []*mcp.ClientSession) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, cs := range sessions {
		open := func() bool {
			var st struct {
				OpenStreams int `json:"open_streams"`
			}
			adminCall(t, http.MethodPost, "/mcp_sessions/lookup", map[string]string{"table": table, "session_id": cs.ID()}, &st)
			return st.OpenStreams > 0
		}
		if !testproc.Until(time.Until(deadline), open) {
			t.Fatalf("session %s has no open GET stream through the proxy", cs.ID())
		}
	}
}

// clientCapEvictions returns caddy_mcp_sessions_evicted_total{reason="client_cap"}
// of table, 0 before the series exists.
func clientCapEvictions(t testing.TB, table string) float64 {
	t.Helper()
	families, _ := scrape(t)
	return max(0, metricValue(families, "caddy_mcp_sessions_evicted_total", map[string]string{"table": table, "reason": "client_cap"}))
}

// freeze stops p with SIGSTOP until the test ends, or until the returned
// function resumes it with SIGCONT.
func freeze(t *testing.T, p *testproc.Proc) (resume func()) {
	t.Helper()
	if err := syscall.Kill(p.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(p.Pid(), syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	return resume
}

// timedConnect opens a go-sdk session through url, giving up after limit,
// and returns it (nil on failure), the server that answers its whoami, and
// how long opening it took.
func timedConnect(t *testing.T, url string, hc *http.Client, limit time.Duration) (*mcp.ClientSession, string, time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	start := time.Now()
	cs, err := connectNoStream(ctx, url, hc)
	took := time.Since(start)
	if err != nil {
		return nil, "", took, err
	}
	t.Cleanup(func() { cs.Close() })
	id, err := whoami(ctx, cs)
	return cs, id.Server, took, err
}

// patientCall makes a raw whoami call of session through url (an
// initialize when session is empty) with a client that gives up after
// limit, and returns its status (0 if it got no answer), body, and how long
// it took.
func patientCall(url, session string, limit time.Duration) (int, string, time.Duration) {
	hc := &http.Client{Timeout: limit}
	defer hc.CloseIdleConnections()
	body := gunicornCallBody
	if session == "" {
		body = initBody
	}
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header = mcpPOSTHeaders(session)
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err.Error(), time.Since(start)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(answer), time.Since(start)
}

// raceGaps returns n pauses for sweep lane of lanes, together covering
// 1.992-2.0005 s in 0.5 ms steps: where, measured on loopback, a request
// sent that long after the previous response reaches gunicorn as it closes
// the idle connection (about one request in five there gets 502 with
// Caddy's own idle timeout).
func raceGaps(lane, lanes, n int) []time.Duration {
	gaps := make([]time.Duration, n)
	for k := range gaps {
		gaps[k] = 1992*time.Millisecond + time.Duration((k*lanes+lane)%18)*500*time.Microsecond
	}
	return gaps
}

// sweepResult counts the outcome of keep-alive sweeps.
type sweepResult struct {
	calls, callFailed   int
	inits, initFailed   int
	initsAfterFailure   int            // initializes sent right after a failed call
	callStatus, initSta map[int]int    // responses by status (0: transport error)
	failedGaps          map[string]int // failed calls by the pause before them
	err                 string         // why a sweep stopped early
}

func (r *sweepResult) add(o sweepResult) {
	r.calls, r.callFailed = r.calls+o.calls, r.callFailed+o.callFailed
	r.inits, r.initFailed, r.initsAfterFailure = r.inits+o.inits, r.initFailed+o.initFailed, r.initsAfterFailure+o.initsAfterFailure
	for _, m := range []*map[int]int{&r.callStatus, &r.initSta} {
		if *m == nil {
			*m = map[int]int{}
		}
	}
	for k, v := range o.callStatus {
		r.callStatus[k] += v
	}
	for k, v := range o.initSta {
		r.initSta[k] += v
	}
	if r.failedGaps == nil {
		r.failedGaps = map[string]int{}
	}
	for k, v := range o.failedGaps {
		r.failedGaps[k] += v
	}
	if r.err == "" {
		r.err = o.err
	}
}

func (r sweepResult) String() string {
	return fmt.Sprintf("%d calls (by status %v, %d failed, by pause %v); %d initializes (by status %v, %d failed, %d right after a failed call); stopped early: %q",
		r.calls, r.callStatus, r.callFailed, r.failedGaps, r.inits, r.initSta, r.initFailed, r.initsAfterFailure, r.err)
}

// sweepKeepAlive opens a session at url, then for each gap waits gap and
// makes a whoami call of the session followed by an initialize, both over
// one client connection. It runs on its own goroutine: it reports problems
// in the result instead of failing a test.
func sweepKeepAlive(url string, gaps []time.Duration) sweepResult {
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	res := sweepResult{callStatus: map[int]int{}, initSta: map[int]int{}, failedGaps: map[string]int{}}
	status, session := keepAlivePost(hc, url, "", gunicornInitBody)
	if status != http.StatusOK || session == "" {
		res.err = fmt.Sprintf("first initialize: %d", status)
		return res
	}
	for _, gap := range gaps {
		time.Sleep(gap)
		status, _ := keepAlivePost(hc, url, session, gunicornCallBody)
		res.calls++
		res.callStatus[status]++
		failed := status != http.StatusOK
		if failed {
			res.callFailed++
			res.failedGaps[gap.String()]++
		}
		status, _ = keepAlivePost(hc, url, "", gunicornInitBody)
		res.inits++
		res.initSta[status]++
		if status != http.StatusOK {
			res.initFailed++
		}
		if failed {
			res.initsAfterFailure++
		}
	}
	return res
}

const (
	gunicornInitBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sweep","version":"0"}}}`
	gunicornCallBody = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`
)

// keepAlivePost sends one MCP POST, with session if not empty, and returns the
// status (0 on a transport error) and the response's Mcp-Session-Id.
func keepAlivePost(hc *http.Client, url, session, body string) (int, string) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, ""
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("Mcp-Session-Id")
}

// connectListening opens a 2026-07-28 session through url with the go-sdk
// client, listening for tool list changes: the client then opens a
// subscriptions/listen stream, and sends the time of each change to changed.
func connectListening(ctx context.Context, url string, hc *http.Client, changed chan<- time.Time) (*mcp.ClientSession, error) {
	opts := &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- time.Now() }}
	client := mcp.NewClient(&mcp.Implementation{Name: "listen-test", Version: "v0"}, opts)
	return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, nil)
}

// openListens returns caddy_mcp_streams_open{kind="listen"} of table.
func openListens(t testing.TB, table string) float64 {
	t.Helper()
	families, _ := scrape(t)
	return metricValue(families, "caddy_mcp_streams_open", map[string]string{"table": table, "kind": "listen"})
}

// waitOpenListens waits up to 10 s for table's open listen streams to be want.
func waitOpenListens(t testing.TB, table string, want float64) {
	t.Helper()
	testproc.Until(10*time.Second, func() bool { return openListens(t, table) == want })
	if got := openListens(t, table); got != want {
		t.Errorf("open listen streams = %v, want %v", got, want)
	}
}

// readSSEBlock reads one SSE block (an event or a comment) from br: its
// lines up to the blank line that ends it, without that blank line.
func readSSEBlock(br *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return b.String() + line, err
		}
		if strings.TrimRight(line, "\r\n") == "" {
			if b.Len() == 0 {
				continue
			}
			return b.String(), nil
		}
		b.WriteString(line)
	}
}

// stamps carries the times at which a double wrote to its response.
type stamps chan time.Time

// next returns the next write time, failing the test if none comes soon.
func (s stamps) next(t testing.TB, what string) time.Time {
	t.Helper()
	select {
	case at := <-s:
		return at
	case <-time.After(5 * time.Second):
		t.Fatalf("the double never wrote %s", what)
		return time.Time{}
	}
}

// writeSSE writes one SSE block and flushes it, returning the time of the write.
func writeSSE(w http.ResponseWriter, block string) time.Time {
	at := time.Now()
	io.WriteString(w, block) //nolint:errcheck
	http.NewResponseController(w).Flush()
	return at
}

// sseHeaders sets the headers of an SSE response as go-sdk does, plus
// X-Accel-Buffering: no, which tells buffering proxies to pass events at once.
func sseHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache, no-transform")
	h.Set("X-Accel-Buffering", "no")
}

// compressibleSSEHeaders are sseHeaders without `no-transform`, which would
// stop Caddy's encode from compressing the stream.
func compressibleSSEHeaders(w http.ResponseWriter) {
	sseHeaders(w)
	w.Header().Set("Cache-Control", "no-cache")
}

// goSDKSession opens a session on a go-sdk server through url with raw
// requests (initialize, then notifications/initialized) and returns its ID.
func goSDKSession(t testing.TB, hc *http.Client, url string) string {
	t.Helper()
	ex := send(t, hc, http.MethodPost, url, mcpPOSTHeaders(""), initBody)
	id := ex.header.Get("Mcp-Session-Id")
	if ex.status != http.StatusOK || id == "" {
		t.Fatalf("initialize: %d %v %q", ex.status, ex.header, ex.body)
	}
	ex = send(t, hc, http.MethodPost, url, mcpPOSTHeaders(id), `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if ex.status != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d %q", ex.status, ex.body)
	}
	return id
}

// openStandaloneGET opens the session's standalone SSE stream through url.
// The caller closes the response body (when it is 200) and cancels ctx.
func openStandaloneGET(ctx context.Context, t testing.TB, hc *http.Client, url, session string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", session)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	return resp
}

// mcpOnly returns the requests that are not health checks.
func mcpOnly(reqs []recorded) []recorded {
	var out []recorded
	for _, r := range reqs {
		if r.path != "/health" {
			out = append(out, r)
		}
	}
	return out
}

// readBody returns the request's body; the double has already buffered it.
func readBody(r *http.Request) string {
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

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
