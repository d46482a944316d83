package mcpwire

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestWriteError: one writer answers with the status, JSON that no cache
// keeps, and a JSON-RPC 2.0 error response carrying the request's id, or
// null when it is unknown (JSON-RPC 2.0 §5).
func TestWriteError(t *testing.T) {
	for _, tc := range []struct {
		id   json.RawMessage
		want string
	}{
		{nil, `{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Session not found"}}`},
		{json.RawMessage(`7`), `{"jsonrpc":"2.0","id":7,"error":{"code":-32001,"message":"Session not found"}}`},
		{json.RawMessage(` "a" `), `{"jsonrpc":"2.0","id":"a","error":{"code":-32001,"message":"Session not found"}}`},
	} {
		rec := httptest.NewRecorder()
		if err := WriteError(rec, http.StatusNotFound, tc.id, CodeSessionNotFound, "Session not found"); err != nil {
			t.Fatal(err)
		}
		if rec.Code != http.StatusNotFound || rec.Body.String() != tc.want {
			t.Errorf("id %s: %d %s, want 404 %s", tc.id, rec.Code, rec.Body, tc.want)
		}
		if rec.Header().Get("Content-Type") != "application/json" || rec.Header().Get("Cache-Control") != "no-store" {
			t.Errorf("id %s: headers %v", tc.id, rec.Header())
		}
	}
	if err := WriteError(httptest.NewRecorder(), 400, json.RawMessage(`{`), CodeInvalidRequest, "x"); err == nil {
		t.Error("an id that is not JSON was written")
	}
}
