package tests

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestFailoverKeepsProtocolVersion: with failover reinitialize over go-sdk
// v1.8.0 servers (2025-11-25) and a go-sdk v1.0.0 one (up to 2025-06-18),
// sessions of raw, go-sdk and TypeScript SDK clients leaving a killed
// v1.8.0 server move only to the other v1.8.0 server, never to the older
// one, which would refuse every later request (the control, same run: it
// answers a request at 2025-11-25 with 400); the older server's own
// sessions keep working. Once no upstream of the session's version is
// left, a session gets the proxy's 404, as without failover, so the
// client negotiates again.
func TestFailoverKeepsProtocolVersion(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod")
	news := startBackends(t, 2, false)
	olds := startOldSDK(t, 1, "old")
	all := append(append([]*testproc.Proc{}, news...), olds...)
	p := startProxy(t, failoverSite(upstreams(all), "versions", true))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The control: a session of the older server, asked at 2025-11-25.
	direct := olds[0].URL()
	old := openRawSession(t, hc, direct, rawNegotiated)
	if old.version != "2025-06-18" {
		t.Fatalf("go-sdk v1.0.0 negotiated %s, want 2025-06-18", old.version)
	}
	old.version = "2025-11-25"
	if status := old.rawCall(t, hc, direct, 0).status; status != http.StatusBadRequest {
		t.Fatalf("the control: the v1.0.0 server answered a 2025-11-25 request %d, want 400", status)
	}

	// Sessions of every client kind, spread over the three upstreams.
	var goSessions []*mcp.ClientSession
	for range 9 {
		cs, err := connectReconnecting(ctx, p.url(), hc)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		goSessions = append(goSessions, cs)
	}
	var raws []*session
	for range 6 {
		raws = append(raws, openRawSession(t, hc, p.url(), rawNegotiated))
	}
	holdDir := t.TempDir()
	tsDone := make(chan tsClientSummary, 1)
	go func() {
		var s tsClientSummary
		defer func() { tsDone <- s }() // also when runTSClients fails the test
		s = runTSClients(t, env, p.url(), 9, 3, "--hold-dir", holdDir)
	}()
	waitFile(t, filepath.Join(holdDir, "ready"), 60*time.Second)

	news[0].Kill()
	<-news[0].Done()
	waitClosesRead(t, news[0].Addr()) // a request on a kept-alive connection to it would get 502, not fail over
	killed, other := news[0].Name(), news[1].Name()
	if err := os.WriteFile(filepath.Join(holdDir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	onKilled := 0
	for i, cs := range goSessions {
		creator := cs.InitializeResult().ServerInfo.Name
		for range 3 {
			who, err := whoami(ctx, cs)
			switch {
			case err != nil:
				t.Errorf("go-sdk session %d (on %s): %v", i, creator, err)
			case creator == killed && who.Server != other, creator != killed && who.Server != creator:
				t.Errorf("go-sdk session %d (on %s): answered by %s", i, creator, who.Server)
			}
		}
		if creator == killed {
			onKilled++
		}
	}
	for i, s := range raws {
		sp := s.rawCall(t, hc, p.url(), 0)
		status, who := sp.status, sp.who
		want := s.creator
		if s.creator == killed {
			want, onKilled = other, onKilled+1
		}
		if status != http.StatusOK || who.Server != want {
			t.Errorf("raw session %d (on %s, %s): %d, answered by %q; want 200 from %s", i, s.creator, s.version, status, who.Server, want)
		}
	}
	ts := <-tsDone
	if ts.OK != 9 || ts.MovedTo[olds[0].Name()] != 0 || ts.MovedTo[other] != ts.PerServer[killed] {
		t.Errorf("TypeScript clients: %+v; want 9/9 sessions ok, those of %s moved to %s, none to %s", ts, killed, other, olds[0].Name())
	}
	if onKilled == 0 || ts.PerServer[killed] == 0 {
		t.Fatalf("no session was on %s (go-sdk and raw %d, TypeScript %v): the test shows nothing", killed, onKilled, ts.PerServer)
	}

	// No upstream of 2025-11-25 left: the proxy's 404, not a move to v1.0.0.
	news[1].Kill()
	<-news[1].Done()
	waitClosesRead(t, news[1].Addr())
	for i, s := range raws {
		if s.version != "2025-11-25" {
			continue
		}
		ex := s.post(t, hc, p.url(), tsWhoamiCall)
		checkProxy404(t, ex.as("raw session "+s.id+" after both 2025-11-25 servers died"))
		if !strings.Contains(ex.body, "no other upstream took the session over") {
			t.Errorf("raw session %d: 404 %s; want it to say no upstream took the session over", i, ex.body)
		}
	}
	for _, s := range raws {
		if s.version == "2025-06-18" {
			if sp := s.rawCall(t, hc, p.url(), 0); sp.status != http.StatusOK || sp.who.Server != olds[0].Name() {
				t.Errorf("a session of the v1.0.0 server: %d from %q; want 200 from it", sp.status, sp.who.Server)
			}
		}
	}
}
