package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestIsInitialize checks how an initialize request is recognised in a
// body or its prefix, alone and in a batch.
func TestIsInitialize(t *testing.T) {
	for _, c := range []struct {
		body        string
		single, any bool
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`, true, true},
		{`{"method":"initialize","params":{"capabilities":{}},"jsonrpc":"2.0","id":0}`, true, true},
		{`{"params":{"clientInfo":{"name":"initialize"}},"method":"initialize","id":1}`, true, true},
		{`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"cut short`, true, true},
		{`{"jsonrpc":"2.0","id":1,"params":{"cut short","method":"initialize"`, false, false},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"initialize"}}`, false, false},
		{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, false, false},
		{`{"jsonrpc":"2.0","id":1,"method":"Initialize"}`, false, false},
		{`[{"jsonrpc":"2.0","method":"notifications/x"},{"jsonrpc":"2.0","id":1,"method":"initialize"}]`, false, true},
		{`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, false, false},
		{`["initialize"]`, false, false},
		{`"initialize"`, false, false},
		{``, false, false},
	} {
		if got := isInitialize([]byte(c.body), false); got != c.single {
			t.Errorf("isInitialize(%s, no batch) = %v, want %v", c.body, got, c.single)
		}
		if got := isInitialize([]byte(c.body), true); got != c.any {
			t.Errorf("isInitialize(%s, batch) = %v, want %v", c.body, got, c.any)
		}
	}
}

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
