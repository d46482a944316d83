package caddymodule

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"unicode/utf8"
)

// DefaultMaxBodySize is the default bound, in bytes, of the request body
// an `mcp` matcher reads: 4 MiB, the MCP Go SDK server's default
// (StreamableHTTPOptions.MaxRequestBodyBytes), so a body it would accept
// can always be checked.
const DefaultMaxBodySize = 4 << 20

// rpcHead is what the plugin reads from a JSON-RPC message: its id, method,
// and the params it checks headers against.
type rpcHead struct {
	ID      json.RawMessage // nil for a notification
	Method  string          // "" for a response
	Name    string          // params.name
	URI     string          // params.uri
	Version string          // params._meta["io.modelcontextprotocol/protocolVersion"]
	Batch   []*rpcHead      // the members of a JSON-RPC batch, in order; nil for one message
}

// name returns the value Mcp-Name mirrors: params.uri for resources/read,
// params.name otherwise (MCP 2026-07-28 transports, §Standard Request Headers).
func (h *rpcHead) name() string {
	if h.Method == "resources/read" {
		return h.URI
	}
	return h.Name
}

// readBody reads the request body, at most limit bytes, once per request,
// and parses it; a later call returns the first one's outcome. It puts the
// body back so that the upstream receives it unchanged, even when it was
// too large to read whole. Errors are faults: a body over the limit (413),
// one that could not be read, is not a single JSON object, or names a field
// the plugin reads twice or under a key that folds to its name (400); or
// the proxy holds MaxBodyMemory of bodies already (503, refuseBodyMemory).
func (ex *exchange) readBody(r *http.Request, limit int64) (*rpcHead, *fault) {
	if !ex.bodyRead {
		ex.bodyRead = true
		var buf []byte
		buf, ex.body, ex.bodyFault = ex.readRPC(r, limit)
		if ex.bodyFault == nil {
			ex.raw = buf // the whole body, before anything reads it
		}
	}
	return ex.body, ex.bodyFault
}

// readRPC reads and parses r's body; see readBody. buf is the body read.
func (ex *exchange) readRPC(r *http.Request, limit int64) (buf []byte, head *rpcHead, f *fault) {
	if r.ContentLength > limit {
		return nil, nil, tooLarge(r.ContentLength, limit)
	}
	buf, whole, err := ex.readHead(r, limit)
	switch {
	case errors.Is(err, errBodyMemory):
		return nil, nil, refuseBodyMemory(r)
	case err != nil:
		return nil, nil, &fault{status: http.StatusBadRequest, code: CodeInvalidRequest, message: "Bad Request: reading the request body: " + err.Error()}
	case !whole:
		return nil, nil, tooLarge(-1, limit)
	}
	head, f = parseRPC(buf)
	return buf, head, f
}

// readWhole reads a request body of known length up to MaxInMemoryBody
// into the exchange, where the mcp transport sends it from, and puts it
// back for anything else that reads r. The body is read before the
// request is routed, so that its upload is not counted against the
// upstream (pinned_timeout) and a body that ends early, or breaks, is the
// client's fault, answered without contacting an upstream. It returns the
// read's error, errBodyMemory when the budget is spent (nothing is read
// then); other bodies are left to stream.
func (ex *exchange) readWhole(r *http.Request) error {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength <= 0 || r.ContentLength > MaxInMemoryBody || ex.sent != nil {
		return nil
	}
	if !ex.mem.charge(r.ContentLength) {
		return errBodyMemory
	}
	buf := make([]byte, r.ContentLength)
	if n, err := io.ReadFull(r.Body, buf); err != nil {
		r.Body = &replayBody{buf: buf[:n], rest: r.Body}
		return err
	}
	ex.sent = buf
	r.Body = io.NopCloser(bytes.NewReader(buf))
	return nil
}

// tooLarge is the fault of a body over the matcher's bound; size is -1 when unknown.
func tooLarge(size, limit int64) *fault {
	msg := fmt.Sprintf("Request body is larger than %d bytes, the most an mcp matcher of this proxy reads (max_body_size)", limit)
	if size >= 0 {
		msg = fmt.Sprintf("Request body of %d bytes is larger than %d bytes, the most an mcp matcher of this proxy reads (max_body_size)", size, limit)
	}
	return &fault{status: http.StatusRequestEntityTooLarge, code: CodeInvalidRequest, message: msg}
}

// replayBody is a request body that was partly or fully read: it returns
// the bytes read first, then the rest of the original body.
type replayBody struct {
	buf     []byte
	rest    io.ReadCloser
	eof     bool // rest is at its end: buf is the whole body
	started bool // Read was called: buf is what is left of the bytes read

	hold    *bodyHold // where buf is charged, when nothing else keeps it; nil otherwise
	charged int64     // bytes, given back to hold once buf is read
}

