package caddymodule

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"net/http"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// initAnswer is an initialize result as a server sends it.
const initAnswer = `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"s","version":"1"}}}`

// encode compresses s with enc, as a server's compression middleware does.
func encode(t *testing.T, enc, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	switch enc {
	case "gzip":
		w := gzip.NewWriter(&b)
		w.Write([]byte(s))
		w.Close()
	case "deflate":
		w, _ := flate.NewWriter(&b, flate.DefaultCompression)
		w.Write([]byte(s))
		w.Close()
	case "zstd":
		w, _ := zstd.NewWriter(&b)
		w.Write([]byte(s))
		w.Close()
	default:
		b.WriteString(s)
	}
	return b.Bytes()
}

// TestInitializeResultDecodes: the answer to a replayed initialize is read
// whatever Content-Encoding the server chose, as JSON and as SSE; an
// encoding the proxy does not decode is an error naming it, not a result.
func TestInitializeResultDecodes(t *testing.T) {
	for _, enc := range []string{"", "identity", "gzip", "x-gzip", "deflate", "zstd"} {
		for _, sse := range []bool{false, true} {
			body, ctype := initAnswer, "application/json"
			if sse {
				body, ctype = "event: message\ndata: "+initAnswer+"\n\n", "text/event-stream"
			}
			packed := enc
			if enc == "x-gzip" {
				packed = "gzip"
			}
			a := newUpstreamAnswer()
			a.header.Set("Content-Type", ctype)
			if enc != "" {
				a.header.Set("Content-Encoding", enc)
			}
			a.WriteHeader(http.StatusOK)
			a.Write(encode(t, packed, body))
			v, err := a.initializeResult()
			if err != nil || v != "2025-11-25" {
				t.Errorf("Content-Encoding %q, %s: version %q, error %v; want 2025-11-25", enc, ctype, v, err)
			}
		}
	}
	a := newUpstreamAnswer()
	a.header.Set("Content-Type", "application/json")
	a.header.Set("Content-Encoding", "br")
	a.Write([]byte{0x1b, 0x00})
	if _, err := a.initializeResult(); err == nil || !strings.Contains(err.Error(), `"br"`) {
		t.Errorf("brotli: error %v; want one naming the encoding", err)
	}
	a = newUpstreamAnswer()
	a.header.Set("Content-Encoding", "gzip")
	a.Write([]byte(initAnswer)) // says gzip, is not
	if _, err := a.initializeResult(); err == nil || !strings.Contains(err.Error(), "gzip") {
		t.Errorf("a body that does not decode: error %v; want one naming gzip", err)
	}
}

// TestReplayAsksForTheSessionsVersion: the replayed initialize asks for the
// session's negotiated version, and only an upstream that negotiates it
// takes the session.
func TestReplayAsksForTheSessionsVersion(t *testing.T) {
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"x":1},"clientInfo":{"name":"c","version":"1"}}}`)
	got := atVersion(body, "2025-06-18")
	if requestedVersion(got) != "2025-06-18" || !isInitialize(got, false) || !bytes.Contains(got, []byte(`"capabilities":{"x":1}`)) {
		t.Errorf("atVersion: %s; want the same initialize asking for 2025-06-18", got)
	}
	if got := atVersion(body, ""); !bytes.Equal(got, body) {
		t.Errorf("atVersion without a session version changed the body: %s", got)
	}
	if got := atVersion(body, "2025-11-25"); !bytes.Equal(got, body) {
		t.Errorf("atVersion of the version asked for changed the body: %s", got)
	}
	for _, c := range []struct {
		want, asked, version string
		ok                   bool
	}{
		{"2025-11-25", "2025-11-25", "2025-11-25", true},
		{"2025-11-25", "2025-11-25", "2025-06-18", false},
		{"2025-06-18", "2025-06-18", "2025-11-25", false},
		{"", "2025-03-26", "2025-03-26", true},
		{"", "2025-11-25", "2025-11-25", true},
		{"", "2025-11-25", "2025-06-18", false},
		{"", "2024-11-05", "2024-11-05", true},
		{"", "2025-11-25", "", false},
	} {
		if got := sameVersion(c.want, c.asked, c.version); got != c.ok {
			t.Errorf("sameVersion(%q, %q, %q) = %v, want %v", c.want, c.asked, c.version, got, c.ok)
		}
	}
}
