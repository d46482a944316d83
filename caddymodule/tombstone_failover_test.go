package caddymodule

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/seal"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
)

// TestFailoverRefusedForEndedAndOld: with sealed IDs and failover
// reinitialize, a session the client DELETEd gets the proxy's 404 on the
// replica that saw the DELETE, reaching no upstream; on a replica that
// never saw it, a sealed ID older than failover_max_age, or of a format
// without its issue time, is refused failover when its upstream lost the
// session (404, counted as refused), while a young one fails over
// (negative control).
func TestFailoverRefusedForEndedAndOld(t *testing.T) {
	key := newKey(t)
	a := newSealedFailoverFixture(t, "test/revoke-a", key, 0)
	b := newSealedFailoverFixture(t, "test/revoke-b", key, 0)
	b.h.table.SetFailoverMaxAge(time.Hour)
	up, minted := lostSessionUpstream("S1", "S2", "S3", "S4")
	sealed := a.serve(t, bodyRequest(testInitBody, ""), up).Header().Get(HeaderSessionID)
	del := bodyRequest("", sealed)
	del.Method, del.Body = http.MethodDelete, http.NoBody
	if rec := a.serve(t, del, up); rec.Code != http.StatusOK {
		t.Fatalf("DELETE: %d", rec.Code)
	}
	delete(minted, "S1") // the upstream ended it
	calls := len(a.proxy.selected)
	rec := a.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":2,"method":"ping"}`, sealed), up)
	if rec.Code != http.StatusNotFound || len(a.proxy.selected) != calls || a.h.table.Stats.Failovers(session.FailoverUpstream404, true) != 0 {
		t.Fatalf("after DELETE, on its replica: %d %q, upstream called %v; want the proxy's 404 and no failover", rec.Code, rec.Body, len(a.proxy.selected) != calls)
	}

	dial := a.proxy.last().Dial
	s := newSealer(t, key)
	init := testSealedInit(testInitBody)
	minted["LOST"] = false
	v2 := sealRaw(t, key, sealVersionInit, v2Plaintext(dial, "LOST", init))
	for _, c := range []struct {
		name, id, why string
		ok            bool
	}{
		{"issued now", s.seal(seal.Session{Dial: dial, ID: "LOST", Init: init}), "", true},
		{"issued 61 minutes ago", s.seal(seal.Session{Issued: time.Now().Add(-61 * time.Minute).Unix(), Dial: dial, ID: "LOST", Init: init}), "failover_max_age", false},
		{"format version 2", v2, "did not seal its issue time", false},
	} {
		refused := b.h.table.Stats.FailoversRefused(session.FailoverUpstream404)
		rec := b.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":3,"method":"ping"}`, c.id), up)
		switch {
		case c.ok && (rec.Code != http.StatusOK || !strings.HasPrefix(rec.Body.String(), "answered in S")):
			t.Errorf("%s: %d %q; want it failed over", c.name, rec.Code, rec.Body)
		case !c.ok && (rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), c.why) || b.h.table.Stats.FailoversRefused(session.FailoverUpstream404) != refused+1):
			t.Errorf("%s: %d %q, refused %d -> %d; want 404 saying %q, one refusal counted", c.name, rec.Code, rec.Body, refused, b.h.table.Stats.FailoversRefused(session.FailoverUpstream404), c.why)
		}
	}
}

// v2Plaintext is the plaintext of a format version 2 sealed ID, as minted
// before sealed IDs carried their issue time.
func v2Plaintext(dial, id string, init seal.Init) []byte {
	b := plaintext(dial, "", "")[:0]
	for _, f := range []string{dial, "", id, init.Accept, init.ContentType, init.Version} {
		b = append(append(b, byte(len(f))), f...)
	}
	return append(b, init.Body...)
}

// TestStoreTombstones: a session ended by its client's DELETE leaves a
// tombstone in Redis before the DELETE is answered, so that another
// instance does not adopt it, a touch of an instance that missed the end
// does not write it back, and a failover finds it ended; an upstream
// opening a session with the same ID lifts the tombstone.
func TestStoreTombstones(t *testing.T) {
	srv := redistest.Start(t)
	ts := failoverTables(t, srv.Addr, 2)
	a, b := ts[0], ts[1]
	a.LearnInit(testSessionID, "10.0.0.1:80", session.Origin{}, testInit())
	if up := b.Lookup(testSessionID); up == nil {
		t.Fatal("b does not find the session a learned")
	}
	stale := storedValue(t, srv.Addr, a, testSessionID)
	a.EndByClient(testSessionID, session.EvictDelete)
	if n := redisCount(srv, "*:x:*"); n != 1 {
		t.Fatalf("Redis holds %d tombstones once the DELETE returned, want 1", n)
	}
	c := failoverTables(t, srv.Addr, 1)[0]
	if up, _, ended := c.LookupEnded(testSessionID, ""); up != nil || !ended {
		t.Fatalf("another instance: lookup = %v, ended %v; want the session ended", up, ended)
	}
	conn := storeOf(b)
	conn.Touch(testSessionID, stale) // b missed the end
	conn.Flush()
	if n := redisCount(srv, "*:s:*"); n != 0 {
		t.Fatalf("a touch of an instance that missed the end wrote the session back: %d session keys", n)
	}
	from, init := c.UseUpstream("10.0.0.1:80"), testInit()
	if _, _, ended := c.MovedInStore(testSessionID, from, init); !ended {
		t.Fatal("a failover must find the session ended in the store")
	}
	a.LearnInit(testSessionID, "10.0.0.2:80", session.Origin{}, testInit())
	if n := redisCount(srv, "*:x:*"); n != 0 {
		t.Fatalf("a session learned again with the ID leaves %d tombstones, want 0", n)
	}
}

// redisCount returns how many keys of the Redis match pattern.
func redisCount(s *redistest.Server, pattern string) int {
	var n int
	_, _ = fmt.Sscan(s.Do("EVAL", "return #redis.call('KEYS', ARGV[1])", "0", pattern), &n)
	return n
}
