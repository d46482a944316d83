package tests

import (
	"context"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/loosekeys"
)

// FuzzLooseKeysSDKDecoders builds JSON-RPC requests whose keys are
// respelled from the Unicode case-fold classes of their characters
// (internal/loosekeys: "paramſ", "param\u017f", "Method", the Kelvin sign
// for k, escapes, look-alikes that do not fold) and checks the `mcp`
// matcher, through its exported API, against the decoders of both Go MCP
// SDKs on their own request types: the go-sdk's (jsonrpc.DecodeMessage,
// then segmentio/encoding/json with DontMatchCaseInsensitiveStructFields,
// as its internal/json decodes params) and mcp-go's (encoding/json, which
// folds keys). Whenever a decoder reads another method or name than the
// matcher, the matcher must have refused the body. internal/mcpwire's
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
