package caddymodule

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/seal"
)

// testUUID is shaped like the IDs the MCP TypeScript and Python SDKs mint.
const testUUID = "3f1c1d2e-8a4b-4c6d-9e0f-1a2b3c4d5e6f"

// sealEncoding is the encoding of sealed session IDs (internal/seal), for
// building and taking apart values by hand.
var sealEncoding = base64.RawURLEncoding.Strict()

// newKey returns a random sealing key.
func newKey(t testing.TB) []byte {
	t.Helper()
	return randomBytes(t, sealKeySize)
}

// randomBytes returns n random bytes.
func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// newSealer returns a sealer of the given keys.
func newSealer(t testing.TB, keys ...[]byte) *SessionSealer {
	t.Helper()
	s, err := NewSessionSealer(keys...)
	if err != nil {
		t.Fatalf("NewSessionSealer: %v", err)
	}
	return s
}

// sealRaw seals plain under key with the given version as prefix and
// associated data, bypassing Seal's plaintext encoding: for values Seal
// never makes.
func sealRaw(t testing.TB, key []byte, version byte, plain []byte) string {
	t.Helper()
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		t.Fatal(err)
	}
	return sealEncoding.EncodeToString(aead.Seal([]byte{version}, nil, plain, []byte{version}))
}

// plaintext encodes dial, bound and id as seal does.
func plaintext(dial, bound, id string) []byte {
	b := append(binary.AppendUvarint(nil, uint64(len(dial))), dial...)
	b = append(binary.AppendUvarint(b, uint64(len(bound))), bound...)
	return append(b, id...)
}

func TestSealedSessionIDsProvision(t *testing.T) {
	key := newKey(t)
	std := base64.StdEncoding.EncodeToString(key)
	t.Setenv("MCP_TEST_SESSION_KEY", std)
	t.Setenv("MCP_TEST_SESSION_KEY_URL", base64.RawURLEncoding.EncodeToString(key))
	t.Setenv("MCP_TEST_SESSION_KEY_EMPTY", "")
	t.Setenv("MCP_TEST_SESSION_KEY_SHORT", base64.StdEncoding.EncodeToString(key[:16]))
	t.Setenv("MCP_TEST_SESSION_KEY_OTHER", base64.StdEncoding.EncodeToString(newKey(t)))
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(std+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := newSealer(t, key).Seal("127.0.0.1:9001", testSessionID)
	for _, keys := range [][]string{
		{"{env.MCP_TEST_SESSION_KEY}"},
		{"{file." + keyFile + "}"},
		{"{env.MCP_TEST_SESSION_KEY_URL}"},
		{std},
		{" " + std + "\n"},
		{"{env.MCP_TEST_SESSION_KEY_OTHER}", "{env.MCP_TEST_SESSION_KEY}"},
	} {
		s, err := (&SealedSessionIDs{Keys: keys}).provision()
		if err != nil {
			t.Errorf("keys %q: %v", keys, err)
			continue
		}
		if _, _, ok := s.Open(want); !ok {
			t.Errorf("keys %q: a value sealed under the key does not open", keys)
		}
	}
	for _, tc := range []struct {
		keys []string
		want string
	}{
		{nil, "no key"},
		{[]string{"{env.MCP_TEST_SESSION_KEY_EMPTY}"}, "key 1 ({env.MCP_TEST_SESSION_KEY_EMPTY}): evaluated placeholder {env.MCP_TEST_SESSION_KEY_EMPTY} is empty; is the environment variable or file set?"},
		{[]string{"{env.MCP_TEST_SESSION_KEY_UNSET_ANYWHERE}"}, "is empty"},
		{[]string{"{env.MCP_TEST_SESSION_KEY}", "{env.MCP_TEST_SESSION_KEY_SHORT}"}, "key 2 ({env.MCP_TEST_SESSION_KEY_SHORT}): decodes to 16 bytes"},
		{[]string{"not base64!"}, "key 1 (given inline, not shown): is not base64"},
		{[]string{std[:20]}, "given inline, not shown"},
		{[]string{"{env.MCP_TEST_SESSION_KEY}", "{env.MCP_TEST_SESSION_KEY_URL}"}, "key 2 is the same as key 1"},
		{[]string{"{unknown.placeholder}"}, "key 1 ({unknown.placeholder})"},
	} {
		_, err := (&SealedSessionIDs{Keys: tc.keys}).provision()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("keys %q: error %v, want it to contain %q", tc.keys, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), std[:20]) {
			t.Errorf("keys %q: error %q shows the key", tc.keys, err)
		}
	}
}

