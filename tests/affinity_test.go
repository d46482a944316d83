package tests

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestPinsSessionsUnderLoad is the main job: 100 concurrent go-sdk client
// sessions of 5 tool calls each through mcp_proxy over 3 go-sdk servers all
// succeed, each call answered by the server that created its session. The
// same load through stock round_robin, in the same run, must break sessions,
// which shows the test can see the bug.
func TestPinsSessionsUnderLoad(t *testing.T) {
	for _, mode := range []struct {
		name string
		json bool
	}{{"sse", false}, {"json", true}} {
		t.Run(mode.name, func(t *testing.T) {
			bs := startBackends(t, 3, mode.json)

			p := startProxy(t, "mcp_proxy "+upstreams(bs))
			res := runSessions(t, p.url(), 100, sessionPlan{calls: 5})
			t.Logf("mcp_proxy: %s", res)
			if res.ok != 100 || res.onCreator != 500 {
				t.Fatalf("mcp_proxy: want 100/100 sessions and 500 pinned calls; got %s", res)
			}
			for _, b := range bs {
				if res.perServer[b.Name()] == 0 {
					t.Errorf("server %s got no sessions: %v", b.Name(), res.perServer)
				}
			}

			stock := startProxy(t, stockRoundRobin(bs))
			ctrl := runSessions(t, stock.url(), 100, sessionPlan{calls: 5})
			t.Logf("stock round_robin (negative control): %s", ctrl)
			if ctrl.ok == 100 {
				t.Fatalf("negative control: stock round_robin kept every session, so this test cannot see misrouting")
			}
		})
	}
}

