package tests

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
	"github.com/klauspost/compress/zstd"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Failover helpers: the sites, the load runs that kill an upstream under
// them, and the summaries of what their sessions saw (see session and
// foRun in sessions_harness_test.go).

// compressingSite is a site of Caddy's own compression middleware (encode
// zstd gzip) in front of server: every JSON answer is compressed with what
// the request accepts, as the gzip and zstd middleware of Python and Node
// apps do. Those ignore the go-sdk's Cache-Control: no-transform, which
// Caddy's encode honours; the site drops it so that encode compresses too.
func compressingSite(server string) string {
	return fmt.Sprintf(`encode zstd gzip {
		minimum_length 1
		match {
			header Content-Type application/json*
		}
	}
	reverse_proxy %s {
		header_down -Cache-Control
	}`, server)
}

// zstdDecoded returns the body of ex, decoded when it came with
// Content-Encoding zstd.
func zstdDecoded(t testing.TB, ex exchange) string {
	t.Helper()
	if ex.header.Get("Content-Encoding") != "zstd" {
		return ex.body
	}
	d, err := zstd.NewReader(strings.NewReader(ex.body))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	raw, err := io.ReadAll(d)
	if err != nil {
		t.Fatalf("decoding a zstd answer: %v", err)
	}
	return string(raw)
}

// startFailoverFleet starts a Redis, three go-sdk servers and three Caddy
// replicas whose tables share the Redis. Their site routes /<table>/mcp to
// an mcp_proxy over the servers: "fo" with failover reinitialize; "nofo"
// without failover (the negative control); "sealedfo" with failover
// reinitialize and seal_session_ids.
func startFailoverFleet(t *testing.T) *fleet {
	global := func(f *fleet) string {
		g := storeLog
		for _, tb := range foTables {
			g = fmt.Sprintf("mcp_sessions %s {\n\t\t%s\n\t}\n\t%s", tb.name, redisStore(f.redis.Addr, sharedTimeout), g)
		}
		return g
	}
	body := func(f *fleet) string {
		b := ""
		for _, tb := range foTables {
			b += fmt.Sprintf("handle_path /%s/* {\n\t\tmcp_proxy %s {\n\t\t\ttable %s\n\t\t\t%s\n\t\t}\n\t}\n\t", tb.name, upstreams(f.srv), tb.name, tb.options)
		}
		return b
	}
	return newFleet(t, withRedis(), withServers(3, false), withReplicas(3, "c", global, body, "FO_SEAL_KEY="+newSealKey(t)))
}

// failoversAt returns the failovers of table on every replica with result.
func (f *fleet) failoversAt(t testing.TB, table, result string) int {
	return int(metricSum(t, f.rs, "caddy_mcp_failovers_total", map[string]string{"table": table, "result": result}))
}

// splitSessions returns how many sessions a server saw under more than
// one session ID: replicas that did not agree on one new upstream session.
func splitSessions(ss []*session) int {
	n := 0
	for _, s := range ss {
		for _, ids := range s.seenBy() {
			if len(ids) > 1 {
				n++
				break
			}
		}
	}
	return n
}

// atOnce calls whoami in session id through every replica at the same
// moment, then twice more through each, and reports whether every call was
// answered by one server other than dead, under one session ID.
func atOnce(t *testing.T, hc *http.Client, f *fleet, table, id, dead string) bool {
	got := make([]identity, len(f.rs))
	status := make([]int, len(f.rs))
	var start, wg sync.WaitGroup
	start.Add(1)
	for i, r := range f.rs {
		wg.Go(func() { start.Wait(); status[i], got[i] = whoamiID(t, hc, tableURL(r, table), id, 10+i) })
	}
	start.Done()
	wg.Wait()
	same := got[0].Server != "" && got[0].Server != dead
	for i, r := range f.rs {
		same = same && status[i] == http.StatusOK && got[i] == got[0]
		for range 2 {
			st, who := rawWhoami(t, hc, tableURL(r, table), id)
			same = same && st == http.StatusOK && who == got[0]
		}
	}
	if !same {
		t.Logf("table %s: replicas disagree on a session after the kill: statuses %v, answered by %+v", table, status, got)
	}
	return same
}

