package mcpwire

// ModernVersion is the first MCP protocol version without sessions (MCP
// 2026-07-28). Versions are dates, so they compare as strings.
const ModernVersion = "2026-07-28"

// IsVersion reports whether v has the shape of an MCP protocol version,
// YYYY-MM-DD (MCP, Versioning).
func IsVersion(v string) bool {
	if len(v) != len("2006-01-02") {
		return false
	}
	for i := range len(v) {
		if c := v[i]; (i == 4 || i == 7) != (c == '-') || c != '-' && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// AtLeast reports whether v is a protocol version no older than min.
func AtLeast(v, min string) bool { return IsVersion(v) && v >= min }

// Before reports whether v is a protocol version older than limit.
func Before(v, limit string) bool { return IsVersion(v) && v < limit }
