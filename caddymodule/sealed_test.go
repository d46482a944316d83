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
	"strconv"
	"strings"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
)

// testUUID is shaped like the IDs the MCP TypeScript and Python SDKs mint.
const testUUID = "3f1c1d2e-8a4b-4c6d-9e0f-1a2b3c4d5e6f"

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

// issuedPlaintext is plaintext of format version 3: the issue time first.
func issuedPlaintext(issued uint64, dial, bound, id string) []byte {
	return append(binary.AppendUvarint(nil, issued), plaintext(dial, bound, id)...)
}

func TestSealOpenRoundTrip(t *testing.T) {
	s := newSealer(t, newKey(t))
	for _, tc := range []struct{ dial, id string }{
		{"127.0.0.1:9001", testSessionID},
		{"10.0.0.12:8080", testUUID},
		{"unix//run/mcp/1.sock", "x"},
		{"[::1]:9001", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"},
		{"mcp-" + strings.Repeat("a", 300) + ".svc.cluster.local:443", strings.Repeat("Z", 1500)}, // a 2-byte length prefix
	} {
		v := s.Seal(tc.dial, tc.id)
		dial, id, ok := s.Open(v)
		if !ok || dial != tc.dial || id != tc.id {
			t.Errorf("Open(Seal(%q, %q)) = %q, %q, %v", tc.dial, tc.id, dial, id, ok)
		}
		if reason := checkSessionID(v, len(v)); reason != "" {
			t.Errorf("sealed value %q %s", v, reason)
		}
		if w := s.Seal(tc.dial, tc.id); w == v {
			t.Errorf("two seals of the same pair are equal (%q): the nonce is not fresh", v)
		}
		raw, _ := sealEncoding.DecodeString(v)
		for _, secret := range []string{tc.dial, tc.id} {
			// a secret shorter than 4 bytes turns up in random bytes by chance (a
			// 1-byte one in about 1 of 5 sealed values)
			if len(secret) >= 4 && (strings.Contains(v, secret) || bytes.Contains(raw, []byte(secret))) {
				t.Errorf("sealed value %q shows %q", v, secret)
			}
		}
	}
}

// TestSealedLength pins the lengths docs/replicas.md states, and the formula
// behind them: 36 bytes of overhead (52 when bound), then base64.
func TestSealedLength(t *testing.T) {
	s := newSealer(t, newKey(t))
	for _, tc := range []struct {
		dial, id string
		bound    bool
		want     int
	}{
		{"127.0.0.1:9001", testSessionID, false, 102}, // go-sdk: 26 bytes
		{"127.0.0.1:9001", testUUID, false, 115},      // TypeScript and Python SDKs: a 36-byte UUID
		{"127.0.0.1:9001", testSessionID, true, 123},
		{"127.0.0.1:9001", testUUID, true, 136},
		{"10.0.0.12:8080", testSessionID, false, 102},
		{"mcp-3.mcp.default.svc.cluster.local:8080", testUUID, false, 150},
		{"mcp-3.mcp.default.svc.cluster.local:8080", testUUID, true, 171},
	} {
		ss := sealedSession{dial: tc.dial, id: tc.id}
		if tc.bound {
			ss.bound = principalDigest("Bearer alice")
		}
		got, formula := len(s.seal(ss)), sealedLength(ss)
		if got != tc.want || got != formula {
			t.Errorf("sealed length of %q on %q (bound %v) = %d, want %d (sealedLength %d)", tc.id, tc.dial, tc.bound, got, tc.want, formula)
		}
	}
}

// TestOpenRejects: nothing but an unmodified value sealed under one of the
// keys, in this format version, opens.
func TestOpenRejects(t *testing.T) {
	key := newKey(t)
	s := newSealer(t, key)
	good := s.Seal("127.0.0.1:9001", testSessionID)
	raw, err := sealEncoding.DecodeString(good)
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{
		"empty":                      "",
		"the upstream's own ID":      testSessionID,
		"a UUID":                     testUUID,
		"forged: random bytes":       sealEncoding.EncodeToString(append([]byte{sealVersion}, randomBytes(t, len(raw)-1)...)),
		"another key":                newSealer(t, newKey(t)).Seal("127.0.0.1:9001", testSessionID),
		"v3 value labelled v4":       sealEncoding.EncodeToString(append([]byte{sealVersionIssuedInit}, raw[1:]...)),
		"v3 value labelled v1":       sealEncoding.EncodeToString(append([]byte{sealVersion}, raw[1:]...)),
		"unknown version, v3 data":   sealEncoding.EncodeToString(append([]byte{5}, raw[1:]...)),
		"unknown version, sealed v5": sealRaw(t, key, 5, issuedPlaintext(1, "127.0.0.1:9001", "", testSessionID)),
		"version 0":                  sealRaw(t, key, 0, plaintext("127.0.0.1:9001", "", testSessionID)),
		"v3 issued at 0":             sealRaw(t, key, sealVersionIssued, issuedPlaintext(0, "127.0.0.1:9001", "", testSessionID)),
		"v3 without issue time":      sealRaw(t, key, sealVersionIssued, plaintext("127.0.0.1:9001", "", testSessionID)),
		"v3 issue time past int64":   sealRaw(t, key, sealVersionIssued, issuedPlaintext(1<<63, "127.0.0.1:9001", "", testSessionID)),
		"v3 issue time cut":          sealRaw(t, key, sealVersionIssued, []byte{0x80, 0x80}),
		"empty dial":                 sealRaw(t, key, sealVersion, plaintext("", "", testSessionID)),
		"empty ID":                   sealRaw(t, key, sealVersion, plaintext("127.0.0.1:9001", "", "")),
		"length past the end":        sealRaw(t, key, sealVersion, append(binary.AppendUvarint(nil, 200), "127.0.0.1:9001\x00x"...)),
		"bad length prefix":          sealRaw(t, key, sealVersion, bytes.Repeat([]byte{0xff}, 12)),
		"empty plaintext":            sealRaw(t, key, sealVersion, nil),
		"no bound field":             sealRaw(t, key, sealVersion, append(binary.AppendUvarint(nil, 14), "127.0.0.1:9001"...)),
		"bound of 5 bytes":           sealRaw(t, key, sealVersion, plaintext("127.0.0.1:9001", "12345", testSessionID)),
		"bound, no ID":               sealRaw(t, key, sealVersion, plaintext("127.0.0.1:9001", principalDigest("x"), "")),
		"padded":                     good + strings.Repeat("=", (4-len(good)%4)%4) + "====",
		"standard alphabet":          base64.RawStdEncoding.EncodeToString(bytes.Repeat([]byte{0xfb, 0xff}, 40)),
		"appended byte":              sealEncoding.EncodeToString(append(bytes.Clone(raw), 0)),
		"doubled":                    good + good,
	}
	for i := 1; i < len(good); i++ {
		bad["truncated to "+strconv.Itoa(i)] = good[:i]
	}
	for i := range raw {
		for bit := range 8 {
			flipped := bytes.Clone(raw)
			flipped[i] ^= 1 << bit
			bad["bit "+strconv.Itoa(bit)+" of byte "+strconv.Itoa(i)+" flipped"] = sealEncoding.EncodeToString(flipped)
		}
	}
	for i := range good {
		c := byte('A')
		if good[i] == 'A' {
			c = 'B'
		}
		bad["character "+strconv.Itoa(i)+" replaced"] = good[:i] + string(c) + good[i+1:]
	}
	for name, v := range bad {
		if dial, id, ok := s.Open(v); ok {
			t.Errorf("%s: Open(%q) = %q, %q, true; want it rejected", name, v, dial, id)
		}
	}
	if _, _, ok := s.Open(good); !ok {
		t.Fatal("the unmodified value does not open: every rejection above proves nothing")
	}
}

// TestSealerKeyRotation walks the rotation docs/replicas.md describes: a new key
// is first added to open, then made the sealing key, then the old key is
// dropped; values sealed at every step open until their key is dropped.
func TestSealerKeyRotation(t *testing.T) {
	oldKey, newK := newKey(t), newKey(t)
	steps := []*SessionSealer{
		newSealer(t, oldKey),       // before
		newSealer(t, oldKey, newK), // 1: the new key opens
		newSealer(t, newK, oldKey), // 2: the new key seals
		newSealer(t, newK),         // 3: the old key is gone
	}
	sealed := make([]string, len(steps))
	for i, s := range steps {
		sealed[i] = s.Seal("127.0.0.1:9001", testSessionID)
	}
	// opens[i][j]: step i's sealer opens step j's value.
	opens := [][]bool{
		{true, true, false, false},
		{true, true, true, true},
		{true, true, true, true},
		{false, false, true, true},
	}
	for i, s := range steps {
		for j, v := range sealed {
			if _, _, ok := s.Open(v); ok != opens[i][j] {
				t.Errorf("step %d opening a value sealed at step %d: %v, want %v", i, j, ok, opens[i][j])
			}
		}
	}
}

func TestNewSessionSealerErrors(t *testing.T) {
	for name, keys := range map[string][][]byte{
		"no key":       nil,
		"short key":    {make([]byte, 16)},
		"long key":     {make([]byte, 33)},
		"second short": {make([]byte, 32), make([]byte, 31)},
	} {
		if _, err := NewSessionSealer(keys...); err == nil {
			t.Errorf("%s: NewSessionSealer succeeded", name)
		}
	}
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
	if got := lookupDial(f.h.table, f.h.tableKey(sealed)); got != owner.Dial {
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
	if got := len(sealed); got != sealedLength(sealedSession{dial: a.proxy.last().Dial, bound: principalDigest("x"), id: testSessionID}) {
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

// FuzzOpenSealed feeds arbitrary values to Open: it must never panic, and
// whatever opens must be a canonical base64url value carrying a non-empty
// dial address and session ID, and, in format versions 2 and 4, a
// non-empty initialize body.
func FuzzOpenSealed(f *testing.F) {
	key := bytes.Repeat([]byte{7}, sealKeySize)
	s, _ := NewSessionSealer(key)
	good := s.Seal("127.0.0.1:9001", testSessionID)
	withInit := s.seal(sealedSession{dial: "127.0.0.1:9001", id: testSessionID, init: testSealedInit(testInitBody)})
	for _, seed := range []string{good, good[:len(good)-1], good[:43], "", "A", testSessionID, testUUID, good + "=", strings.Repeat("A", 43), strings.Repeat("_", 200),
		withInit, withInit[:len(withInit)-1], withInit[:200], "Ag" + good[2:]} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		_, ss, ok := s.open(v)
		if !ok {
			return
		}
		if ss.dial == "" || ss.id == "" {
			t.Fatalf("open(%q) = %+v, true", v, ss)
		}
		raw, err := sealEncoding.DecodeString(v)
		if err != nil || sealEncoding.EncodeToString(raw) != v {
			t.Fatalf("Open accepted a non-canonical value %q", v)
		}
		if (raw[0] == sealVersionInit || raw[0] == sealVersionIssuedInit) != (ss.init.body != "") {
			t.Fatalf("version %d opened to initialize %+v", raw[0], ss.init)
		}
	})
}

// FuzzOpenTampered flips bits of a valid sealed value, of format version 3
// or 4 (carrying an initialize), at fuzzed positions: no change of any
// byte, whatever the mask, may open.
func FuzzOpenTampered(f *testing.F) {
	key := bytes.Repeat([]byte{9}, sealKeySize)
	s, _ := NewSessionSealer(key)
	var raws [2][]byte
	for i, ss := range []sealedSession{
		{dial: "127.0.0.1:9001", id: testSessionID},
		{dial: "127.0.0.1:9001", id: testSessionID, init: testSealedInit(testInitBody)},
	} {
		raws[i], _ = sealEncoding.DecodeString(s.seal(ss))
	}
	for _, withInit := range []bool{false, true} {
		f.Add(withInit, uint16(0), byte(1))
		f.Add(withInit, uint16(1), byte(0x80))
		f.Add(withInit, uint16(len(raws[1])-1), byte(0xff))
		f.Add(withInit, uint16(20), byte(0x10))
		f.Add(withInit, uint16(0), byte(7)) // version 3 <-> 4
		f.Add(withInit, uint16(0), byte(2)) // version 3 <-> 1, 4 <-> 6
	}
	f.Fuzz(func(t *testing.T, withInit bool, pos uint16, mask byte) {
		if mask == 0 {
			return
		}
		raw := raws[0]
		if withInit {
			raw = raws[1]
		}
		tampered := bytes.Clone(raw)
		tampered[int(pos)%len(tampered)] ^= mask
		if _, ss, ok := s.open(sealEncoding.EncodeToString(tampered)); ok {
			t.Fatalf("byte %d ^ %#x opened to %+v", int(pos)%len(tampered), mask, ss)
		}
	})
}

// sealBenches are the sealed sessions the sealing benchmarks seal and
// open: without an initialize (format version 3), and carrying the go-sdk
// client's 190-byte initialize (version 4, a table with failover).
var sealBenches = []struct {
	name string
	ss   sealedSession
}{
	{"no init", sealedSession{dial: "127.0.0.1:9001", id: testSessionID}},
	{"init 190 B", sealedSession{dial: "127.0.0.1:9001", id: testSessionID, init: testSealedInit(testInitGo)}},
}

func BenchmarkSeal(b *testing.B) {
	for _, bc := range sealBenches {
		b.Run(bc.name, func(b *testing.B) {
			s := newSealer(b, newKey(b))
			b.ReportAllocs()
			for b.Loop() {
				s.seal(bc.ss)
			}
		})
	}
}

func BenchmarkOpen(b *testing.B) {
	for _, sb := range sealBenches {
		for _, bc := range []struct {
			name string
			keys int // keys of the sealer; the value is sealed under the last
		}{{"first key", 1}, {"second key", 2}} {
			b.Run(sb.name+"/"+bc.name, func(b *testing.B) {
				keys := [][]byte{newKey(b), newKey(b)}[:bc.keys]
				v := newSealer(b, keys[bc.keys-1]).seal(sb.ss)
				s := newSealer(b, keys...)
				b.ReportAllocs()
				for b.Loop() {
					if _, _, ok := s.open(v); !ok {
						b.Fatal("did not open")
					}
				}
			})
		}
		b.Run(sb.name+"/forged", func(b *testing.B) {
			s := newSealer(b, newKey(b))
			v := newSealer(b, newKey(b)).seal(sb.ss)
			b.ReportAllocs()
			for b.Loop() {
				s.open(v)
			}
		})
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
			f.h.logger = zap.NewNop() // as in production: no debug logging
			f.h.table.SetLogger(f.h.logger)
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
