package tests

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestFailoverOverCompressingServers: with failover reinitialize in front of
// servers that compress their answers (go-sdk servers in JSON response mode
// behind Caddy's encode zstd gzip), sessions of go-sdk, raw and TypeScript
// SDK clients whose upstream goes away move to the other upstream and their
// calls are answered: the proxy asks its own requests for identity and
// decodes what comes compressed anyway. The control, same run: the
// compressing server answers an initialize carrying a client's
// Accept-Encoding compressed, which the proxy's replay used to forward and
// fail to read ("the answer carried no initialize result").
func TestFailoverOverCompressingServers(t *testing.T) {
	env := tsNeedNode(t, "@modelcontextprotocol/sdk", "zod")
	servers := startBackends(t, 2, true)
	ports := []int{mustFreePort(), mustFreePort(), mustFreePort()}
	fronts := []string{fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])}
	proxySite := siteBlock(ports[2], failoverSite(fronts[0]+" "+fronts[1], "compressing", true))
	loadCaddyfile(t, globalOptions()+siteBlock(ports[0], compressingSite(servers[0].Addr()))+siteBlock(ports[1], compressingSite(servers[1].Addr()))+proxySite)
	url := fmt.Sprintf("http://127.0.0.1:%d/mcp", ports[2])
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The control: what a client's Accept-Encoding gets from the server.
	hdr := map[string][]string{"Accept": {"application/json, text/event-stream"}, "Accept-Encoding": {"zstd, gzip"}}
	if ex := send(t, hc, http.MethodPost, "http://"+fronts[0]+"/mcp", hdr, initBody); ex.header.Get("Content-Encoding") != "zstd" {
		t.Fatalf("the control: the compressing server answered initialize %d with Content-Encoding %q (%v %q); want zstd", ex.status, ex.header.Get("Content-Encoding"), ex.header, ex.body)
	}

	var goSessions []*mcp.ClientSession
	for range 6 {
		cs, err := connectReconnecting(ctx, url, hc)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		goSessions = append(goSessions, cs)
	}
	var raws []*session
	for range 4 {
		raws = append(raws, openRawSession(t, hc, url, rawZstd))
	}
	holdDir := t.TempDir()
	tsDone := make(chan tsClientSummary, 1)
	go func() {
		var s tsClientSummary
		defer func() { tsDone <- s }() // also when runTSClients fails the test
		s = runTSClients(t, env, url, 6, 3, "--hold-dir", holdDir)
	}()
	waitFile(t, filepath.Join(holdDir, "ready"), 60*time.Second)

	// The first server's site goes away (its port refuses), the proxy stays.
	loadCaddyfile(t, globalOptions()+siteBlock(ports[1], compressingSite(servers[1].Addr()))+proxySite)
	gone, other := servers[0].Name(), servers[1].Name()
	if err := os.WriteFile(filepath.Join(holdDir, "go"), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	moved := 0
	for i, cs := range goSessions {
		creator := cs.InitializeResult().ServerInfo.Name
		for range 3 {
			if who, err := whoami(ctx, cs); err != nil || who.Server != other {
				t.Errorf("go-sdk session %d (on %s): answered by %q, error %v; want %s", i, creator, who.Server, err, other)
			}
		}
		if creator == gone {
			moved++
		}
	}
	for i, s := range raws {
		sp := s.rawCall(t, hc, url, 0)
		who, status, enc := sp.who, sp.status, sp.header.Get("Content-Encoding")
		if status != http.StatusOK || who.Server != other {
			t.Errorf("raw session %d (on %s): %d from %q; want 200 from %s", i, s.creator, status, who.Server, other)
		}
		if enc != "zstd" {
			t.Errorf("raw session %d: the answer came with Content-Encoding %q; want the client's zstd, as the server sends it", i, enc)
		}
		if s.creator == gone {
			moved++
		}
	}
	ts := <-tsDone
	if ts.OK != 6 || ts.MovedTo[other] != ts.PerServer[gone] {
		t.Errorf("TypeScript clients: %+v; want 6/6 sessions ok, those of %s moved to %s", ts, gone, other)
	}
	if moved == 0 || ts.PerServer[gone] == 0 {
		t.Fatalf("no session was on %s (go-sdk and raw %d, TypeScript %v): the test shows nothing", gone, moved, ts.PerServer)
	}
	if m, failed := failoversOf(t, "compressing"); m == 0 || failed != 0 {
		t.Errorf("caddy_mcp_failovers_total: %v moved, %v failed; want moves and no failure", m, failed)
	}
}