// sealedFixture is an affinityFixture whose handler seals session IDs
// under key.
func newSealedFixture(t testing.TB, table string, keys ...[]byte) *affinityFixture {
	t.Helper()
	cfg := &SealedSessionIDs{}
	for _, k := range keys {
		cfg.Keys = append(cfg.Keys, base64.StdEncoding.EncodeToString(k))
	}
	h, logs := provisionHandler(t, &Handler{Table: table, SealSessionIDs: cfg})
	policy := provisionPolicy(t, &SessionSelection{Table: h.Table})
	return &affinityFixture{h: h, logs: logs, proxy: &fakeProxy{policy: policy, pool: testPool()}}
}

// seen records the Mcp-Session-Id values of the requests that reached the
// upstream, and answers with the given status and response session IDs.
type seen struct{ ids [][]string }

func (s *seen) answer(status int, ids ...string) func(http.ResponseWriter, *http.Request, *reverseproxy.Upstream) {
	return func(w http.ResponseWriter, r *http.Request, up *reverseproxy.Upstream) {
		s.ids = append(s.ids, r.Header.Values(HeaderSessionID))
		answer(status, ids...)(w, r, up)
	}
}

// TestSealedSessionLifecycle: initialize gets a sealed ID, later requests
// carry it and reach the session's upstream with the upstream's own ID,
// and responses repeating the upstream's ID give the client its own sealed
// value back.
func TestSealedSessionLifecycle(t *testing.T) {
	key := newKey(t)
	f := newSealedFixture(t, "", key)
	var up seen
	rec := f.serve(t, newRequest(http.MethodPost), up.answer(200, testSessionID))
	owner := f.proxy.last()
	sealed := rec.Header().Get(HeaderSessionID)
	if sealed == "" || sealed == testSessionID || len(rec.Header().Values(HeaderSessionID)) != 1 {
		t.Fatalf("initialize response Mcp-Session-Id = %q; want one sealed value", rec.Header().Values(HeaderSessionID))
	}
	if dial, id, ok := newSealer(t, key).Open(sealed); !ok || dial != owner.Dial || id != testSessionID {
		t.Fatalf("the sealed value opens to %q, %q, %v; want %q, %q", dial, id, ok, owner.Dial, testSessionID)
	}
	if got := lookupDial(f.h.table, f.h.sealer.tableKey(sealed)); got != owner.Dial {
		t.Errorf("table maps the sealed value to %q, want %q", got, owner.Dial)
	}
	for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodPost} {
		rec := f.serve(t, newRequest(method, sealed), up.answer(200, testSessionID))
		if f.proxy.last() != owner {
			t.Fatalf("%s went to %v, want %v", method, f.proxy.last(), owner)
		}
		if got := rec.Header().Values(HeaderSessionID); len(got) != 1 || got[0] != sealed {
			t.Errorf("%s response Mcp-Session-Id = %q, want the request's own sealed value", method, got)
		}
	}
	// The upstream saw no session on initialize, then always its own ID.
	for i, ids := range up.ids[1:] {
		if len(ids) != 1 || ids[0] != testSessionID {
			t.Errorf("request %d reached the upstream with Mcp-Session-Id %q, want its own %q", i+2, ids, testSessionID)
		}
	}
	// Another session ID on a pinned response is sealed, never passed in clear.
	rec = f.serve(t, newRequest(http.MethodPost, sealed), up.answer(200, "OTHERSESSION"))
	other := rec.Header().Get(HeaderSessionID)
	if dial, id, ok := newSealer(t, key).Open(other); !ok || dial != owner.Dial || id != "OTHERSESSION" {
		t.Errorf("a pinned response's other session ID became %q (opens to %q, %q, %v); want it sealed with the session's upstream", other, dial, id, ok)
	}
	if f.h.table.Len() != 1 || f.h.table.Stats.Adopted() != 0 {
		t.Errorf("Len %d, adopted %d; want 1 learned session and no adoption", f.h.table.Len(), f.h.table.Stats.Adopted())
	}
	// DELETE ends it here for good: a tombstone keeps the value from being
	// adopted again, so its next request gets the proxy's 404 without
	// reaching the upstream, even one that would answer it.
	f.serve(t, newRequest(http.MethodDelete, sealed), up.answer(204))
	wantEvictions(t, f.h.table, map[session.EvictReason]uint64{session.EvictDelete: 1})
	reached := len(up.ids)
	rec = f.serve(t, newRequest(http.MethodPost, sealed), up.answer(200, testSessionID))
	if rec.Code != 404 || !strings.Contains(rec.Body.String(), `"code":-32001`) || len(up.ids) != reached || f.h.table.Stats.Adopted() != 0 {
		t.Errorf("after DELETE: %d %q, reached the upstream %v, adopted %d; want the proxy's 404, no upstream, no adoption",
			rec.Code, rec.Body, len(up.ids) != reached, f.h.table.Stats.Adopted())
	}
	if f.h.table.Tombstones() != 1 {
		t.Errorf("%d tombstones after a DELETE, want 1", f.h.table.Tombstones())
	}
}

