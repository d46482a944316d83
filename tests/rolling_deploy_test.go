package tests

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// rdScript is the rolling deploy example script, relative to this package.
const rdScript = "../examples/rolling-deploy/rolling-deploy.sh"

// TestRollingDeployUnderLoad runs examples/rolling-deploy/rolling-deploy.sh
// against the in-process Caddy in front of 3 whoami servers while 8 workers
// open short go-sdk client sessions in a loop. The script drains each
// server, waits for drain done, replaces it with a new version and undrains
// it. Not one session may fail or be misrouted.
func TestRollingDeployUnderLoad(t *testing.T) {
	rdRequireTools(t)
	const table = "rolling_deploy"
	f := newFleet(t, withScriptedServers("s1", "s2", "s3"))
	p := startProxy(t, "mcp_proxy "+strings.Join(f.ups, " ")+" {\n\t\ttable "+table+"\n\t}")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	// The load: 8 workers, each running sessions of 3 to 5 calls back to back.
	const workers = 8
	var (
		stopLoad atomic.Bool
		loadWG   sync.WaitGroup
		mu       sync.Mutex
		sessions []*session
	)
	for range workers {
		loadWG.Go(func() {
			for !stopLoad.Load() {
				s := runSession(ctx, p.url(), hc, sessionPlan{calls: 3 + rand.IntN(3), pause: 80 * time.Millisecond})
				mu.Lock()
				sessions = append(sessions, s)
				mu.Unlock()
			}
		})
	}

	time.Sleep(700 * time.Millisecond) // sessions on the first versions
	// The observer: polls every upstream's status through the admin API
	// while the script runs.
	var (
		stopPoll atomic.Bool
		pollWG   sync.WaitGroup
		obs      = make([][]rdObservation, len(f.ups))
		pollErr  error
	)
	pollWG.Go(func() {
		for !stopPoll.Load() {
			for i, up := range f.ups {
				st, err := upstreamOf(table, up)
				if err != nil {
					pollErr = err
					return
				}
				obs[i] = append(obs[i], rdObservation{at: time.Now(), draining: st.Draining, live: st.LiveSessions})
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	scriptStart := time.Now()
	out, code := runRollingDeploy(t, append([]string{
		"--admin", adminAddr, "--table", table,
		"--stop", f.stopCmd(), "--start", f.startCmd(),
		"--timeout", "15", "--poll", "0.1", "--port-timeout", "10",
	}, f.ups...)...)
	scriptEnd := time.Now()
	time.Sleep(700 * time.Millisecond) // sessions on the new versions
	stopLoad.Store(true)
	loadWG.Wait()
	stopPoll.Store(true)
	pollWG.Wait()

	t.Logf("rolling-deploy.sh took %v, exit %d:\n%s", scriptEnd.Sub(scriptStart).Round(time.Millisecond), code, out)
	if code != 0 {
		for i := range f.ups {
			t.Logf("server log of %s:\n%s", f.ups[i], f.log(i))
		}
		t.Fatalf("rolling-deploy.sh exited %d", code)
	}
	if pollErr != nil {
		t.Errorf("polling the admin API: %v", pollErr)
	}
	for _, up := range f.ups {
		if !strings.Contains(out, up+": drain done, 0 live sessions") {
			t.Errorf("the script did not report drain done for %s", up)
		}
	}
	if strings.Contains(out, "timed out") || strings.Contains(out, "warning") {
		t.Errorf("the script reported a timeout or a warning")
	}

	// Zero failed sessions, and where they ran.
	var (
		failed              []error
		before, after, all  = map[string]int{}, map[string]int{}, map[string]int{}
		calls               int
		drainSeen           = make([]time.Time, len(f.ups))
		afterDrainOnOldName []string
	)
	for i := range f.ups {
		for _, o := range obs[i] {
			if o.draining {
				drainSeen[i] = o.at
				break
			}
		}
	}
	for _, s := range sessions {
		if !s.ok() {
			failed = append(failed, fmt.Errorf("session created by %q: %d calls misrouted, error %v", s.creator, s.misrouted, s.err))
			continue
		}
		calls += len(s.answered)
		all[s.creator]++
		switch {
		case s.began.Before(scriptStart):
			before[s.creator]++
		case s.began.After(scriptEnd):
			after[s.creator]++
		}
		for i, name := range f.names {
			if s.creator == name && !drainSeen[i].IsZero() && s.began.After(drainSeen[i]) {
				afterDrainOnOldName = append(afterDrainOnOldName, fmt.Sprintf("%s began %v after its drain",
					name, s.began.Sub(drainSeen[i]).Round(time.Millisecond)))
			}
		}
	}
	t.Logf("%d sessions, %d calls, %d failed; before the script %v, after it %v, in all %v",
		len(sessions), calls, len(failed), before, after, all)
	for i, err := range failed {
		if i == 5 {
			t.Errorf("... and %d more failed sessions", len(failed)-5)
			break
		}
		t.Errorf("failed session: %v", err)
	}
	if len(afterDrainOnOldName) > 0 {
		t.Errorf("%d sessions that began after their upstream was seen draining landed on it: %v",
			len(afterDrainOnOldName), afterDrainOnOldName)
	}
	for i, name := range f.names {
		if before[name] == 0 {
			t.Errorf("no session on %s before the deploy: %v", name, before)
		}
		if after[name+"-v2"] == 0 {
			t.Errorf("no session on %s-v2 after the deploy: %v", name, after)
		}
		if after[name] != 0 {
			t.Errorf("%d sessions on the old %s after the deploy", after[name], name)
		}
		if pid := f.pid(t, i); pid == f.pids[i] {
			t.Errorf("%s was not replaced: PID %d is the same", f.ups[i], pid)
		}
		if !rdProcessGone(f.pids[i]) {
			t.Errorf("the old %s (PID %d) is still running", name, f.pids[i])
		}
	}
	for name := range all {
		if !slices.Contains(f.names, name) && !slices.Contains(f.names, strings.TrimSuffix(name, "-v2")) {
			t.Errorf("a session was answered by an unknown server %q", name)
		}
	}

	// What the admin API said while the script ran: each upstream drained
	// down to 0 live sessions, and was undrained at the end.
	waited := 0
	for i, up := range f.ups {
		var lives []string
		maxLive, done := int64(0), false
		for _, o := range obs[i] {
			if !o.draining {
				if len(lives) > 0 { // undrained
					break
				}
				continue
			}
			if n := len(lives); n == 0 || lives[n-1] != strconv.FormatInt(o.live, 10) {
				lives = append(lives, strconv.FormatInt(o.live, 10))
			}
			maxLive = max(maxLive, o.live)
			done = done || o.live == 0
		}
		t.Logf("%s while draining: live sessions %s", up, strings.Join(lives, " → "))
		if len(lives) == 0 {
			t.Errorf("%s was never seen draining", up)
			continue
		}
		if !done {
			t.Errorf("%s was never seen draining with 0 live sessions (drain done)", up)
		}
		if maxLive > 0 && done {
			waited++
		}
		if last := obs[i][len(obs[i])-1]; last.draining {
			t.Errorf("%s is still draining after the script", up)
		}
	}
	if waited == 0 {
		t.Errorf("no upstream was seen draining with live sessions that then went to 0: the script waited for nothing")
	}
}

// TestRollingDeployScriptFailures covers the script's failure paths: a
// failing admin call or command exits non-zero, and the drain timeout
// either aborts (undraining the old version) or replaces it anyway, after
// which the sessions left behind get 404 and new sessions work.
func TestRollingDeployScriptFailures(t *testing.T) {
	rdRequireTools(t)
	const table = "rolling_failures"
	f := newFleet(t, withScriptedServers("f1", "f2"))
	p := startProxy(t, "mcp_proxy "+strings.Join(f.ups, " ")+" {\n\t\ttable "+table+"\n\t}")
	victim := f.ups[0]
	runSessions(t, p.url(), 2, sessionPlan{calls: 1}) // traffic, as in production; TestRollingDeployIdleProxy runs without
	common := []string{"--admin", adminAddr, "--poll", "0.1", "--port-timeout", "10"}
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("unknown table", func(t *testing.T) {
		out, code := runRollingDeploy(t, append(common, "--table", "no_such_table", "--stop", "true", "--start", "true", victim)...)
		if code != 1 || !strings.Contains(out, `no session table named \"no_such_table\"`) {
			t.Errorf("want exit 1 and the admin API's error; got exit %d:\n%s", code, out)
		}
	})

	t.Run("failing stop command", func(t *testing.T) {
		out, code := runRollingDeploy(t, append(common, "--table", table, "--stop", "exit 7", "--start", "true", victim)...)
		if code != 1 || !strings.Contains(out, "stop command exited with status 7") || !strings.Contains(out, "left drained") {
			t.Errorf("want exit 1 naming the failed stop command; got exit %d:\n%s", code, out)
		}
		if st := mustUpstream(t, table, victim); !st.Draining {
			t.Errorf("after a failed stop command %s should be left drained: %+v", victim, st)
		}
		setDraining(t, table, victim, false)
	})

	// A session pinned to the victim, which keeps its drain from finishing.
	held := rdSessionOn(ctx, t, p.url(), hc, f.names[0])

	t.Run("drain timeout, abort", func(t *testing.T) {
		out, code := runRollingDeploy(t, append(common, "--table", table, "--timeout", "1", "--on-timeout", "abort",
			"--stop", "exit 9", "--start", "exit 9", victim)...)
		if code != 3 || !strings.Contains(out, "drain timed out after 1s with 1 live sessions") {
			t.Errorf("want exit 3 after a drain timeout with 1 live session; got exit %d:\n%s", code, out)
		}
		if st := mustUpstream(t, table, victim); st.Draining || st.LiveSessions != 1 {
			t.Errorf("after an aborted drain %s should be undrained with its 1 session: %+v", victim, st)
		}
		if id, err := whoami(ctx, held); err != nil || id.Server != f.names[0] {
			t.Errorf("the held session after an aborted drain: %+v, %v", id, err)
		}
	})

	t.Run("drain timeout, proceed", func(t *testing.T) {
		out, code := runRollingDeploy(t, append(common, "--table", table, "--timeout", "1",
			"--stop", f.stopCmd(), "--start", f.startCmd(), victim)...)
		t.Logf("rolling-deploy.sh exit %d:\n%s", code, out)
		if code != 0 || !strings.Contains(out, "replacing it anyway: forgetting its 1 remaining sessions") {
			t.Fatalf("want exit 0 after replacing anyway; got exit %d", code)
		}
		if st := mustUpstream(t, table, victim); st.LiveSessions != 0 {
			t.Errorf("after replacing %s anyway its sessions should be forgotten: %+v", victim, st)
		}
		if pid := f.pid(t, 0); pid == f.pids[0] {
			t.Errorf("%s was not replaced: PID %d is the same", victim, pid)
		}
		// The session left behind is gone: the proxy answers its requests
		// 404, which tells a client to initialize a new session. (The go-sdk
		// client itself already gave up on it when the old process cut its
		// SSE stream.)
		req, err := http.NewRequest(http.MethodPost, p.url(), strings.NewReader(
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"whoami"}}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", held.ID())
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("request of the session left behind: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("request of the session left behind on the replaced %s: want 404, got %s", victim, resp.Status)
		}
		_, err = whoami(ctx, held)
		t.Logf("the go-sdk client of the session left behind: %v", err)
		if err == nil {
			t.Errorf("the session left behind on the replaced %s still works", victim)
		}
		// New sessions work; the client of the lost one would re-initialize.
		// The go-sdk client's DELETE of the lost session, sent while the
		// port was closed, failed to dial: Caddy's passive health check
		// then keeps new sessions off the replaced upstream for
		// fail_duration (10s with mcp_proxy), so they all go to the other.
		var health []map[string]any
		if _, err := adminDo(http.MethodGet, "/reverse_proxy/upstreams", nil, &health); err == nil {
			t.Logf("Caddy's upstream health after the forced replacement: %v", health)
		}
		res := runSessions(t, p.url(), 6, sessionPlan{calls: 2})
		t.Logf("new sessions after the forced replacement: %s", res)
		if res.ok != 6 {
			t.Errorf("new sessions after the forced replacement: want 6/6; got %s", res)
		}
	})
}

// TestRollingDeployIdleProxy runs the script against a proxy that has not
// served a request since its config was loaded, as right after Caddy starts
// or reloads, or at a quiet hour: draining and replacing its configured
// upstreams must work without traffic.
func TestRollingDeployIdleProxy(t *testing.T) {
	rdRequireTools(t)
	const table = "rolling_idle"
	f := newFleet(t, withScriptedServers("i1", "i2"))
	p := startProxy(t, "mcp_proxy "+strings.Join(f.ups, " ")+" {\n\t\ttable "+table+"\n\t}")
	out, code := runRollingDeploy(t, append([]string{"--admin", adminAddr, "--table", table,
		"--stop", f.stopCmd(), "--start", f.startCmd(), "--poll", "0.1", "--port-timeout", "10"}, f.ups...)...)
	t.Logf("rolling-deploy.sh exit %d:\n%s", code, out)
	if code != 0 {
		// Seen with the plugin at d8675a0: the admin API answers 404 for an
		// upstream its table does not know, and the mcp_session policy
		// records its pool's upstreams only when it selects for a request,
		// so no configured upstream can be drained before the first request
		// after a config load or a Caddy start.
		t.Fatalf("rolling-deploy.sh on an idle proxy: want exit 0, got %d", code)
	}
	for i, up := range f.ups {
		if pid := f.pid(t, i); pid == f.pids[i] {
			t.Errorf("%s was not replaced: PID %d is the same", up, pid)
		}
		if st := mustUpstream(t, table, up); st.Draining {
			t.Errorf("%s is still draining after the script: %+v", up, st)
		}
	}
	res := runSessions(t, p.url(), 6, sessionPlan{calls: 2})
	t.Logf("sessions after the deploy: %s", res)
	if res.ok != 6 || res.perServer["i1-v2"] == 0 || res.perServer["i2-v2"] == 0 {
		t.Errorf("want 6/6 sessions on i1-v2 and i2-v2; got %s", res)
	}
}

// TestDrainSurvivesReload drains an upstream through the admin API, then
// reloads a changed config that keeps the upstream: the upstream stays
// draining, gets no new session, keeps serving the session pinned to it
// before the drain, and gets new sessions again once undrained.
func TestDrainSurvivesReload(t *testing.T) {
	bs := startBackends(t, 3, false)
	victim := bs[1]
	const table = "drain_reload"
	port := mustFreePort()
	cfg := func(options string) string {
		return siteConfig(port, "mcp_proxy "+upstreams(bs)+" {\n\t\ttable "+table+"\n"+options+"\t}")
	}
	loadCaddyfile(t, cfg(""))
	p := proxy{addr: fmt.Sprintf("127.0.0.1:%d", port)}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	// A session on the victim, opened before the drain.
	pinned := rdSessionOn(ctx, t, p.url(), hc, victim.Name())

	if st := setDraining(t, table, victim.Addr(), true); st.LiveSessions != 1 {
		t.Errorf("drain %s: want 1 live session, got %+v", victim.Addr(), st)
	}
	t.Cleanup(func() { // the table outlives the test when the next config uses it (-count)
		_, _ = adminDo(http.MethodPost, "/mcp_sessions/undrain", map[string]string{"table": table, "upstream": victim.Addr()}, nil)
	})

	reloadViaAdmin(t, cfg("\t\tmax_sessions 5000\n"))
	hc.CloseIdleConnections()
	if st := mustUpstream(t, table, victim.Addr()); !st.Draining || st.LiveSessions != 1 {
		t.Errorf("after the reload %s should still be draining with its 1 session: %+v", victim.Addr(), st)
	}

	res := runSessions(t, p.url(), 12, sessionPlan{calls: 3})
	t.Logf("12 new sessions while %s drains: %s", victim.Name(), res)
	if res.ok != 12 || res.perServer[victim.Name()] != 0 {
		t.Errorf("want 12/12 new sessions, none on the draining %s; got %s", victim.Name(), res)
	}
	for _, b := range bs {
		if b != victim && res.perServer[b.Name()] == 0 {
			t.Errorf("no new session on %s: %v", b.Name(), res.perServer)
		}
	}
	// The new config is the one running. (Its handler applies its bounds to
	// the table when it serves its first request, so check after some.)
	if ts := tableOf(t, table); ts.MaxSessions != 5000 {
		t.Fatalf("the reload did not apply max_sessions 5000 to table %s: %+v", table, ts)
	}

	id, err := whoamiAcrossReload(ctx, t, hc, pinned)
	if err != nil || id.Server != victim.Name() || id.Session != pinned.ID() {
		t.Errorf("the session pinned to the draining %s before the reload: %+v, %v", victim.Name(), id, err)
	}
	pinned.Close()
	if st := mustUpstream(t, table, victim.Addr()); !st.Draining || st.LiveSessions != 0 {
		t.Errorf("after its last session closed %s should be draining with 0 live sessions (drain done): %+v", victim.Addr(), st)
	}

	setDraining(t, table, victim.Addr(), false)
	res = runSessions(t, p.url(), 12, sessionPlan{calls: 3})
	t.Logf("12 new sessions after undraining %s: %s", victim.Name(), res)
	if res.ok != 12 || res.perServer[victim.Name()] == 0 {
		t.Errorf("want 12/12 new sessions, some on the undrained %s; got %s", victim.Name(), res)
	}
}
