package tests

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// Sealed session IDs (docs/replicas.md, "Sealed session
// IDs"): the proxy gives the client its upstream and the upstream's session
// ID sealed under a key the Caddy replicas share, so any replica routes the
// session and restarts lose nothing.

// TestSealedReplicas: three Caddy replicas (separate processes, each with
// its own memory table) with the same key, behind a client that sends every
// request to a random replica. 100 sessions of at least 10 calls each are
// all answered by the server that created them, while every replica is
// restarted one by one, a fourth replica joins, and then all four crash and
// come back at once: 0 sessions lost. The same replicas with plain IDs
// break sessions (negative control).
func TestSealedReplicas(t *testing.T) {
	bs := startBackends(t, 3, false)
	key := newSealKey(t)
	env := []string{"MCP_SESSION_KEY=" + key}
	rs := make([]*replica, 3)
	for i := range rs {
		rs[i] = startReplica(t, fmt.Sprintf("caddy%d", i+1), "mcp_proxy "+upstreams(bs), env...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	ctrl := openSessions(ctx, rs[0].url(), newBalancer(rs...).client(), 20, sessionPlan{calls: 3, reconnect: true})
	ok, _, first := sessionsResult(ctrl)
	_ = closeSessions(ctrl)
	t.Logf("plain IDs over 3 replicas (negative control): %d/20 sessions ok; first error: %v", ok, first)
	if ok == 20 {
		t.Fatal("negative control: plain IDs over randomly chosen replicas kept every session, so this test cannot see a lost session")
	}

	for _, r := range rs {
		r.reload(t, sealedProxy(upstreams(bs), "MCP_SESSION_KEY"))
	}
	lb := newBalancer(rs...)
	hc := lb.client()
	const sessions = 100
	ss := openSessions(ctx, rs[0].url(), hc, sessions, sessionPlan{calls: 3, sealed: true, reconnect: true})
	requireSessions(t, "3 calls each over 3 replicas", ss, sessions, 3*sessions)

	// Calls go on while each replica is taken out of rotation, stopped and
	// started again, and a fourth replica joins after the second restart.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	eachSessionAsync(&wg, ss, func(s *session) {
		for broken := 0; s.err == nil; {
			s.callPlan(ctx, sessionPlan{calls: 1, sealed: true})
			if s.err != nil && isConnectionError(s.err) && broken < 3 {
				// The connection broke before any answer: a replica stopped
				// with the call in flight. The client calls again; a lost
				// session is a 404 or another server.
				broken++
				s.err = nil
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	var fresh *replica
	for i, r := range rs {
		lb.remove(r)
		time.Sleep(drainDelay)
		r.stop()
		r.start(t)
		lb.add(r)
		t.Logf("restarted %s", r.name)
		if i == 1 {
			fresh = startReplica(t, "caddy4", sealedProxy(upstreams(bs), "MCP_SESSION_KEY"), env...)
			lb.add(fresh)
			t.Logf("added %s", fresh.name)
		}
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	ok, calls, first := sessionsResult(ss)
	t.Logf("during the rolling restart: %d/%d sessions ok, %d calls so far; first error: %v", ok, sessions, calls, first)
	requireSessions(t, "rolling restart of every replica", ss, sessions, 0)
	freshOK, freshFailed := lb.servedBy(fresh)
	families, _ := scrapeAt(t, fresh.admin)
	adopted := metricValue(families, "caddy_mcp_sessions_adopted_total", map[string]string{"table": "default"})
	unknown := metricValue(families, "caddy_mcp_unknown_session_total", map[string]string{"table": "default"})
	t.Logf("the new replica answered %d requests of existing sessions (%d not 2xx), adopted %v sessions, %v unknown", freshOK, freshFailed, adopted, unknown)
	if freshOK == 0 || freshFailed != 0 || adopted <= 0 || unknown != 0 {
		t.Errorf("the new replica did not serve existing sessions at once: %d answered, %d failed, %v adopted, %v unknown", freshOK, freshFailed, adopted, unknown)
	}

	// Every replica crashes at once, losing every table, and comes back.
	all := append(rs, fresh)
	for _, r := range all {
		r.crash()
	}
	for _, r := range all {
		r.start(t)
	}
	lb.closeIdle() // connections to the crashed processes are dead
	t.Log("crashed and restarted all 4 replicas at once")
	eachSession(ss, func(s *session) { s.callPlan(ctx, sessionPlan{calls: 3, sealed: true}) })
	requireSessions(t, "after all replicas crashed and restarted", ss, sessions, 0)
	for _, s := range ss {
		if s.onCreator < 10 {
			t.Errorf("session created by %s made %d calls answered by it, want at least 10", s.creator, s.onCreator)
		}
	}
	for _, r := range all {
		served, failed := lb.servedBy(r)
		t.Logf("%s answered %d requests of existing sessions, %d not 2xx", r.name, served, failed)
		if served == 0 || failed != 0 {
			t.Errorf("%s answered %d requests of existing sessions and %d others; want some, all 2xx", r.name, served, failed)
		}
	}
	if err := closeSessions(ss); err != nil {
		t.Errorf("closing sessions (DELETE through random replicas): %v", err)
	}
	ok, calls, _ = sessionsResult(ss)
	t.Logf("%d/%d sessions ok, %d calls, every call answered by the session's server", ok, sessions, calls)
}

// TestSealedReplicaBookkeeping: each replica keeps its own table of the
// sealed sessions it serves. The admin API finds a session by its sealed
// value on every replica that served it; a DELETE ends it on the replica
// that sees it, and another replica still forwards it, gets the upstream's
// own 404, passes it through and forgets the session; draining an upstream
// on a replica keeps that replica's new sessions off it while its sealed
// sessions keep working.
func TestSealedReplicaBookkeeping(t *testing.T) {
	bs := startBackends(t, 3, false)
	key := newSealKey(t)
	site := sealedProxy(upstreams(bs), "MCP_SESSION_KEY")
	a := startReplica(t, "caddyA", site, "MCP_SESSION_KEY="+key)
	b := startReplica(t, "caddyB", site, "MCP_SESSION_KEY="+key)
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	id := mcpInitialize(t, hc, a.url())
	owner, _ := sessionLookup(t, a.admin, id)
	if _, status := sessionLookup(t, b.admin, id); status != http.StatusNotFound {
		t.Fatalf("replica B holds a session it never served: %d", status)
	}
	ex := mcpPost(t, hc, b.url(), id, tsWhoamiCall)
	who, err := tsWhoamiResult(ex.body)
	if got := ex.header.Values("Mcp-Session-Id"); ex.status != http.StatusOK || err != nil || len(got) > 0 && got[0] != id {
		t.Fatalf("whoami through replica B: %d %v %q %v", ex.status, ex.header, ex.body, err)
	}
	if up, status := sessionLookup(t, b.admin, id); status != http.StatusOK || up != owner || owner == "" {
		t.Fatalf("replica B's admin lookup by the sealed value: %q %d; want %q", up, status, owner)
	}
	t.Logf("session created on replica A (upstream %s, server %s) is found by its sealed value on both replicas", owner, who.Server)

	del := send(t, hc, http.MethodDelete, a.url(), map[string][]string{"Mcp-Session-Id": {id}, "Mcp-Protocol-Version": {"2025-11-25"}}, "")
	if del.status >= 300 {
		t.Fatalf("DELETE through replica A: %d %s", del.status, del.body)
	}
	if _, status := sessionLookup(t, a.admin, id); status != http.StatusNotFound {
		t.Errorf("replica A still holds the session after its DELETE: %d", status)
	}
	after := mcpPost(t, hc, b.url(), id, tsWhoamiCall)
	t.Logf("after DELETE on A, a call through B: %d %q %q", after.status, after.header.Get("Content-Type"), strings.TrimSpace(after.body))
	if after.status != http.StatusNotFound || strings.Contains(after.header.Get("Content-Type"), "application/json") {
		t.Errorf("after DELETE on A, a call through B got %d %q; want the upstream's own 404 (go-sdk: text/plain), not the proxy's", after.status, after.body)
	}
	if _, status := sessionLookup(t, b.admin, id); status != http.StatusNotFound {
		t.Errorf("replica B still holds the session after the upstream's 404: %d", status)
	}

	// Drain on replica A only: its new sessions avoid the upstream, and a
	// sealed session of that upstream keeps working through A.
	kept := mcpInitialize(t, hc, b.url())
	drained, _ := sessionLookup(t, b.admin, kept)
	if code, err := adminDoAt(a.admin, http.MethodPost, "/mcp_sessions/drain", map[string]string{"upstream": drained}, nil); code != http.StatusOK {
		t.Fatalf("drain %s on A: %d %v", drained, code, err)
	}
	for range 6 {
		s := mcpInitialize(t, hc, a.url())
		if up, _ := sessionLookup(t, a.admin, s); up == drained {
			t.Errorf("replica A gave a new session to %s, which it drains", drained)
		}
	}
	if ex := mcpPost(t, hc, a.url(), kept, tsWhoamiCall); ex.status != http.StatusOK {
		t.Errorf("a sealed session of the drained upstream through A: %d %s", ex.status, ex.body)
	}
	var st caddymodule.UpstreamStatus
	if _, err := adminDoAt(a.admin, http.MethodGet, "/mcp_sessions/upstream?upstream="+drained, nil, &st); err != nil {
		t.Fatal(err)
	}
	if !st.Draining || st.LiveSessions != 1 {
		t.Errorf("replica A's view of %s: %+v; want draining with the 1 session it served", drained, st)
	}
}

// TestSealedReloadFromPlain: turning seal_session_ids on is a reload that
// loses no live session (the table's plain sessions keep working, with
// their plain IDs) and seals new sessions; turning it off again ends the
// sealed sessions with the proxy's 404, and plain sessions keep working.
func TestSealedReloadFromPlain(t *testing.T) {
	bs := startBackends(t, 3, true)
	t.Setenv("MCP_SESSION_KEY", newSealKey(t))
	p := startProxy(t, "mcp_proxy "+upstreams(bs))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	plain := openSessions(ctx, p.url(), hc, 30, sessionPlan{calls: 2, reconnect: true})
	requireSessions(t, "plain sessions before the reload", plain, 30, 60)
	reloadViaAdmin(t, siteConfig(p.port(), sealedProxy(upstreams(bs), "MCP_SESSION_KEY")))
	hc.CloseIdleConnections()
	eachSession(plain, func(s *session) { s.callPlan(ctx, sessionPlan{calls: 2}) })
	requireSessions(t, "plain sessions after turning sealing on", plain, 30, 120)
	sealed := openSessions(ctx, p.url(), hc, 30, sessionPlan{calls: 2, sealed: true, reconnect: true})
	requireSessions(t, "new sessions after turning sealing on", sealed, 30, 60)
	t.Log("after the reload to sealed IDs: 30/30 plain sessions kept, 30/30 new sessions sealed")

	reloadViaAdmin(t, siteConfig(p.port(), "mcp_proxy "+upstreams(bs)))
	hc.CloseIdleConnections()
	eachSession(plain, func(s *session) { s.callPlan(ctx, sessionPlan{calls: 1}) })
	requireSessions(t, "plain sessions after turning sealing off", plain, 30, 150)
	for _, s := range sealed {
		ex := mcpPost(t, hc, p.url(), s.cs.ID(), tsWhoamiCall)
		if ex.status != http.StatusNotFound || !strings.Contains(ex.body, "-32001") {
			t.Fatalf("a sealed session after turning sealing off: %d %s; want the proxy's 404", ex.status, ex.body)
		}
	}
	t.Log("after the reload back to plain IDs: 30/30 plain sessions kept, 30/30 sealed sessions get the proxy's 404")
}

// TestSealedKeyRotation follows docs/replicas.md's key rotation step by step over
// three replicas with calls through random replicas after every single
// reload: no session is lost until the old key is dropped, when exactly the
// sessions sealed with it get 404. Doing step 2 on one replica before step 1
// is done everywhere loses sessions (negative control).
func TestSealedKeyRotation(t *testing.T) {
	bs := startBackends(t, 3, true)
	oldKey, newKey, nextKey := newSealKey(t), newSealKey(t), newSealKey(t)
	env := []string{"MCP_SESSION_KEY=" + oldKey, "MCP_SESSION_KEY_NEXT=" + newKey, "MCP_SESSION_KEY_LATER=" + nextKey}
	rs := make([]*replica, 3)
	for i := range rs {
		rs[i] = startReplica(t, fmt.Sprintf("caddy%d", i+1), sealedProxy(upstreams(bs), "MCP_SESSION_KEY"), env...)
	}
	lb := newBalancer(rs...)
	hc := lb.client()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	var ss []*session
	round := func(step string) {
		t.Helper()
		ss = append(ss, openSessions(ctx, rs[0].url(), hc, 5, sessionPlan{calls: 1, sealed: true, reconnect: true})...)
		eachSession(ss, func(s *session) { s.callPlan(ctx, sessionPlan{calls: 1, sealed: true}) })
		requireSessions(t, step, ss, len(ss), 0)
	}
	round("before the rotation")
	steps := []struct {
		name string
		keys []string
	}{
		{"step 1: the new key opens", []string{"MCP_SESSION_KEY", "MCP_SESSION_KEY_NEXT"}},
		{"step 2: the new key seals", []string{"MCP_SESSION_KEY_NEXT", "MCP_SESSION_KEY"}},
	}
	for _, step := range steps {
		for _, r := range rs {
			r.reload(t, sealedProxy(upstreams(bs), step.keys...))
			lb.closeIdle()
			round(fmt.Sprintf("%s, reloaded on %s", step.name, r.name))
		}
	}
	oldSealer, newSealer := sealerOf(t, oldKey), sealerOf(t, newKey)
	var sealedOld, sealedNew int
	for _, s := range ss {
		_, _, o := oldSealer.Open(s.cs.ID())
		_, _, n := newSealer.Open(s.cs.ID())
		switch {
		case o:
			sealedOld++
		case n:
			sealedNew++
		}
	}
	t.Logf("steps 1 and 2: %d/%d sessions ok through every reload (%d sealed with the old key, %d with the new)", len(ss), len(ss), sealedOld, sealedNew)
	if sealedOld == 0 || sealedNew == 0 {
		t.Fatalf("sessions sealed with the old key: %d, with the new: %d; want both kinds", sealedOld, sealedNew)
	}

	for _, r := range rs {
		r.reload(t, sealedProxy(upstreams(bs), "MCP_SESSION_KEY_NEXT"))
	}
	lb.closeIdle()
	lost, kept := 0, 0
	for _, s := range ss {
		_, _, wasOld := oldSealer.Open(s.cs.ID())
		err := s.call(ctx, sessionPlan{calls: 1, sealed: true})
		switch {
		case wasOld && errors.Is(err, mcp.ErrSessionMissing):
			lost++
		case !wasOld && err == nil:
			kept++
		default:
			t.Errorf("step 3: a session sealed with the %s key: %v", map[bool]string{true: "old", false: "new"}[wasOld], err)
		}
	}
	t.Logf("step 3 (old key dropped): %d sessions sealed with the new key kept, %d sealed with the old key get 404", kept, lost)

	// Negative control: one replica seals with a key the others cannot open yet.
	rs[0].reload(t, sealedProxy(upstreams(bs), "MCP_SESSION_KEY_LATER", "MCP_SESSION_KEY_NEXT"))
	early := mcpInitialize(t, newHTTPClient(), rs[0].url())
	ex := mcpPost(t, newHTTPClient(), rs[1].url(), early, tsWhoamiCall)
	t.Logf("step 2 on one replica before step 1 everywhere: a session it sealed, through another replica: %d", ex.status)
	if ex.status != http.StatusNotFound {
		t.Errorf("negative control: a session sealed with a key the other replica lacks got %d there; want 404", ex.status)
	}
}

// TestSealedBadValues: values that do not open — forged, truncated,
// bit-flipped, sealed under another key or an unknown format version, or
// the upstream's own session ID — get the proxy's 404, byte for byte the
// answer to an unknown session, and no request reaches any upstream. A
// value sealed, with the right key, for an address not in the config gets
// the upstream-gone 404 and the proxy never dials it; so does a session of
// an upstream removed by a reload. The TypeScript servers also show what
// upstreams see: only their own session IDs, and the client's sealed value
// comes back on every response, SSE and the GET stream included.
func TestSealedBadValues(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod")
	ss := startTSServers(t, env, 2, "t")
	key := newSealKey(t)
	t.Setenv("MCP_SESSION_KEY", key)
	p := startProxy(t, sealedProxy(upstreams(ss), "MCP_SESSION_KEY"))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	// A session, and what its upstream sees of it.
	init := send(t, hc, http.MethodPost, p.url(), tsMCPHeaders("", ""), initBody).as("initialize")
	id := init.header.Get("Mcp-Session-Id")
	dial, upstreamID, ok := sealerOf(t, key).Open(id)
	if init.status != http.StatusOK || !ok {
		t.Fatalf("initialize: %d, Mcp-Session-Id %q does not open", init.status, id)
	}
	t.Logf("sealed %d-byte UUID on %s into a %d-byte Mcp-Session-Id", len(upstreamID), dial, len(id))
	hdr := tsMCPHeaders(id, "")
	hdr.Del("Origin")
	if ex := send(t, hc, http.MethodPost, p.url(), hdr, tsInitializedMsg).as("initialized"); ex.status != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d %s", ex.status, ex.body)
	}
	// The SDK repeats the session ID (as mcp-session-id) on SSE responses.
	for _, ex := range []exchange{
		send(t, hc, http.MethodPost, p.url(), hdr, tsWhoamiCall).as("whoami (SSE)"),
		tsStream(t, hc, "GET stream", p.url(), hdr),
	} {
		if got := ex.header.Values("Mcp-Session-Id"); ex.status >= 300 || len(got) != 1 || got[0] != id {
			t.Errorf("%s: %d, Mcp-Session-Id %q; want the client's own sealed value", ex.step, ex.status, got)
		}
	}
	seenBy := map[string]int{}
	for _, s := range ss {
		for sid, n := range tsStatsOf(t, s).BySession {
			seenBy[sid] += n
		}
	}
	if len(seenBy) != 1 || seenBy[upstreamID] != 3 {
		t.Errorf("the upstreams saw session IDs %v; want only their own %q, 3 times", seenBy, upstreamID)
	}

	raw, _ := base64.RawURLEncoding.DecodeString(id)
	flip := func(i int) string {
		b := append([]byte(nil), raw...)
		b[i] ^= 0x01
		return base64.RawURLEncoding.EncodeToString(b)
	}
	forged := make([]byte, len(raw))
	_, _ = rand.Read(forged)
	forged[0] = raw[0]
	bad := map[string]string{
		"forged":                base64.RawURLEncoding.EncodeToString(forged),
		"truncated":             id[:len(id)-2],
		"bit-flipped (nonce)":   flip(3),
		"bit-flipped (body)":    flip(len(raw) / 2),
		"bit-flipped (tag)":     flip(len(raw) - 1),
		"another deployment's":  sealerOf(t, newSealKey(t)).Seal(dial, upstreamID),
		"unknown version":       withVersion(raw, 2),
		"the upstream's own ID": upstreamID,
		"an unknown plain ID":   "3f1c1d2e-8a4b-4c6d-9e0f-1a2b3c4d5e6f",
	}
	before := tsRequests(t, ss)
	reference := send(t, hc, http.MethodPost, p.url(), tsMCPHeaders("NEVERISSUED", ""), tsWhoamiCall).as("unknown")
	for name, v := range bad {
		for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
			ex := send(t, hc, method, p.url(), tsMCPHeaders(v, ""), tsWhoamiCall).as(name + " " + method)
			checkProxy404(t, ex)
			if ex.body != reference.body {
				t.Errorf("%s %s: body %q differs from the unknown-session answer %q", name, method, ex.body, reference.body)
			}
		}
	}
	if after := tsRequests(t, ss); after != before {
		t.Errorf("bad values reached the upstreams: %d requests before, %d after", before, after)
	}
	t.Logf("%d bad values x POST, GET, DELETE: the unknown-session 404, 0 upstream requests", len(bad))

	// Sealed with the right key, for addresses the config does not list.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var dialed atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dialed.Add(1)
			c.Close()
		}
	}()
	for _, target := range []string{ln.Addr().String(), "localhost:" + portOf(ln), "unix//tmp/mcp.sock"} {
		ex := send(t, hc, http.MethodPost, p.url(), tsMCPHeaders(sealerOf(t, key).Seal(target, upstreamID), ""), tsWhoamiCall).as("sealed for " + target)
		checkProxy404(t, ex)
		if !strings.Contains(ex.body, "upstream is gone") {
			t.Errorf("sealed for %s: %q; want the upstream-gone 404", target, ex.body)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if n := dialed.Load(); n != 0 || tsRequests(t, ss) != before {
		t.Errorf("values sealed for addresses outside the config made the proxy connect %d times, or reached an upstream", n)
	}

	// The session's upstream leaves the config.
	var keep []*testproc.Proc
	for _, s := range ss {
		if s.Addr() != dial {
			keep = append(keep, s)
		}
	}
	reloadViaAdmin(t, siteConfig(p.port(), sealedProxy(upstreams(keep), "MCP_SESSION_KEY")))
	hc.CloseIdleConnections()
	gone := send(t, hc, http.MethodPost, p.url(), hdr, tsWhoamiCall).as("removed upstream")
	checkProxy404(t, gone)
	if !strings.Contains(gone.body, "upstream is gone") || tsRequests(t, ss) != before {
		t.Errorf("a session of a removed upstream: %q; want the upstream-gone 404 and no upstream request", gone.body)
	}
}
