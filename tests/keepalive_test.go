package tests

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// keepAliveGaps are the pauses between requests of a sweep: around
// gunicorn's default keep-alive timeout of 2 s, densest where a request
// meets the upstream's close of the idle connection.
var keepAliveGaps = []time.Duration{
	1800 * time.Millisecond, 1900 * time.Millisecond, 1950 * time.Millisecond, 1990 * time.Millisecond,
	1995 * time.Millisecond, 1998 * time.Millisecond, 2000 * time.Millisecond, 2002 * time.Millisecond,
	2010 * time.Millisecond, 2050 * time.Millisecond, 2100 * time.Millisecond, 2300 * time.Millisecond,
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

// TestUpstreamIdleCloseNever5xx: real gunicorn (uvicorn worker, its default
// keep-alive of 2 s), each a lone upstream behind mcp_proxy, gets calls of a
// session spaced by pauses swept across 1.8-2.3 s, each call followed by a
// new session's initialize; 6 sweeps run at once, each on its own gunicorn.
// docs/caddyfile.md, "keepalive": the proxy closes idle upstream connections
// after 1 s, before gunicorn does, so no call meets a connection gunicorn is
// closing: every call and every initialize gets 200.
//
// The control sweeps the same gunicorns through mcp_proxy with Caddy's own
// idle timeout (`keepalive 2m`), with pauses where the race happens: some
// calls must get 502 (gunicorn closed the connection as the proxy reused
// it; up to 3 rounds), or the sweep could not show the fault. Each 502
// counts a passive health failure against the lone upstream, which passive
// health checks (max_fails 1, fail_duration 10s) would take out of service;
// the initialize right after it must still get 200, not 503: passive
// health never leaves new sessions without an upstream.
func TestUpstreamIdleCloseNever5xx(t *testing.T) {
	peer := findGunicorn(t)
	const lanes = 6
	names := make([]string, lanes)
	for i := range names {
		names[i] = fmt.Sprintf("ka%d", i+1)
	}
	gs := startGunicorns(t, peer, names, 1)
	var bodies []string
	for _, g := range gs {
		bodies = append(bodies, "mcp_proxy "+g.Addr(),
			"mcp_proxy "+g.Addr()+" {\n\t\ttransport http {\n\t\t\tkeepalive 2m\n\t\t}\n\t}")
	}
	ps := startProxies(t, bodies...)

	var dflt, ctrl sweepResult
	for round := 1; round <= 3 && ctrl.callFailed == 0; round++ {
		sweeps := make([]sweepResult, len(ps))
		var wg sync.WaitGroup
		for i, p := range ps {
			lane := i / 2
			gaps := raceGaps(lane, lanes, 9)
			if i%2 == 0 {
				if round > 1 {
					continue // the defaults ran their sweep in round 1
				}
				gaps = slices.Concat(keepAliveGaps[lane*2:], keepAliveGaps[:lane*2]) // each lane starts elsewhere
			}
			wg.Go(func() { sweeps[i] = sweepKeepAlive(p.url(), gaps) })
		}
		wg.Wait()
		for i, s := range sweeps {
			if i%2 == 0 {
				dflt.add(s)
			} else {
				ctrl.add(s)
			}
		}
		t.Logf("round %d: mcp_proxy defaults: %s", round, dflt)
		t.Logf("round %d: control, keepalive 2m: %s", round, ctrl)
	}
	if dflt.err != "" || dflt.callFailed > 0 || dflt.initFailed > 0 || dflt.calls != lanes*len(keepAliveGaps) {
		t.Errorf("mcp_proxy defaults: want %d calls and initializes, all 200; got %s", lanes*len(keepAliveGaps), dflt)
	}
	if ctrl.err != "" || ctrl.callFailed == 0 {
		t.Fatalf("control: no call failed with Caddy's idle timeout, so this sweep cannot show the fault: %s", ctrl)
	}
	if ctrl.initFailed > 0 {
		t.Errorf("control: new sessions failed after a 502 (passive health took the lone upstream out of service): %s", ctrl)
	}
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
