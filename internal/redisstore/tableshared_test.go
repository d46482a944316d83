package redisstore

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
)

// TestConfirmKeepsItsOwnKey: a session's first use confirms it under the
// request's key, which may share a larger buffer (an opened sealed ID's key
// shares the buffer of the whole ID and its plaintext). The table must
// keep a copy of the key, not the request's buffer, and one copy: the
// learned key is dropped by the list, the kept initialize (failover) and
// the shared store's index (redis) alike.
func TestConfirmKeepsItsOwnKey(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name            string
		failover, redis bool
	}{{"memory", false, false}, {"memory, failover", true, false}, {"redis", false, true}, {"redis, failover", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			var tbl *session.Table
			if tc.redis {
				tbl = sharedTable(t, srv.Addr, "confirm/"+t.Name(), time.Second)
			} else {
				var err error
				if tbl, err = session.NewTable("memory", 10, time.Hour, nil); err != nil {
					t.Fatal(err)
				}
			}
			var init *session.Init
			if tc.failover {
				tbl.SetFailover(session.FailoverReinitialize, 0)
				init = &session.Init{Body: []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize"}`)}
			}
			key := strings.Repeat("k", 300)
			requestFreed, learnedFreed := make(chan struct{}), make(chan struct{})
			func() {
				learned := strings.Clone(key)
				runtime.AddCleanup(unsafe.StringData(learned), func(ch chan struct{}) { close(ch) }, learnedFreed)
				tbl.LearnInit(learned, "10.0.0.1:80", session.Origin{}, init)
				request := key + strings.Repeat("x", 4096) // the key, and more, in one allocation
				runtime.AddCleanup(unsafe.StringData(request), func(ch chan struct{}) { close(ch) }, requestFreed)
				if tbl.Lookup(request[:len(key)]) == nil {
					t.Fatal("the learned session is not found")
				}
			}()
			for what, ch := range map[string]chan struct{}{"the request's buffer": requestFreed, "the learned key too": learnedFreed} {
				if !freedSoon(ch) {
					t.Errorf("after confirming the session, the table keeps %s", what)
				}
			}
			if up, kept := tbl.InitOf(key); up == nil || (kept == nil) != (init == nil) || init != nil && string(kept.Body) != string(init.Body) {
				t.Errorf("after confirming, the session is on %v with kept initialize %+v, want %+v", up, kept, init)
			}
		})
	}
}

// freedSoon runs the GC until ch is closed, for up to a second, and
// reports whether it was.
func freedSoon(ch chan struct{}) bool {
	for range 50 {
		runtime.GC()
		select {
		case <-ch:
			return true
		case <-time.After(20 * time.Millisecond):
		}
	}
	return false
}

// TestTableAdoptedSessionsAreConfirmed: a session taken from a sealed ID
// (Adopt) or from the shared store arrives with a request, its use, so it
// is confirmed at once: a flood of new sessions through a full table pushes
// out a learned session never used (the negative control), not those.
func TestTableAdoptedSessionsAreConfirmed(t *testing.T) {
	srv := redistest.Start(t)
	name := "shared/" + t.Name()
	learner := sharedTable(t, srv.Addr, name, time.Second)
	tbl := sharedTable(t, srv.Addr, name, time.Second)
	tbl.Configure(4, 0)
	learner.Learn("from-store", "10.0.0.1:80")
	tbl.Learn("never-used", "10.0.0.1:80")
	tbl.Adopt("sealed", "10.0.0.2:80", session.Origin{})
	if up := tbl.Lookup("from-store"); up == nil {
		t.Fatal("the session learned on the other instance was not found in the store")
	}
	if tbl.Unconfirmed() != 1 {
		t.Errorf("Unconfirmed() = %d after adopting two sessions and learning one, want 1", tbl.Unconfirmed())
	}
	for i := range 100 {
		tbl.Learn(fmt.Sprintf("flood%d", i), "10.0.0.3:80")
	}
	if holds(tbl, "never-used") {
		t.Error("the learned session never used survived the flood")
	}
	for _, id := range []string{"sealed", "from-store"} {
		if !holds(tbl, id) {
			t.Errorf("%s was pushed out by the flood", id)
		}
	}
	wantEvictions(t, tbl, map[session.EvictReason]uint64{session.EvictUnconfirmed: 99})
}

// holds reports whether tbl itself holds session id, without asking its
// store.
func holds(tbl *session.Table, id string) bool {
	return tbl.Holds(id)
}
