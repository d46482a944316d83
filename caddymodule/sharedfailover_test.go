package caddymodule

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/redis/go-redis/v9"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redisstore"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// failoverTables returns n tables of one name sharing the Redis at addr,
// each with failover reinitialize, as n Caddy instances have them.
func failoverTables(t *testing.T, addr string, n int) []*session.Table {
	t.Helper()
	out := make([]*session.Table, n)
	for i := range out {
		out[i] = sharedTable(t, addr, "fo/"+t.Name(), time.Second)
		out[i].SetFailover(session.FailoverReinitialize, 0)
	}
	// Moves published before an instance subscribed are lost to it, as
	// after a lost connection: wait until every instance listens.
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	events := storeOf(out[0]).Events()
	if !testproc.Until(5*time.Second, func() bool { return rc.PubSubNumSub(context.Background(), events).Val()[events] >= int64(n) }) {
		t.Fatal("the instances did not subscribe to the table's events within 5 s")
	}
	return out
}

// testInit is a kept initialize as the handler captures it.
func testInit() *session.Init {
	return &session.Init{
		Body:   []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","clientInfo":{"name":"SECRETCLIENT"}}}`),
		Accept: "application/json, text/event-stream", ContentType: "application/json",
	}
}

// where returns the session's upstream and upstream ID in tbl, "" when
// the table does not hold it or has no record.
func where(tbl *session.Table, id string) (string, string) {
	up, init := tbl.InitOf(id)
	if up == nil || init == nil {
		return "", ""
	}
	return up.Dial(), init.UpstreamID
}

// storedValue returns the value of session id in the Redis at addr.
func storedValue(t *testing.T, addr string, tbl *session.Table, id string) string {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	c := storeOf(tbl)
	v, _ := rc.Get(context.Background(), c.SessionKey(id)).Result()
	return v
}

// TestFailoverRecordShared: with failover and the redis store, an instance
// that never saw a session adopts it with its kept initialize; a move on
// one instance reaches the others (published, and read by instances that
// adopt it afterwards); Redis sees neither the initialize nor the upstream
// IDs in the clear; a touch of an instance holding the old upstream does
// not undo the move.
func TestFailoverRecordShared(t *testing.T) {
	srv := redistest.Start(t)
	ts := failoverTables(t, srv.Addr, 3)
	a, b, c := ts[0], ts[1], ts[2]
	a.LearnInit(testSessionID, "10.0.0.1:80", session.Origin{}, testInit())
	if up := b.Lookup(testSessionID); up == nil || up.Dial() != "10.0.0.1:80" {
		t.Fatalf("b.Lookup = %v, want 10.0.0.1:80", up)
	}
	if _, init := b.InitOf(testSessionID); init == nil || string(init.Body) != string(testInit().Body) || init.Accept != testInit().Accept || init.UpstreamID != "" {
		t.Fatalf("b adopted the session with record %+v, want the initialize a kept", init)
	}
	stale := storedValue(t, srv.Addr, a, testSessionID)

	from, init := a.InitOf(testSessionID)
	res, err := a.RecordMove(testSessionID, from, init, a.UseUpstream("10.0.0.2:80"), init.MovedTo("UPSTREAM-ID-2"))
	if err != nil || res.Followed || res.Up.Dial() != "10.0.0.2:80" {
		t.Fatalf("recordMove = %+v, %v; want moved to 10.0.0.2:80", res, err)
	}
	if !testproc.Until(5*time.Second, func() bool { d, u := where(b, testSessionID); return d == "10.0.0.2:80" && u == "UPSTREAM-ID-2" }) {
		d, u := where(b, testSessionID)
		t.Fatalf("b, holding the session, did not follow the move within 5 s: %s %q", d, u)
	}
	c.Lookup(testSessionID)
	if d, u := where(c, testSessionID); d != "10.0.0.2:80" || u != "UPSTREAM-ID-2" {
		t.Fatalf("c adopted the moved session on %s as %q, want 10.0.0.2:80 as UPSTREAM-ID-2", d, u)
	}
	if dump := redistest.Dump(t, srv.Addr); strings.Contains(dump, "SECRETCLIENT") || strings.Contains(dump, "UPSTREAM-ID-2") || strings.Contains(dump, testSessionID) {
		t.Fatalf("Redis holds the initialize, an upstream ID or a session ID in the clear:\n%s", dump)
	}

	// A touch of the old value, queued by an instance that has not heard of
	// the move, leaves the move in place.
	moved := storedValue(t, srv.Addr, a, testSessionID)
	conn := storeOf(b)
	conn.Touch(testSessionID, stale)
	conn.Flush()
	if got := storedValue(t, srv.Addr, a, testSessionID); got != moved {
		t.Fatalf("a stale touch changed the value from %q to %q", moved, got)
	}
	// An instance that missed the move's message follows it at its touch.
	d := failoverTables(t, srv.Addr, 1)[0]
	d.AdoptShared(testSessionID, storeOf(d).Parse(testSessionID, stale), session.PrincipalSum{})
	storeOf(d).Touch(testSessionID, stale)
	storeOf(d).Flush()
	if dial, u := where(d, testSessionID); dial != "10.0.0.2:80" || u != "UPSTREAM-ID-2" {
		t.Fatalf("an instance holding the old upstream touched the session and kept %s %q, want the move", dial, u)
	}
	// A record moved under another session's key does not open.
	dial, bound, rec := session.ParseValue(moved)
	if s := conn.Parse("another-session", session.EncodeValue(dial, bound, rec)); s.Init != nil {
		t.Fatal("a failover record opened under another session's key")
	}
}

