package caddymodule

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/seal"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
)

// The initialize requests of three clients, as docs/replicas.md's Length table
// counts them: the go-sdk client's with a 16-byte client name (190 bytes),
// the TypeScript SDK client's (150 bytes) and one the size of VS Code's,
// whose capabilities make it about 450 bytes.
const (
	testInitGo     = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"roots":{"listChanged":true}},"clientInfo":{"name":"affinity-test-go","version":"v0"}}}`
	testInitTS     = `{"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"tsc","version":"1.0"}},"jsonrpc":"2.0","id":0}`
	testInitVSCode = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"roots":{"listChanged":true},"sampling":{},"elicitation":{"form":{},"url":{}},"tasks":{"list":{},"cancel":{},"requests":{"sampling":{"createMessage":{}},"elicitation":{"create":{}}}},"extensions":{"io.modelcontextprotocol/ui":{"mimeTypes":["text/html;profile=mcp-app"]}}},"clientInfo":{"name":"Visual Studio Code - Insiders","version":"1.107.0"}}}`
)

// testSealedInit is what a sealed ID carries of an initialize request of
// body sent with the headers every SDK client sends.
func testSealedInit(body string) seal.Init {
	return seal.Init{Accept: "application/json, text/event-stream", ContentType: "application/json", Body: body}
}

// newSealedFailoverFixture is a sealed fixture whose table fails sessions
// over, with max_session_id_length maxLen (0: the default).
func newSealedFailoverFixture(t testing.TB, table string, key []byte, maxLen int) *affinityFixture {
	t.Helper()
	cfg := &SealedSessionIDs{Keys: []string{base64.StdEncoding.EncodeToString(key)}}
	h, logs := provisionHandler(t, &Handler{TableSettings: TableSettings{Failover: session.FailoverReinitialize}, Table: table, SealSessionIDs: cfg, MaxSessionIDLength: maxLen})
	policy := provisionPolicy(t, &SessionSelection{Table: h.Table})
	return &affinityFixture{h: h, logs: logs, proxy: &fakeProxy{policy: policy, pool: testPool()}}
}

// versionOf returns the format version byte of a sealed value.
func versionOf(t testing.TB, v string) byte {
	t.Helper()
	raw, err := sealEncoding.DecodeString(v)
	if err != nil || len(raw) == 0 {
		t.Fatalf("%q is not base64url: %v", v, err)
	}
	return raw[0]
}

// TestSealedLengthWithInit pins the lengths docs/replicas.md's Length table states
// for sealed IDs carrying an initialize request, and that each fits the
// default max_session_id_length.
func TestSealedLengthWithInit(t *testing.T) {
	s := newSealer(t, newKey(t))
	for _, tc := range []struct {
		body   string
		id     string
		bound  bool
		want   int
		client string
	}{
		{testInitGo, testSessionID, false, 428, "go-sdk"},
		{testInitGo, testSessionID, true, 450, "go-sdk, bound"},
		{testInitTS, testUUID, false, 388, "TypeScript SDK"},
		{testInitTS, testUUID, true, 410, "TypeScript SDK, bound"},
		{testInitVSCode, testUUID, false, 788, "VS Code-sized"},
		{testInitVSCode, testUUID, true, 810, "VS Code-sized, bound"},
	} {
		if len(tc.body) != map[string]int{testInitGo: 190, testInitTS: 150, testInitVSCode: 450}[tc.body] {
			t.Fatalf("%s: initialize of %d bytes", tc.client, len(tc.body))
		}
		ss := seal.Session{Dial: "127.0.0.1:9001", ID: tc.id, Init: testSealedInit(tc.body)}
		if tc.bound {
			ss.Bound = principalDigest("Bearer alice")
		}
		got := len(s.seal(ss))
		if got != tc.want || got != sealedLength(ss) || got > DefaultMaxSessionIDLength {
			t.Errorf("%s: sealed length %d, want %d (sealedLength %d, at most %d)", tc.client, got, tc.want, sealedLength(ss), DefaultMaxSessionIDLength)
		}
	}
	// The largest initialize the default limit admits with a UUID (docs/replicas.md).
	for body, fits := range map[int]bool{1395: true, 1396: false} {
		ss := seal.Session{Dial: "127.0.0.1:9001", ID: testUUID, Init: testSealedInit(strings.Repeat("x", body))}
		if got := len(s.seal(ss)); (got <= DefaultMaxSessionIDLength) != fits {
			t.Errorf("an initialize of %d bytes seals to %d bytes; fits %d: %v, want %v", body, got, DefaultMaxSessionIDLength, !fits, fits)
		}
	}
}

// TestSealedFailoverOnEveryReplica: with seal_session_ids and failover
// reinitialize, the sealed ID of a new session carries its initialize, so
// a replica that never saw the session (its own table, the same key) fails
// it over when its upstream lost it, exactly once: its later requests go
// to the new upstream session from its table. Each replica moves the
// session on its own (a: NEWA, b: NEWB), and the client keeps its sealed
// value on every response. A version 3 value (minted without the
// initialize) cannot fail over on b: the upstream's 404 passes, as without
// failover.
func TestSealedFailoverOnEveryReplica(t *testing.T) {
	key := newKey(t)
	a := newSealedFailoverFixture(t, "test/fo-a", key, 0)
	b := newSealedFailoverFixture(t, "test/fo-b", key, 0)
	up, minted := lostSessionUpstream("OLD", "NEWA", "NEWB")
	sealed := a.serve(t, bodyRequest(testInitBody, ""), up).Header().Get(HeaderSessionID)
	if versionOf(t, sealed) != sealVersionIssuedInit {
		t.Fatalf("the sealed ID of a session of a failover table is version %d, want %d (carrying its initialize)", versionOf(t, sealed), sealVersionIssuedInit)
	}
	a.serve(t, bodyRequest(`{"jsonrpc":"2.0","method":"notifications/initialized"}`, sealed), up)
	old := newSealer(t, key).Seal(a.proxy.last().Dial, "OLD")
	delete(minted, "OLD") // the upstream restarts and forgets the session
	for _, c := range []struct {
		f   *affinityFixture
		new string
	}{{a, "NEWA"}, {b, "NEWB"}} {
		for i := range 3 {
			rec := c.f.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":2,"method":"ping"}`, sealed), up)
			if body := rec.Body.String(); rec.Code != http.StatusOK || !strings.HasPrefix(body, "answered in "+c.new) ||
				len(rec.Header().Values(HeaderSessionID)) != 1 || rec.Header().Get(HeaderSessionID) != sealed {
				t.Fatalf("%s, request %d: %d %q, Mcp-Session-Id %q; want it answered in %s under the client's sealed value",
					c.f.h.Table, i+1, rec.Code, body, rec.Header().Values(HeaderSessionID), c.new)
			}
		}
		if n := c.f.h.table.Stats.Failovers(session.FailoverUpstream404, true); n != 1 {
			t.Errorf("%s failed the session over %d times, want once", c.f.h.Table, n)
		}
	}
	if b.h.table.Stats.Adopted() != 1 {
		t.Errorf("b adopted %d sessions, want 1", b.h.table.Stats.Adopted())
	}
	minted["OLD"] = true // a version 3 value of a session the upstream holds routes
	if rec := b.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":3,"method":"ping"}`, old), up); rec.Code != http.StatusOK || rec.Header().Get(HeaderSessionID) != old {
		t.Fatalf("a version 3 value on b: %d %q, want 200 under its own value", rec.Code, rec.Body)
	}
	delete(minted, "OLD")
	rec := b.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":4,"method":"ping"}`, old), up)
	if rec.Code != http.StatusNotFound || b.h.table.Stats.Failovers(session.FailoverUpstream404, true) != 1 || b.h.table.Stats.Failovers(session.FailoverUpstream404, false) != 0 {
		t.Fatalf("a version 3 value whose upstream lost it, on b: %d %q, failovers %d; want the upstream's 404 and no failover",
			rec.Code, rec.Body, b.h.table.Stats.Failovers(session.FailoverUpstream404, true))
	}
}

