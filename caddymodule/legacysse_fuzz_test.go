package caddymodule

import (
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
)

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
		if reason := mcpwire.CheckSessionID(id, 256); reason != "" {
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