// TestFailoverConcurrentMoves: two instances failing the same session
// over at once end with one record: one wins the compare-and-set, the
// other follows its move, and every instance then sends the session to the
// winner's upstream under the winner's upstream ID.
func TestFailoverConcurrentMoves(t *testing.T) {
	srv := redistest.Start(t)
	ts := failoverTables(t, srv.Addr, 3)
	ts[0].LearnInit(testSessionID, "10.0.0.1:80", session.Origin{}, testInit())
	storeOf(ts[0]).Flush() // the write is queued; under load it may land after the others look
	for i, tbl := range ts[1:] {
		if !testproc.Until(5*time.Second, func() bool {
			_, init := tbl.InitOf(testSessionID)
			return tbl.Lookup(testSessionID) != nil && init != nil
		}) {
			t.Fatalf("setup: instance %d does not find the session and its kept initialize in Redis", i+1)
		}
	}
	results := make([]session.FailoverResult, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, to := range []string{"10.0.0.2:80", "10.0.0.3:80"} {
		wg.Go(func() {
			tbl := ts[i]
			from, init := tbl.InitOf(testSessionID)
			results[i], errs[i] = tbl.RecordMove(testSessionID, from, init, tbl.UseUpstream(to), init.MovedTo("ID-ON-"+to))
		})
	}
	wg.Wait()
	if results[0].Followed == results[1].Followed {
		t.Fatalf("followed: %v and %v (errors %v, %v); want exactly one instance to follow the other's move", results[0].Followed, results[1].Followed, errs[0], errs[1])
	}
	winner := results[0]
	if winner.Followed {
		winner = results[1]
	}
	want := winner.Up.Dial()
	ok := testproc.Until(5*time.Second, func() bool {
		for _, tbl := range ts {
			if d, u := where(tbl, testSessionID); d != want || u != "ID-ON-"+want {
				return false
			}
		}
		return true
	})
	for i, tbl := range ts {
		d, u := where(tbl, testSessionID)
		t.Logf("instance %d: %s as %s", i, d, u)
	}
	if !ok {
		t.Fatalf("the instances do not agree on %s as ID-ON-%s", want, want)
	}
}

// TestFailoverStoreDown: a failover while Redis is down moves the session
// on this instance, counts a store error (op move), and writes the move to
// Redis once it answers again.
func TestFailoverStoreDown(t *testing.T) {
	srv := redistest.Start(t)
	a := failoverTables(t, srv.Addr, 1)[0]
	a.LearnInit(testSessionID, "10.0.0.1:80", session.Origin{}, testInit())
	srv.Stop()
	from, init := a.InitOf(testSessionID)
	res, err := a.RecordMove(testSessionID, from, init, a.UseUpstream("10.0.0.2:80"), init.MovedTo("ID-2"))
	if err != nil || res.Followed || res.Up.Dial() != "10.0.0.2:80" {
		t.Fatalf("recordMove with Redis down = %+v, %v; want moved here", res, err)
	}
	if d, u := where(a, testSessionID); d != "10.0.0.2:80" || u != "ID-2" || storeOf(a).ErrorCount(redisstore.OpMove) == 0 {
		t.Fatalf("with Redis down: %s %q, %d move errors; want 10.0.0.2:80, ID-2, at least 1", d, u, storeOf(a).ErrorCount(redisstore.OpMove))
	}
	srv.Restart()
	if !testproc.Until(5*time.Second, func() bool {
		d, _, _ := session.ParseValue(storedValue(t, srv.Addr, a, testSessionID))
		return d == "10.0.0.2:80"
	}) {
		t.Fatalf("Redis holds %q 5 s after it came back, want the move", storedValue(t, srv.Addr, a, testSessionID))
	}
	b := failoverTables(t, srv.Addr, 1)[0]
	b.Lookup(testSessionID)
	if d, u := where(b, testSessionID); d != "10.0.0.2:80" || u != "ID-2" {
		t.Fatalf("another instance adopted the session on %s as %q after Redis came back", d, u)
	}
}

// restartingUpstream answers as one MCP server that mints NEW1, NEW2, ...
// for initialize requests and forgets sessions on restart; before it
// answers the next initialize, it calls beforeInit once.
type restartingUpstream struct {
	mu         sync.Mutex
	minted     int
	live       map[string]bool
	deleted    []string
	beforeInit func()
}

func (u *restartingUpstream) respond(w http.ResponseWriter, r *http.Request, _ *reverseproxy.Upstream) {
	body, _ := io.ReadAll(r.Body)
	id := r.Header.Get(HeaderSessionID)
	u.mu.Lock()
	before := u.beforeInit
	if id == "" {
		u.beforeInit = nil
	}
	u.mu.Unlock()
	if id == "" && before != nil {
		before()
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case id == "" && isInitialize(body, false):
		u.minted++
		id = fmt.Sprintf("NEW%d", u.minted)
		u.live[id] = true
		w.Header().Set(HeaderSessionID, id)
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25"}}`)
	case !u.live[id]:
		w.WriteHeader(http.StatusNotFound)
	case r.Method == http.MethodDelete:
		delete(u.live, id)
		u.deleted = append(u.deleted, id)
	case strings.Contains(string(body), "notifications/initialized"):
		w.WriteHeader(http.StatusAccepted)
	default:
		_, _ = io.WriteString(w, "answered in "+id)
	}
}

// TestFailoverLoserFollows: two instances sharing Redis meet the 404 of
// a restarted server for one session; the second replays its initialize
// while the first's failover completes. The second loses the
// compare-and-set, sends its request to the first's new upstream session,
// and ends the session it opened with DELETE: the server keeps one session.
func TestFailoverLoserFollows(t *testing.T) {
	srv := redistest.Start(t)
	up := &restartingUpstream{live: map[string]bool{}}
	var fs [2]*affinityFixture
	for i := range fs {
		h, logs := provisionHandler(t, &Handler{Table: fmt.Sprintf("fo/%s/%d", t.Name(), i)})
		attachStore(t, h.table, srv.Addr, "shared", testHashKey, time.Second)
		h.table.SetFailover(session.FailoverReinitialize, 0)
		policy := provisionPolicy(t, &SessionSelection{Table: h.Table})
		fs[i] = &affinityFixture{h: h, logs: logs, proxy: &fakeProxy{policy: policy, pool: testPool()[:1]}}
	}
	a, b := fs[0], fs[1]
	a.serve(t, bodyRequest(testInitBody, ""), up.respond)
	if rec := b.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":2,"method":"ping"}`, "NEW1"), up.respond); rec.Body.String() != "answered in NEW1" {
		t.Fatalf("b, reading the session from Redis: %d %q", rec.Code, rec.Body.String())
	}
	up.mu.Lock()
	up.live = map[string]bool{} // the server restarts
	var aBody string
	up.beforeInit = func() { // b replays; a fails the session over meanwhile, and first
		aBody = a.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":3,"method":"ping"}`, "NEW1"), up.respond).Body.String()
	}
	up.mu.Unlock()
	bBody := b.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":4,"method":"ping"}`, "NEW1"), up.respond).Body.String()
	next := b.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":5,"method":"ping"}`, "NEW1"), up.respond).Body.String()
	t.Logf("a: %q, b: %q then %q; the server holds %v, ended %v; a moved %d, b followed %d",
		aBody, bBody, next, up.live, up.deleted, a.h.table.Stats.Failovers(session.FailoverUpstream404, true), b.h.table.Stats.FailoversFollowed(session.FailoverUpstream404))
	if aBody != "answered in NEW2" || bBody != "answered in NEW2" || next != "answered in NEW2" {
		t.Fatal("want both instances to answer in the session the first failover opened")
	}
	if len(up.live) != 1 || len(up.deleted) != 1 || up.deleted[0] != "NEW3" {
		t.Fatal("want the server to hold one session, the loser's ended with DELETE")
	}
	if a.h.table.Stats.Failovers(session.FailoverUpstream404, true) != 1 || b.h.table.Stats.FailoversFollowed(session.FailoverUpstream404) != 1 {
		t.Fatal("want one move on a, one followed on b")
	}
}
