package caddymodule

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types/ref"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
)

func init() {
	caddy.RegisterModule(MatchMCP{})
}

// MatchMCP matches MCP requests by what they are: their JSON-RPC method, the
// tool, prompt or resource they name, their protocol era and protocol
// version. MCP 2026-07-28 mirrors the method and name into the `Mcp-Method`
// and `Mcp-Name` headers so that proxies can route without reading bodies
// (MCP 2026-07-28 transports, §Request Metadata; SEP-2243); the matcher reads
// them there. With `body`, it also reads the JSON-RPC body, once per request
// however many matchers run, and passes it on unchanged: it checks a
// 2026-07-28 request's headers against the body, and takes the method and
// name of older requests, which have no trusted headers, from the body.
//
// Every condition given must hold; a list holds when any of its values
// does. `method` and `name` values are exact, or patterns in which `*`
// matches any run of characters (`/` included; there are no other special
// characters): `render_*`, `file:///reports/*`.
//
// The method and name of a request come from its `Mcp-Method` and `Mcp-Name`
// headers (`Mcp-Name` decoded from its `=?base64?...?=` form) only when its
// `MCP-Protocol-Version` is 2026-07-28 or later, the versions whose servers
// must reject headers that disagree with the body; older servers never look
// at them, so a client could otherwise have one call routed as another.
// Older requests have a method and name only once `body` read them, and
// otherwise match no `method` or `name` condition.
//
// A request carrying `Mcp-Session-Id` matches only a matcher that lists
// `era legacy_session`: routing a session's requests to a pool other than
// the one that created the session splits the session (see docs/behaviour.md, "Routing
// by tool").
//
// The proxy answers a malformed request itself, without contacting an
// upstream, and no `mcp` matcher matches it:
//
// | Request | Response |
// |---|---|
// | `Mcp-Method`, `Mcp-Name` or `MCP-Protocol-Version` sent more than once, or an `Mcp-Name` whose Base64 does not decode | 400, JSON-RPC error -32020 (HeaderMismatch) |
// | with `body`, a 2026-07-28 request whose `Mcp-Method`, `Mcp-Name` or `MCP-Protocol-Version` is missing or differs from the body | 400, JSON-RPC error -32020 |
// | with `body`, a body that is not one JSON object or batch, a batch at a protocol version without batches (2025-06-18 and later) or whose members route differently, or one that names a field the matcher reads twice | 400, JSON-RPC error -32700 or -32600 |
// | with `body`, a key that folds to the name of a field the matcher reads without being it (`Method`, `paramſ`, `param\u017f`: Go's encoding/json reads it as the field; see docs/behaviour.md, "The mcp matcher") | 400, JSON-RPC error -32600 naming the key |
// | with `body`, a body over `max_body_size` | 413, JSON-RPC error -32600 |
//
// The `mcp_session` handler (and so `mcp_proxy`) writes that answer when the
// request reaches it, or, when the matcher runs inside the handler's own
// routes, as soon as the matcher fails the request. A route without
// `mcp_session` forwards such a request as it is, to a server that must
// validate it.
type MatchMCP struct {
	// The JSON-RPC methods to match, such as `tools/call`: exact, or
	// patterns with `*`. Default: any method, or none known.
	Methods []string `json:"method,omitempty"`

	// The names to match: the tool name of `tools/call`, the prompt name of
	// `prompts/get`, the resource URI of `resources/read`. Exact, or
	// patterns with `*`. Requests of other methods have no name and match
	// no name. Default: any name, or none.
	Names []string `json:"name,omitempty"`

	// The protocol eras to match, as the `era` label of the
	// `caddy_mcp_requests_total` metric names them: `legacy_session`
	// (carries `Mcp-Session-Id`), `modern_sessionless` (2026-07-28: has
	// `Mcp-Method` or an `MCP-Protocol-Version` of 2026-07-28 or later),
	// `other_sessionless`. Default: `modern_sessionless` and
	// `other_sessionless`; `legacy_session` only when listed.
	Eras []string `json:"era,omitempty"`

	// Conditions on the `MCP-Protocol-Version` header, all of which must
	// hold: a comparison operator (`=`, `!=`, `<`, `<=`, `>`, `>=`; none
	// means `=`) followed by a version date, such as `>=2026-07-28`. Versions
	// are dates and compare as dates. A request without a date-shaped
	// version (none, as in `initialize` and 2025-03-26 traffic, or another
	// value) satisfies no condition. Default: any version, or none.
	ProtocolVersion []string `json:"protocol_version,omitempty"`

	// Reads the JSON-RPC body of POST requests to check a 2026-07-28
	// request's headers against it and to take the method and name of
	// older requests from it. Default: false (headers only; no body is read).
	Body bool `json:"body,omitempty"`

	// The largest body `body` reads, in bytes; a larger one is answered 413.
	// The first matcher to read a request's body applies its bound, so give
	// the matchers of one site the same value. At most 64 MiB, the bound of
	// every body the proxy holds (MaxBodyMemory). Default: 4194304 (4 MiB,
	// the MCP Go SDK server's own limit).
	MaxBodySize int64 `json:"max_body_size,omitempty"`

	versions []versionCond
	sessions bool // legacy_session is listed: sessions may match
}

