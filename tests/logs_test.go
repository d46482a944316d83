package tests

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
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

// logsConfig returns a Caddyfile whose default log (at DEBUG, the most
// verbose level) and access log go to files in dir, with the Logs recipe
// when recipe is set, and whose site proxies to upstreams.
func logsConfig(dir string, port int, upstreams string, recipe bool) string {
	def, acc := "", ""
	if recipe {
		def, acc = defaultLogFilter, accessLogFilter
	}
	return fmt.Sprintf(`{
	admin %s
	log {
		output file %s
		level DEBUG
		%s
	}
	auto_https off
	persist_config off
	servers {
		protocols h1 h2c
	}
}

http://:%d {
	bind 127.0.0.1
	log {
		output file %s
		%s
	}
	mcp_proxy %s
}
`, adminAddr, filepath.Join(dir, "caddy.log"), def, port, filepath.Join(dir, "access.log"), acc, upstreams)
}

// linesWith returns the lines of file that contain any of ids, and the
// number of lines.
func linesWith(t *testing.T, file string, ids []string) (hits []string, lines int) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines++
		for _, id := range ids {
			if strings.Contains(sc.Text(), id) {
				hits = append(hits, sc.Text())
				break
			}
		}
	}
	return hits, lines
}

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

// logTraffic runs the traffic of TestLogRecipeRemovesSessionIDs through url
// to bs (s1 answering with SSE, s2 in JSON mode) and returns every session
// ID it used.
func logTraffic(t *testing.T, url string, hc *http.Client, bs []*testproc.Proc) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	on := map[string]string{} // server -> session ID
	var ids []string
	// least_sessions spreads sessions, but what else the shared Caddy holds
	// (a request in flight to a reused port) can tip one choice: open
	// sessions until each server has one.
	for i := 0; i < 8 && (on["s1"] == "" || on["s2"] == ""); i++ {
		cs, err := connect(ctx, url, hc)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		id, err := whoami(ctx, cs)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, cs.ID())
		if on[id.Server] == "" {
			on[id.Server] = cs.ID()
		}
	}
	if on["s1"] == "" || on["s2"] == "" {
		t.Fatalf("want a session on each server after %d sessions, got %v", len(ids), on)
	}
	dropMidStream(t, url, on["s1"])
	done := make(chan int, 1)
	go func() { done <- slowCallStatus(url, on["s2"]) }()
	time.Sleep(500 * time.Millisecond)
	bs[1].Kill()
	if status := <-done; status != http.StatusBadGateway {
		t.Errorf("a call whose server died: %d, want 502", status)
	}
	return ids
}

// slowCall is a raw tools/call of the slow tool, 3 s with progress.
const slowCall = `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"slow","arguments":{"milliseconds":3000,"steps":6},"_meta":{"progressToken":1}}}`

// dropMidStream makes a slow call of session through url, reads its first
// SSE event and hangs up, then waits for the proxy to write into the closed
// connection.
func dropMidStream(t *testing.T, url, session string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(slowCall))
	req.Header = mcpPOSTHeaders(session)
	hc := &http.Client{Transport: &http.Transport{}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readSSEBlock(bufio.NewReader(resp.Body)); err != nil {
		t.Fatalf("first event: %v", err)
	}
	cancel()
	resp.Body.Close()
	hc.CloseIdleConnections()
	time.Sleep(1500 * time.Millisecond) // two more progress events reach the closed connection
}

// slowCallStatus makes a slow call of session through url and returns the
// status it got, 0 for none.
func slowCallStatus(url, session string) int {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(slowCall))
	req.Header = mcpPOSTHeaders(session)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
