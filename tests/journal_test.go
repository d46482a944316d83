package tests

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// Resumable streams (docs/behaviour.md, "Resumable streams"): with the
// journal on, a client whose connection to the proxy breaks mid-call
// resumes with the last event ID it got and receives every progress event
// and the result once; with it off (the control, in the same run), the
// result is lost.

// journalSteps and journalMillis shape the slow call: a progress event
// every 300 ms for 3 s.
const (
	journalSteps  = 10
	journalMillis = 3000
	cutAfter      = 3 // progress events the client reads before its connection is cut
)

// TestJournalResumesRawClient: a raw client calls the slow tool of a
// server without an event store (go-sdk, TypeScript SDK) through a relay,
// reads three progress events, and the relay cuts its connection. It
// resumes with a GET carrying the last event ID: journal on, the rest of
// the progress events and the result arrive, each once; journal off, the
// client has no ID to resume with and the call's result never reaches it.
func TestJournalResumesRawClient(t *testing.T) {
	servers := map[string]string{"go-sdk": startBackends(t, 1, false)[0].Addr()}
	if env, ok := tsNodeIfPresent(t); ok {
		servers["TypeScript SDK"] = startTSServers(t, env, 1, "jr")[0].Addr()
	}
	for server, addr := range servers {
		ps := startProxies(t, journalSite(addr, "journal-raw-on", true), journalSite(addr, "journal-raw-off", false))
		for _, tc := range []struct {
			name string
			p    proxy
			on   bool
		}{{"journal on", ps[0], true}, {"journal off", ps[1], false}} {
			t.Run(server+"/"+tc.name, func(t *testing.T) {
				got := cutAndResume(t, tc.p.addr)
				t.Logf("%s, %s: %s", server, tc.name, got)
				switch {
				case tc.on && !got.complete(journalSteps):
					t.Errorf("journal on: got %s; want progress 1..%d once each, in order, and the result once", got, journalSteps)
				case !tc.on && got.results != 0:
					t.Errorf("journal off: got %s; the control lost nothing, so the test does not cut what it should", got)
				}
			})
		}
	}
}

// TestJournalResumesTSClient: the TypeScript SDK client calls the slow
// tool through a relay that cuts its connection after three progress
// notifications; the SDK resumes by itself with the last event ID it got.
// Servers without an event store (go-sdk, TypeScript SDK): journal on,
// every notification and the result arrive once; journal off, the client
// has no ID, does not resume, and the call times out.
func TestJournalResumesTSClient(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod")
	servers := map[string]string{
		"go-sdk":         startBackends(t, 1, false)[0].Addr(),
		"TypeScript SDK": startTSServers(t, env, 1, "jt")[0].Addr(),
	}
	for server, addr := range servers {
		ps := startProxies(t, journalSite(addr, "journal-ts-on", true), journalSite(addr, "journal-ts-off", false))
		for _, tc := range []struct {
			name string
			p    proxy
			on   bool
		}{{"journal on", ps[0], true}, {"journal off", ps[1], false}} {
			t.Run(server+"/"+tc.name, func(t *testing.T) {
				got := runResumeClient(t, env, tc.p.addr)
				t.Logf("%s, %s: %+v", server, tc.name, got)
				switch {
				case tc.on && !got.complete(journalSteps):
					t.Errorf("journal on: got %+v; want progress 1..%d once each, in order, and the result", got, journalSteps)
				case !tc.on && got.Result:
					t.Errorf("journal off: got %+v; the control lost nothing, so the test does not cut what it should", got)
				}
			})
		}
	}
}

// TestJournalServerEventStore: a TypeScript SDK server with its own event
// store (InMemoryEventStore) still resumes through the proxy. With the
// journal on, the TypeScript client resumes from the journal; with a
// journal that holds nothing (journal_session_bytes 1), from the server's
// store, through the upstream's own ID carried in the proxy's. Negative
// control: the same journal before a server without a store loses the
// result.
func TestJournalServerEventStore(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod")
	withStore := startTSServers(t, env, 1, "js", "--event-store")[0].Addr()
	without := startTSServers(t, env, 1, "jn")[0].Addr()
	ps := startProxies(t,
		journalSite(withStore, "journal-store", true),
		journalSite(withStore, "journal-store-empty", true, "journal_session_bytes 1"),
		journalSite(without, "journal-nostore-empty", true, "journal_session_bytes 1"))
	for _, tc := range []struct {
		name  string
		p     proxy
		table string
		whole bool
	}{
		{"from the journal", ps[0], "journal-store", true},
		{"from the server's store", ps[1], "journal-store-empty", true},
		{"control: no store anywhere", ps[2], "journal-nostore-empty", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := runResumeClient(t, env, tc.p.addr)
			resumes := journalResumes(t, tc.table)
			t.Logf("%s: %+v; resuming GETs answered by the journal %v, by the upstream %v", tc.name, got, resumes["journal"], resumes["upstream"])
			switch {
			case tc.whole && !got.complete(journalSteps):
				t.Errorf("got %+v; want progress 1..%d once each, in order, and the result", got, journalSteps)
			case !tc.whole && got.Result:
				t.Errorf("control: got %+v; without any store the result should be lost", got)
			case tc.table == "journal-store-empty" && resumes["upstream"] == 0:
				t.Errorf("no resuming GET went to the upstream; the test does not exercise the upstream's store")
			}
		})
	}
}