// Read reads the bytes read before, then the rest of the original body.
func (b *replayBody) Read(p []byte) (int, error) {
	b.started = true
	if len(b.buf) > 0 {
		n := copy(p, b.buf)
		b.buf = b.buf[n:]
		if len(b.buf) == 0 && b.hold != nil {
			b.buf = nil
			b.hold.giveBack(b.charged)
			b.hold = nil
		}
		return n, nil
	}
	if b.eof {
		return 0, io.EOF
	}
	return b.rest.Read(p)
}

// Close closes the original body.
func (b *replayBody) Close() error { return b.rest.Close() }

// parseRPC reads a JSON-RPC message. Fields are matched by their exact
// name, as the MCP Go SDK decodes them; a field the plugin reads that
// appears twice, or a key that folds to its name (jsonfold.go: "Method",
// "param\u017f", which Go's encoding/json and so mcp-go read as the field),
// is refused: a server could read another value than the proxy. The body
// is validated by encoding/json, then scanned in place: the scan allocates
// only the strings it returns.
func parseRPC(body []byte) (*rpcHead, *fault) {
	if !json.Valid(body) {
		return nil, &fault{status: http.StatusBadRequest, code: CodeParseError, message: "Parse error: the request body is not one JSON object"}
	}
	sc := scanner{b: body}
	head := new(rpcHead)
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
		return nil, &fault{status: http.StatusBadRequest, code: CodeInvalidRequest, message: "Invalid Request: " + err.Error(), id: head.ID}
	}
	return head, nil
}

// topKeys are the fields of a JSON-RPC message the plugin reads.
var topKeys = []string{"id", "method", "params"}

// batch reads a JSON-RPC batch (JSON-RPC 2.0 §6), an array of messages,
// which protocol 2025-03-26 allows and 2025-06-18 removed: the head of each
// member, in order. An empty batch is an error, as JSON-RPC 2.0 makes it.
func (sc *scanner) batch() ([]*rpcHead, error) {
	sc.i++ // '['
	var heads []*rpcHead
	for sc.peek() != ']' {
		h := new(rpcHead)
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

// callName returns what a matcher's name condition compares for this
// message: its name for the methods that carry Mcp-Name, else "".
func (h *rpcHead) callName() string {
	if !namedMethod(h.Method) {
		return ""
	}
	return h.name()
}

// describe names the message in an error: its method, and the name it carries.
func (h *rpcHead) describe() string {
	switch {
	case h.Method == "":
		return "a response"
	case h.callName() != "":
		return h.Method + " " + h.callName()
	}
	return h.Method
}

// readTop reads the value of one top-level field the plugin reads.
func (h *rpcHead) readTop(sc *scanner, key string) (err error) {
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
func (h *rpcHead) readParams(sc *scanner, key string) (err error) {
	switch key {
	case "name":
		h.Name, err = sc.string("params.name")
	case "uri":
		h.URI, err = sc.string("params.uri")
	case "_meta":
		err = sc.object("params._meta", []string{metaProtocolVersion}, h.readMeta)
	}
	return err
}

// metaProtocolVersion is the _meta key mirrored by MCP-Protocol-Version
// (MCP 2026-07-28 schema, RequestMetaObject).
const metaProtocolVersion = "io.modelcontextprotocol/protocolVersion"

// readMeta reads params._meta's protocol version.
func (h *rpcHead) readMeta(sc *scanner, _ string) (err error) {
	h.Version, err = sc.string("params._meta." + metaProtocolVersion)
	return err
}

// scanner walks JSON text that json.Valid accepted.
type scanner struct {
	b []byte
	i int
}

// peek skips white space and returns the next byte.
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
		sc.peek()
		sc.i++ // ':'
		if key == "" {
			sc.skip()
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
	default:
		return "", fmt.Errorf("%s is a JSON %s, not a string", what, kindOf(c))
	}
	raw := sc.skip()
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw[1 : len(raw)-1]), nil
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

// skip skips one value and returns its text.
func (sc *scanner) skip() []byte {
	c := sc.peek()
	start := sc.i
	switch c {
	case '"':
		sc.i++
		for sc.b[sc.i] != '"' {
			if sc.b[sc.i] == '\\' {
				sc.i++
			}
			sc.i++
		}
		sc.i++
	case '{', '[':
		sc.skipNested()
	default:
		for sc.i < len(sc.b) && !isSpace(sc.b[sc.i]) && sc.b[sc.i] != ',' && sc.b[sc.i] != '}' && sc.b[sc.i] != ']' {
			sc.i++
		}
	}
	return sc.b[start:sc.i]
}

// skipNested skips an object or array.
func (sc *scanner) skipNested() {
	depth := 0
	for {
		switch sc.b[sc.i] {
		case '"':
			sc.skip()
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		}
		sc.i++
		if depth == 0 {
			return
		}
	}
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
