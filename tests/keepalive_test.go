package tests

import (
	"fmt"
	"slices"
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