// CaddyModule returns the Caddy module information.
func (MatchMCP) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.matchers.mcp",
		New: func() caddy.Module { return new(MatchMCP) },
	}
}

// Provision parses the conditions and fills in defaults. A matcher that
// selects sessions' requests by method or name is logged as a warning:
// routing them elsewhere splits their sessions.
func (m *MatchMCP) Provision(ctx caddy.Context) error {
	if m.MaxBodySize == 0 {
		m.MaxBodySize = DefaultMaxBodySize
	}
	if err := m.Validate(); err != nil {
		return err
	}
	m.sessions = slices.Contains(m.Eras, session.EraLegacySession.String())
	if m.sessions && (len(m.Methods) > 0 || len(m.Names) > 0) {
		ctx.Logger().Warn("mcp matcher selects requests of legacy sessions by method or name; " +
			"a route that sends them to upstreams other than their session's ends those sessions (docs/behaviour.md#routing-by-tool)")
	}
	return nil
}

// Validate checks the conditions.
func (m *MatchMCP) Validate() error {
	for _, e := range m.Eras {
		if e == "" || !slices.Contains(session.EraNames[:], e) {
			return fmt.Errorf("mcp matcher: era %q is not one of %s, %s, %s", e, session.EraLegacySession, session.EraModern, session.EraOther)
		}
	}
	for _, list := range [][]string{m.Methods, m.Names} {
		if slices.Contains(list, "") {
			return fmt.Errorf("mcp matcher: an empty method or name matches nothing; remove it")
		}
	}
	if m.MaxBodySize < 0 {
		return fmt.Errorf("mcp matcher: max_body_size must be positive, got %d", m.MaxBodySize)
	}
	if m.MaxBodySize > MaxBodyMemory {
		return fmt.Errorf("mcp matcher: max_body_size %d is above 64 MiB, the most the proxy holds of request bodies over all requests "+
			"(MaxBodyMemory); write a size up to 64MiB, such as `body 4MiB`", m.MaxBodySize)
	}
	m.versions = m.versions[:0]
	for _, s := range m.ProtocolVersion {
		c, err := parseVersionCond(s)
		if err != nil {
			return err
		}
		m.versions = append(m.versions, c)
	}
	return nil
}

// Match reports whether r matches; see MatchWithError.
func (m *MatchMCP) Match(r *http.Request) bool {
	ok, _ := m.MatchWithError(r)
	return ok
}

// MatchWithError reports whether r matches. A malformed request matches
// nothing and is recorded for the `mcp_session` handler to answer; when the
// matcher runs inside that handler's routes, the fault is returned as a
// caddyhttp.HandlerError, which the handler answers.
func (m *MatchMCP) MatchWithError(r *http.Request) (bool, error) {
	ex := exchangeOf(r)
	ok, f := m.match(ex, r)
	if f == nil {
		return ok, nil
	}
	return false, ex.report(f)
}

