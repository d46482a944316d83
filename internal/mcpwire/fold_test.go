package mcpwire

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/loosekeys"
)

// readNames are the keys the plugin reads from a JSON-RPC body, at every
// level: Parse's top level, params and params._meta, and isInitialize's
// method.
var readNames = []string{"id", "method", "params", "name", "uri", "_meta", MetaProtocolVersion}

// TestFoldsTo checks foldsTo against bytes.EqualFold, the comparison
// encoding/json matches keys with, on every spelling of each name read
// (and of names with k, whose fold class holds the Kelvin sign) that
// loosekeys.Char writes with one choice for all characters, and on
// spellings mixing two choices.
func TestFoldsTo(t *testing.T) {
	names := append(slices.Clone(readNames), "progressToken", "task", "jsonrpc", "arguments")
	for _, name := range names {
		for a := range 256 {
			for _, b := range []int{a, 0x01, 0x02, 0x30, 0xff} {
				var key strings.Builder
				for i, r := range name {
					choice := byte(a)
					if i%2 == 1 {
						choice = byte(b)
					}
					key.WriteString(loosekeys.Char(r, choice&0xcf)) // raw, not escaped: foldsTo sees unescaped keys
				}
				k := []byte(key.String())
				want := bytes.EqualFold(k, []byte(name)) && string(k) != name
				if got := foldsTo(k, name); got != want {
					t.Fatalf("foldsTo(%+q, %q) = %v, bytes.EqualFold says %v", k, name, got, want)
				}
			}
		}
	}
	for _, tc := range []struct {
		key, name string
		want      bool
	}{
		{"param\u017f", "params", true},
		{"PARAM\u017f", "params", true},
		{"params", "params", false},
		{"progressto\u212aen", "progressToken", true},
		{"param\u0161", "params", false}, // š does not fold to s
		{"p\u0430rams", "params", false}, // Cyrillic а looks like a, does not fold
		{"param\xc5", "params", false},   // half of ſ: not UTF-8
		{"\x7fmeta", "_meta", false},     // 0x7f and '_' differ in more than case
		{"io.modelcontextprotocol\x0fprotocolVersion", MetaProtocolVersion, false},
		{"", "id", false},
	} {
		if got := foldsTo([]byte(tc.key), tc.name); got != tc.want {
			t.Errorf("foldsTo(%+q, %q) = %v, want %v", tc.key, tc.name, got, tc.want)
		}
	}
}

// TestFoldsToDoesNotAllocate checks that comparing a key costs no
// allocation, ASCII or not.
func TestFoldsToDoesNotAllocate(t *testing.T) {
	keys := [][]byte{[]byte("params"), []byte("Params"), []byte("param\u017f"), []byte("arguments"), []byte("progressToken")}
	if n := testing.AllocsPerRun(100, func() {
		for _, k := range keys {
			for _, name := range readNames {
				foldsTo(k, name)
			}
		}
	}); n != 0 {
		t.Fatalf("foldsTo allocates %v times per run", n)
	}
}

// looseMessage is a JSON-RPC message as the most permissive decoder reads
// it: encoding/json, which matches keys ignoring letter case with Unicode
// folding, into the structs mcp-go decodes requests into, with the _meta
// protocol version as a field too (mcp-go and the go-sdk read _meta as a
// map, whose keys encoding/json matches exactly).
type looseMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params *struct {
		Name string `json:"name"`
		URI  string `json:"uri"`
		Meta *struct {
			Version string `json:"io.modelcontextprotocol/protocolVersion"`
		} `json:"_meta"`
	} `json:"params"`
}

// fields returns the values of the fields the plugin reads.
func (m *looseMessage) fields() Head {
	h := Head{ID: m.ID, Method: m.Method}
	if m.Params != nil {
		h.Name, h.URI = m.Params.Name, m.Params.URI
		if m.Params.Meta != nil {
			h.Version = m.Params.Meta.Version
		}
	}
	return h
}

