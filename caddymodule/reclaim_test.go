package caddymodule

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// TestReclaimDeletesForgottenSessions opens sessions through the handler,
// forgets them for each reason, and checks which the upstream gets a
// DELETE for, with what headers, through the handler's next handler;
// with reclaim off, none (the control).
func TestReclaimDeletesForgottenSessions(t *testing.T) {
	t.Setenv("RECLAIM_TEST_TOKEN", "s3cret")
	for _, off := range []bool{false, true} {
		h := &Handler{Table: "reclaim/" + t.Name(), TableSettings: TableSettings{MaxSessions: 10},
			Reclaim: ReclaimOn, ReclaimHeaders: map[string]string{"Authorization": "Bearer {env.RECLAIM_TEST_TOKEN}"}}
		if off {
			h.Table, h.Reclaim = h.Table+"-off", ReclaimOff
		}
		h, _ = provisionHandler(t, h)
		ids := []string{"ADMINEVICTED0000000000000A", "CLIENTDELETED0000000000000", "UPSTREAM404000000000000000"}
		var mu sync.Mutex
		var deletes []*http.Request
		fp := &fakeProxy{policy: provisionPolicy(t, &SessionSelection{Table: h.Table}), pool: testPool()[:1]}
		fp.respond = func(w http.ResponseWriter, r *http.Request, up *reverseproxy.Upstream) {
			id := r.Header.Get(HeaderSessionID)
			switch {
			case r.Header.Get("Authorization") != "": // the proxy's own DELETE
				deletes = append(deletes, r)
			case id == "": // an initialize: the next ID
				w.Header().Set(HeaderSessionID, ids[len(fp.selected)-1])
			case id == ids[2]:
				w.WriteHeader(http.StatusNotFound)
				return
			}
			w.WriteHeader(http.StatusOK)
		}
		proxy := &lockedNext{next: fp, mu: &mu}
		for range ids {
			r := newRequest(http.MethodPost)
			r.URL.Path = "/v1/mcp"
			if err := h.ServeHTTP(httptest.NewRecorder(), r, proxy); err != nil {
				t.Fatal(err)
			}
		}
		pinned := newRequest(http.MethodPost, ids[0])
		pinned.Header.Set(HeaderProtocolVersion, "2025-06-18")
		_ = h.ServeHTTP(httptest.NewRecorder(), pinned, proxy)

		h.table.Evict(ids[0], session.EvictAdmin)
		_ = h.ServeHTTP(httptest.NewRecorder(), newRequest(http.MethodDelete, ids[1]), proxy) // the client's own: not sent again
		_ = h.ServeHTTP(httptest.NewRecorder(), newRequest(http.MethodPost, ids[2]), proxy)   // the upstream's 404: not sent

		want := 1
		if off {
			want = 0
		}
		deadline := time.Now().Add(5 * time.Second)
		for h.table.Stats.Reclaims.Sent.Load() < uint64(want) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond) // let a wrong second DELETE show
		mu.Lock()
		got := deletes
		mu.Unlock()
		if len(got) != want {
			t.Fatalf("reclaim off=%v: %d DELETEs sent, want %d", off, len(got), want)
		}
		if off {
			continue
		}
		d := got[0]
		if d.Method != http.MethodDelete || d.URL.Path != "/v1/mcp" || d.Header.Get(HeaderSessionID) != ids[0] ||
			d.Header.Get("Authorization") != "Bearer s3cret" || d.Header.Get(HeaderProtocolVersion) != "2025-06-18" {
			t.Errorf("DELETE %s %s, session %q, Authorization %q, version %q; want DELETE /v1/mcp of %s with the token and 2025-06-18",
				d.Method, d.URL.Path, d.Header.Get(HeaderSessionID), d.Header.Get("Authorization"), d.Header.Get(HeaderProtocolVersion), ids[0])
		}
		if n := h.table.Stats.Reclaims.OK.Load(); n != 1 {
			t.Errorf("reclaims answered 2xx: %d, want 1", n)
		}
	}
}

// TestReclaimHeaderOptions checks the Caddyfile and JSON checks of
// reclaim_header and reclaim.
func TestReclaimHeaderOptions(t *testing.T) {
	for _, bad := range []map[string]string{{"Mcp-Session-Id": "x"}, {"Bad Name": "x"}, {"": "x"}, {"mcp-protocol-version": "x"}} {
		if err := (&Handler{ReclaimHeaders: bad}).Validate(); err == nil {
			t.Errorf("reclaim_headers %v validated", bad)
		}
	}
	if err := (&Handler{Reclaim: "maybe"}).Validate(); err == nil || !strings.Contains(err.Error(), "reclaim") {
		t.Errorf("reclaim maybe: %v", err)
	}
}

// lockedNext serves one request at a time through next, which is not
// safe for concurrent use: the test's requests and the reclaim DELETEs.
type lockedNext struct {
	next *fakeProxy
	mu   *sync.Mutex
}

func (l *lockedNext) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next.ServeHTTP(w, r)
}

// TestReclaimQueueDrops checks that the table's lock never waits for a
// full queue: past reclaimQueue waiting sessions, each one more is dropped
// and counted.
func TestReclaimQueueDrops(t *testing.T) {
	h, _ := provisionHandler(t, &Handler{TableSettings: TableSettings{MaxSessions: 10}, Reclaim: ReclaimOn})
	for i := range reclaimQueue + 7 { // no request served: no sender takes any
		h.reclaim.enqueue(session.Forgotten{Key: fmt.Sprint(i), Dial: "10.0.0.1:8080", Reason: session.EvictTTL})
	}
	if n := h.table.Stats.Reclaims.Dropped.Load(); n != 7 {
		t.Errorf("dropped %d, want 7", n)
	}
}

// TestReclaimHookAcrossConfigs: the handler provisioned last owns the
// table's hook; one whose config is unloaded first (a reload that failed)
// gives the table back the hook of the handler still running, and the
// last one to go leaves none.
func TestReclaimHookAcrossConfigs(t *testing.T) {
	name := "reclaim/" + t.Name()
	running, _ := provisionHandler(t, &Handler{Table: name, Reclaim: ReclaimOn})
	failed, _ := provisionHandler(t, &Handler{Table: name, Reclaim: ReclaimOff})
	if running.table.Reclaiming() {
		t.Error("after a reclaim off handler: the table reclaims")
	}
	_ = failed.Cleanup()
	if !running.table.Reclaiming() {
		t.Error("after the failed config's cleanup: the running handler's hook is not back")
	}
	_ = running.Cleanup()
	if running.table.Reclaiming() {
		t.Error("after every handler's cleanup: the table still reclaims")
	}
}