// match reports whether the request matches, or the fault that makes it
// match nothing.
func (m *MatchMCP) match(ex *exchange, r *http.Request) (bool, *fault) {
	switch {
	case ex.fault != nil:
		return false, ex.fault
	case ex.headerFault != nil:
		return false, ex.headerFault
	case ex.era == session.EraLegacySession && !m.sessions:
		return false, nil
	case len(m.Eras) > 0 && !slices.Contains(m.Eras, ex.era.String()):
		return false, nil
	case !m.versionHolds(ex.version):
		return false, nil
	}
	if m.Body && r.Method == http.MethodPost {
		if f := ex.checkBody(r, m.MaxBodySize); f != nil {
			return false, f
		}
	}
	if batch := ex.batch(); batch != nil {
		return m.matchBatch(batch)
	}
	return m.matchCall(ex.method(), ex.name()), nil
}

// matchCall reports whether a request of method, naming name (see
// exchange.name), matches the method and name conditions.
func (m *MatchMCP) matchCall(method, name string) bool {
	return anyMatch(m.Methods, method) && anyMatch(m.Names, name)
}

// matchBatch judges a JSON-RPC batch by its members: it matches when every
// member matches, and not when none does. A batch whose members disagree
// cannot go one way, and a server would run all of them: it is refused, so
// that a route for some calls, a refusal above all, is never bypassed by
// batching them with others.
func (m *MatchMCP) matchBatch(batch []*mcpwire.Head) (bool, *fault) {
	first := m.matchCall(batch[0].Method, batch[0].CallName())
	for i, h := range batch[1:] {
		if m.matchCall(h.Method, h.CallName()) != first {
			return false, &fault{status: http.StatusBadRequest, code: CodeInvalidRequest, message: fmt.Sprintf(
				"Invalid Request: members 1 (%s) and %d (%s) of this JSON-RPC batch are routed differently by this proxy; "+
					"send them in separate requests", batch[0].Describe(), i+2, h.Describe())}
		}
	}
	return first, nil
}

// versionHolds reports whether every protocol_version condition holds for v.
func (m *MatchMCP) versionHolds(v string) bool {
	for _, c := range m.versions {
		if !c.holds(v) {
			return false
		}
	}
	return true
}

// anyMatch reports whether s matches one of patterns; no patterns match
// anything, and a pattern never matches an empty s.
func anyMatch(patterns []string, s string) bool {
	if len(patterns) == 0 {
		return true
	}
	if s == "" {
		return false
	}
	for _, p := range patterns {
		if globMatch(p, s) {
			return true
		}
	}
	return false
}

