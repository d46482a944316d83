package mcpwire

import (
	"encoding/json"
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
		if got := IsInitialize([]byte(c.body), false); got != c.single {
			t.Errorf("IsInitialize(%s, no batch) = %v, want %v", c.body, got, c.single)
		}
		if got := IsInitialize([]byte(c.body), true); got != c.any {
			t.Errorf("IsInitialize(%s, batch) = %v, want %v", c.body, got, c.any)
		}
	}
}

// FuzzParseRPC feeds arbitrary bodies to the JSON-RPC parser that the mcp
// matcher and initialize_timeout read requests with: it must never panic,
// and whatever it accepts, encoding/json (as mcp-go decodes it) must read
// the same method, id and params.name: a body the proxy routes as one call
// cannot reach the server as another. FuzzLooseKeys builds the keys that
// only fold to these names.
func FuzzParseRPC(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}`,
		`{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"render","arguments":{}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"method":"tools/call","Method":"initialize"}`,
		`{"method":"a","method":"b"}`,
		`{"method":"\u0069nitialize"}`,
		`[{"method":"initialize"}]`,
		`{"params":{"name":"x","name":"y"},"method":"tools/call"}`,
		`"initialize"`, ``, `{`, `{"method":1}`, `{"id":null,"method":"ping"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		head, perr := Parse(body)
		if perr != nil {
			if head != nil || perr.Code != CodeParseError && perr.Code != CodeInvalidRequest || perr.Message == "" {
				t.Fatalf("refused with head %+v, error %+v", head, perr)
			}
			return
		}
		var std struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		if err := json.Unmarshal(body, &std); err != nil {
			return // a shape encoding/json refuses (e.g. method not a string) reaches no method
		}
		if std.Method != head.Method || head.Method == "tools/call" && std.Params.Name != head.Name {
			t.Fatalf("Parse read method %q name %q; encoding/json reads %q %q in %s", head.Method, head.Name, std.Method, std.Params.Name, body)
		}
	})
}

// TestInitializeClassifiedOnce: bodies that the json.Decoder reader
// failover and stale sessions used before (main a187596) took for an
// initialize while the mcp matcher's scanner refused them. Now one scanner
// reads both: each is refused, and is no initialize, alone or in a batch.
// A well-formed initialize stays one, so the refusals prove something.
func TestInitializeClassifiedOnce(t *testing.T) {
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","Params":{}}`,                                                         // Params folds to params
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"name":7}}`,                                                 // params.name not a string
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":2025}}}`, // a number
		`{"jsonrpc":"2.0","id":1,"method":"initialize"} {"method":"ping"}`,                                                   // two messages
		`[{"jsonrpc":"2.0","id":1,"method":"initialize"},{"jsonrpc":"2.0","id":2,"method":"ping","METHOD":"x"}]`,             // a member refused
		`[{"jsonrpc":"2.0","id":1,"method":"initialize"},7]`,                                                                 // a member not an object
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"name":7,"cut`,                                              // cut, after a refusal
	} {
		if _, err := Parse([]byte(body)); err == nil {
			t.Errorf("Parse accepted %s", body)
		}
		for _, batch := range []bool{false, true} {
			if IsInitialize([]byte(body), batch) {
				t.Errorf("IsInitialize(%s, batch %v) = true; Parse refuses it", body, batch)
			}
		}
	}
	if good := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"name":"x"}}`; !IsInitialize([]byte(good), false) {
		t.Fatalf("IsInitialize(%s) = false", good)
	}
}

// FuzzIsInitialize: for any body, and any prefix of it, IsInitialize never
// panics; for a whole JSON body it agrees with Parse: an initialize
// exactly when Parse reads one (as the message, or with batch as a member
// of the batch).
func FuzzIsInitialize(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}`,
		`[{"jsonrpc":"2.0","method":"notifications/x"},{"jsonrpc":"2.0","id":1,"method":"initialize"}]`,
		`{"method":"initialize","Method":"x"}`, `{"method":"initialize","params":{"name":1}}`,
		`{"a":"\\`, `{"method":"initialize", "x" 1`, `[{"method":"initialize"}`, `{"method"`, `{"method" `, `{`, `[`, ``,
	} {
		f.Add([]byte(seed), uint16(len(seed)))
	}
	f.Fuzz(func(t *testing.T, body []byte, cut uint16) {
		prefix := body[:int(cut)%(len(body)+1)]
		for _, batch := range []bool{false, true} {
			IsInitialize(prefix, batch)
			if !json.Valid(body) {
				continue
			}
			head, err := Parse(body)
			want := err == nil && (head.Method == "initialize" || batch && hasInitialize(head))
			if got := IsInitialize(body, batch); got != want {
				t.Fatalf("IsInitialize(%s, batch %v) = %v; Parse reads %+v, %v", body, batch, got, head, err)
			}
		}
	})
}
