package mcpwire

import (
	"net/http"
	"strings"
	"testing"
)

// testSessionID is shaped like the go-sdk's session IDs (26 bytes).
const testSessionID = "B5CKDXQ4Z3N7RWJ2YHT6MFEA4U"

// DefaultMaxSessionIDLength is the plugin's default max_session_id_length.
const DefaultMaxSessionIDLength = 2048

func TestCheckSessionID(t *testing.T) {
	visible := make([]byte, 0, 0x7e-0x21+1)
	for c := byte(0x21); c <= 0x7e; c++ {
		visible = append(visible, c)
	}
	for _, tc := range []struct {
		name   string
		id     string
		maxLen int    // 0: DefaultMaxSessionIDLength
		want   string // substring of the reason; "" for a valid id
	}{
		{name: "go-sdk", id: testSessionID},
		{name: "uuid", id: "3f1c1d2e-8a4b-4c6d-9e0f-1a2b3c4d5e6f"},
		{name: "jwt", id: "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"},
		{name: "single byte", id: "x"},
		{name: "punctuation", id: `.-_=+/~:,;"%`},
		{name: "commas are part of the value", id: "a,b,c"},
		{name: "every visible byte", id: string(visible)},
		{name: "empty", id: "", want: "is empty"},
		{name: "space", id: "a b", want: "byte 0x20 at offset 1"},
		{name: "leading space", id: " a", want: "byte 0x20 at offset 0"},
		{name: "tab", id: "a\tb", want: "byte 0x09 at offset 1"},
		{name: "NUL", id: "a\x00", want: "byte 0x00 at offset 1"},
		{name: "DEL", id: "ab\x7f", want: "byte 0x7f at offset 2"},
		{name: "0x80", id: "\x80", want: "byte 0x80 at offset 0"},
		{name: "0xff", id: "a\xff", want: "byte 0xff at offset 1"},
		{name: "utf-8", id: "sessión", want: "byte 0xc3 at offset 5"},
		{name: "newline", id: "a\nb", want: "byte 0x0a"},
		{name: "at the limit", id: strings.Repeat("a", DefaultMaxSessionIDLength)},
		{name: "over the limit", id: strings.Repeat("a", DefaultMaxSessionIDLength+1), want: "is 2049 bytes long; the limit is 2048 (max_session_id_length)"},
		{name: "at a small limit", id: "abcd", maxLen: 4},
		{name: "over a small limit", id: "abcde", maxLen: 4, want: "is 5 bytes long; the limit is 4"},
		{name: "length checked first", id: "a b c", maxLen: 4, want: "bytes long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			maxLen := tc.maxLen
			if maxLen == 0 {
				maxLen = DefaultMaxSessionIDLength
			}
			got := CheckSessionID(tc.id, maxLen)
			switch {
			case tc.want == "" && got != "":
				t.Errorf("CheckSessionID(%q) = %q, want it accepted", tc.id, got)
			case tc.want != "" && !strings.Contains(got, tc.want):
				t.Errorf("CheckSessionID(%q) = %q, want it to contain %q", tc.id, got, tc.want)
			}
		})
	}
}

// FuzzSessionHeader feeds arbitrary Mcp-Session-Id and Connection values
// to the request header check: it must never panic, and whatever it
// accepts must be one value of 1 to max_session_id_length visible ASCII
// bytes that Connection does not name, returned unchanged.
func FuzzSessionHeader(f *testing.F) {
	for _, seed := range []struct {
		id, connection string
		twice          bool
	}{
		{testSessionID, "", false},
		{testSessionID, "keep-alive", false},
		{testSessionID, "keep-alive, mcp-session-id", false},
		{testSessionID, "MCP-SESSION-ID", false},
		{testSessionID, "", true},
		{"", "", false},
		{"a b", "", false},
		{"sessión", "", false},
		{"a\x00", "close", false},
		{strings.Repeat("a", DefaultMaxSessionIDLength+1), "", false},
		{"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl", "Upgrade,  Mcp-Session-Id ", false},
	} {
		f.Add(seed.id, seed.connection, seed.twice)
	}
	f.Fuzz(func(t *testing.T, id, connection string, twice bool) {
		h := http.Header{HeaderSessionID: {id}}
		if twice {
			h[HeaderSessionID] = append(h[HeaderSessionID], id)
		}
		if connection != "" {
			h["Connection"] = []string{connection}
		}
		got, problem := SessionOf(h, DefaultMaxSessionIDLength)
		if problem != "" {
			if got != "" {
				t.Fatalf("refused (%s) but returned %q", problem, got)
			}
			return
		}
		if twice || got != id || len(id) == 0 || len(id) > DefaultMaxSessionIDLength {
			t.Fatalf("accepted %q (sent twice: %v) as %q", id, twice, got)
		}
		for i := range len(id) {
			if id[i] < 0x21 || id[i] > 0x7e {
				t.Fatalf("accepted %q with byte %#x", id, id[i])
			}
		}
		for _, tok := range strings.Split(connection, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), HeaderSessionID) {
				t.Fatalf("accepted a session that Connection %q strips", connection)
			}
		}
	})
}
