package caddymodule

import (
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/seal"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
)

// isSealVersion reports whether b is a format version of sealed IDs.
func isSealVersion(b byte) bool { return seal.IsSessionVersion(b) }

// decodeSealed returns the decoded bytes of id if it has the encoding and
// version of a sealed ID, without opening it.
func decodeSealed(id string) (string, bool) {
	raw, ok := seal.Decode(id)
	if !ok || len(raw) == 0 || !isSealVersion(raw[0]) {
		return "", false
	}
	return raw, true
}

// clientID returns the Mcp-Session-Id the client holds for a table key.
func clientID(key string) string {
	if len(key) > 0 && isSealVersion(key[0]) {
		return seal.Encode(key)
	}
	return key
}

// adminKey returns the table key of a session ID given to the admin API:
// the ID itself if the table holds it, else a sealed ID's decoded bytes.
func adminKey(t *session.Table, id string) string {
	if _, ok := t.Info(id); ok {
		return id
	}
	if key, ok := decodeSealed(id); ok {
		return key
	}
	return id
}
