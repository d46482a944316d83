package mcpwire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Head is what the plugin reads from a JSON-RPC message: its id, method,
// and the params it checks headers against.
type Head struct {
	ID      json.RawMessage // nil for a notification
	Method  string          // "" for a response
	Name    string          // params.name
	URI     string          // params.uri
	Version string          // params._meta["io.modelcontextprotocol/protocolVersion"]
	Batch   []*Head         // the members of a JSON-RPC batch, in order; nil for one message
}

// MirroredName returns the value Mcp-Name mirrors: params.uri for
// resources/read, params.name otherwise (MCP 2026-07-28 transports,
// §Standard Request Headers).
func (h *Head) MirroredName() string {
	if h.Method == "resources/read" {
		return h.URI
	}
	return h.Name
}

// NamedMethod reports whether requests of method carry Mcp-Name (MCP
// 2026-07-28 transports, §Standard Request Headers).
func NamedMethod(method string) bool {
	return method == "tools/call" || method == "prompts/get" || method == "resources/read"
}

// CallName returns what a matcher's name condition compares for this
// message: its name for the methods that carry Mcp-Name, else "".
func (h *Head) CallName() string {
	if !NamedMethod(h.Method) {
		return ""
	}
	return h.MirroredName()
}

// Describe names the message in an error: its method, and the name it
// carries.
func (h *Head) Describe() string {
	switch {
	case h.Method == "":
		return "a response"
	case h.CallName() != "":
		return h.Method + " " + h.CallName()
	}
	return h.Method
}

// ParseError is a body [Parse] refuses: the JSON-RPC error to answer it
// with (JSON-RPC 2.0 §5.1), and the id of the request when it was read.
type ParseError struct {
	Code    int             // CodeParseError or CodeInvalidRequest
	Message string          // for the client, such as "Parse error: …"
	ID      json.RawMessage // the request's id; nil if unknown
}

// Error returns the error's message.
func (e *ParseError) Error() string { return e.Message }

// Parse reads a JSON-RPC message or batch. Fields are matched by their
// exact name, as the MCP Go SDK decodes them; a field the plugin reads
// that appears twice, or a key that folds to its name (fold.go: "Method",
// "param\u017f", which Go's encoding/json and so mcp-go read as the
// field), is refused: a server could read another value than the proxy.
// The body is validated by encoding/json, then scanned in place: the scan
// allocates only the strings it returns.
func Parse(body []byte) (*Head, *ParseError) {
	if !json.Valid(body) {
		return nil, &ParseError{Code: CodeParseError, Message: "Parse error: the request body is not one JSON object"}
	}
	sc := scanner{b: body}
	head := new(Head)
	var err error
	switch c := sc.peek(); c {
	case '{':
		err = sc.object("the message", topKeys, head.readTop)
	case '[':
		head.Batch, err = sc.batch()
	default:
		err = fmt.Errorf("the message is a JSON %s, not an object", kindOf(c))
	}
	if err != nil {
		return nil, &ParseError{Code: CodeInvalidRequest, Message: "Invalid Request: " + err.Error(), ID: head.ID}
	}
	return head, nil
}

// IsInitialize reports whether body, a request body or its first bytes,
// is a JSON-RPC initialize request, or, with batch, a batch holding one.
// A whole body is read by [Parse], so that it is an initialize exactly
// when Parse reads one: a body Parse refuses is none. A body that is not
// JSON because it is cut short is read as far as it goes, by the same
// scanner and rules: the members read before the cut decide, so that it
// is one if "method":"initialize" came first and nothing read so far is
// refused.
func IsInitialize(body []byte, batch bool) bool {
	if json.Valid(body) {
		head, err := Parse(body)
		if err != nil || head.Batch != nil && !batch {
			return false
		}
		return hasInitialize(head)
	}
	sc := scanner{b: body}
	switch sc.peek() {
	case '{':
		head := new(Head)
		err := sc.object("the message", topKeys, head.readTop)
		return errors.Is(err, errCut) && head.Method == "initialize"
	case '[':
		if !batch {
			return false
		}
		sc.i++
		for sc.peek() != ']' {
			head := new(Head)
			err := sc.object("a batch member", topKeys, head.readTop)
			if head.Method == "initialize" && (err == nil || errors.Is(err, errCut)) {
				return true
			}
			if err != nil {
				return false
			}
			if sc.peek() == ',' {
				sc.i++
			}
		}
	}
	return false
}

// hasInitialize reports whether head, or a member of its batch, is an
// initialize request.
func hasInitialize(head *Head) bool {
	for _, h := range head.Batch {
		if h.Method == "initialize" {
			return true
		}
	}
	return head.Method == "initialize"
}

// errCut is the error of a scan that ran off the end of its input: a body
// cut short.
var errCut = errors.New("the body is cut short")

// topKeys are the fields of a JSON-RPC message the plugin reads.
var topKeys = []string{"id", "method", "params"}

// batch reads a JSON-RPC batch (JSON-RPC 2.0 §6), an array of messages,
// which protocol 2025-03-26 allows and 2025-06-18 removed: the head of each
// member, in order. An empty batch is an error, as JSON-RPC 2.0 makes it.
func (sc *scanner) batch() ([]*Head, error) {
	sc.i++ // '['
	var heads []*Head
	for sc.peek() != ']' {
		h := new(Head)
		if err := sc.object(fmt.Sprintf("batch member %d", len(heads)+1), topKeys, h.readTop); err != nil {
			return nil, err
		}
		heads = append(heads, h)
		if sc.peek() == ',' {
			sc.i++
		}
	}
	sc.i++
	if len(heads) == 0 {
		return nil, fmt.Errorf("the batch is empty (JSON-RPC 2.0 §6)")
	}
	return heads, nil
}

