package caddymodule

import (
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strings"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
)

// Handles of MCP 2026-07-28: a server without sessions keeps the state of
// a browser, a cursor or a REPL in its memory and names it by a handle that
// a tool returns; later calls pass the handle back as an argument, which
// the client mirrors into an `Mcp-Param-{Name}` request header when the
// tool's inputSchema marks the argument with `x-mcp-header` (SEP-2243).
// The handler learns handle -> upstream from the minting tool's result and
// pins every request carrying the handle in that header to the upstream
// (docs/handles.md). This file holds the rules; handleserve.go serves the
// requests, handleresult.go reads the results.

// Values of [Handler.UnknownHandle].
const (
	// UnknownHandleForward balances a request whose handle the table does
	// not hold; the server answers the handle it does not know.
	UnknownHandleForward = "forward"
	// UnknownHandleReject answers a request whose handle the table does not
	// hold itself, with UnknownHandleStatus and a JSON-RPC error.
	UnknownHandleReject = "reject"
)

// HandleFromText is the [HandleRule.From] that takes the handle from the
// result's text content instead of its structuredContent.
const HandleFromText = "text"

// ParamHeaderPrefix begins every header that carries a tool argument marked
// with `x-mcp-header` (SEP-2243, MCP 2026-07-28 transports).
const ParamHeaderPrefix = "Mcp-Param-"

// DefaultHandleTableSuffix names a handler's handle table after its
// session table: `default` keeps its handles in `default_handles`.
const DefaultHandleTableSuffix = "_handles"

// maxHandleResult is the most bytes of a minting call's result the handler
// reads to find its handle; a larger result passes unread, and its handle
// is not learned.
const maxHandleResult = 1 << 20

// HandleRule names how one kind of handle is minted and how it comes back.
type HandleRule struct {
	// The tool whose result mints the handle: its name, or a pattern where
	// `*` stands for any characters (`browser_*`). Required.
	Tool string `json:"tool"`

	// Where the result holds the handle: a JSON pointer (RFC 6901) into the
	// result's `structuredContent`, such as `/handle` or `/session/id`,
	// whose value is a string, an integer or a boolean; or `text`, the
	// result's first text content, without surrounding white space.
	// Required.
	From string `json:"from"`

	// The request header that carries the handle back: `Mcp-Param-` and the
	// `x-mcp-header` name the server gives the handle's parameter in the
	// inputSchema of the tools that take it, such as `Mcp-Param-Handle`.
	// Header names are case-insensitive. Required.
	Header string `json:"header"`
}

// check returns what is wrong with rule, saying what to write instead, or nil.
func (rule HandleRule) check() error {
	example := "such as {\"tool\": \"open_browser\", \"from\": \"/handle\", \"header\": \"Mcp-Param-Handle\"}"
	switch {
	case rule.Tool == "":
		return fmt.Errorf("handle rule needs the tool whose result mints the handle, a name or a pattern with *, %s", example)
	case rule.From == "":
		return fmt.Errorf("handle rule for tool %q needs where its result holds the handle: a JSON pointer into structuredContent, such as /handle, or text", rule.Tool)
	case rule.From != HandleFromText && !validPointer(rule.From):
		return fmt.Errorf("handle rule for tool %q: %q is neither a JSON pointer into structuredContent (it begins with /, such as /handle; ~ is written ~0 and / inside a name ~1) nor text", rule.Tool, rule.From)
	}
	return checkParamHeader(rule.Tool, rule.Header)
}

// checkParamHeader returns what is wrong with header, the header a rule for
// tool reads handles from, or nil.
func checkParamHeader(tool, header string) error {
	name, ok := cutPrefixFold(header, ParamHeaderPrefix)
	switch {
	case header == "":
		return fmt.Errorf("handle rule for tool %q needs the header that carries the handle back: Mcp-Param- and the x-mcp-header name of its parameter, such as Mcp-Param-Handle", tool)
	case !ok || name == "":
		return fmt.Errorf("handle rule for tool %q: header %q must be Mcp-Param- followed by the x-mcp-header name the server gives the handle's parameter, such as Mcp-Param-%s", tool, header, strings.TrimPrefix(header, "-"))
	case strings.IndexFunc(name, func(c rune) bool { return c <= ' ' || c >= 0x7f || c == ':' }) >= 0:
		return fmt.Errorf("handle rule for tool %q: header %q has a character not allowed in a header name (space, control, ':' or non-ASCII)", tool, header)
	}
	return nil
}

// cutPrefixFold returns s without prefix, matched case-insensitively, and
// whether it was there.
func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return s, false
	}
	return s[len(prefix):], true
}

