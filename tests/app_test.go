package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestSessionsAppSettings: a table's settings come from the mcp_sessions
// global option or from mcp_proxy, apply when the config has loaded (a
// reload that lowers max_sessions evicts at once, before any request), and
// a load that fails, for instance because a handler and its policy name
// different tables, changes nothing.
func TestSessionsAppSettings(t *testing.T) {
	bs := startBackends(t, 2, true)
	port := mustFreePort()
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	site := func(body string) string { return siteConfig(port, body) }
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	// The global option sets the bounds of a table mcp_proxy names.
	loadCaddyfile(t, withGlobal(site("mcp_proxy "+upstreams(bs)+" {\n\t\ttable app\n\t}"),
		"mcp_sessions app {\n\t\tmax_sessions 10\n\t\tsession_ttl 1h\n\t}"))
	css := openLiveSessions(ctx, t, url, hc, 6)
	if st := tableOf(t, "app"); st.MaxSessions != 10 || st.SessionTTL != "1h0m0s" || st.Sessions != 6 {
		t.Fatalf("table from the global option: %+v, want 6 sessions of 10, ttl 1h", st)
	}

	// A load whose handler and policy name different tables fails, and
	// changes nothing, not even the bounds it asks for.
	mismatch := site(`mcp_session {
		table app
		max_sessions 1
	}
	reverse_proxy ` + upstreams(bs) + ` {
		lb_policy mcp_session {
			table other
		}
	}`)
	err := tryLoadCaddyfile(t, mismatch)
	if err == nil || !strings.Contains(err.Error(), `writes session table "app"`) || !strings.Contains(err.Error(), `reads table "other"`) {
		t.Fatalf("loading a handler and a policy with different tables: err = %v, want it to name both tables", err)
	}
	if st := tableOf(t, "app"); st.MaxSessions != 10 || st.Sessions != 6 {
		t.Fatalf("after the failed load: %+v, want 6 sessions of 10", st)
	}
	// The same config with one table name loads (negative control).
	matching := strings.NewReplacer("table other", "table app", "max_sessions 1", "max_sessions 10").Replace(mismatch)
	if err := tryLoadCaddyfile(t, matching); err != nil {
		t.Fatalf("the same config with matching tables: %v", err)
	}

	// A reload that lowers max_sessions applies at the reload: the least
	// recently used sessions go before any request arrives.
	reloadViaAdmin(t, site("mcp_proxy "+upstreams(bs)+" {\n\t\ttable app\n\t\tmax_sessions 3\n\t}"))
	if st := tableOf(t, "app"); st.MaxSessions != 3 || st.Sessions != 3 || st.SessionTTL != "24h0m0s" {
		t.Fatalf("after reloading with max_sessions 3: %+v, want 3 sessions of 3, the default ttl", st)
	}
	hc.CloseIdleConnections()
	kept := 0
	for i, s := range css {
		id, err := whoamiAcrossReload(ctx, t, hc, s.cs)
		switch {
		case i < 3 && err == nil:
			t.Errorf("session %d, among the least recently used, survived the lower max_sessions", i)
		case i >= 3 && (err != nil || id.Server != s.first.Server):
			t.Errorf("session %d lost or misrouted after the reload: %v, %+v", i, err, id)
		case err == nil:
			kept++
		}
	}
	if kept != 3 {
		t.Errorf("%d sessions kept, want the 3 most recently used", kept)
	}

	// Two places that set one option differently fail the load.
	err = tryLoadCaddyfile(t, withGlobal(site("mcp_proxy "+upstreams(bs)+" {\n\t\ttable app\n\t\tmax_sessions 5\n\t}"),
		"mcp_sessions app {\n\t\tmax_sessions 7\n\t}"))
	if err == nil || !strings.Contains(err.Error(), "max_sessions 5 in an mcp_session handler, but 7 in the mcp_sessions app") {
		t.Fatalf("conflicting max_sessions: err = %v", err)
	}
	if st := tableOf(t, "app"); st.MaxSessions != 3 {
		t.Fatalf("after the failed load: max_sessions %d, want 3", st.MaxSessions)
	}
}
