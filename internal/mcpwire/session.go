package mcpwire

import (
	"fmt"
	"net/http"
	"strings"
)

// HeaderSessionID is the MCP session header, in Go's canonical spelling
// (MCP 2025-03-26 transports, §Session Management).
const HeaderSessionID = "Mcp-Session-Id"

// CheckSessionID returns why id is not a usable Mcp-Session-Id, or "" if
// it is: it must be 1 to maxLen bytes of visible ASCII, 0x21-0x7E (MCP
// 2025-03-26 transports, §Session Management). The reason reads after
// "Mcp-Session-Id ", such as "is empty".
func CheckSessionID(id string, maxLen int) string {
	if id == "" {
		return "is empty"
	}
	if len(id) > maxLen {
		return fmt.Sprintf("is %d bytes long; the limit is %d (max_session_id_length)", len(id), maxLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return fmt.Sprintf("has byte 0x%02x at offset %d; only visible ASCII 0x21-0x7E is allowed", c, i)
		}
	}
	return ""
}

// SessionOf returns the session ID of a request with header h, or why its
// Mcp-Session-Id cannot be used: sent more than once (or not at all),
// malformed (see [CheckSessionID]), or named in Connection. A proxy strips
// the fields that Connection names before forwarding (RFC 9110 §7.6.1), so
// the upstream would get the request without the session the proxy pinned
// it on.
func SessionOf(h http.Header, maxLen int) (id, problem string) {
	ids := h[HeaderSessionID]
	if len(ids) != 1 {
		return "", fmt.Sprintf("Mcp-Session-Id was sent %d times; send it once", len(ids))
	}
	if reason := CheckSessionID(ids[0], maxLen); reason != "" {
		return "", "Mcp-Session-Id " + reason
	}
	if NamedInConnection(h, HeaderSessionID) {
		return "", "Connection names Mcp-Session-Id, which would strip the session from the forwarded request; " +
			"remove Mcp-Session-Id from Connection"
	}
	return ids[0], ""
}

// NamedInConnection reports whether the Connection fields of h list name
// (case-insensitive, RFC 9110 §7.6.1).
func NamedInConnection(h http.Header, name string) bool {
	for _, v := range h["Connection"] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), name) {
				return true
			}
		}
	}
	return false
}