// FuzzLooseKeys builds JSON-RPC bodies whose keys are respelled from the
// Unicode case-fold classes of their characters (internal/loosekeys:
// `paramſ`, `param\u017f`, `Method`, the Kelvin sign for k, escapes, and
// look-alikes that do not fold) and checks the JSON-RPC readers against
// encoding/json, which reads such keys as the fields they fold to: whenever
// encoding/json reads another id, method, params.name, params.uri or
// _meta protocol version than Parse (the `mcp` matcher's reader),
// Parse must have refused the body; and isInitialize (failover's and
// stale sessions' reader) finds an initialize only where encoding/json
// reads one. Keys spelled exactly as the fields are the go-sdk's reading,
// which tests.FuzzLooseKeysSDKDecoders checks with the go-sdk's decoder.
func FuzzLooseKeys(f *testing.F) {
	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"danger","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","progressToken":1}}}`
	for _, seed := range []struct {
		body  string
		spell []byte
	}{
		{call, nil},
		{call, []byte{0, 0, 0, 0, 0, 1}},          // ſ for s: "jſonrpc", "paramſ", ...
		{call, []byte{0x11, 0, 0x21, 0x02, 0x30}}, // escapes, upper case, look-alikes
		{call, []byte{0xff, 0}},                   // bytes that are not UTF-8
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","paramſ":{"name":"danger"}}`, nil},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","param\u017f":{"name":"danger"}}`, nil},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"safe"},"PARAM\u017F":{"name":"danger"}}`, nil},
		{`{"id":1,"method":"tools/call","params":{"name":"x","_meta":{"io.modelcontextprotocol/protocolVerſion":"2099-01-01"}}}`, nil},
		{`{"id":1,"method":"tools/call","params":{"name":"x","progressto\u212aen":1}}`, nil},
		{`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}`, []byte{0, 1}},
		{`[{"jsonrpc":"2.0","id":1,"method":"tools/call"},{"jsonrpc":"2.0","id":2,"Method":"initialize"}]`, nil},
		{`{"method":"initialize","METHOD":"tools/call"}`, nil},
		{`{"method":"initialize","method":"tools/call"}`, nil},
		{`{"id":1,"method":"resources/read","params":{"uri":"file:///etc/passwd","URI":"file:///ok"}}`, nil},
	} {
		f.Add([]byte(seed.body), seed.spell)
	}
	f.Fuzz(func(t *testing.T, body, spell []byte) {
		body = loosekeys.Respell(body, spell)
		if !json.Valid(body) {
			return // refused by every reader (FuzzParseRPC fuzzes such bodies)
		}
		checkParseRPCAgrees(t, body)
		for _, batch := range []bool{false, true} {
			if IsInitialize(body, batch) && !looseInitialize(body, batch) {
				t.Fatalf("IsInitialize(batch %v) finds an initialize that encoding/json does not read in %s", batch, body)
			}
		}
	})
}

// checkParseRPCAgrees fails t if Parse accepts body but encoding/json
// reads another value of a field Parse reads.
func checkParseRPCAgrees(t *testing.T, body []byte) {
	t.Helper()
	head, f := Parse(body)
	var loose looseMessage
	if f != nil || json.Unmarshal(body, &loose) != nil {
		return // refused, by the plugin or by the server's decoder
	}
	if got := loose.fields(); string(got.ID) != string(head.ID) || got.Method != head.Method ||
		got.Name != head.Name || got.URI != head.URI || got.Version != head.Version {
		t.Fatalf("Parse accepted %s reading %+q; encoding/json reads %+q", body, fieldList(head), fieldList(&got))
	}
}

// fieldList lists the values of a head's fields, for messages.
func fieldList(h *Head) []string {
	return []string{string(h.ID), h.Method, h.Name, h.URI, h.Version}
}

// looseInitialize reports whether encoding/json reads body, or with batch
// one message of a batch body, as an initialize request.
func looseInitialize(body []byte, batch bool) bool {
	var msgs []json.RawMessage
	if !batch || json.Unmarshal(body, &msgs) != nil {
		msgs = []json.RawMessage{body}
	}
	for _, m := range msgs {
		var loose struct {
			Method string `json:"method"`
		}
		if json.Unmarshal(m, &loose) == nil && loose.Method == "initialize" {
			return true
		}
	}
	return false
}
