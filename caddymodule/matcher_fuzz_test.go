package caddymodule

import (
	"encoding/base64"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
)

// FuzzMatcherParsers covers what the mcp matcher parses from a request
// and its config: the Base64 sentinel of Mcp-Name (round trip, and any
// value decodes or is refused without a panic), `name` wildcards (against
// a regular expression of the same pattern) and protocol_version
// conditions.
func FuzzMatcherParsers(f *testing.F) {
	for _, s := range [][2]string{
		{"render_*", "render_chart"}, {"*", ""}, {"a*b*c", "aXbYc"}, {"**", "x"}, {"=?base64?aGk=?=", "=?base64?%%?="},
		{">=2026-07-28", "2026-07-28"}, {"!= 2025-06-18", "2025-13-45"}, {"", "\xff"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, s string) {
		if got, ok := decodeSentinel("=?base64?" + base64.StdEncoding.EncodeToString([]byte(s)) + "?="); !ok || got != s {
			t.Fatalf("sentinel of %q decodes to %q, %v", s, got, ok)
		}
		if got, ok := decodeSentinel(s); ok && !strings.HasPrefix(s, "=?base64?") && got != s {
			t.Fatalf("a plain value %q decodes to %q", s, got)
		}
		if utf8.ValidString(pattern) && utf8.ValidString(s) { // regexp reads runes; globMatch bytes
			re := regexp.MustCompile("(?s)^" + strings.ReplaceAll(regexp.QuoteMeta(pattern), `\*`, ".*") + "$")
			if got, want := globMatch(pattern, s), re.MatchString(s); got != want {
				t.Fatalf("globMatch(%q, %q) = %v, the regular expression says %v", pattern, s, got, want)
			}
		}
		if c, err := parseVersionCond(pattern); err == nil && c.holds(s) && !mcpwire.IsVersion(s) {
			t.Fatalf("condition %q holds for %q, which is not a version date", pattern, s)
		}
	})
}
