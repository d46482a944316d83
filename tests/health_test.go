package tests

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestHealthBlipKeepsSessions: with `health_uri /healthz` and
// `health_interval 1s`, one of two servers fails its health endpoint for
// 1.5 s. docs/behaviour.md, "What happens when": the upstream is unavailable, not
// gone. During the blip, its sessions' requests get the proxy's 503 with
// Retry-After (the go-sdk client reports the call failed and keeps its
// session), the other server's sessions and new sessions are served; after
// it, every session of both servers works again, answered by its own
// server under its own session ID.
func TestHealthBlipKeepsSessions(t *testing.T) {
	f := startHealthFleet(t, "\t\thealth_interval 1s", 8)
	ctx := context.Background()
	f.setDown(t, 0, true)
	start := time.Now()
	ex, _ := f.waitStatus(t, f.sessions["s1"][0], http.StatusServiceUnavailable, 3*time.Second)
	checkUnavailable(t, ex)
	unavailable, served := 0, 0
	for server, css := range f.sessions {
		for _, cs := range css {
			_, err := whoami(ctx, cs)
			switch {
			case server == "s1" && err != nil && strings.Contains(err.Error(), "Service Unavailable"):
				unavailable++
			case server == "s2" && err == nil:
				served++
			default:
				t.Errorf("during the blip, a session of %s: %v", server, err)
			}
		}
	}
	if id, err := whoami(ctx, mustConnect(t, f)); err != nil || id.Server != "s2" {
		t.Errorf("a new session during the blip: %+v, %v; want it on s2", id, err)
	}
	blip := time.Since(start)
	time.Sleep(1500*time.Millisecond - blip)
	f.setDown(t, 0, false)
	f.waitStatus(t, f.sessions["s1"][0], http.StatusOK, 5*time.Second)
	t.Logf("blip of 1.5 s (the calls took %v): %d calls got 503, %d were served", blip.Round(time.Millisecond), unavailable, served)
	kept := 0
	for cs, want := range f.first {
		if id, err := whoami(ctx, cs); err != nil || id != want {
			t.Errorf("after the blip: %+v, %v; want %+v", id, err, want)
			continue
		}
		kept++
	}
	if unavailable != len(f.sessions["s1"]) || kept != len(f.first) {
		t.Fatalf("want every session of s1 to get 503 during the blip and all %d sessions kept; got %d 503s, %d kept",
			len(f.first), unavailable, kept)
	}
}

// TestLastingUnhealthyEndsSessionsAfterGrace: with `unhealthy_grace 2s`, a
// server that keeps failing its health checks gets its sessions' requests
// answered 503 for the grace, then the proxy's 404: the sessions end (the
// go-sdk client then sees its session gone), and stay ended when the
// server recovers. A server whose process is gone ends its sessions at
// once: the proxy finds its port refusing connections, and answers 404
// without waiting for the grace.
func TestLastingUnhealthyEndsSessionsAfterGrace(t *testing.T) {
	ctx := context.Background()
	t.Run("failing health checks", func(t *testing.T) {
		const grace = 2 * time.Second
		f := startHealthFleet(t, "\t\thealth_interval 250ms\n\t\tunhealthy_grace 2s", 6)
		f.setDown(t, 0, true)
		cs := f.sessions["s1"][0]
		ex, first503 := f.waitStatus(t, cs, http.StatusServiceUnavailable, 3*time.Second)
		checkUnavailable(t, ex)
		ex, ended := f.waitStatus(t, cs, http.StatusNotFound, grace+3*time.Second)
		checkProxy404(t, ex)
		took := ended.Sub(first503)
		t.Logf("503 for %v, then 404 (grace %v)", took.Round(time.Millisecond), grace)
		if took < grace-500*time.Millisecond {
			t.Errorf("the session ended %v after the first 503; want about the grace, %v", took, grace)
		}
		for _, cs := range f.sessions["s1"] {
			if _, err := whoami(ctx, cs); !errors.Is(err, mcp.ErrSessionMissing) {
				t.Errorf("a session of s1 after the grace: %v; want it gone", err)
			}
		}
		f.setDown(t, 0, false)
		time.Sleep(time.Second) // a few health checks pass
		checkProxy404(t, f.call(t, f.sessions["s1"][len(f.sessions["s1"])-1]))
		for _, cs := range f.sessions["s2"] {
			if id, err := whoami(ctx, cs); err != nil || id != f.first[cs] {
				t.Errorf("a session of s2: %+v, %v; want %+v", id, err, f.first[cs])
			}
		}
	})

	t.Run("process gone", func(t *testing.T) {
		f := startHealthFleet(t, "\t\thealth_interval 250ms", 6)
		f.srv[0].Kill()
		time.Sleep(time.Second) // the health checks see it
		start := time.Now()
		for _, cs := range f.sessions["s1"] {
			checkProxy404(t, f.call(t, cs))
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("the 404s took %v; want them at once", took)
		}
	})
}