// globMatch reports whether s matches pattern, in which `*` matches any run
// of bytes, none included, and every other byte matches itself.
func globMatch(pattern, s string) bool {
	p, i, star, mark := 0, 0, -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, i
			p++
		case p < len(pattern) && pattern[p] == s[i]:
			p++
			i++
		case star >= 0: // let the last star take one more byte
			mark++
			p, i = star+1, mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// report records f as the request's fault. Inside an mcp_session handler,
// which answers faults it receives as errors, it returns f as the error
// that stops the routes; outside, the request goes on to the next route
// and the first mcp_session handler it reaches answers it.
func (ex *exchange) report(f *fault) error {
	if ex.fault == nil {
		ex.fault = f
	}
	if ex.serving {
		return caddyhttp.Error(ex.fault.status, ex.fault)
	}
	return nil
}

// checkBody reads the body and checks a 2026-07-28 request's headers
// against it (MCP 2026-07-28 transports, §Server Validation). A batch is
// refused at protocol versions that removed batches.
func (ex *exchange) checkBody(r *http.Request, limit int64) *fault {
	head, f := ex.readBody(r, limit)
	switch {
	case f != nil:
		return f
	case head.Batch != nil && !batchesAllowed(ex.version):
		return &fault{status: http.StatusBadRequest, code: CodeInvalidRequest, message: fmt.Sprintf(
			"Invalid Request: protocol %s has no JSON-RPC batches (2025-06-18 removed them); send one message per request", ex.version)}
	case !ex.trusted || head.Batch != nil:
		return nil
	}
	if f = ex.validate(head); f != nil {
		f.id = head.ID
	}
	return f
}

// validate returns the fault of a 2026-07-28 request whose mirrored headers
// are missing or disagree with the body head.
func (ex *exchange) validate(head *mcpwire.Head) *fault {
	request := head.ID != nil
	switch {
	case ex.hdrMethod == "" && request:
		return mismatch("the Mcp-Method header is required; the body's method is %q", head.Method)
	case ex.hdrMethod != "" && ex.hdrMethod != head.Method:
		return mismatch("Mcp-Method header value %q does not match body value %q", ex.hdrMethod, head.Method)
	case request && mcpwire.NamedMethod(head.Method) && !ex.nameSent:
		return mismatch("the Mcp-Name header is required for %s; the body's value is %q", head.Method, head.MirroredName())
	case request && mcpwire.NamedMethod(head.Method) && ex.hdrName != head.MirroredName():
		return mismatch("Mcp-Name header value %q does not match body value %q", ex.hdrName, head.MirroredName())
	case head.Version != "" && head.Version != ex.version:
		return mismatch("MCP-Protocol-Version header value %q does not match body value %q (%s)", ex.version, head.Version, mcpwire.MetaProtocolVersion)
	}
	return nil
}

// versionCond is one protocol_version condition.
type versionCond struct {
	op      string // =, !=, <, <=, >, >=
	version string // YYYY-MM-DD
}

// versionOps are the comparison operators, longest first.
var versionOps = []string{">=", "<=", "!=", "=", ">", "<"}

// parseVersionCond parses a condition such as `>=2026-07-28`, `>= 2026-07-28` or `2025-06-18`.
func parseVersionCond(s string) (versionCond, error) {
	c := versionCond{op: "="}
	rest := strings.TrimSpace(s)
	for _, op := range versionOps {
		if after, ok := strings.CutPrefix(rest, op); ok {
			c.op, rest = op, strings.TrimSpace(after)
			break
		}
	}
	if !mcpwire.IsVersion(rest) {
		return c, fmt.Errorf("mcp matcher: protocol_version %q must be an operator (=, !=, <, <=, >, >=) and a version date such as 2026-07-28", s)
	}
	c.version = rest
	return c, nil
}

// holds reports whether version v satisfies the condition; a v that is not
// a date satisfies none. Dates compare as strings.
func (c versionCond) holds(v string) bool {
	if !mcpwire.IsVersion(v) {
		return false
	}
	cmp := strings.Compare(v, c.version)
	switch c.op {
	case "!=":
		return cmp != 0
	case "<":
		return cmp < 0
	case "<=":
		return cmp <= 0
	case ">":
		return cmp > 0
	case ">=":
		return cmp >= 0
	}
	return cmp == 0
}

// UnmarshalCaddyfile sets up the matcher from Caddyfile tokens. Syntax:
//
//	mcp [<option> <values...>] {
//	    method           <methods...>
//	    name             <names...>
//	    era              legacy_session|modern_sessionless|other_sessionless...
//	    protocol_version [<op>] <version> [[<op>] <version>...]
//	    body             [<max_size>]
//	}
//
// One option may be given on the `mcp` line itself, e.g.
// `@discover mcp method server/discover`. Options may repeat; their values
// add up. `max_size` is a size such as `64KiB`.
func (m *MatchMCP) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // matcher name
	if d.NextArg() {
		if err := m.unmarshalOption(d); err != nil {
			return err
		}
	}
	for d.NextBlock(0) {
		if err := m.unmarshalOption(d); err != nil {
			return err
		}
	}
	return nil
}