// TestKillOneServerMidRun kills one of three servers while sessions are
// calling tools: the sessions of the other servers are untouched, the killed
// server's sessions fail fast with 404 instead of being re-routed, and new
// sessions go to the live servers.
func TestKillOneServerMidRun(t *testing.T) {
	bs := startBackends(t, 3, false)
	p := startProxy(t, "mcp_proxy "+upstreams(bs))
	victim := bs[1]

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	const sessions = 60
	var (
		stop      atomic.Bool
		killed    atomic.Bool
		wg        sync.WaitGroup
		mu        sync.Mutex
		survivors = map[string]int{} // server -> sessions that made it to the end
		lost      []string           // failures, each with its server
		slowFail  time.Duration
	)
	started := make(chan struct{}, sessions)
	for range sessions {
		wg.Go(func() {
			cs, err := connect(ctx, p.url(), hc)
			if err != nil {
				t.Errorf("connect before the kill: %v", err)
				started <- struct{}{}
				return
			}
			defer cs.Close()
			first, err := whoami(ctx, cs)
			started <- struct{}{}
			if err != nil {
				t.Errorf("first call before the kill: %v", err)
				return
			}
			for !stop.Load() {
				begin := time.Now()
				id, err := whoami(ctx, cs)
				took := time.Since(begin)
				mu.Lock()
				switch {
				case err != nil && first.Server == victim.Name() && killed.Load():
					lost = append(lost, first.Server)
					slowFail = max(slowFail, took)
				case err != nil:
					t.Errorf("session on %s failed: %v", first.Server, err)
				case id.Server != first.Server:
					t.Errorf("session of %s answered by %s", first.Server, id.Server)
				}
				mu.Unlock()
				if err != nil {
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			mu.Lock()
			survivors[first.Server]++
			mu.Unlock()
		})
	}
	for range sessions {
		<-started
	}
	time.Sleep(300 * time.Millisecond)
	killed.Store(true)
	victim.Kill()
	time.Sleep(1500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()

	t.Logf("after killing %s: survivors %v, lost sessions %d, slowest failure %v", victim.Name(), survivors, len(lost), slowFail)
	if survivors[victim.Name()] != 0 {
		t.Errorf("%d sessions of the killed server still succeeded: they were re-routed", survivors[victim.Name()])
	}
	if len(lost) == 0 {
		t.Errorf("no session of the killed server %s failed; did it own any?", victim.Name())
	}
	// The 404 comes at once (milliseconds); the bound only tells it from a
	// hang or a client timeout, with room for a loaded 2-core machine.
	if slowFail > 10*time.Second {
		t.Errorf("a session of the killed server took %v to fail; want its 404 at once, not a hang", slowFail)
	}
	if survivors[bs[0].Name()] == 0 || survivors[bs[2].Name()] == 0 {
		t.Errorf("sessions of live servers did not survive: %v", survivors)
	}

	res := runSessions(t, p.url(), 30, sessionPlan{calls: 3})
	t.Logf("new sessions after the kill: %s", res)
	if res.ok != 30 || res.perServer[victim.Name()] != 0 {
		t.Errorf("new sessions after the kill: want 30/30 on live servers; got %s", res)
	}
}

// TestPinsOverHTTP2 pins a session's requests sent over cleartext HTTP/2
// (h2c) connections, with the header in lowercase as HTTP/2 sends it.
func TestPinsOverHTTP2(t *testing.T) {
	bs := startBackends(t, 3, false)
	p := startProxy(t, "mcp_proxy "+upstreams(bs))
	hc := newH2CClient()
	defer hc.CloseIdleConnections()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 6 {
		rep := runSession(ctx, p.url(), hc, sessionPlan{calls: 5})
		if !rep.ok() || rep.onCreator != 5 {
			t.Fatalf("session %d over h2c: %d of 5 calls on its server, error %v", i, rep.onCreator, rep.err)
		}
	}
}

// TestReloadKeepsSessions (docs/behaviour.md, "What happens when": `caddy reload`): the
// session table survives config reloads through the admin API (what `caddy
// reload` does) that keep an upstream, including reloads that change the
// plugin's own options and the upstream list: 0 mappings lost.
func TestReloadKeepsSessions(t *testing.T) {
	bs := startBackends(t, 4, false)
	p := startProxy(t, "mcp_proxy "+upstreams(bs[:3]))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	const sessions = 30
	css := make([]*session, sessions)
	for i := range css {
		css[i] = openLiveSession(ctx, t, p.url(), hc)
	}
	reloads := []string{
		"mcp_proxy " + upstreams(bs[:3]) + " {\n\t\tmax_sessions 5000\n\t\tsession_ttl 2h\n\t}",
		"mcp_proxy " + upstreams(bs) + " {\n\t\tfallback least_conn\n\t\tlb_retries 1\n\t}",
		"mcp_proxy " + upstreams(bs[1:]) + " {\n\t\tfallback random\n\t}",
		"mcp_proxy " + upstreams(bs),
	}
	for n, cfg := range reloads {
		reloadViaAdmin(t, siteConfig(p.port(), cfg))
		hc.CloseIdleConnections()
		lost := 0
		for _, s := range css {
			id, err := whoamiAcrossReload(ctx, t, hc, s.cs)
			removed := n == 2 && s.first.Server == bs[0].Name()
			switch {
			case removed && err == nil:
				t.Errorf("reload %d: a session of the removed upstream %s was re-routed to %s", n+1, s.first.Server, id.Server)
			case removed:
				lost++
			case err != nil:
				t.Errorf("reload %d: session on %s lost: %v", n+1, s.first.Server, err)
			case id.Server != s.first.Server:
				t.Errorf("reload %d: session of %s answered by %s", n+1, s.first.Server, id.Server)
			}
		}
		t.Logf("reload %d kept every session of its upstreams (%d sessions of the removed upstream ended)", n+1, lost)
		if n == 2 {
			css = reopenLost(ctx, t, p.url(), hc, css, bs[0].Name())
		}
	}
}

// TestInteropGoSDK records the Go SDK's row of docs/interop.md's
// Interoperability table: go-sdk clients and servers, SSE and JSON modes.
func TestInteropGoSDK(t *testing.T) {
	for _, mode := range []struct {
		name string
		json bool
	}{{"SSE responses", false}, {"JSON responses", true}} {
		bs := startBackends(t, 3, mode.json)
		p := startProxy(t, "mcp_proxy "+upstreams(bs))
		res := runSessions(t, p.url(), 50, sessionPlan{calls: 5})
		if res.ok != 50 || res.onCreator != 250 {
			t.Fatalf("%s: want 50/50 sessions and 250 pinned calls; got %s", mode.name, res)
		}
		recordInterop(interopRow{
			Server: fmt.Sprintf("go-sdk %s, stateful, %s (3 processes)", goSDKVersion, mode.name),
			Client: "go-sdk " + goSDKVersion,
			Result: fmt.Sprintf("%d/50 sessions ok; %d/250 calls answered by the session's server", res.ok, res.onCreator),
		})
	}
}
