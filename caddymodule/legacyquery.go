package caddymodule

import (
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
)

// DefaultLegacySSEParams are the query parameters that carry the session of
// a legacy HTTP+SSE POST by default, as the MCP SDKs spell them: `sessionId`
// (TypeScript SDK, mcp-go), `session_id` (Python SDK), `sessionid` (Go SDK).
var DefaultLegacySSEParams = []string{"sessionId", "session_id", "sessionid"}

// legacySessionOf returns the legacy HTTP+SSE session that r names in one
// of the query parameters params, or why it cannot be used (see
// querySession). The query of every request is read but a CORS
// preflight's (see readsQuerySession).
func legacySessionOf(r *http.Request, params []string, maxLen int) (id, problem string) {
	if len(params) == 0 || !readsQuerySession(r) {
		return "", ""
	}
	return querySession(r.URL.RawQuery, params, maxLen)
}

// readsQuerySession reports whether the query of r can name a legacy
// HTTP+SSE session: that of any request but a CORS preflight, an OPTIONS
// without a body, which carries no credentials and no message. The spec's
// message endpoint takes POSTs, but servers act on the session of any
// method: python-sdk's SseServerTransport delivers the body of a PUT or a
// GET to its `session_id` as it does a POST's.
func readsQuerySession(r *http.Request) bool {
	return r.URL.RawQuery != "" && (r.Method != http.MethodOptions || r.ContentLength != 0)
}

// querySession returns the session that the raw query names in one of
// params, or why the proxy refuses the query. The proxy must check the
// session a server acts in, so it reads the query as the servers do, and
// more: pairs split at '&' whatever their number (Go's url.ParseQuery reads
// none of a query of more than 10000, where Node's URLSearchParams and
// Python's parse_qsl read them all); a pair split at ';' too (Python before
// 3.9.2 splits there, Go skips the pair, Node does neither); keys decoded
// leniently (an invalid escape kept as sent, as Node and Python keep it);
// and a key that is a parameter followed by '[' (Express's qs reads
// `sessionId[]=a` as sessionId). A session named in any way but once,
// plainly (`<param>=<session>` between '&', no ';', valid escapes), is a
// problem: servers could read another session than the proxy, or none.
func querySession(raw string, params []string, maxLen int) (id, problem string) {
	var named []string
	for pair := range strings.SplitSeq(raw, "&") {
		param, key, value, plain := readPair(pair, params)
		if strings.IndexByte(pair, ';') >= 0 {
			for piece := range strings.SplitSeq(pair, ";") {
				if p, _, _, _ := readPair(piece, params); p != "" {
					param = p
				}
			}
			if param != "" {
				return "", fmt.Sprintf("query parameter %s is in a pair with ';', which servers split differently; "+
					"send %s=<session> between '&' only", param, param)
			}
		}
		switch {
		case param == "":
			continue
		case key != param:
			return "", fmt.Sprintf("query parameter %q is read as %s by some servers (Express's qs); send %s=<session> without brackets",
				key, param, param)
		case !plain:
			return "", fmt.Sprintf("query parameter %s has a malformed percent-encoding, which servers read differently; "+
				"escape bytes as %%XX with two hex digits", param)
		}
		named, id = append(named, param), value
	}
	switch {
	case len(named) == 0:
		return "", ""
	case len(named) > 1:
		return "", fmt.Sprintf("the query names the legacy SSE session more than once (%s); send one of %s once",
			strings.Join(named, ", "), strings.Join(params, ", "))
	}
	if reason := mcpwire.CheckSessionID(id, maxLen); reason != "" {
		return "", "query parameter " + named[0] + " " + reason
	}
	return id, ""
}

// readPair reads one key=value pair of a query: the parameter of params its
// key names (the key itself, or the key up to a '['), the key and value
// percent-decoded, and whether both decoded without an invalid escape.
func readPair(pair string, params []string) (param, key, value string, plain bool) {
	k, v, _ := strings.Cut(pair, "=")
	key, keyOK := unescapeQuery(k)
	param = key
	if i := strings.IndexByte(key, '['); i > 0 {
		param = key[:i]
	}
	if !slices.Contains(params, param) {
		return "", "", "", false
	}
	value, valueOK := unescapeQuery(v)
	return param, key, value, keyOK && valueOK
}

// unescapeQuery decodes a query key or value as url.QueryUnescape does
// ('+' is a space, %XX a byte) and reports whether it was valid. An invalid
// escape is kept as sent, as lenient decoders (Node's URLSearchParams,
// Python's unquote) keep it.
func unescapeQuery(s string) (string, bool) {
	if v, err := url.QueryUnescape(s); err == nil {
		return v, true
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			b.WriteByte(' ')
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			n, _ := strconv.ParseUint(s[i+1:i+3], 16, 8)
			b.WriteByte(byte(n))
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), false
}

// isHex reports whether c is a hexadecimal digit.
func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// hasLegacySession reports whether a query names a legacy HTTP+SSE session
// in one of [DefaultLegacySSEParams], usably or not. It is what matchers
// and metrics know of a request, before any handler's own
// legacy_sse_params apply.
func hasLegacySession(rawQuery string) bool {
	id, problem := querySession(rawQuery, DefaultLegacySSEParams, math.MaxInt)
	return id != "" || problem != ""
}
