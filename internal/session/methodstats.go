package session

import (
	"sync/atomic"
)

// specMethods are the JSON-RPC methods an MCP client sends a server, in
// protocol versions 2025-03-26 to 2026-07-28 (MCP schema, ClientRequest and
// ClientNotification of each version). They, `other` and `unknown` are the
// values of the `method` label, which keeps its cardinality bounded.
var specMethods = [...]string{
	"initialize", "ping", "server/discover",
	"tools/list", "tools/call",
	"resources/list", "resources/templates/list", "resources/read", "resources/subscribe", "resources/unsubscribe",
	"prompts/list", "prompts/get",
	"completion/complete", "logging/setLevel", "subscriptions/listen",
	"tasks/get", "tasks/result", "tasks/list", "tasks/cancel",
	"notifications/initialized", "notifications/cancelled", "notifications/progress", "notifications/roots/list_changed",
}

// Label values beyond the spec's methods.
const (
	// MethodOther labels a method the spec does not define.
	MethodOther = "other"
	// MethodUnknown labels a request whose method the plugin did not read:
	// a request older than 2026-07-28 (no trusted Mcp-Method header) whose
	// body no `mcp` matcher read, a GET stream, a DELETE.
	MethodUnknown = "unknown"
)

// methodIndexes maps a method to its index in specMethods.
var methodIndexes = func() map[string]int {
	m := make(map[string]int, len(specMethods))
	for i, name := range specMethods {
		m[name] = i
	}
	return m
}()

const (
	methodOther   = len(specMethods)
	methodUnknown = methodOther + 1
	methodLabels  = methodUnknown + 1
	// firstCode and lastCode bound the HTTP statuses counted.
	firstCode, lastCode = 100, 599
)

// methodIndex returns the label index of a method.
func methodIndex(method string) int {
	if method == "" {
		return methodUnknown
	}
	if i, ok := methodIndexes[method]; ok {
		return i
	}
	return methodOther
}

// methodLabel returns the label value of index i.
func methodLabel(i int) string {
	switch i {
	case methodOther:
		return MethodOther
	case methodUnknown:
		return MethodUnknown
	}
	return specMethods[i]
}

// methodCounts counts requests by method label and response status.
type methodCounts [methodLabels][lastCode - firstCode + 1]atomic.Uint64

// methodStats are a table's per-method counters and its open
// subscriptions/listen streams. The counts are allocated on first use
// (about 100 KiB), so a table that serves no traffic costs nothing.
type MethodStats struct {
	counts  atomic.Pointer[methodCounts]
	listens atomic.Int64
}

// count counts one request of method answered with status.
func (s *MethodStats) Count(method string, status int) {
	if status < firstCode || status > lastCode {
		return
	}
	c := s.counts.Load()
	if c == nil {
		s.counts.CompareAndSwap(nil, new(methodCounts))
		c = s.counts.Load()
	}
	c[methodIndex(method)][status-firstCode].Add(1)
}

// AddListens counts delta subscriptions/listen streams opened (above 0)
// or closed (below 0).
func (s *MethodStats) AddListens(delta int64) { s.listens.Add(delta) }

// Listens returns the number of subscriptions/listen streams open.
func (s *MethodStats) Listens() int64 { return s.listens.Load() }

// each calls fn for every method label and status counted at least once.
func (s *MethodStats) Each(fn func(method string, status int, n uint64)) {
	c := s.counts.Load()
	if c == nil {
		return
	}
	for i := range c {
		for j := range c[i] {
			if n := c[i][j].Load(); n > 0 {
				fn(methodLabel(i), j+firstCode, n)
			}
		}
	}
}
