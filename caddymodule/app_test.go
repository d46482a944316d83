package caddymodule

import (
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
)

func TestAcquireReleaseTable(t *testing.T) {
	name := "acquire-" + t.Name()
	t1, err := acquireTable(name, 10, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t2, err := acquireTable(name, 20, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if t1 != t2 {
		t.Fatal("two acquisitions of one name gave different tables")
	}
	t1.Learn("s", "a:1")
	releaseTable(name)
	if t3, _ := acquireTable(name, 10, time.Hour); t3 != t1 {
		t.Error("table replaced while still referenced")
	}
	releaseTable(name)
	releaseTable(name) // last reference: destructed
	t4, err := acquireTable(name, 10, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer releaseTable(name)
	if t4 == t1 || t4.Len() != 0 {
		t.Error("table survived its last release")
	}
	if _, err := acquireTable("bad-"+t.Name(), 0, time.Hour); err == nil {
		releaseTable("bad-" + t.Name())
		t.Error("acquireTable with max 0 succeeded")
	}
}

// TestNewTableKnowsSealedKeys: a table made by NewTable tells the keys of
// sealed session IDs from plain ones: without failover, a DELETE of a
// sealed session leaves a tombstone (any replica could adopt it again),
// one of a plain session none (negative control).
func TestNewTableKnowsSealedKeys(t *testing.T) {
	tbl, err := NewTable(t.Name(), 10, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	sealed := string([]byte{sealVersionIssuedInit}) + "one"
	for _, id := range []string{"plain", sealed} {
		tbl.Learn(id, "10.0.0.1:80")
		tbl.Evict(id, session.EvictDelete)
	}
	if n := tbl.Tombstones(); n != 1 || tbl.Buried(sealed) != session.TombEnded {
		t.Errorf("after ending a plain and a sealed session: %d tombstones, sealed buried %v; want 1, the sealed one", n, tbl.Buried(sealed))
	}
}
