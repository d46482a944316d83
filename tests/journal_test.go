package tests

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
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

// TestJournalResumesRawClient: a raw client calls go-sdk's slow tool
// (a server without an event store) through a relay, reads three
// progress events, and the relay cuts its connection. It resumes with a
// GET carrying the last event ID: journal on, the rest of the progress
// events and the result arrive, each once; journal off, the client has
// no ID to resume with and the call's result never reaches it.
func TestJournalResumesRawClient(t *testing.T) {
	srv := startBackends(t, 1, false)[0]
	ps := startProxies(t, journalSite(srv.Addr(), "journal-raw-on", true), journalSite(srv.Addr(), "journal-raw-off", false))
	for _, tc := range []struct {
		name string
		p    proxy
		on   bool
	}{{"journal on", ps[0], true}, {"journal off", ps[1], false}} {
		t.Run(tc.name, func(t *testing.T) {
			got := cutAndResume(t, tc.p.addr)
			t.Logf("%s: %s", tc.name, got)
			switch {
			case tc.on && !got.complete(journalSteps):
				t.Errorf("journal on: got %s; want progress 1..%d once each, in order, and the result once", got, journalSteps)
			case !tc.on && got.results != 0:
				t.Errorf("journal off: got %s; the control lost nothing, so the test does not cut what it should", got)
			}
		})
	}
}

// cutAndResume runs the scenario of TestJournalResumesRawClient through a
// relay to addr and returns what the client got of the call.
func cutAndResume(t *testing.T, addr string) *callEvents {
	t.Helper()
	relay := redistest.NewRelay(t, addr)
	url := "http://" + relay.Addr + "/mcp"
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
	r := resumeGET(rctx, t, hc, url, id, got.lastID)
	if r.StatusCode != 200 {
		r.Body.Close()
		t.Logf("resuming GET after %q: %s", got.lastID, r.Status)
		return got
	}
	_ = readEvents(rctx, r.Body, got, func(c *callEvents) bool { return c.results > 0 })
	return got
}