// cutAndResume runs the scenario of TestJournalResumesRawClient through a
// relay to addr and returns what the client got of the call.
func cutAndResume(t *testing.T, addr string) *callEvents {
	t.Helper()
	return cutAndResumeVia(t, addr, "/mcp", "")
}

// cutAndResumeVia is cutAndResume with the MCP endpoint at path, resuming
// through the proxy at resumeAddr ("": through the relay again).
func cutAndResumeVia(t *testing.T, addr, path, resumeAddr string) *callEvents {
	t.Helper()
	relay := redistest.NewRelay(t, addr)
	url := "http://" + relay.Addr + path
	resumeURL := url
	if resumeAddr != "" {
		resumeURL = "http://" + resumeAddr + path
	}
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	id := goSDKSession(t, hc, url)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	got := new(callEvents)
	resp := postSSE(ctx, t, hc, url, id, progressCall(2, journalMillis, journalSteps))
	err := readEvents(ctx, resp.Body, got, func(c *callEvents) bool { return len(c.progress) == cutAfter })
	if err != nil || len(got.progress) != cutAfter {
		t.Fatalf("before the cut: %v, %s", err, got)
	}
	relay.Cut()

	// The client reconnects at once, as the SDKs do, and waits for the
	// rest of the stream; without the journal it waits past the call's
	// end, then gives up.
	rctx, rcancel := context.WithTimeout(ctx, journalMillis*time.Millisecond+2*time.Second)
	defer rcancel()
	r := resumeGET(rctx, t, hc, resumeURL, id, got.lastID)
	if r.StatusCode != 200 {
		r.Body.Close()
		t.Logf("resuming GET after %q: %s", got.lastID, r.Status)
		return got
	}
	_ = readEvents(rctx, r.Body, got, func(c *callEvents) bool { return c.results > 0 })
	return got
}

// TestJournalFailoverMidStream: with `failover reinitialize`, a raw
// client's connection is cut after three progress events of a slow call;
// the proxy records three more, then the session's upstream is killed,
// and the session's next POST fails it over to the other server. The
// client's GET with its last event ID then gets, from the journal, the
// events the dead upstream had sent, each once and in order, and no
// result (the dead upstream never sent one). Journal off (control): the
// client resumes nothing.
func TestJournalFailoverMidStream(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("journal=%v", on), func(t *testing.T) {
			srv := startBackends(t, 2, false)
			table := fmt.Sprintf("journal-fo-%v", on)
			p := startProxy(t, journalSite(upstreams(srv), table, on, "failover reinitialize"))
			relay := redistest.NewRelay(t, p.addr)
			url := "http://" + relay.Addr + "/mcp"
			hc := newHTTPClient()
			defer hc.CloseIdleConnections()
			id := goSDKSession(t, hc, url)
			_, before := rawWhoami(t, hc, url, id)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()

			got := new(callEvents)
			resp := postSSE(ctx, t, hc, url, id, progressCall(2, journalMillis, journalSteps))
			if err := readEvents(ctx, resp.Body, got, func(c *callEvents) bool { return len(c.progress) == cutAfter }); err != nil {
				t.Fatalf("before the cut: %v, %s", err, got)
			}
			relay.Cut()
			if on { // the proxy goes on recording: wait for three more progress events
				events := func() float64 {
					families, _ := scrape(t)
					return metricValue(families, "caddy_mcp_journal_events_total", map[string]string{"table": table})
				}
				recorded := events()
				if !testproc.Until(5*time.Second, func() bool { return events() >= recorded+3 }) {
					t.Fatalf("the journal recorded no more events after the cut (%v)", events())
				}
			} else {
				time.Sleep(time.Second)
			}
			for _, s := range srv {
				if s.Name() == before.Server {
					s.Kill()
				}
			}
			st, after := rawWhoami(t, hc, url, id)
			if st != http.StatusOK || after.Server == before.Server {
				t.Fatalf("whoami after the kill: %d from %q; want 200 from the other server than %q", st, after.Server, before.Server)
			}

			rctx, rcancel := context.WithTimeout(ctx, 3*time.Second)
			defer rcancel()
			if r := resumeGET(rctx, t, hc, url, id, got.lastID); r.StatusCode == http.StatusOK && on {
				_ = readEvents(rctx, r.Body, got, nil)
			} else {
				r.Body.Close()
			}
			t.Logf("journal %v: session moved from %s to %s; the client got %s", on, before.Server, after.Server, got)
			contiguous := got.results == 0 && len(got.progress) > 0
			for i, v := range got.progress {
				contiguous = contiguous && v == float64(i+1)
			}
			switch {
			case on && (!contiguous || len(got.progress) < cutAfter+3):
				t.Errorf("journal on: got %s; want progress 1..k, k >= %d, once each and in order, and no result", got, cutAfter+3)
			case !on && len(got.progress) != cutAfter:
				t.Errorf("journal off: got %s; want only the %d events read before the cut", got, cutAfter)
			}
		})
	}
}

