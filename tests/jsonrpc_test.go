package tests

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// rpcError is a JSON-RPC 2.0 error response body.
type rpcError struct {
	JSONRPC string `json:"jsonrpc"`
	ID      any    `json:"id"`
	Error   struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// parseRPCError decodes a JSON-RPC error response body.
func parseRPCError(body string) (rpcError, error) {
	var e rpcError
	err := json.Unmarshal([]byte(body), &e)
	return e, err
}

// rpcErrorCode returns the error code of a JSON-RPC error body, or 0.
func rpcErrorCode(body string) int {
	e, _ := parseRPCError(body)
	return e.Error.Code
}

// checkProxy404 asserts that ex is the proxy's own 404 for a session it
// does not hold (docs/behaviour.md, "What happens when"): a JSON-RPC error with id
// null and code -32001 as application/json, so that clients re-initialize.
func checkProxy404(t testing.TB, ex exchange) {
	t.Helper()
	e, err := parseRPCError(ex.body)
	if ex.status != http.StatusNotFound || err != nil || e.JSONRPC != "2.0" || e.ID != nil || e.Error.Code != -32001 ||
		ex.header.Get("Content-Type") != "application/json" {
		t.Fatalf("%s: want the proxy's 404 (JSON-RPC -32001, id null, application/json); got %d %v %q",
			ex.step, ex.status, ex.header, ex.body)
	}
}

// checkBadRequest asserts that ex is a 400 whose JSON-RPC message contains reason.
func checkBadRequest(t testing.TB, ex exchange, reason string) {
	t.Helper()
	e, err := parseRPCError(ex.body)
	if ex.status != http.StatusBadRequest || err != nil || e.JSONRPC != "2.0" || !strings.Contains(e.Error.Message, reason) {
		t.Fatalf("want 400 JSON-RPC error mentioning %q, got %d %s", reason, ex.status, ex.body)
	}
}

// rpcMessage extracts the JSON-RPC message from a JSON or SSE response body.
func rpcMessage(body string) (json.RawMessage, error) {
	body = strings.TrimSpace(body)
	if strings.HasPrefix(body, "{") {
		return json.RawMessage(body), nil
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && strings.HasPrefix(data, "{") {
			return json.RawMessage(data), nil
		}
	}
	return nil, fmt.Errorf("no JSON-RPC message in %q", body)
}
