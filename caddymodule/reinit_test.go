package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestStaleInitializeKeepsBody checks that looking at a body passes it on
// unchanged, even one longer than the prefix read, and that only POSTs are
// looked at.
func TestStaleInitializeKeepsBody(t *testing.T) {
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"pad":"` + strings.Repeat("x", 2*maxInitPrefix) + `"}}`
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	if stale, _ := staleInitialize(r, nil); !stale {
		t.Fatal("an initialize longer than the prefix was not recognised")
	}
	got, _ := io.ReadAll(r.Body)
	if string(got) != body {
		t.Fatalf("the body passed on is %d bytes, want the %d sent", len(got), len(body))
	}
	if stale, _ := staleInitialize(httptest.NewRequest(http.MethodGet, "/mcp", strings.NewReader(body)), nil); stale {
		t.Fatal("a GET was taken for an initialize")
	}
	modern := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	modern.Header.Set(HeaderMethod, "tools/call")
	if stale, _ := staleInitialize(modern, nil); stale {
		t.Fatal("Mcp-Method tools/call was taken for an initialize")
	}
}