// TestJournalAcrossReplicas: two Caddy replicas on one Redis, a table with
// the redis store and the journal on. A raw client's call goes through
// replica c1, whose connection is cut after three progress events; the
// client resumes through replica c2: it gets the rest of the events, which
// c1 goes on recording into Redis, and the result, each once. Control, in
// the same run: a table without a store, whose sealed session IDs let c2
// route the session, but whose journal is in c1's memory: c2 sends the
// resume to the upstream, and the result is lost.
func TestJournalAcrossReplicas(t *testing.T) {
	global := func(f *fleet) string {
		return fmt.Sprintf("mcp_sessions jshared {\n\t\tjournal on\n\t\t%s\n\t}\n\tmcp_sessions jlocal {\n\t\tjournal on\n\t}",
			redisStore(f.redis.Addr, ""))
	}
	body := func(f *fleet) string {
		ups := upstreams(f.srv)
		return fmt.Sprintf("handle_path /jshared/* {\n\t\tmcp_proxy %s {\n\t\t\ttable jshared\n\t\t}\n\t}\n\t"+
			"handle_path /jlocal/* {\n\t\tmcp_proxy %s {\n\t\t\ttable jlocal\n\t\t\tseal_session_ids {env.JOURNAL_SEAL_KEY}\n\t\t}\n\t}", ups, ups)
	}
	f := newFleet(t, withRedis(), withServers(1, false), withReplicas(2, "c", global, body, "JOURNAL_SEAL_KEY="+newSealKey(t)))
	for _, tc := range []struct {
		table  string
		shared bool
	}{{"jshared", true}, {"jlocal", false}} {
		t.Run(tc.table, func(t *testing.T) {
			got := cutAndResumeVia(t, f.rs[0].addr, "/"+tc.table+"/mcp", f.rs[1].addr)
			t.Logf("%s: call through c1, resumed through c2: %s", tc.table, got)
			switch {
			case tc.shared && !got.complete(journalSteps):
				t.Errorf("journal in Redis: got %s; want progress 1..%d once each, in order, and the result once", got, journalSteps)
			case !tc.shared && got.results != 0:
				t.Errorf("control, journal in c1's memory: got %s; c2 should not have had the rest", got)
			}
		})
	}
}

// TestJournalDeleteEndsCall: a DELETE of the session still ends a call the
// proxy goes on reading for a client that went away, and drops the
// session's events: after it, the journal records no more of the call and
// holds nothing of the session. Control, in the same run: before the
// DELETE, the journal goes on recording the call after the cut.
func TestJournalDeleteEndsCall(t *testing.T) {
	hc, url, id, metric, atCut := cutJournaledCall(t, "journal-delete")
	atDelete := metric("caddy_mcp_journal_events_total")
	ex := send(t, hc, http.MethodDelete, url, sid(id), "")
	if ex.status/100 != 2 {
		t.Fatalf("DELETE: %d %s", ex.status, ex.body)
	}
	time.Sleep(time.Second) // three progress events' time
	after, sessions := metric("caddy_mcp_journal_events_total"), metric("caddy_mcp_journal_sessions")
	t.Logf("events recorded: %v at the cut, %v at the DELETE, %v a second later; sessions held %v", atCut, atDelete, after, sessions)
	if after > atDelete+2 || sessions != 0 { // events on their way while the DELETE was sent
		t.Errorf("after the DELETE the journal recorded %v more events and holds %v sessions; want the call ended and nothing held", after-atDelete, sessions)
	}
}

