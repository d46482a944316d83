package mcpwire

import (
	"encoding/json"
	"net/http"
)

// JSON-RPC error codes of the proxy's own answers.
const (
	// CodeParseError is JSON-RPC 2.0's "Parse error": the body is not JSON
	// (JSON-RPC 2.0 §5.1).
	CodeParseError = -32700
	// CodeInvalidRequest is JSON-RPC 2.0's "Invalid Request" (JSON-RPC 2.0
	// §5.1), used for a malformed Mcp-Session-Id or message.
	CodeInvalidRequest = -32600
	// CodeInternalError is JSON-RPC 2.0's "Internal error" (JSON-RPC 2.0
	// §5.1), used when the proxy itself cannot serve a request.
	CodeInternalError = -32603
	// CodeSessionNotFound is the code the MCP TypeScript SDK answers an
	// unknown session with, in the implementation-defined server error
	// range (JSON-RPC 2.0 §5.1).
	CodeSessionNotFound = -32001
	// CodeUpstreamUnavailable answers a request whose session's upstream
	// is failing health checks (HTTP 503), in the implementation-defined
	// server error range (JSON-RPC 2.0 §5.1). Not -32002, which MCP assigns
	// to "resource not found" (MCP 2025-11-25, server/resources §Error
	// Handling).
	CodeUpstreamUnavailable = -32003
	// CodeHeaderMismatch is MCP's HeaderMismatch error: a request's MCP
	// headers are missing, malformed or disagree with its body (MCP
	// 2026-07-28 transports, §Server Validation).
	CodeHeaderMismatch = -32020
)

// errorBody is a JSON-RPC 2.0 error response (JSON-RPC 2.0 §5).
type errorBody struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   errorObject     `json:"error"`
}

// errorObject is the error member of an error response (JSON-RPC 2.0 §5.1).
type errorObject struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// ErrorBody returns the JSON-RPC 2.0 error response of code and message
// to the request of JSON-RPC id id (JSON-RPC 2.0 §5): id is the request's
// id as JSON text, or nil for null, the id of an answer to a request whose
// id is unknown. It errors only on an id that is not JSON.
func ErrorBody(id json.RawMessage, code int, message string) ([]byte, error) {
	if id == nil {
		id = json.RawMessage("null")
	}
	return json.Marshal(errorBody{JSONRPC: "2.0", ID: id, Error: errorObject{Code: code, Message: message}})
}

// WriteError answers on w with HTTP status and the JSON-RPC error body of
// [ErrorBody], as application/json that no cache may keep. Every answer
// the proxy gives itself goes through it.
func WriteError(w http.ResponseWriter, status int, id json.RawMessage, code int, message string) error {
	body, err := ErrorBody(id, code, message)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, err = w.Write(body)
	return err
}