// readTop reads the value of one top-level field the plugin reads.
func (h *Head) readTop(sc *scanner, key string) (err error) {
	switch key {
	case "id":
		h.ID = sc.skip()
	case "method":
		h.Method, err = sc.string(key)
	case "params":
		err = sc.object("params", []string{"name", "uri", "_meta"}, h.readParams)
	}
	return err
}

// readParams reads the value of one field of params the plugin reads.
func (h *Head) readParams(sc *scanner, key string) (err error) {
	switch key {
	case "name":
		h.Name, err = sc.string("params.name")
	case "uri":
		h.URI, err = sc.string("params.uri")
	case "_meta":
		err = sc.object("params._meta", []string{MetaProtocolVersion}, h.readMeta)
	}
	return err
}

// MetaProtocolVersion is the _meta key mirrored by MCP-Protocol-Version
// (MCP 2026-07-28 schema, RequestMetaObject).
const MetaProtocolVersion = "io.modelcontextprotocol/protocolVersion"

// readMeta reads params._meta's protocol version.
func (h *Head) readMeta(sc *scanner, _ string) (err error) {
	h.Version, err = sc.string("params._meta." + MetaProtocolVersion)
	return err
}

// scanner walks JSON text that json.Valid accepted or, for IsInitialize,
// the start of JSON text cut short: where the text ends inside a value,
// skip returns nil and the reads return errCut.
type scanner struct {
	b []byte
	i int
}

// peek skips white space and returns the next byte; 0 at the end.
func (sc *scanner) peek() byte {
	for sc.i < len(sc.b) && isSpace(sc.b[sc.i]) {
		sc.i++
	}
	if sc.i == len(sc.b) {
		return 0
	}
	return sc.b[sc.i]
}

// object reads an object, calling read for each member whose key is one of
// keys, with the scanner at its value; it skips the others. A null is an
// empty object. A key of keys given twice, or one that folds to a key of
// keys without being it (foldsTo), is an error.
func (sc *scanner) object(what string, keys []string, read func(*scanner, string) error) error {
	switch sc.peek() {
	case 'n':
		sc.skip()
		return nil
	case '{':
	case 0:
		return errCut
	default:
		return fmt.Errorf("%s is a JSON %s, not an object", what, kindOf(sc.peek()))
	}
	sc.i++
	var seen uint64
	for sc.peek() != '}' {
		key, err := sc.key(what, keys, &seen)
		if err != nil {
			return err
		}
		if sc.peek() == 0 {
			return errCut
		}
		sc.i++ // ':'
		if key == "" {
			if sc.skip() == nil {
				return errCut
			}
		} else if err := read(sc, key); err != nil {
			return err
		}
		if sc.peek() == ',' {
			sc.i++
		}
	}
	sc.i++
	return nil
}

// key reads a member's key of object what and returns it if it is one of
// keys, else "". The key is compared unescaped, as decoders read it.
func (sc *scanner) key(what string, keys []string, seen *uint64) (string, error) {
	sc.peek()
	raw := sc.skip()
	switch {
	case raw == nil || sc.i >= len(sc.b):
		return "", errCut // the key, or the text after it, is cut
	case len(raw) < 2 || raw[0] != '"':
		return "", fmt.Errorf("%s has a member without a key", what) // only in text cut short
	}
	kb := raw[1 : len(raw)-1]
	if bytes.IndexByte(raw, '\\') >= 0 {
		var key string
		_ = json.Unmarshal(raw, &key)
		kb = []byte(key)
	}
	for i, k := range keys {
		switch {
		case string(kb) == k && *seen&(1<<i) != 0:
			return "", fmt.Errorf("field %q of %s appears twice", k, what)
		case string(kb) == k:
			*seen |= 1 << i
			return k, nil
		case foldsTo(kb, k):
			return "", looseKeyError(what, kb, k)
		}
	}
	return "", nil
}

// string reads a string value; null is "". Escapes are decoded, and bytes
// that are not UTF-8 become U+FFFD, as encoding/json reads them.
func (sc *scanner) string(what string) (string, error) {
	switch c := sc.peek(); c {
	case 'n':
		sc.skip()
		return "", nil
	case '"':
	case 0:
		return "", errCut
	default:
		return "", fmt.Errorf("%s is a JSON %s, not a string", what, kindOf(c))
	}
	raw := sc.skip()
	if raw == nil {
		return "", errCut
	}
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw[1 : len(raw)-1]), nil
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

// skip skips one value and returns its text; nil when the text ends
// inside a string, object or array.
func (sc *scanner) skip() []byte {
	c := sc.peek()
	start := sc.i
	switch c {
	case '"':
		sc.i++
		for sc.i < len(sc.b) && sc.b[sc.i] != '"' {
			if sc.b[sc.i] == '\\' {
				sc.i++
			}
			sc.i++
		}
		if sc.i >= len(sc.b) {
			sc.i = len(sc.b)
			return nil
		}
		sc.i++
	case '{', '[':
		if !sc.skipNested() {
			return nil
		}
	default:
		for sc.i < len(sc.b) && !isSpace(sc.b[sc.i]) && sc.b[sc.i] != ',' && sc.b[sc.i] != '}' && sc.b[sc.i] != ']' {
			sc.i++
		}
	}
	return sc.b[start:sc.i]
}

// skipNested skips an object or array; false when the text ends first.
func (sc *scanner) skipNested() bool {
	depth := 0
	for sc.i < len(sc.b) {
		switch sc.b[sc.i] {
		case '"':
			if sc.skip() == nil {
				return false
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		}
		sc.i++
		if depth == 0 {
			return true
		}
	}
	return false
}

// isSpace reports whether c is JSON white space.
func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// kindOf names the JSON type of a value starting with c.
func kindOf(c byte) string {
	switch c {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}