// TestLastingUnhealthyFailsOverAfterGrace: as the "failing health checks"
// run of TestLastingUnhealthyEndsSessionsAfterGrace (its negative control:
// there the sessions end with 404), but with `failover reinitialize`. The
// sessions of the server that keeps failing its health checks get 503 for
// the grace; then each one's next call is answered by the other server
// (cause upstream_gone) without the go-sdk client doing anything: the same
// client session, a new upstream session. The other server's sessions are
// untouched, and the moved sessions stay where they are when the failed
// server recovers.
func TestLastingUnhealthyFailsOverAfterGrace(t *testing.T) {
	ctx := context.Background()
	f := startHealthFleet(t, "\t\thealth_interval 250ms\n\t\tunhealthy_grace 2s\n\t\ttable grace_failover\n\t\tfailover reinitialize", 8)
	f.setDown(t, 0, true)
	ex, _ := f.waitStatus(t, f.sessions["s1"][0], http.StatusServiceUnavailable, 3*time.Second)
	checkUnavailable(t, ex)
	f.waitStatus(t, f.sessions["s1"][0], http.StatusOK, 5*time.Second) // past the grace: moved
	moved := map[*mcp.ClientSession]identity{}
	for _, cs := range f.sessions["s1"] {
		id, err := whoami(ctx, cs)
		if err != nil || id.Server != "s2" || id.Session == f.first[cs].Session {
			t.Errorf("a session of s1 after the grace: %+v, %v; want it answered by s2 under a new upstream session", id, err)
		}
		moved[cs] = id
	}
	f.setDown(t, 0, false)
	time.Sleep(time.Second) // a few health checks pass
	for cs, want := range moved {
		if id, err := whoami(ctx, cs); err != nil || id != want {
			t.Errorf("a moved session once s1 recovered: %+v, %v; want it still on %+v", id, err, want)
		}
	}
	for _, cs := range f.sessions["s2"] {
		if id, err := whoami(ctx, cs); err != nil || id != f.first[cs] {
			t.Errorf("a session of s2: %+v, %v; want %+v", id, err, f.first[cs])
		}
	}
	fam, _ := scrape(t)
	n := metricValue(fam, "caddy_mcp_failovers_total", map[string]string{"table": "grace_failover", "cause": "upstream_gone", "result": "moved"})
	t.Logf("%d sessions of s1 moved to s2 after the grace; failovers{cause=upstream_gone,result=moved} %v", len(moved), n)
	if int(n) != len(f.sessions["s1"]) {
		t.Fatalf("want %d failovers counted with cause upstream_gone, got %v", len(f.sessions["s1"]), n)
	}
}

// TestHealthURIOnMCPEndpointWarns: active health checks that probe the MCP
// endpoint (`health_uri /mcp`, a natural first guess) fail on every MCP
// server, which answers a GET without a session there with 400 or 405, so
// every upstream is unhealthy and every new session gets 503. Caddy warns
// when it loads such a config (`caddy adapt` shows it); with a health
// endpoint (`/healthz`, the control) there is no warning and initialize
// works.
func TestHealthURIOnMCPEndpointWarns(t *testing.T) {
	bs := startBackends(t, 2, true)
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	if ex := send(t, hc, http.MethodGet, bs[0].URL(), nil, ""); ex.status < 400 || ex.status >= 500 {
		t.Fatalf("the server answered a GET of /mcp without a session %d; want 4xx", ex.status)
	}
	for _, tc := range []struct {
		uri    string
		warn   bool
		status int
	}{{"/mcp", true, http.StatusServiceUnavailable}, {"/healthz", false, http.StatusOK}} {
		t.Run(tc.uri, func(t *testing.T) {
			site := fmt.Sprintf("mcp_proxy %s {\n\t\thealth_uri %s\n\t\thealth_interval 200ms\n\t}", upstreams(bs), tc.uri)
			file := filepath.Join(t.TempDir(), "Caddyfile")
			if err := os.WriteFile(file, []byte(":8000 {\n\t"+site+"\n}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(caddyBinary(t), "adapt", "--config", file, "--adapter", "caddyfile").CombinedOutput()
			if warned := strings.Contains(string(out), "health_uri "+tc.uri+" is the MCP endpoint"); err != nil || warned != tc.warn {
				t.Errorf("caddy adapt: %v, warned %v, want %v:\n%s", err, warned, tc.warn, out)
			}
			p := startProxy(t, site)
			time.Sleep(time.Second) // several health checks
			if ex := send(t, hc, http.MethodPost, p.url(), mcpPOSTHeaders(""), initBody); ex.status != tc.status {
				t.Errorf("initialize: %d %q; want %d", ex.status, firstLine(ex.body), tc.status)
			}
		})
	}
}
