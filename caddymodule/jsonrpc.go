package caddymodule

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
)

// JSON-RPC error codes of the plugin's own answers (internal/mcpwire
// documents each).
const (
	// CodeInvalidRequest is JSON-RPC 2.0's "Invalid Request" (JSON-RPC 2.0 §5.1),
	// used for a malformed Mcp-Session-Id.
	CodeInvalidRequest = mcpwire.CodeInvalidRequest
	// CodeSessionNotFound is the code the MCP TypeScript SDK answers an unknown
	// session with, in the implementation-defined server error range (JSON-RPC 2.0 §5.1).
	CodeSessionNotFound = mcpwire.CodeSessionNotFound
	// CodeUpstreamUnavailable answers a request whose session's upstream is
	// failing health checks (HTTP 503), in the implementation-defined server
	// error range (JSON-RPC 2.0 §5.1). Not -32002, which MCP assigns to
	// "resource not found" (MCP 2025-11-25, server/resources §Error Handling).
	CodeUpstreamUnavailable = mcpwire.CodeUpstreamUnavailable
	// CodeHeaderMismatch is MCP's HeaderMismatch error: a request's MCP headers
	// are missing, malformed or disagree with its body (MCP 2026-07-28
	// transports, §Server Validation).
	CodeHeaderMismatch = mcpwire.CodeHeaderMismatch
	// CodeParseError is JSON-RPC 2.0's "Parse error": the body is not JSON (JSON-RPC 2.0 §5.1).
	CodeParseError = mcpwire.CodeParseError
	// CodeUpstreamTimeout answers a request whose upstream sent no response
	// headers within the proxy's bound (HTTP 504), in the implementation-defined
	// server error range (JSON-RPC 2.0 §5.1).
	CodeUpstreamTimeout = -32004
)

// writeSessionNotFound answers 404, which tells MCP clients to start a new
// session (MCP 2025-03-26 transports, §Session Management).
func writeSessionNotFound(w http.ResponseWriter, message string) error {
	return mcpwire.WriteError(w, http.StatusNotFound, nil, CodeSessionNotFound, message)
}

// writeBadSession answers 400 for a malformed Mcp-Session-Id.
func writeBadSession(w http.ResponseWriter, reason string) error {
	return mcpwire.WriteError(w, http.StatusBadRequest, nil, CodeInvalidRequest, "Bad Request: "+reason)
}

// fingerprint returns a short, non-reversible name for a session ID, for
// logs: the first 12 hex digits of its SHA-256. A sealed session's table
// key gets the fingerprint of the sealed value the client holds, so that
// the debug log, the admin API and {mcp.session_fingerprint} agree.
func fingerprint(id string) string {
	sum := sha256.Sum256([]byte(clientID(id)))
	return hex.EncodeToString(sum[:6])
}
