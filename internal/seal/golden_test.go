package seal

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// golden is testdata/golden.json: values sealed by the code before this
// package existed, which every later version must open.
type golden struct {
	SessionKeyHex string `json:"session_key_hex"`
	Sessions      []struct {
		Value, Dial, ID string
		Issued          int64
		BoundPrincipal  string `json:"bound_principal"`
		Init            struct {
			Accept, Version, Body string
			ContentType           string `json:"content_type"`
		}
	}
	RecordKeyHex string `json:"record_key_hex"`
	Records      []struct {
		Value  string
		ADHex  string `json:"ad_hex"`
		Fields []string
	}
}

func readGolden(t *testing.T) golden {
	t.Helper()
	b, err := os.ReadFile("testdata/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g golden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	return g
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGoldenSessionIDs: session IDs sealed by main a187596 (versions 3 and
// 4, bound and not) open to what was sealed, and a seal of the same session
// today has the same length and version.
func TestGoldenSessionIDs(t *testing.T) {
	g := readGolden(t)
	s := newSealer(t, unhex(t, g.SessionKeyHex))
	for _, c := range g.Sessions {
		want := Session{Issued: c.Issued, Dial: c.Dial, ID: c.ID,
			Init: Init{Accept: c.Init.Accept, ContentType: c.Init.ContentType, Version: c.Init.Version, Body: c.Init.Body}}
		if c.BoundPrincipal != "" {
			want.Bound = principalDigest(c.BoundPrincipal)
		}
		raw, got, ok := s.OpenSession(c.Value)
		if !ok || got != want {
			t.Errorf("OpenSession(%.20s…) = %+v, %v; want %+v", c.Value, got, ok, want)
			continue
		}
		if Encode(raw) != c.Value {
			t.Errorf("the decoded value of %.20s… encodes to another spelling", c.Value)
		}
		again := s.SealSession(want)
		if len(again) != len(c.Value) || versionOf(t, again) != versionOf(t, c.Value) {
			t.Errorf("sealing %+v today: %d bytes, version %d; before: %d bytes, version %d",
				want, len(again), versionOf(t, again), len(c.Value), versionOf(t, c.Value))
		}
	}
	if len(g.Sessions) != 4 {
		t.Fatalf("%d golden session IDs, want 4", len(g.Sessions))
	}
}

// TestGoldenRecords: failover records sealed by main a187596 for the redis
// store open, with the same key and associated data, to their five fields,
// and to nothing with another session's associated data.
func TestGoldenRecords(t *testing.T) {
	g := readGolden(t)
	block, err := aes.NewCipher(unhex(t, g.RecordKeyHex))
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		t.Fatal(err)
	}
	s := Under(aead)
	isRecord := func(v byte) bool { return v == 1 }
	for i, c := range g.Records {
		ad := unhex(t, c.ADHex)
		_, plain, ok := s.Open(c.Value, ad[1:], isRecord)
		fields := make([]string, 5)
		if !ok {
			t.Errorf("record %d does not open", i)
			continue
		}
		if _, ok := Split(plain, false, fields); !ok || !slices.Equal(fields, c.Fields) {
			t.Errorf("record %d: fields %q, %v; want %q", i, fields, ok, c.Fields)
		}
		other := unhex(t, g.Records[1-i].ADHex)
		if _, _, ok := s.Open(c.Value, other[1:], isRecord); ok {
			t.Errorf("record %d opens with another session's key hash", i)
		}
		again := s.Seal(1, ad[1:], Message{Fields: c.Fields})
		if len(again) != len(c.Value) || again[:1] != c.Value[:1] {
			t.Errorf("record %d sealed today: %d bytes, %q first; before: %d bytes, %q first", i, len(again), again[:1], len(c.Value), c.Value[:1])
		}
	}
	if len(g.Records) != 2 {
		t.Fatalf("%d golden records, want 2", len(g.Records))
	}
}

// TestNoCaddyImport: the package stays below the Caddy glue.
func TestNoCaddyImport(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for dep := range bytes.Lines(out) {
		if strings.HasPrefix(string(dep), "github.com/caddyserver/") {
			t.Errorf("internal/seal imports %s", bytes.TrimSpace(dep))
		}
	}
}
