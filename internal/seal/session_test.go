package seal

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Test values, as the plugin's tests use them: a session ID shaped like the
// go-sdk's (26 bytes), one like the TypeScript and Python SDKs' (a UUID),
// and the go-sdk client's initialize request with a 16-byte client name
// (190 bytes).
const (
	testSessionID = "B5CKDXQ4Z3N7RWJ2YHT6MFEA4U"
	testUUID      = "3f1c1d2e-8a4b-4c6d-9e0f-1a2b3c4d5e6f"
	testInitGo    = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"roots":{"listChanged":true}},"clientInfo":{"name":"affinity-test-go","version":"v0"}}}`
	testInitBody  = testInitGo
)

// testSealedInit is what a sealed ID carries of an initialize request of
// body sent with the headers every SDK client sends.
func testSealedInit(body string) Init {
	return Init{Accept: "application/json, text/event-stream", ContentType: "application/json", Body: body}
}

// principalDigest is the digest the plugin seals for a bound session: the
// first BoundSize bytes of the principal's SHA-256.
func principalDigest(principal string) string {
	sum := sha256.Sum256([]byte(principal))
	return string(sum[:BoundSize])
}

// newKey returns a random sealing key.
func newKey(t testing.TB) []byte {
	t.Helper()
	return randomBytes(t, KeySize)
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
func newSealer(t testing.TB, keys ...[]byte) Sealer {
	t.Helper()
	s, err := New(keys...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

// sealPair seals an unbound session ID of dial and id, issued now.
func sealPair(s Sealer, dial, id string) string { return s.SealSession(Session{Dial: dial, ID: id}) }

// openPair opens a sealed session ID to its dial address and ID.
func openPair(s Sealer, v string) (dial, id string, ok bool) {
	_, ss, ok := s.OpenSession(v)
	return ss.Dial, ss.ID, ok
}

// visibleASCII reports whether v is all visible ASCII, as Mcp-Session-Id
// must be.
func visibleASCII(v string) bool {
	for i := range len(v) {
		if v[i] < 0x21 || v[i] > 0x7e {
			return false
		}
	}
	return v != ""
}

// versionOf returns the format version byte of a sealed value.
func versionOf(t testing.TB, v string) byte {
	t.Helper()
	raw, err := encoding.DecodeString(v)
	if err != nil || len(raw) == 0 {
		t.Fatalf("%q is not base64url: %v", v, err)
	}
	return raw[0]
}

// sealRaw seals plain under key with the given version as prefix and
// associated data, bypassing the plaintext encoding: for values
// SealSession never makes.
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
	return encoding.EncodeToString(aead.Seal([]byte{version}, nil, plain, []byte{version}))
}

// plaintext encodes dial, bound and id as a version 1 value carries them.
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
		v := sealPair(s, tc.dial, tc.id)
		dial, id, ok := openPair(s, v)
		if !ok || dial != tc.dial || id != tc.id {
			t.Errorf("Open(Seal(%q, %q)) = %q, %q, %v", tc.dial, tc.id, dial, id, ok)
		}
		if !visibleASCII(v) {
			t.Errorf("sealed value %q is not visible ASCII", v)
		}
		if w := sealPair(s, tc.dial, tc.id); w == v {
			t.Errorf("two seals of the same pair are equal (%q): the nonce is not fresh", v)
		}
		raw, _ := encoding.DecodeString(v)
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
		ss := Session{Dial: tc.dial, ID: tc.id}
		if tc.bound {
			ss.Bound = principalDigest("Bearer alice")
		}
		got, formula := len(s.SealSession(ss)), SessionLength(ss)
		if got != tc.want || got != formula {
			t.Errorf("sealed length of %q on %q (bound %v) = %d, want %d (SessionLength %d)", tc.id, tc.dial, tc.bound, got, tc.want, formula)
		}
	}
}

// TestOpenRejects: nothing but an unmodified value sealed under one of the
// keys, in this format version, opens.
func TestOpenRejects(t *testing.T) {
	key := newKey(t)
	s := newSealer(t, key)
	good := sealPair(s, "127.0.0.1:9001", testSessionID)
	raw, err := encoding.DecodeString(good)
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]string{
		"empty":                      "",
		"the upstream's own ID":      testSessionID,
		"a UUID":                     testUUID,
		"forged: random bytes":       encoding.EncodeToString(append([]byte{VersionPlain}, randomBytes(t, len(raw)-1)...)),
		"another key":                sealPair(newSealer(t, newKey(t)), "127.0.0.1:9001", testSessionID),
		"v3 value labelled v4":       encoding.EncodeToString(append([]byte{VersionIssuedInit}, raw[1:]...)),
		"v3 value labelled v1":       encoding.EncodeToString(append([]byte{VersionPlain}, raw[1:]...)),
		"unknown version, v3 data":   encoding.EncodeToString(append([]byte{5}, raw[1:]...)),
		"unknown version, sealed v5": sealRaw(t, key, 5, issuedPlaintext(1, "127.0.0.1:9001", "", testSessionID)),
		"version 0":                  sealRaw(t, key, 0, plaintext("127.0.0.1:9001", "", testSessionID)),
		"v3 issued at 0":             sealRaw(t, key, VersionIssued, issuedPlaintext(0, "127.0.0.1:9001", "", testSessionID)),
		"v3 without issue time":      sealRaw(t, key, VersionIssued, plaintext("127.0.0.1:9001", "", testSessionID)),
		"v3 issue time past int64":   sealRaw(t, key, VersionIssued, issuedPlaintext(1<<63, "127.0.0.1:9001", "", testSessionID)),
		"v3 issue time cut":          sealRaw(t, key, VersionIssued, []byte{0x80, 0x80}),
		"empty dial":                 sealRaw(t, key, VersionPlain, plaintext("", "", testSessionID)),
		"empty ID":                   sealRaw(t, key, VersionPlain, plaintext("127.0.0.1:9001", "", "")),
		"length past the end":        sealRaw(t, key, VersionPlain, append(binary.AppendUvarint(nil, 200), "127.0.0.1:9001\x00x"...)),
		"bad length prefix":          sealRaw(t, key, VersionPlain, bytes.Repeat([]byte{0xff}, 12)),
		"empty plaintext":            sealRaw(t, key, VersionPlain, nil),
		"no bound field":             sealRaw(t, key, VersionPlain, append(binary.AppendUvarint(nil, 14), "127.0.0.1:9001"...)),
		"bound of 5 bytes":           sealRaw(t, key, VersionPlain, plaintext("127.0.0.1:9001", "12345", testSessionID)),
		"bound, no ID":               sealRaw(t, key, VersionPlain, plaintext("127.0.0.1:9001", principalDigest("x"), "")),
		"padded":                     good + strings.Repeat("=", (4-len(good)%4)%4) + "====",
		"standard alphabet":          base64.RawStdEncoding.EncodeToString(bytes.Repeat([]byte{0xfb, 0xff}, 40)),
		"appended byte":              encoding.EncodeToString(append(bytes.Clone(raw), 0)),
		"doubled":                    good + good,
	}
	for i := 1; i < len(good); i++ {
		bad["truncated to "+strconv.Itoa(i)] = good[:i]
	}
	for i := range raw {
		for bit := range 8 {
			flipped := bytes.Clone(raw)
			flipped[i] ^= 1 << bit
			bad["bit "+strconv.Itoa(bit)+" of byte "+strconv.Itoa(i)+" flipped"] = encoding.EncodeToString(flipped)
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
		if dial, id, ok := openPair(s, v); ok {
			t.Errorf("%s: Open(%q) = %q, %q, true; want it rejected", name, v, dial, id)
		}
	}
	if _, _, ok := openPair(s, good); !ok {
		t.Fatal("the unmodified value does not open: every rejection above proves nothing")
	}
}

// TestSealerKeyRotation walks the rotation docs/replicas.md describes: a new key
// is first added to open, then made the sealing key, then the old key is
// dropped; values sealed at every step open until their key is dropped.
func TestSealerKeyRotation(t *testing.T) {
	oldKey, newK := newKey(t), newKey(t)
	steps := []Sealer{
		newSealer(t, oldKey),       // before
		newSealer(t, oldKey, newK), // 1: the new key opens
		newSealer(t, newK, oldKey), // 2: the new key seals
		newSealer(t, newK),         // 3: the old key is gone
	}
	sealed := make([]string, len(steps))
	for i, s := range steps {
		sealed[i] = sealPair(s, "127.0.0.1:9001", testSessionID)
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
			if _, _, ok := openPair(s, v); ok != opens[i][j] {
				t.Errorf("step %d opening a value sealed at step %d: %v, want %v", i, j, ok, opens[i][j])
			}
		}
	}
}

func TestNewErrors(t *testing.T) {
	for name, keys := range map[string][][]byte{
		"no key":       nil,
		"short key":    {make([]byte, 16)},
		"long key":     {make([]byte, 33)},
		"second short": {make([]byte, 32), make([]byte, 31)},
	} {
		if _, err := New(keys...); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

// FuzzOpenSealed feeds arbitrary values to Open: it must never panic, and
// whatever opens must be a canonical base64url value carrying a non-empty
// dial address and session ID, and, in format versions 2 and 4, a
// non-empty initialize body.
func FuzzOpenSealed(f *testing.F) {
	key := bytes.Repeat([]byte{7}, KeySize)
	s, _ := New(key)
	good := sealPair(s, "127.0.0.1:9001", testSessionID)
	withInit := s.SealSession(Session{Dial: "127.0.0.1:9001", ID: testSessionID, Init: testSealedInit(testInitBody)})
	for _, seed := range []string{good, good[:len(good)-1], good[:43], "", "A", testSessionID, testUUID, good + "=", strings.Repeat("A", 43), strings.Repeat("_", 200),
		withInit, withInit[:len(withInit)-1], withInit[:200], "Ag" + good[2:]} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		_, ss, ok := s.OpenSession(v)
		if !ok {
			return
		}
		if ss.Dial == "" || ss.ID == "" {
			t.Fatalf("open(%q) = %+v, true", v, ss)
		}
		raw, err := encoding.DecodeString(v)
		if err != nil || encoding.EncodeToString(raw) != v {
			t.Fatalf("Open accepted a non-canonical value %q", v)
		}
		if (raw[0] == VersionInit || raw[0] == VersionIssuedInit) != (ss.Init.Body != "") {
			t.Fatalf("version %d opened to initialize %+v", raw[0], ss.Init)
		}
	})
}

// FuzzOpenTampered flips bits of a valid sealed value, of format version 3
// or 4 (carrying an initialize), at fuzzed positions: no change of any
// byte, whatever the mask, may open.
func FuzzOpenTampered(f *testing.F) {
	key := bytes.Repeat([]byte{9}, KeySize)
	s, _ := New(key)
	var raws [2][]byte
	for i, ss := range []Session{
		{Dial: "127.0.0.1:9001", ID: testSessionID},
		{Dial: "127.0.0.1:9001", ID: testSessionID, Init: testSealedInit(testInitBody)},
	} {
		raws[i], _ = encoding.DecodeString(s.SealSession(ss))
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
		if _, ss, ok := s.OpenSession(encoding.EncodeToString(tampered)); ok {
			t.Fatalf("byte %d ^ %#x opened to %+v", int(pos)%len(tampered), mask, ss)
		}
	})
}

// sealBenches are the sealed sessions the sealing benchmarks seal and
// open: without an initialize (format version 3), and carrying the go-sdk
// client's 190-byte initialize (version 4, a table with failover).
var sealBenches = []struct {
	name string
	ss   Session
}{
	{"no init", Session{Dial: "127.0.0.1:9001", ID: testSessionID}},
	{"init 190 B", Session{Dial: "127.0.0.1:9001", ID: testSessionID, Init: testSealedInit(testInitGo)}},
}

func BenchmarkSeal(b *testing.B) {
	for _, bc := range sealBenches {
		b.Run(bc.name, func(b *testing.B) {
			s := newSealer(b, newKey(b))
			b.ReportAllocs()
			for b.Loop() {
				s.SealSession(bc.ss)
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
				v := newSealer(b, keys[bc.keys-1]).SealSession(sb.ss)
				s := newSealer(b, keys...)
				b.ReportAllocs()
				for b.Loop() {
					if _, _, ok := s.OpenSession(v); !ok {
						b.Fatal("did not open")
					}
				}
			})
		}
		b.Run(sb.name+"/forged", func(b *testing.B) {
			s := newSealer(b, newKey(b))
			v := newSealer(b, newKey(b)).SealSession(sb.ss)
			b.ReportAllocs()
			for b.Loop() {
				s.OpenSession(v)
			}
		})
	}
}

// TestSealInitRoundTrip: a sealed ID carrying an initialize request (format
// version 4) opens to everything sealed, its issue time included; one
// without (version 3) opens with no initialize; a version 2 or 4 plaintext
// that seal never makes does not open, and a well-formed version 2 one (as
// minted before the issue time was sealed) opens, with no issue time.
func TestSealInitRoundTrip(t *testing.T) {
	key := newKey(t)
	s := newSealer(t, key)
	issued := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC).Unix()
	for _, ss := range []Session{
		{Issued: issued, Dial: "127.0.0.1:9001", ID: testSessionID, Init: testSealedInit(testInitBody)},
		{Issued: issued, Dial: "10.0.0.12:8080", Bound: principalDigest("Bearer alice"), ID: testUUID, Init: Init{Version: "2025-06-18", Body: "{}"}},
		{Issued: issued, Dial: "127.0.0.1:9001", ID: testSessionID, Init: testSealedInit(strings.Repeat("x", 300))}, // a 2-byte length prefix
		{Issued: issued, Dial: "127.0.0.1:9001", ID: testSessionID},
		{Issued: 1, Dial: "127.0.0.1:9001", ID: testSessionID}, // a 1-byte issue time
	} {
		v := s.SealSession(ss)
		want := map[bool]byte{true: VersionIssuedInit, false: VersionIssued}[ss.Init.Body != ""]
		if got := versionOf(t, v); got != want {
			t.Errorf("sealed with init %v: version %d, want %d", ss.Init.Body != "", got, want)
		}
		_, got, ok := s.OpenSession(v)
		if !ok || got != ss {
			t.Errorf("open(seal(%+v)) = %+v, %v", ss, got, ok)
		}
		if len(v) != SessionLength(ss) || !visibleASCII(v) {
			t.Errorf("sealed value of %d bytes, SessionLength %d, visible ASCII %v", len(v), SessionLength(ss), visibleASCII(v))
		}
		if ss.Init.Body != "" && strings.Contains(v, "initialize") {
			t.Errorf("sealed value %q shows the initialize request", v)
		}
	}
	v2 := func(fields ...string) []byte {
		var b []byte
		for i, f := range fields {
			if i < len(fields)-1 {
				b = append(binary.AppendUvarint(b, uint64(len(f))), f...)
			} else {
				b = append(b, f...)
			}
		}
		return b
	}
	for version, prefix := range map[byte][]byte{VersionInit: nil, VersionIssuedInit: binary.AppendUvarint(nil, uint64(issued))} {
		for name, plain := range map[string][]byte{
			"v1 plaintext":        plaintext("127.0.0.1:9001", "", testSessionID),
			"empty body":          v2("127.0.0.1:9001", "", testSessionID, "a", "c", "", ""),
			"no header fields":    v2("127.0.0.1:9001", "", testSessionID, testInitBody),
			"empty ID":            v2("127.0.0.1:9001", "", "", "a", "c", "", testInitBody),
			"empty dial":          v2("", "", testSessionID, "a", "c", "", testInitBody),
			"bound of 3 bytes":    v2("127.0.0.1:9001", "abc", testSessionID, "a", "c", "", testInitBody),
			"length past the end": append(v2("127.0.0.1:9001", "", testSessionID, "a", "c"), 0x7f, 'x'),
		} {
			if _, ss, ok := s.OpenSession(sealRaw(t, key, version, append(bytes.Clone(prefix), plain...))); ok {
				t.Errorf("%s: a version %d value opened to %+v", name, version, ss)
			}
		}
		_, ss, ok := s.OpenSession(sealRaw(t, key, version, append(bytes.Clone(prefix), v2("127.0.0.1:9001", "", testSessionID, "a", "c", "", testInitBody)...)))
		if !ok || ss.Init.Body != testInitBody || ss.Issued != map[bool]int64{true: issued, false: 0}[prefix != nil] {
			t.Fatalf("a well-formed version %d plaintext opens to %+v, %v: the rejections above prove nothing", version, ss, ok)
		}
	}
}