// validPointer reports whether p is a JSON pointer (RFC 6901 §3) naming a
// member below the root: it begins with `/`, and every `~` is `~0` or `~1`.
func validPointer(p string) bool {
	if !strings.HasPrefix(p, "/") {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] == '~' && (i+1 == len(p) || p[i+1] != '0' && p[i+1] != '1') {
			return false
		}
	}
	return true
}

// handleRules are a handler's rules, compiled for the request path.
type handleRules struct {
	rules   []HandleRule // header in canonical form
	headers []string     // the distinct headers, in canonical form, in rule order
	table   *session.Table
	reject  bool // unknown_handle reject
	status  int  // the status of a rejected unknown handle
}

// newHandleRules compiles rules (already checked) into the table t.
func newHandleRules(rules []HandleRule, t *session.Table, unknown string, status int) *handleRules {
	hr := &handleRules{table: t, reject: unknown == UnknownHandleReject, status: status}
	for _, rule := range rules {
		rule.Header = textproto.CanonicalMIMEHeaderKey(rule.Header)
		hr.rules = append(hr.rules, rule)
		if !slices.Contains(hr.headers, rule.Header) {
			hr.headers = append(hr.headers, rule.Header)
		}
	}
	return hr
}

// carried returns the handle r carries in the first rule header it sends,
// decoded from the Base64 sentinel form, and that header; "" when it
// sends none. A header sent twice, or one whose sentinel is not Base64,
// is returned as problem: the request is refused, since a server reading
// the other copy would act on a handle the proxy did not route by.
func (hr *handleRules) carried(r *http.Request, maxLen int) (handle, header, problem string) {
	for _, k := range hr.headers {
		v := r.Header[k]
		switch {
		case len(v) == 0:
			continue
		case len(v) > 1:
			return "", k, fmt.Sprintf("%s was sent %d times; send it once", k, len(v))
		}
		h, ok := decodeSentinel(v[0])
		switch {
		case !ok:
			return "", k, fmt.Sprintf("%s %q is not valid Base64 inside =?base64?...?=", k, v[0])
		case h == "":
			return "", k, k + " is empty; send the handle the tool returned"
		case len(h) > maxLen:
			return "", k, fmt.Sprintf("%s is %d bytes long, longer than max_session_id_length (%d)", k, len(h), maxLen)
		}
		return h, k, ""
	}
	return "", "", ""
}

// minter returns the rule whose tool a tools/call request of the tool name
// calls, or nil: its result is read for a handle.
func (hr *handleRules) minter(method, name string) *HandleRule {
	if method != "tools/call" || name == "" {
		return nil
	}
	for i := range hr.rules {
		if globMatch(hr.rules[i].Tool, name) {
			return &hr.rules[i]
		}
	}
	return nil
}

// provisionHandles checks the handler's handle rules and fetches their
// table from app, which gets the handler's principal binding.
func (h *Handler) provisionHandles(app *App) error {
	if len(h.Handles) == 0 {
		return nil
	}
	if h.HandleTable == "" {
		h.HandleTable = h.Table + DefaultHandleTableSuffix
	}
	if h.UnknownHandleStatus == 0 {
		h.UnknownHandleStatus = http.StatusNotFound
	}
	t, err := app.Table(h.HandleTable, TableConfig{TableSettings: TableSettings{BindPrincipal: h.BindPrincipal}}, "the handles of an mcp_session handler")
	if err != nil {
		return err
	}
	h.handles = newHandleRules(h.Handles, t, h.UnknownHandle, h.UnknownHandleStatus)
	return nil
}

// validateHandles checks the handle settings; its error says what to write.
func (h *Handler) validateHandles() error {
	for _, rule := range h.Handles {
		if err := rule.check(); err != nil {
			return err
		}
	}
	switch {
	case h.UnknownHandle != "" && h.UnknownHandle != UnknownHandleForward && h.UnknownHandle != UnknownHandleReject:
		return fmt.Errorf("unknown_handle must be %q or %q, got %q", UnknownHandleForward, UnknownHandleReject, h.UnknownHandle)
	case h.UnknownHandleStatus != 0 && (h.UnknownHandleStatus < 400 || h.UnknownHandleStatus > 499):
		return fmt.Errorf("unknown_handle_status must be a 4xx status such as 404 or 410, got %d", h.UnknownHandleStatus)
	case len(h.Handles) == 0 && (h.HandleTable != "" || h.UnknownHandle != "" || h.UnknownHandleStatus != 0):
		return fmt.Errorf("handle_table and unknown_handle apply to handle rules, and there is none; " +
			"add one such as 'handle open_browser /browser_id Mcp-Param-Browser', or leave them out")
	case len(h.Handles) > 0 && h.HandleTable != "" && h.HandleTable == h.Table:
		return fmt.Errorf("handle_table %q is the session table; give handles a table of their own, or leave it out for %q", h.HandleTable, h.Table+DefaultHandleTableSuffix)
	}
	return nil
}
