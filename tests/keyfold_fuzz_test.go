package tests

import (
	"bytes"
	"context"
	stdjson "encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	mgmcp "github.com/mark3labs/mcp-go/mcp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	segjson "github.com/segmentio/encoding/json"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/loosekeys"
)

// rpcView is what a reader of a JSON-RPC request takes from it: its method
// and the name Mcp-Name mirrors (the tool or prompt name, the resource URI).
type rpcView struct{ method, name string }

// FuzzLooseKeysSDKDecoders builds JSON-RPC requests whose keys are
// respelled from the Unicode case-fold classes of their characters
// (internal/loosekeys: "paramſ", "param\u017f", "Method", the Kelvin sign
// for k, escapes, look-alikes that do not fold) and checks the `mcp`
// matcher, through its exported API, against the decoders of both Go MCP
// SDKs on their own request types: the go-sdk's (jsonrpc.DecodeMessage,
// then segmentio/encoding/json with DontMatchCaseInsensitiveStructFields,
// as its internal/json decodes params) and mcp-go's (encoding/json, which
// folds keys). Whenever a decoder reads another method or name than the
// matcher, the matcher must have refused the body. caddymodule's
// FuzzLooseKeys checks the parser itself against encoding/json, _meta
// included.
func FuzzLooseKeysSDKDecoders(f *testing.F) {
	for _, seed := range []struct {
		body  string
		spell []byte
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"danger","arguments":{}}}`, nil},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"safe"},"paramſ":{"name":"danger"}}`, nil},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","param\u017f":{"name":"danger"}}`, nil},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"danger"}}`, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"danger"}}`, []byte{0x11, 0x20, 0x01, 0x30, 0xff}},
		{`{"jsonrpc":"2.0","id":2,"method":"prompts/get","params":{"name":"p","NAME":"q"}}`, nil},
		{`{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"file:///a","Uri":"file:///b"}}`, nil},
		{`{"jsonrpc":"2.0","id":4,"method":"ping","Method":"tools/call","params":{"name":"danger"}}`, nil},
		{`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"danger","task":{},"tas\u212a":{}}}`, nil},
		{"{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"tools/call\",\"params\":{\"name\":\"dan\xffger\"}}", nil},
	} {
		f.Add([]byte(seed.body), seed.spell)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	m := &caddymodule.MatchMCP{Body: true}
	if err := m.Provision(ctx); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body, spell []byte) {
		body = loosekeys.Respell(body, spell)
		seen, ok := matcherView(m, body)
		if !ok {
			return // refused
		}
		for _, d := range []struct {
			name string
			read func([]byte) (rpcView, bool)
		}{{"the go-sdk", goSDKView}, {"mcp-go", mcpGoView}} {
			if got, ok := d.read(body); ok && got != seen {
				t.Fatalf("the matcher accepted %s reading %+q; %s reads %+q", body, seen, d.name, got)
			}
		}
	})
}

// matcherView runs m, which has no conditions but body, on a POST of body
// without MCP headers, and returns what it read, from the {mcp.method} and
// {mcp.name} placeholders; false if it refused the body (it matches any
// body it can read).
func matcherView(m *caddymodule.MatchMCP, body []byte) (rpcView, bool) {
	r := httptest.NewRequest(http.MethodPost, "/mcp", bytes.NewReader(body))
	repl := caddy.NewReplacer()
	c := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
	c = context.WithValue(c, caddyhttp.VarsCtxKey, map[string]any{})
	r = r.WithContext(c)
	if !m.Match(r) {
		return rpcView{}, false
	}
	method, _ := repl.GetString("mcp.method")
	name, _ := repl.GetString("mcp.name")
	return rpcView{method, name}, true
}

// goSDKView reads body as a go-sdk server does: the message with
// jsonrpc.DecodeMessage, the params of named methods into the go-sdk's
// params types with segmentio/encoding/json set up as the go-sdk's
// internal/json sets it up (keys matched exactly). false if it refuses.
func goSDKView(body []byte) (rpcView, bool) {
	msg, err := jsonrpc.DecodeMessage(body)
	if err != nil {
		return rpcView{}, false
	}
	req, ok := msg.(*jsonrpc.Request)
	if !ok {
		return rpcView{}, true // a response: no method
	}
	v := rpcView{method: req.Method}
	decode := func(p any) bool {
		if len(req.Params) == 0 {
			return true
		}
		dec := segjson.NewDecoder(bytes.NewReader(req.Params))
		dec.DontMatchCaseInsensitiveStructFields()
		return dec.Decode(p) == nil
	}
	switch req.Method {
	case "tools/call":
		var p mcp.CallToolParamsRaw
		ok = decode(&p)
		v.name = p.Name
	case "prompts/get":
		var p mcp.GetPromptParams
		ok = decode(&p)
		v.name = p.Name
	case "resources/read":
		var p mcp.ReadResourceParams
		ok = decode(&p)
		v.name = p.URI
	}
	return v, ok
}

// mcpGoView reads body as an mcp-go server does: the method with
// encoding/json, then the whole message into mcp-go's request type of
// named methods. false if it refuses.
func mcpGoView(body []byte) (rpcView, bool) {
	var base struct {
		Method string `json:"method"`
	}
	if stdjson.Unmarshal(body, &base) != nil {
		return rpcView{}, false
	}
	v := rpcView{method: base.Method}
	var err error
	switch base.Method {
	case "tools/call":
		var req mgmcp.CallToolRequest
		err = stdjson.Unmarshal(body, &req)
		v.name = req.Params.Name
	case "prompts/get":
		var req mgmcp.GetPromptRequest
		err = stdjson.Unmarshal(body, &req)
		v.name = req.Params.Name
	case "resources/read":
		var req mgmcp.ReadResourceRequest
		err = stdjson.Unmarshal(body, &req)
		v.name = req.Params.URI
	}
	return v, err == nil
}