// unmarshalOption parses the option at the cursor and its arguments.
func (m *MatchMCP) unmarshalOption(d *caddyfile.Dispenser) error {
	opt := d.Val()
	args := d.RemainingArgs()
	if opt == "body" {
		return m.unmarshalBody(d, args)
	}
	if len(args) == 0 {
		return d.Errf("mcp matcher: %s needs at least one value", opt)
	}
	switch opt {
	case "method":
		m.Methods = append(m.Methods, args...)
	case "name":
		m.Names = append(m.Names, args...)
	case "era":
		m.Eras = append(m.Eras, args...)
	case "protocol_version":
		conds, err := joinVersionConds(args)
		if err != nil {
			return d.Err(err.Error())
		}
		m.ProtocolVersion = append(m.ProtocolVersion, conds...)
	default:
		return d.Errf("mcp matcher: unrecognized option '%s' (method, name, era, protocol_version or body)", opt)
	}
	return nil
}

// unmarshalBody parses `body [<max_size>]`.
func (m *MatchMCP) unmarshalBody(d *caddyfile.Dispenser, args []string) error {
	if m.Body || len(args) > 1 {
		return d.Err("mcp matcher: body takes at most one value, a size such as 64KiB, and is given once")
	}
	m.Body = true
	if len(args) == 1 {
		size, err := humanize.ParseBytes(args[0])
		if err != nil || size == 0 || size > math.MaxInt64 {
			return d.Errf("mcp matcher: body: '%s' is not a size such as 64KiB or 4MiB", args[0])
		}
		m.MaxBodySize = int64(size)
	}
	return nil
}

// joinVersionConds groups protocol_version arguments into conditions: an
// operator given as its own argument joins the version after it.
func joinVersionConds(args []string) ([]string, error) {
	var conds []string
	for i := 0; i < len(args); i++ {
		c := args[i]
		if slices.Contains(versionOps, c) && i+1 < len(args) {
			i++
			c += args[i]
		}
		if _, err := parseVersionCond(c); err != nil {
			return nil, err
		}
		conds = append(conds, c)
	}
	return conds, nil
}

// CELLibrary makes the matcher available in CEL expressions as `mcp(...)`,
// given a map of the JSON options, e.g.
// `expression mcp({'method': 'tools/call', 'name': ['render_*']}) && path('/mcp')`.
// `body` takes `'on'` or a size; `max_body_size` is not a key.
func (MatchMCP) CELLibrary(ctx caddy.Context) (cel.Library, error) {
	return caddyhttp.CELMatcherImpl("mcp", "mcp_matcher_request_map", []*cel.Type{caddyhttp.CELTypeJSON},
		func(data ref.Val) (caddyhttp.RequestMatcherWithError, error) {
			opts, err := caddyhttp.CELValueToMapStrList(data)
			if err != nil {
				return nil, err
			}
			m, err := matcherFromMap(opts)
			if err != nil {
				return nil, err
			}
			return m, m.Provision(ctx)
		})
}

// matcherFromMap builds a matcher from CEL map options.
func matcherFromMap(opts map[string][]string) (*MatchMCP, error) {
	m := new(MatchMCP)
	for k, v := range opts {
		switch k {
		case "method":
			m.Methods = v
		case "name":
			m.Names = v
		case "era":
			m.Eras = v
		case "protocol_version":
			m.ProtocolVersion = v
		case "body":
			if err := m.celBody(v); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("mcp matcher: unrecognized option %q (method, name, era, protocol_version or body)", k)
		}
	}
	return m, nil
}

// celBody parses the CEL `body` option: 'on', or a size.
func (m *MatchMCP) celBody(v []string) error {
	if len(v) != 1 {
		return fmt.Errorf("mcp matcher: body takes one value, 'on' or a size such as '64KiB'")
	}
	m.Body = true
	if v[0] == "on" {
		return nil
	}
	size, err := humanize.ParseBytes(v[0])
	if err != nil || size == 0 || size > math.MaxInt64 {
		return fmt.Errorf("mcp matcher: body %q is not 'on' or a size such as '64KiB'", v[0])
	}
	m.MaxBodySize = int64(size)
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner                 = (*MatchMCP)(nil)
	_ caddy.Validator                   = (*MatchMCP)(nil)
	_ caddyhttp.RequestMatcherWithError = (*MatchMCP)(nil)
	_ caddyfile.Unmarshaler             = (*MatchMCP)(nil)
	_ caddyhttp.CELLibraryProducer      = (*MatchMCP)(nil)
)