// TestSealedOnAnotherReplica: a handler with its own table and the same key
// (another Caddy) routes a sealed session it never saw, and records it.
func TestSealedOnAnotherReplica(t *testing.T) {
	key := newKey(t)
	a := newSealedFixture(t, "test/replica-a", key)
	b := newSealedFixture(t, "test/replica-b", key)
	sealed := a.serve(t, newRequest(http.MethodPost), answer(200, testSessionID)).Header().Get(HeaderSessionID)
	owner := a.proxy.last()
	var up seen
	for range 3 {
		rec := b.serve(t, newRequest(http.MethodPost, sealed), up.answer(200, testSessionID))
		if b.proxy.last().Dial != owner.Dial || rec.Header().Get(HeaderSessionID) != sealed {
			t.Fatalf("replica b sent the session to %s and answered Mcp-Session-Id %q; want %s and the client's value",
				b.proxy.last().Dial, rec.Header().Get(HeaderSessionID), owner.Dial)
		}
	}
	if len(up.ids) != 3 || up.ids[2][0] != testSessionID {
		t.Errorf("upstream saw %q", up.ids)
	}
	if b.h.table.Stats.Adopted() != 1 || b.h.table.Len() != 1 || b.h.table.KnownUpstream(owner.Dial).LiveSessions() != 1 {
		t.Errorf("replica b: adopted %d, Len %d; want the session recorded once", b.h.table.Stats.Adopted(), b.h.table.Len())
	}
}

// TestSealedBadValues: a value that does not open gets the 404 of an
// unknown session, and a value naming an upstream not in the pool gets the
// upstream-gone 404; no upstream is selected for either.
func TestSealedBadValues(t *testing.T) {
	key := newKey(t)
	good := newSealer(t, key).Seal("10.0.0.1:8080", testSessionID)
	raw, _ := sealEncoding.DecodeString(good)
	flipped := bytes.Clone(raw)
	flipped[len(flipped)/2] ^= 1
	for name, v := range map[string]string{
		"forged":       sealEncoding.EncodeToString(append([]byte{sealVersion}, newKey(t)...)) + "AAAA",
		"truncated":    good[:len(good)-1],
		"bit-flipped":  sealEncoding.EncodeToString(flipped),
		"another key":  newSealer(t, newKey(t)).Seal("10.0.0.1:8080", testSessionID),
		"version 3":    sealRaw(t, key, 3, plaintext("10.0.0.1:8080", "", testSessionID)),
		"upstream's":   testSessionID,
		"not in table": "PLAINSESSIONTHETABLEDOESNOTHOLD",
	} {
		for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
			f := newSealedFixture(t, "", key)
			next := new(countingNext)
			rec := httptest.NewRecorder()
			if err := f.h.ServeHTTP(rec, newRequest(method, v), next); err != nil {
				t.Fatal(err)
			}
			if next.calls != 0 {
				t.Errorf("%s %s: reached the upstream", name, method)
			}
			checkRPCError(t, rec, 404, CodeSessionNotFound, "Session not found")
			if strings.Contains(rec.Body.String(), "gone") || f.h.table.Len() != 0 {
				t.Errorf("%s %s: body %s, Len %d; want the unknown-session answer and nothing recorded", name, method, rec.Body, f.h.table.Len())
			}
		}
	}
	// A value sealed with an upstream the config does not list.
	f := newSealedFixture(t, "", key)
	for _, dial := range []string{"10.9.9.9:8080", "127.0.0.1:22", "unix//tmp/x.sock"} {
		rec := f.serve(t, newRequest(http.MethodPost, newSealer(t, key).Seal(dial, testSessionID)), answer(200))
		if f.proxy.last() != nil {
			t.Errorf("sealed with %s: the policy selected %s", dial, f.proxy.last().Dial)
		}
		checkRPCError(t, rec, 404, CodeSessionNotFound, "Session not found: its upstream is gone")
	}
	if f.h.table.Len() != 0 || f.h.table.Stats.Gone() != 3 {
		t.Errorf("Len %d, gone %d; want 0 and 3", f.h.table.Len(), f.h.table.Stats.Gone())
	}
}

