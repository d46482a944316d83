package caddymodule

import (
	"bytes"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// FuzzSSEEvent: for any bytes an upstream's GET stream starts with, finding
// the first block and reading its event never panics, the block ends at a
// blank line within the input, and the data span is the event's data.
func FuzzSSEEvent(f *testing.F) {
	for _, s := range []string{
		"event: endpoint\ndata: /m?sessionid=A\n\nevent: message\n", "event: endpoint\r\ndata: /m?x=1\r\n\r\n",
		"event:endpoint\rdata:/m\r\r", ": ping\n\n", "event: endpoint\n\n", "data: a\ndata: b\n\n", "\n", "\r\n\r\n",
		"event: endpoint\ndata: /m?sessionId=A\n", "data:\x00\xff\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		end := blockEnd(in)
		if end < 0 {
			return
		}
		if end == 0 || end > len(in) || (in[end-1] != '\n' && in[end-1] != '\r') {
			t.Fatalf("blockEnd(%q) = %d: not the end of a line within the input", in, end)
		}
		block := in[:end]
		ev := parseEvent(block)
		if ev.dataLines < 0 || ev.dataStart < 0 || ev.dataStart > ev.dataEnd || ev.dataEnd > len(block) {
			t.Fatalf("parseEvent(%q): data span %d..%d, %d data lines", block, ev.dataStart, ev.dataEnd, ev.dataLines)
		}
		if ev.dataLines == 1 && !bytes.Equal(block[ev.dataStart:ev.dataEnd], ev.data) {
			t.Fatalf("parseEvent(%q): data %q, span %q", block, ev.data, block[ev.dataStart:ev.dataEnd])
		}
		if bytes.ContainsAny(ev.data, "\r\n") {
			t.Fatalf("parseEvent(%q): data %q spans lines", block, ev.data)
		}
	})
}

// FuzzLegacySessionQuery: for any query string of a legacy POST, the
// session it names is one value of one configured parameter, passes the
// session ID check, or the request is refused with a reason; never both,
// never a panic.
func FuzzLegacySessionQuery(f *testing.F) {
	for _, s := range []string{
		"sessionId=abc", "session_id=abc&sessionid=abc", "sessionid=", "sessionId=a%20b", "x=1&sessionId=%ZZ",
		"sessionId=a&sessionId=b", "sessionid=" + strings.Repeat("a", 300), ";sessionId=a",
		"sessionId[]=a", "sessionId=a" + strings.Repeat("&", 10000), "session%49d=a", "sessionId=a;b",
	} {
		f.Add(s)
	}
	params := DefaultLegacySSEParams
	f.Fuzz(func(t *testing.T, rawQuery string) {
		r := httptest.NewRequest("POST", "http://example.com/message", nil)
		r.URL.RawQuery = rawQuery
		id, problem := legacySessionOf(r, params, 256)
		if id != "" && problem != "" {
			t.Fatalf("query %q: both session %q and problem %q", rawQuery, id, problem)
		}
		if id == "" {
			return
		}
		if reason := checkSessionID(id, 256); reason != "" {
			t.Fatalf("query %q: session %q fails the session ID check: %s", rawQuery, id, reason)
		}
		named := 0 // pairs naming a session, as url.ParseQuery reads them, with no limit on their number
		for pair := range strings.SplitSeq(rawQuery, "&") {
			k, _, _ := strings.Cut(pair, "=")
			if key, err := url.QueryUnescape(k); err == nil && slices.Contains(params, key) {
				named++
				if strings.Contains(pair, ";") {
					t.Fatalf("query %q: session %q taken from a pair with ';', which servers split differently", rawQuery, id)
				}
			}
		}
		if named != 1 {
			t.Fatalf("query %q: session %q taken from a query that names a session %d times", rawQuery, id, named)
		}
	})
}