// TestSealedInitTooLong: when the sealed ID carrying the initialize would
// be longer than max_session_id_length, the proxy seals the session without
// it (version 3, a value it accepts), logs one warning, and the session
// works and fails over on the replica that learned it; the same table with
// the default limit seals the initialize (control).
func TestSealedInitTooLong(t *testing.T) {
	key := newKey(t)
	for _, maxLen := range []int{300, 0} {
		f := newSealedFailoverFixture(t, "", key, maxLen)
		up, minted := lostSessionUpstream("S1", "S2", "S3")
		ids := []string{
			f.serve(t, bodyRequest(testInitBody, ""), up).Header().Get(HeaderSessionID),
			f.serve(t, bodyRequest(testInitBody, ""), up).Header().Get(HeaderSessionID),
		}
		warned := f.logs.FilterMessageSnippet("too large to seal").Len()
		want := map[bool]byte{true: sealVersionIssued, false: sealVersionIssuedInit}[maxLen != 0]
		for _, id := range ids {
			if v := versionOf(t, id); v != want || mcpwire.CheckSessionID(id, f.h.MaxSessionIDLength) != "" {
				t.Fatalf("max_session_id_length %d: sealed ID of %d bytes, version %d; want version %d within the limit", f.h.MaxSessionIDLength, len(id), v, want)
			}
		}
		if warned != map[bool]int{true: 1, false: 0}[maxLen != 0] {
			t.Errorf("max_session_id_length %d: %d warnings", f.h.MaxSessionIDLength, warned)
		}
		delete(minted, "S1")
		rec := f.serve(t, bodyRequest(`{"jsonrpc":"2.0","id":2,"method":"ping"}`, ids[0]), up)
		if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Body.String(), "answered in S3") || rec.Header().Get(HeaderSessionID) != ids[0] {
			t.Fatalf("max_session_id_length %d: the session did not fail over on its own replica: %d %q", f.h.MaxSessionIDLength, rec.Code, rec.Body)
		}
	}
}
