package redisstore

import (
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
)

// TestLayoutOneSessionsRead: during a rolling upgrade, a replica of the
// older version writes sessions in layout 1 (every key under the table's
// tag). A replica of this version finds such a session, moves it into its
// own keys at its first touch, and removes both layouts' keys when it
// ends; a session neither layout holds stays unknown (negative control).
func TestLayoutOneSessionsRead(t *testing.T) {
	srv := redistest.Start(t)
	name := "legacy"
	tbl := sharedTable(t, srv.Addr, name, time.Second)
	c := storeOf(tbl)
	const id = "OLDFORMAT0000000000000000A"
	h := c.ks.hash(id).String()
	old := c.ks.legacySession(h)
	srv.Do("SET", old, "10.0.0.9:80", "PX", "3600000")
	srv.Do("ZADD", c.ks.legacyUpstream("10.0.0.9:80"), "9999999999999", h)
	if up := tbl.Lookup(id); up == nil || up.Dial() != "10.0.0.9:80" {
		t.Fatalf("a session in layout 1 is %v here, want 10.0.0.9:80", up)
	}
	if up := tbl.Lookup("NEVERLEARNED00000000000000"); up != nil {
		t.Errorf("a session neither layout holds is %v here", up)
	}
	if srv.Do("EXISTS", c.SessionKey(id)) != "0" {
		t.Fatalf("a read wrote the session in this layout already")
	}
	c.Touch(id, "10.0.0.9:80")
	c.Flush()
	if srv.Do("EXISTS", c.SessionKey(id)) != "1" {
		t.Errorf("the first touch did not write the session in this layout")
	}
	tbl.Evict(id, session.EvictDelete)
	if !waitFor(2*time.Second, func() bool {
		return srv.Do("EXISTS", c.SessionKey(id)) == "0" && srv.Do("EXISTS", old) == "0" &&
			srv.Do("ZSCORE", c.ks.legacyUpstream("10.0.0.9:80"), h) == "-1" // nil
	}) {
		t.Errorf("after the end, this layout's key exists: %s, layout 1's: %s, the member's score: %q",
			srv.Do("EXISTS", c.SessionKey(id)), srv.Do("EXISTS", old), srv.Do("ZSCORE", c.ks.legacyUpstream("10.0.0.9:80"), h))
	}
}
