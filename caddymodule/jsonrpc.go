package caddymodule

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
)

// JSON-RPC error codes of the plugin's own answers.
const (
	// CodeInvalidRequest is JSON-RPC 2.0's "Invalid Request" (JSON-RPC 2.0 §5.1),
	// used for a malformed Mcp-Session-Id.
	CodeInvalidRequest = -32600
	// CodeSessionNotFound is the code the MCP TypeScript SDK answers an unknown
	// session with, in the implementation-defined server error range (JSON-RPC 2.0 §5.1).
	CodeSessionNotFound = -32001
	// CodeUpstreamUnavailable answers a request whose session's upstream is
	// failing health checks (HTTP 503), in the implementation-defined server
	// error range (JSON-RPC 2.0 §5.1). Not -32002, which MCP assigns to
	// "resource not found" (MCP 2025-11-25, server/resources §Error Handling).
	CodeUpstreamUnavailable = -32003
)

// rpcError is a JSON-RPC 2.0 error response with a null id (JSON-RPC 2.0 §5).
type rpcError struct {
	JSONRPC string   `json:"jsonrpc"`
	ID      *int     `json:"id"`
	Error   rpcCause `json:"error"`
}

type rpcCause struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// writeRPCError answers with status and a JSON-RPC error body.
func writeRPCError(w http.ResponseWriter, status, code int, message string) error {
	body, err := json.Marshal(rpcError{JSONRPC: "2.0", Error: rpcCause{Code: code, Message: message}})
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, err = w.Write(body)
	return err
}

// writeSessionNotFound answers 404, which tells MCP clients to start a new
// session (MCP 2025-03-26 transports, §Session Management).
func writeSessionNotFound(w http.ResponseWriter, message string) error {
	return writeRPCError(w, http.StatusNotFound, CodeSessionNotFound, message)
}

// writeBadSession answers 400 for a malformed Mcp-Session-Id.
func writeBadSession(w http.ResponseWriter, reason string) error {
	return writeRPCError(w, http.StatusBadRequest, CodeInvalidRequest, "Bad Request: "+reason)
}

// fingerprint returns a short, non-reversible name for a session ID, for
// logs: the first 12 hex digits of its SHA-256. A sealed session's table
// key gets the fingerprint of the sealed value the client holds, so that
// the debug log, the admin API and {mcp.session_fingerprint} agree.
func fingerprint(id string) string {
	sum := sha256.Sum256([]byte(clientID(id)))
	return hex.EncodeToString(sum[:6])
}