// TestSealedKeepsPlainSessions: after a switch to sealed IDs on the same
// table (a reload), the plain sessions the table holds keep working, and
// their responses keep the plain ID.
func TestSealedKeepsPlainSessions(t *testing.T) {
	plain := newAffinityFixture(t)
	owner := plain.initialize(t, testSessionID)
	key := newKey(t)
	f := newSealedFixture(t, plain.h.Table, key)
	var up seen
	rec := f.serve(t, newRequest(http.MethodPost, testSessionID), up.answer(200, testSessionID))
	if f.proxy.last().Dial != owner.Dial || rec.Header().Get(HeaderSessionID) != testSessionID || up.ids[0][0] != testSessionID {
		t.Errorf("plain session after the switch: to %v, response ID %q, upstream saw %q; want %v and the plain ID both ways",
			f.proxy.last(), rec.Header().Get(HeaderSessionID), up.ids[0], owner)
	}
	// New sessions are sealed.
	sealed := f.serve(t, newRequest(http.MethodPost), answer(200, testUUID)).Header().Get(HeaderSessionID)
	if _, id, ok := newSealer(t, key).Open(sealed); !ok || id != testUUID {
		t.Errorf("a new session after the switch got %q; want it sealed", sealed)
	}
}

// TestSealedResponseShapes: every Mcp-Session-Id of a response to a
// request without a session is sealed; values that cannot be sealed are
// removed, never passed in clear.
func TestSealedResponseShapes(t *testing.T) {
	key := newKey(t)
	s := newSealer(t, key)
	for _, tc := range []struct {
		name   string
		status int
		ids    []string
		want   int // sealed values in the response
		learn  bool
	}{
		{name: "200", status: 200, ids: []string{testSessionID}, want: 1, learn: true},
		{name: "400 with an ID", status: 400, ids: []string{testUUID}, want: 1},
		{name: "two IDs", status: 200, ids: []string{testSessionID, testUUID}, want: 2},
		{name: "malformed", status: 200, ids: []string{"a b"}},
		{name: "empty", status: 200, ids: []string{""}},
		{name: "sealed too long for max_session_id_length", status: 200, ids: []string{strings.Repeat("x", 1500)}, want: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newSealedFixture(t, "", key)
			rec := f.serve(t, newRequest(http.MethodPost), answer(tc.status, tc.ids...))
			got := rec.Header().Values(HeaderSessionID)
			if len(got) != tc.want {
				t.Fatalf("response Mcp-Session-Id %q, want %d sealed values", got, tc.want)
			}
			for i, v := range got {
				if _, id, ok := s.Open(v); !ok || id != tc.ids[i] {
					t.Errorf("value %d = %q; want %q sealed", i, v, tc.ids[i])
				}
			}
			if learned := f.h.table.Len() == 1; learned != tc.learn {
				t.Errorf("learned %v, want %v", learned, tc.learn)
			}
		})
	}
}

// TestSealedPrincipalBinding: with bind_principal, the sealed ID carries
// the principal of the request that opened the session, so every replica
// (here: a second handler with its own table and the same key) answers a
// request of another principal with the unknown session's 404, before
// adopting anything.
func TestSealedPrincipalBinding(t *testing.T) {
	key := newKey(t)
	a := newSealedFixture(t, "test/bound-a", key)
	b := newSealedFixture(t, "test/bound-b", key)
	for _, f := range []*affinityFixture{a, b} {
		f.h.table.SetBindPrincipal("{http.request.header.Authorization}")
	}
	as := func(r *http.Request, auth string) *http.Request {
		r.Header.Set("Authorization", auth)
		caddyhttp.NewTestReplacer(r)
		return r
	}
	sealed := a.serve(t, as(newRequest(http.MethodPost), "Bearer alice"), answer(200, testSessionID)).Header().Get(HeaderSessionID)
	if got := len(sealed); got != sealedLength(seal.Session{Dial: a.proxy.last().Dial, Bound: principalDigest("x"), ID: testSessionID}) {
		t.Errorf("sealed value of a bound session is %d bytes; want the bound length", got)
	}
	unbound := a.serve(t, as(newRequest(http.MethodPost), ""), answer(200, testUUID)).Header().Get(HeaderSessionID)
	for _, f := range []*affinityFixture{b, a} { // b first: it must refuse before adopting
		for _, who := range []string{"Bearer mallory", ""} {
			next := new(countingNext)
			rec := httptest.NewRecorder()
			if err := f.h.ServeHTTP(rec, as(newRequest(http.MethodPost, sealed), who), next); err != nil {
				t.Fatal(err)
			}
			if next.calls != 0 || rec.Code != http.StatusNotFound {
				t.Errorf("%s as %q: %d, next called %d times; want the unknown session's 404", f.h.Table, who, rec.Code, next.calls)
			}
		}
		if rec := f.serve(t, as(newRequest(http.MethodPost, sealed), "Bearer alice"), answer(200)); rec.Code != http.StatusOK {
			t.Errorf("%s as alice: %d; want her session", f.h.Table, rec.Code)
		}
		if rec := f.serve(t, as(newRequest(http.MethodPost, unbound), "Bearer anyone"), answer(200)); rec.Code != http.StatusOK {
			t.Errorf("%s: an unbound session as anyone: %d", f.h.Table, rec.Code)
		}
	}
	if b.h.table.Stats.PrincipalMismatches() != 2 || b.h.table.Stats.Adopted() != 2 {
		t.Errorf("replica b: %d mismatches, %d adopted; want 2 and 2", b.h.table.Stats.PrincipalMismatches(), b.h.table.Stats.Adopted())
	}
}