// TestJournalCancelledEndsCall: with the journal on, a client whose
// connection was cut mid-call can still cancel the call with
// notifications/cancelled (MCP 2025-11-25, Cancellation): the proxy passes
// it to the upstream, whose tool stops, so the journal records no more of
// the call, and the session stays (only the call ends). Control, in the
// same run: before the cancellation, the journal goes on recording the call
// after the cut.
func TestJournalCancelledEndsCall(t *testing.T) {
	hc, url, id, metric, atCut := cutJournaledCall(t, "journal-cancel")
	atCancel := metric("caddy_mcp_journal_events_total")
	ex := send(t, hc, http.MethodPost, url, mcpPOSTHeaders(id),
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2,"reason":"the client went away"}}`)
	if ex.status != http.StatusAccepted {
		t.Fatalf("notifications/cancelled: %d %s; want 202", ex.status, ex.body)
	}
	time.Sleep(time.Second) // three progress events' time
	after, sessions := metric("caddy_mcp_journal_events_total"), metric("caddy_mcp_journal_sessions")
	t.Logf("events recorded: %v at the cut, %v at the cancellation, %v a second later; sessions held %v", atCut, atCancel, after, sessions)
	if after > atCancel+2 { // events on their way while the cancellation was sent
		t.Errorf("after notifications/cancelled the journal recorded %v more events; want the call ended", after-atCancel)
	}
	if ex := send(t, hc, http.MethodPost, url, mcpPOSTHeaders(id), `{"jsonrpc":"2.0","id":3,"method":"ping"}`); ex.status != http.StatusOK {
		t.Errorf("a ping of the session after the cancellation: %d %s; want the session kept", ex.status, ex.body)
	}
}

// TestJournalWindowEndsCall: the proxy reads a call on for a client that
// went away only for journal_window; then it cancels the call, whose
// upstream tool stops, and the journal records no more of it. Control, in
// the same run: with the default window (5m) the call goes on after the same
// time.
func TestJournalWindowEndsCall(t *testing.T) {
	srv := startBackends(t, 1, false)[0]
	ps := startProxies(t, journalSite(srv.Addr(), "journal-window-short", true, "journal_window 1s"),
		journalSite(srv.Addr(), "journal-window-default", true))
	for i, table := range []string{"journal-window-short", "journal-window-default"} {
		short := i == 0
		t.Run(table, func(t *testing.T) {
			relay := redistest.NewRelay(t, ps[i].addr)
			url := "http://" + relay.Addr + "/mcp"
			hc := newHTTPClient()
			defer hc.CloseIdleConnections()
			id := goSDKSession(t, hc, url)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			got := new(callEvents)
			resp := postSSE(ctx, t, hc, url, id, progressCall(2, 6000, 24)) // 4 events a second for 6 s
			if err := readEvents(ctx, resp.Body, got, func(c *callEvents) bool { return len(c.progress) == cutAfter }); err != nil {
				t.Fatalf("before the cut: %v, %s", err, got)
			}
			relay.Cut()
			metric := func() float64 {
				families, _ := scrape(t)
				return metricValue(families, "caddy_mcp_journal_events_total", map[string]string{"table": table})
			}
			time.Sleep(2 * time.Second) // the short window and a margin
			atWindow := metric()
			time.Sleep(time.Second)
			after := metric()
			t.Logf("%s: %v events 2 s after the cut, %v a second later", table, atWindow, after)
			switch {
			case short && after > atWindow:
				t.Errorf("journal_window 1s: the journal recorded %v events more than 2 s after the cut; want the call cancelled at the window", after-atWindow)
			case !short && after < atWindow+2:
				t.Errorf("control, default window: the journal recorded %v events in the third second after the cut; want the call read on", after-atWindow)
			}
		})
	}
}

// cutJournaledCall opens a session through a relay to a proxy with the
// journal on for table, starts a 5 s call of 20 progress events, cuts the
// client's connection after three, and checks the control: the journal
// goes on recording the call. It returns the client, the relay's URL, the
// session, a reader of table's metrics, and the events recorded at the cut.
func cutJournaledCall(t *testing.T, table string) (*http.Client, string, string, func(string) float64, float64) {
	t.Helper()
	srv := startBackends(t, 1, false)[0]
	p := startProxy(t, journalSite(srv.Addr(), table, true))
	relay := redistest.NewRelay(t, p.addr)
	url := "http://" + relay.Addr + "/mcp"
	hc := newHTTPClient()
	t.Cleanup(hc.CloseIdleConnections)
	id := goSDKSession(t, hc, url)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	got := new(callEvents)
	resp := postSSE(ctx, t, hc, url, id, progressCall(2, 5000, 20))
	if err := readEvents(ctx, resp.Body, got, func(c *callEvents) bool { return len(c.progress) == cutAfter }); err != nil {
		t.Fatalf("before the cut: %v, %s", err, got)
	}
	relay.Cut()
	metric := func(name string) float64 {
		families, _ := scrape(t)
		return metricValue(families, name, map[string]string{"table": table})
	}
	atCut := metric("caddy_mcp_journal_events_total")
	if !testproc.Until(5*time.Second, func() bool { return metric("caddy_mcp_journal_events_total") >= atCut+2 }) {
		t.Fatalf("control: the journal recorded nothing after the cut (%v events)", metric("caddy_mcp_journal_events_total"))
	}
	return hc, url, id, metric, atCut
}