// whoamiID is rawWhoami with JSON-RPC request ID rpcID: calls in flight at
// once in one session need distinct IDs (go-sdk servers answer a duplicate
// with 400).
func whoamiID(t testing.TB, hc *http.Client, url, id string, rpcID int) (int, identity) {
	t.Helper()
	ex := mcpPost(t, hc, url, id, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`, rpcID))
	if ex.status != http.StatusOK {
		t.Logf("whoami in session %s through %s: %d %s", id, url, ex.status, ex.body)
		return ex.status, identity{}
	}
	who, err := tsWhoamiResult(ex.body)
	if err != nil {
		t.Fatalf("whoami in session %s: %v in %s", id, err, ex.body)
	}
	return ex.status, who
}

// foCounts are what every failover summary counts of a run's sessions.
type foCounts struct {
	sessions, connErrs, calls, failedCalls, inFlight, lost int
	errs                                                   []string
}

// add counts session x of a run whose server was killed between killed
// and dead, and reports whether x connected at all.
func (c *foCounts) add(x *session, killed, dead time.Time) bool {
	c.sessions++
	if x.connErr != nil {
		c.connErrs++
		c.errs = append(c.errs, x.connErr.Error())
		return false
	}
	c.calls += len(x.answered)
	c.failedCalls += len(x.failed())
	for _, sp := range x.spans {
		if sp.start.Before(dead) && sp.end.After(killed) {
			c.inFlight++
		}
	}
	for _, sp := range x.failed() {
		if len(c.errs) < 4 {
			c.errs = append(c.errs, sp.err.Error())
		}
	}
	if x.lost {
		c.lost++
	}
	return true
}

// foSummary sums up the sessions of a failover run against the server
// that was killed between killed and dead.
type foSummary struct {
	foCounts
	onDead, lostOnDead, movedOK, othersOK, inconsistent int
}

func summarizeFailover(ss []*session, deadServer string, killed, dead time.Time) foSummary {
	var s foSummary
	for _, x := range ss {
		if !s.add(x, killed, dead) {
			continue
		}
		if !x.consistent() {
			s.inconsistent++
		}
		if x.creator != deadServer {
			if !x.lost && x.servers() == 1 {
				s.othersOK++
			}
			continue
		}
		s.onDead++
		if x.lost {
			s.lostOnDead++
		}
		if !x.lost && x.servers() == 2 && len(x.seenBy()[deadServer]) == 1 {
			s.movedOK++
		}
	}
	return s
}

func (s foSummary) String() string {
	return fmt.Sprintf("%d sessions (%d could not connect), %d on the killed server: %d moved to another server and kept working, %d lost; other sessions ok: %d/%d; "+
		"calls answered %d, failed %d, in flight at the kill %d; sessions whose servers saw inconsistent IDs: %d; errors %q",
		s.sessions, s.connErrs, s.onDead, s.movedOK, s.lostOnDead, s.othersOK, s.sessions-s.onDead, s.calls, s.failedCalls, s.inFlight, s.inconsistent, s.errs)
}

// failoverSite is an mcp_proxy over ups with its own table, with failover
// reinitialize or without (off).
func failoverSite(ups, table string, on bool) string {
	mode := "off"
	if on {
		mode = "reinitialize"
	}
	return fmt.Sprintf("mcp_proxy %s {\n\t\ttable %s\n\t\tfailover %s\n\t}", ups, table, mode)
}

// vsSummary sums up raw sessions after the kill of deadServer: how many
// were on it, and how many of those and of the others got 200 to their GET
// and every POST, the POSTs all answered by one live server.
func vsSummary(vs []*session, deadServer string) (onDead, deadOK, others, othersOK int) {
	for _, v := range vs {
		after := v.afterGET()
		ok := v.get == http.StatusOK
		for _, sp := range after {
			ok = ok && sp.status == http.StatusOK && sp.who.Server == after[0].who.Server && sp.who.Server != deadServer
		}
		if v.creator == deadServer {
			onDead++
			if ok {
				deadOK++
			}
		} else {
			others++
			if ok && after[0].who.Server == v.creator {
				othersOK++
			}
		}
	}
	return onDead, deadOK, others, othersOK
}

// killUnderLoad runs, through a proxy with `failover reinitialize` and one
// without over the servers srv, 60 go-sdk client sessions calling whoami
// and 15 raw sessions each, kills srv[1] under that load, then has the raw
// sessions reopen their GET stream and call. It checks the proxy with
// failover kept every session, and the other lost the killed server's.
func killUnderLoad(t *testing.T, srv []*testproc.Proc, label string) {
	t.Helper()
	ps := startProxies(t, failoverSite(upstreams(srv), label+"fo", true), failoverSite(upstreams(srv), label+"nofo", false))
	// The table and its metrics outlive the config (go test -count=N runs
	// this again over the same table): count this run's failovers only.
	movedBefore, failedBefore := failoversOf(t, label+"fo")
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	const n, raw = 60, 15
	vs := [][]*session{openRawSessions(t, hc, ps[0].url(), raw, rawPlain), openRawSessions(t, hc, ps[1].url(), raw, rawPlain)}
	var killed, dead time.Time
	runs := make([][]*session, 2)
	var wg sync.WaitGroup
	ready, kill := make(chan struct{}, 2), make(chan struct{})
	for i, p := range ps {
		wg.Go(func() { runs[i] = foRun(t, p.url(), n, 3*time.Second, func() { ready <- struct{}{}; <-kill }) })
	}
	<-ready
	<-ready
	killed = time.Now()
	srv[1].Kill()
	<-srv[1].Done()
	waitClosesRead(t, srv[1].Addr()) // else a call may go out on a kept-alive connection to it: 502, not a failover
	dead = time.Now()
	close(kill)
	wg.Wait()
	for _, v := range append(vs[0], vs[1]...) {
		v.resume(t, hc, 3, ps[slicesIndex(vs[0], v)].url())
	}

	son := summarizeFailover(runs[0], srv[1].Name(), killed, dead)
	soff := summarizeFailover(runs[1], srv[1].Name(), killed, dead)
	t.Logf("%s, go-sdk clients, failover reinitialize: %s", label, son)
	t.Logf("%s, go-sdk clients, failover off (negative control): %s", label, soff)
	if son.connErrs != 0 || son.onDead == 0 || son.movedOK != son.onDead || son.lost != 0 || son.othersOK != n-son.onDead ||
		son.inconsistent != 0 || son.failedCalls > son.inFlight {
		t.Errorf("with failover: want every session of the killed server moved and working, no session lost, failed calls <= in flight; got %s", son)
	}
	if soff.onDead == 0 || soff.lostOnDead != soff.onDead {
		t.Errorf("negative control: want every session of the killed server lost without failover; got %s", soff)
	}
	onDead, deadOK, others, othersOK := vsSummary(vs[0], srv[1].Name())
	t.Logf("%s, raw clients reopening GET then POSTing, failover reinitialize: %d/%d sessions of the killed server ok, %d/%d others ok", label, deadOK, onDead, othersOK, others)
	if onDead == 0 || deadOK != onDead || othersOK != others {
		t.Errorf("raw clients with failover: want all sessions ok; got %d/%d of the killed server's, %d/%d others", deadOK, onDead, othersOK, others)
	}
	offDead, offDeadOK, offOthers, offOthersOK := vsSummary(vs[1], srv[1].Name())
	t.Logf("%s, raw clients, failover off (negative control): %d/%d sessions of the killed server ok, %d/%d others ok", label, offDeadOK, offDead, offOthersOK, offOthers)
	if offDead == 0 || offDeadOK != 0 || offOthersOK != offOthers {
		t.Errorf("raw clients without failover: want the killed server's sessions broken and the others ok; got %d/%d, %d/%d", offDeadOK, offDead, offOthersOK, offOthers)
	}
	moved, failed := failoversOf(t, label+"fo")
	moved, failed = moved-movedBefore, failed-failedBefore
	t.Logf("%s: caddy_mcp_failovers_total{cause=refused}: moved %v, failed %v", label, moved, failed)
	if int(moved) != son.onDead+onDead || failed != 0 {
		t.Errorf("caddy_mcp_failovers_total{cause=refused}: moved %v, failed %v; want %d moved, 0 failed", moved, failed, son.onDead+onDead)
	}
}

// failoversOf returns caddy_mcp_failovers_total{cause="refused"} of table,
// moved and failed, 0 for a series not there yet.
func failoversOf(t testing.TB, table string) (moved, failed float64) {
	t.Helper()
	fam, _ := scrape(t)
	f := fam["caddy_mcp_failovers_total"]
	moved = samplesSum(f, map[string]string{"table": table, "cause": "refused", "result": "moved"})
	failed = samplesSum(f, map[string]string{"table": table, "cause": "refused", "result": "failed"})
	return moved, failed
}

// slicesIndex returns 0 if v is in vs, 1 otherwise.
func slicesIndex(vs []*session, v *session) int {
	for _, x := range vs {
		if x == v {
			return 0
		}
	}
	return 1
}

// rawWhoami calls whoami in session id with a raw POST and returns the
// status and, on 200, who answered.
func rawWhoami(t testing.TB, hc *http.Client, url, id string) (int, identity) {
	t.Helper()
	ex := mcpPost(t, hc, url, id, tsWhoamiCall)
	if ex.status != http.StatusOK {
		return ex.status, identity{}
	}
	who, err := tsWhoamiResult(ex.body)
	if err != nil {
		t.Fatalf("whoami in session %s: %v in %s", id, err, ex.body)
	}
	return ex.status, who
}

// reinitWith sends initialize carrying the stale session ID stale and, on
// 200, notifications/initialized and a whoami call in the new session; it
// returns the initialize's status, the new ID, and who answered the call.
func reinitWith(t testing.TB, hc *http.Client, url, stale string) (int, string, identity) {
	t.Helper()
	hdr := map[string][]string{"Accept": {"application/json, text/event-stream"}, "Mcp-Session-Id": {stale}}
	ex := send(t, hc, http.MethodPost, url, hdr, initBody)
	id := ex.header.Get("Mcp-Session-Id")
	if ex.status != http.StatusOK || id == "" {
		return ex.status, "", identity{}
	}
	if ex := mcpPost(t, hc, url, id, tsInitializedMsg); ex.status != http.StatusAccepted {
		t.Fatalf("notifications/initialized of the new session: %d %s", ex.status, ex.body)
	}
	status, who := rawWhoami(t, hc, url, id)
	if status != http.StatusOK {
		t.Fatalf("whoami in the new session %s: %d", id, status)
	}
	return ex.status, id, who
}

// drainDeadline drains upstream in table through the admin API with a
// deadline and returns the answer.
func drainDeadline(t testing.TB, table, upstream, deadline string) caddymodule.UpstreamStatus {
	t.Helper()
	var st caddymodule.UpstreamStatus
	adminOK(t, http.MethodPost, "/mcp_sessions/drain", map[string]string{"table": table, "upstream": upstream, "deadline": deadline}, &st)
	return st
}

// whoamiAll calls whoami once in every session and returns who answered
// each, and how many calls failed.
func whoamiAll(ctx context.Context, css []*mcp.ClientSession) ([]identity, int) {
	ids, failed, _ := timedWhoamiAll(ctx, css)
	return ids, failed
}

// timedWhoamiAll is whoamiAll that also returns how long each call took.
func timedWhoamiAll(ctx context.Context, css []*mcp.ClientSession) ([]identity, int, []time.Duration) {
	ids := make([]identity, len(css))
	took := make([]time.Duration, len(css))
	failed := 0
	for i, cs := range css {
		start := time.Now()
		id, err := whoami(ctx, cs)
		took[i] = time.Since(start)
		if err != nil {
			failed++
		}
		ids[i] = id
	}
	return ids, failed, took
}

// medianOn returns the median of the durations of the calls answered
// before by server (on) or by another server (!on).
func medianOn(took []time.Duration, before []identity, server string, on bool) time.Duration {
	var ds []time.Duration
	for i, d := range took {
		if (before[i].Server == server) == on {
			ds = append(ds, d)
		}
	}
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// failoverKeepsClientID is one run of TestFailoverSealed.
func failoverKeepsClientID(t *testing.T, srv []*testproc.Proc, sealed bool) {
	seal := ""
	if sealed {
		seal = "\n\t\tseal_session_ids {env.FO_SEAL_KEY}"
	}
	p := startProxy(t, fmt.Sprintf("mcp_proxy %s {\n\t\ttable fo%s%v%s\n\t\tfailover reinitialize\n\t}", upstreams(srv), srv[0].Name(), sealed, seal))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	vs := openRawSessions(t, hc, p.url(), 12, rawPlain)
	seen := map[string]string{} // client ID -> the session ID its creator saw
	for _, v := range vs {
		_, who := rawWhoami(t, hc, p.url(), v.id)
		seen[v.id] = who.Session
	}
	srv[1].Kill()
	<-srv[1].Done()
	waitClosesRead(t, srv[1].Addr())
	moved, others, leaked, echoed := 0, 0, 0, 0
	for _, v := range vs {
		v.resume(t, hc, 3, p.url())
		ex := mcpPost(t, hc, p.url(), v.id, tsWhoamiCall)
		who, _ := tsWhoamiResult(ex.body)
		if got := ex.header.Values("Mcp-Session-Id"); len(got) > 1 || len(got) == 1 && got[0] != v.id {
			leaked++
		} else if len(got) == 1 {
			echoed++
		}
		switch {
		case v.creator == srv[1].Name() && who.Server != srv[1].Name() && who.Session != seen[v.id] && !strings.Contains(v.id, who.Session):
			moved++
		case v.creator != srv[1].Name() && who.Server == v.creator && who.Session == seen[v.id]:
			others++
		}
	}
	onDead, deadOK, nOthers, othersOK := vsSummary(vs, srv[1].Name())
	t.Logf("%d sessions on the killed server, %d moved (%d ok through GET and POSTs); %d/%d others untouched (%d ok); responses carrying the client's own Mcp-Session-Id %d, another one %d",
		onDead, moved, deadOK, others, nOthers, othersOK, echoed, leaked)
	if onDead == 0 || moved != onDead || deadOK != onDead || others != nOthers || othersOK != nOthers || leaked != 0 {
		t.Fatal("want every session of the killed server moved under its sealed ID, the others untouched, no other ID given to a client")
	}
}

// sessionOn opens go-sdk sessions (no GET stream) through url until one
// is on the server called server, and returns it; the others are closed.
func sessionOn(ctx context.Context, t *testing.T, url string, hc *http.Client, server string) *mcp.ClientSession {
	t.Helper()
	for range 30 {
		cs, err := connectNoStream(ctx, url, hc)
		if err != nil {
			t.Fatal(err)
		}
		if id, err := whoami(ctx, cs); err == nil && id.Server == server {
			return cs
		}
		cs.Close()
	}
	t.Fatalf("no session landed on %s in 30 tries", server)
	return nil
}

// refusalFleet starts two whoami servers and a third started with flags,
// and returns all three, the third last.
func refusalFleet(t *testing.T, flags ...string) []*testproc.Proc {
	t.Helper()
	return startBackendsWith(t, 3, false, func(name string) []string {
		if name == "s3" {
			return flags
		}
		return nil
	})
}

// openRaw opens n raw sessions through url and calls whoami once in each;
// it returns, per answering server, the IDs of the sessions it holds, and
// the statuses of the initializes that failed.
func openRaw(t *testing.T, hc *http.Client, url string, n int) (perServer map[string][]string, failed []int) {
	t.Helper()
	perServer = map[string][]string{}
	for range n {
		ex := mcpPost(t, hc, url, "", initBody)
		id := ex.header.Get("Mcp-Session-Id")
		if ex.status != http.StatusOK || id == "" {
			failed = append(failed, ex.status)
			continue
		}
		if ex := mcpPost(t, hc, url, id, tsInitializedMsg); ex.status != http.StatusAccepted {
			t.Fatalf("notifications/initialized: %d %s", ex.status, ex.body)
		}
		status, who := rawWhoami(t, hc, url, id)
		if status != http.StatusOK {
			t.Fatalf("whoami in a new session: %d", status)
		}
		perServer[who.Server] = append(perServer[who.Server], id)
	}
	return perServer, failed
}

// revokeCheck is one expectation: the statuses of a whoami call of a
// session through each replica; 0 where the test only reports it.
type revokeCheck struct {
	table, what, id string
	want            []int
}

// statusesMatch reports whether got has want's statuses where want is not 0.
func statusesMatch(got, want []int) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range want {
		if want[i] != 0 && got[i] != want[i] {
			return false
		}
	}
	return true
}

// startSealedFleet starts two Caddy replicas <name>1, <name>2 with the
// same sealing key (env holds MCP_SESSION_KEY) over the servers srv, with
// `failover reinitialize` or without, behind a balancer that sends every
// initialize to the first replica and every other request to the replicas
// in turn.
func startSealedFleet(t *testing.T, name string, srv []*testproc.Proc, failover bool, env []string) *fleet {
	t.Helper()
	mode := map[bool]string{true: "reinitialize", false: "off"}[failover]
	body := func(f *fleet) string {
		return fmt.Sprintf("mcp_proxy %s {\n\t\tseal_session_ids {env.MCP_SESSION_KEY}\n\t\tfailover %s\n\t}", upstreams(f.srv), mode)
	}
	return newFleet(t, withServersOf(srv), withReplicas(2, name, nil, body, env...), withLearnOnFirst())
}

// failoversAt returns how many sessions the Caddy with admin endpoint admin
// moved to another upstream, and failed to, by any cause.
func failoversAt(t *testing.T, admin string) (moved, failed int) {
	t.Helper()
	fam, _ := scrapeAt(t, admin)
	for _, cause := range []string{"upstream_gone", "refused", "upstream_404", "drain_deadline"} {
		for result, n := range map[string]*int{"moved": &moved, "failed": &failed} {
			*n += max(0, int(metricValue(fam, "caddy_mcp_failovers_total", map[string]string{"table": "default", "cause": cause, "result": result})))
		}
	}
	return moved, failed
}

// idsAfterGET counts the Mcp-Session-Id fields of the answers after the
// session's reopened GET: the client's own, or any other (an upstream's
// ID leaked, or a fresh value).
func idsAfterGET(s *session) (echoed, other int) {
	for _, sp := range s.afterGET() {
		switch ids := sp.header.Values("Mcp-Session-Id"); {
		case len(ids) == 1 && ids[0] == s.id:
			echoed++
		case len(ids) > 0:
			other++
		}
	}
	return echoed, other
}

// answeredVia returns, by the index of the URL a call went through, who
// answered the session's calls after its GET with 200.
func answeredVia(s *session) map[int][]identity {
	by := map[int][]identity{}
	for _, sp := range s.afterGET() {
		if sp.status == http.StatusOK {
			by[sp.via] = append(by[sp.via], sp.who)
		}
	}
	return by
}

// spreadOK reports whether the session came through as failover promises:
// its GET and every call answered 200; through each replica, one upstream
// session answered every call (a replica moves a session at most once);
// a session of a dead server was answered by a live server in a session
// of its own, any other by its first server under its own ID; no answer
// gave the client another Mcp-Session-Id than its own.
func spreadOK(s *session, dead map[string]bool) bool {
	if _, other := idsAfterGET(s); s.get != http.StatusOK || other != 0 {
		return false
	}
	for _, st := range s.statuses() {
		if st != http.StatusOK {
			return false
		}
	}
	for _, ids := range answeredVia(s) {
		for _, who := range ids {
			if who != ids[0] {
				return false
			}
		}
		moved := ids[0].Server != s.first.Server && !dead[ids[0].Server] && ids[0].Session != s.first.Session
		if dead[s.first.Server] != moved || !moved && ids[0] != s.first {
			return false
		}
	}
	return true
}

// spreadBroken reports whether the session got 404 to its GET and every
// call after it.
func spreadBroken(s *session) bool {
	for _, st := range append([]int{s.get}, s.statuses()...) {
		if st != http.StatusNotFound {
			return false
		}
	}
	return true
}

// upstreamSessionsAfterGET returns how many upstream sessions answered the
// session's calls after its GET.
func upstreamSessionsAfterGET(s *session) int {
	seen := map[identity]bool{}
	for _, ids := range answeredVia(s) {
		for _, who := range ids {
			seen[who] = true
		}
	}
	return len(seen)
}

// spreadSummary counts the sessions of dead servers and the others, those of
// each that are ok, those broken, and the upstream sessions of the dead
// servers' sessions that are ok.
type spreadSummary struct{ onDead, deadOK, deadBroken, others, othersOK, newSessions, echoed, otherIDs int }

func summarizeSpread(ss []*session, dead map[string]bool) spreadSummary {
	var r spreadSummary
	for _, s := range ss {
		echoed, other := idsAfterGET(s)
		r.echoed, r.otherIDs = r.echoed+echoed, r.otherIDs+other
		ok := spreadOK(s, dead)
		if !dead[s.first.Server] {
			r.others++
			if ok && upstreamSessionsAfterGET(s) == 1 {
				r.othersOK++
			}
			continue
		}
		r.onDead++
		if ok {
			r.deadOK++
			r.newSessions += upstreamSessionsAfterGET(s)
		}
		if spreadBroken(s) {
			r.deadBroken++
		}
	}
	return r
}

// sealedFoSummary sums up the go-sdk sessions of a run over a sealed
// fleet, whose server dead was killed between killed and deadAt.
type sealedFoSummary struct {
	foCounts
	onDead, deadOK, lostOnDead, others, othersOK, newSessions int
}

// summarizeSealedFailover counts a session of the dead server as ok if it
// was never lost, the replicas both answered it after the kill, and one or
// two upstream sessions on live servers (at most one per replica) answered
// its calls; any other session if it was never lost, both replicas
// answered it, and only its creator did, under one ID.
func summarizeSealedFailover(ss []*session, lb *balancer, dead string, killed, deadAt time.Time) sealedFoSummary {
	var s sealedFoSummary
	for _, x := range ss {
		if !s.add(x, killed, deadAt) {
			continue
		}
		seen := x.seenBy()
		live := map[identity]bool{}
		for srv, ids := range seen {
			for _, id := range ids {
				if srv != dead {
					live[identity{srv, id}] = true
				}
			}
		}
		both := lb.replicasThatAnswered(x.id) == 2
		if x.creator != dead {
			s.others++
			if !x.lost && both && len(live) == 1 && len(seen) == 1 {
				s.othersOK++
			}
			continue
		}
		s.onDead++
		if x.lost {
			s.lostOnDead++
		}
		if !x.lost && both && len(live) >= 1 && len(live) <= 2 {
			s.deadOK++
			s.newSessions += len(live)
		}
	}
	return s
}

func (s sealedFoSummary) String() string {
	return fmt.Sprintf("%d sessions (%d could not connect), %d on the killed server: %d kept working through both replicas, %d lost, in %d new upstream sessions; "+
		"other sessions ok through both replicas: %d/%d; sessions lost %d; calls answered %d, failed %d, in flight at the kill %d; errors %q",
		s.sessions, s.connErrs, s.onDead, s.deadOK, s.lostOnDead, s.newSessions, s.othersOK, s.others, s.lost, s.calls, s.failedCalls, s.inFlight, s.errs)
}

// startOldSDK builds tests/oldsdk (a whoami server on go-sdk v1.0.0, whose
// newest protocol version is 2025-06-18; a module of its own) and starts n
// of them named <prefix>1..<prefix>n.
func startOldSDK(t *testing.T, n int, prefix string) []*testproc.Proc {
	t.Helper()
	bin := filepath.Join(binDir, "oldsdk")
	if _, err := os.Stat(bin); err != nil {
		build := exec.Command("go", "build", "-o", bin, ".")
		build.Dir = "oldsdk"
		build.Env = append(os.Environ(), "GOWORK=off")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building tests/oldsdk: %v\n%s", err, out)
		}
	}
	return launchFleet(t, n, prefix, whoamiTimeout, func(name, addrFile string) *exec.Cmd {
		return exec.Command(bin, "-name", name, "-addr-file", addrFile)
	})
}

// waitFile waits until path exists, for at most timeout.
func waitFile(t *testing.T, path string, timeout time.Duration) {
	t.Helper()
	if !testproc.Until(timeout, func() bool { _, err := os.Stat(path); return err == nil }) {
		t.Fatalf("%s did not appear within %v", path, timeout)
	}
}