func TestSealedCaddyfile(t *testing.T) {
	var h Handler
	d := caddyfile.NewTestDispenser(`mcp_session {
		seal_session_ids {env.MCP_SESSION_KEY} {env.MCP_SESSION_KEY_OLD}
		max_sessions 10
	}`)
	if err := h.UnmarshalCaddyfile(d); err != nil {
		t.Fatal(err)
	}
	if h.SealSessionIDs == nil || strings.Join(h.SealSessionIDs.Keys, " ") != "{env.MCP_SESSION_KEY} {env.MCP_SESSION_KEY_OLD}" || h.MaxSessions != 10 {
		t.Errorf("parsed %+v, keys %+v", h, h.SealSessionIDs)
	}
	for input, want := range map[string]string{
		"mcp_session {\n seal_session_ids\n}":                        "needs at least one key",
		"mcp_session {\n seal_session_ids a\n seal_session_ids b\n}": "duplicate option 'seal_session_ids'",
	} {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", input, err, want)
		}
	}
}

// BenchmarkServePinned is the handler's whole work for a request of a known
// session, plain and sealed: the table lookup, and with sealing the opening,
// the header restored for the upstream and the response's ID replaced. The
// upstream is a function that answers 200 repeating the session ID, as the
// TypeScript SDK does on SSE responses. "sealed, init 190 B" is a value
// carrying the go-sdk client's initialize (minted by a table with failover,
// which is then turned off so that only the longer value's cost shows).
func BenchmarkServePinned(b *testing.B) {
	for _, kind := range []string{"plain", "sealed", "sealed, init 190 B"} {
		b.Run(kind, func(b *testing.B) {
			f, init := newAffinityFixture(b), newRequest(http.MethodPost)
			switch kind {
			case "sealed":
				f = newSealedFixture(b, "", newKey(b))
			case "sealed, init 190 B":
				f, init = newSealedFailoverFixture(b, "", newKey(b), 0), bodyRequest(testInitGo, "")
			}
			id := f.serve(b, init, answer(200, testSessionID)).Header().Get(HeaderSessionID)
			if kind == "sealed, init 190 B" && versionOf(b, id) != sealVersionInit {
				b.Fatalf("%s: the value is version %d", kind, versionOf(b, id))
			}
			f.h.table.SetFailover(session.FailoverOff, 0)
			f.h.setLogger(zap.NewNop()) // as in production: no debug logging
			f.proxy.respond = func(w http.ResponseWriter, r *http.Request, _ *reverseproxy.Upstream) {
				w.Header()[HeaderSessionID] = r.Header[HeaderSessionID]
				w.WriteHeader(http.StatusOK)
			}
			r := newRequest(http.MethodPost, id)
			b.ReportAllocs()
			for b.Loop() {
				r.Header[HeaderSessionID] = []string{id}
				f.proxy.selected = f.proxy.selected[:0]
				rec := httptest.NewRecorder()
				if err := f.h.ServeHTTP(rec, r, f.proxy); err != nil || rec.Header().Get(HeaderSessionID) != id {
					b.Fatalf("ServeHTTP: %v, Mcp-Session-Id %q", err, rec.Header().Get(HeaderSessionID))
				}
			}
		})
	}
}
