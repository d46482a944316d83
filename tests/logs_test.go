package tests

import (
	"fmt"
	"path/filepath"
	"testing"
)

// logRecipe is docs/operating.md's "Logs" recipe that keeps session IDs out of Caddy's
// logs: a filter on the default logger (which holds the servers' error
// logs and reverse_proxy's own lines) and one on each access log.
const (
	defaultLogFilter = `format filter {
			request>headers>Mcp-Session-Id delete
			headers>Mcp-Session-Id delete
		}`
	accessLogFilter = `format filter {
			request>headers>Mcp-Session-Id delete
			resp_headers>Mcp-Session-Id delete
		}`
)

// TestLogRecipeRemovesSessionIDs: the traffic that makes Caddy log session
// IDs — sessions with calls and a GET stream (every proxied request at
// DEBUG), a client that drops an SSE response mid-stream (WARN "aborting
// with incomplete response"), and a 502 when the session's server dies
// during a call (ERROR) — leaves IDs in the default log and the access log
// without the Logs recipe (the negative control), and none with it, while
// those lines are still logged.
func TestLogRecipeRemovesSessionIDs(t *testing.T) {
	for _, recipe := range []bool{false, true} {
		t.Run(map[bool]string{false: "without the recipe", true: "with the recipe"}[recipe], func(t *testing.T) {
			dir := t.TempDir()
			bs := startBackendsWith(t, 2, false, func(name string) []string { // s1 streams SSE, s2 answers in JSON mode
				if name == "s2" {
					return []string{"-json"}
				}
				return nil
			})
			port := mustFreePort()
			loadCaddyfile(t, logsConfig(dir, port, upstreams(bs), recipe))
			url := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
			hc := newHTTPClient()
			defer hc.CloseIdleConnections()
			ids := logTraffic(t, url, hc, bs)

			loadCaddyfile(t, siteConfig(mustFreePort(), "respond 204")) // closes the log files
			def, defLines := linesWith(t, filepath.Join(dir, "caddy.log"), ids)
			acc, accLines := linesWith(t, filepath.Join(dir, "access.log"), ids)
			t.Logf("%d of %d default log lines and %d of %d access log lines carry a session ID", len(def), defLines, len(acc), accLines)
			for _, want := range []string{"aborting with incomplete response", `"status":502`, "upstream roundtrip"} {
				if hits, _ := linesWith(t, filepath.Join(dir, "caddy.log"), []string{want}); len(hits) == 0 {
					t.Errorf("the default log has no line with %q: the traffic did not produce what it should", want)
				}
			}
			if recipe && len(def)+len(acc) > 0 {
				t.Errorf("with the recipe, session IDs remain in %d default log lines and %d access log lines; first: %s", len(def), len(acc), append(def, acc...)[0])
			}
			if !recipe && (len(def) == 0 || len(acc) == 0) {
				t.Errorf("without the recipe, no session ID in the default log (%d lines) or the access log (%d lines): the negative control shows nothing", len(def), len(acc))
			}
		})
	}
}

// slowCall is a raw tools/call of the slow tool, 3 s with progress.
const slowCall = `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"slow","arguments":{"milliseconds":3000,"steps":6},"_meta":{"progressToken":1}}}`
