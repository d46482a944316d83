package session

import (
	"strings"
	"sync/atomic"
)

// Forgetting a session here does not end it on its upstream: MCP servers
// keep a session until its DELETE (MCP 2025-03-26 transports, §Session
// Management), and some keep a bounded number of them (the Python SDK 2.2
// answers initialize 503 past 10,000 live sessions). A table tells a
// [ForgetHook] of each session it forgets for a reason of its own, so that
// the proxy can end the session upstream (caddymodule/reclaim.go).

// Forgotten is a session that a table forgot while its upstream may
// still hold it.
type Forgotten struct {
	// Key is the table's key of the session: the client's Mcp-Session-Id,
	// or the decoded form of its sealed session ID (see [KeyKinds]).
	Key string
	// Dial is the dial address of the upstream that owns the session.
	Dial string
	// UpstreamID is the session's ID on that upstream once a failover
	// changed it; "" when the upstream knows the session by its key (or,
	// for a sealed key, by the ID the sealed value carries).
	UpstreamID string
	// Reason is why the table forgot the session.
	Reason EvictReason
}

// Reclaims reports whether a session that left a table for r may still
// be held by its upstream, which should then be asked to end it: every
// valid reason but the upstream's own answer (a DELETE passed through,
// answered 2xx or 404; a 404 to a POST) and the close of a legacy
// HTTP+SSE stream, which ends that session on the server too.
func (r EvictReason) Reclaims() bool {
	return r.Valid() && r != EvictDelete && r != EvictUpstream404 && r != EvictStreamClosed
}

// ForgetHook receives the sessions a table forgets that their upstream
// may still hold (see [EvictReason.Reclaims]). Fn runs with the table's
// lock held: it must return at once (queue the work) and must not call
// the table. A hook with a nil Fn receives nothing: it stands for a
// setting that turns reclaim off.
type ForgetHook struct {
	Fn func(Forgotten)
}

// forgetHooks holds a table's forget hook.
type forgetHooks struct {
	hook atomic.Pointer[ForgetHook]
}

// SetForgetHook makes h receive the sessions the table forgets from now
// on, and returns the hook it replaces; nil turns that off. A table has
// one hook: the last one set.
//
// Without a shared store, the table calls it for every session it forgets
// for a reason that [EvictReason.Reclaims]. With one, a session forgotten
// for the table's own bounds (session_ttl, max_sessions) lives on in the
// store, and a session ended on another instance is that instance's to
// reclaim: the store calls [Table.Reclaim] on the one instance whose write
// ended the session in the store.
func (f *forgetHooks) SetForgetHook(h *ForgetHook) (prev *ForgetHook) { return f.hook.Swap(h) }

// ClearForgetHook removes h if it is the table's hook, and reports whether it was.
func (f *forgetHooks) ClearForgetHook(h *ForgetHook) bool { return f.hook.CompareAndSwap(h, nil) }

// RestoreForgetHook makes prev the table's hook again if h still is, and
// reports whether it was: a config that set h and failed to load gives the
// table back the hook of the config still running.
func (f *forgetHooks) RestoreForgetHook(h, prev *ForgetHook) bool {
	return f.hook.CompareAndSwap(h, prev)
}

// Reclaiming reports whether the table has a forget hook.
func (f *forgetHooks) Reclaiming() bool {
	h := f.hook.Load()
	return h != nil && h.Fn != nil
}

// Reclaim hands s to the table's forget hook, if any, and reports whether
// there was one. A shared store calls it for a session whose end its
// write made.
func (f *forgetHooks) Reclaim(s Forgotten) bool {
	h := f.hook.Load()
	if h == nil || h.Fn == nil || !s.Reason.Reclaims() {
		return false
	}
	h.Fn(s)
	return true
}

// upstreamID returns the ID the session's current upstream knows it by,
// when a failover changed it; "" otherwise, and for a nil s.
func (s *Init) upstreamID() string {
	if s == nil {
		return ""
	}
	return s.UpstreamID
}

// ReclaimStats count the DELETEs a proxy sent for sessions its tables
// forgot. They are read by the metrics collector.
type ReclaimStats struct {
	// Sent counts DELETEs sent to an upstream.
	Sent atomic.Uint64
	// OK counts DELETEs the upstream answered 2xx: it ended the session.
	OK atomic.Uint64
	// NotFound counts DELETEs answered 404: the upstream no longer held the session.
	NotFound atomic.Uint64
	// Failed counts DELETEs that got no answer in time, another status, or
	// could not be sent (the session's upstream ID or MCP path unknown).
	Failed atomic.Uint64
	// Dropped counts forgotten sessions not reclaimed because the queue of
	// DELETEs was full.
	Dropped atomic.Uint64
}

// SetMCPPath records p, the request path of an initialize that opened a
// session on u: the path DELETEs of its forgotten sessions go to.
func (u *Upstream) SetMCPPath(p string) { storeIfChanged(&u.mcpPath, p) }

// MCPPath returns the path recorded by [Upstream.SetMCPPath]; "" before any.
func (u *Upstream) MCPPath() string { return loadString(&u.mcpPath) }

// SetProtocolVersion records v, an MCP-Protocol-Version a request of one
// of u's sessions carried: a version u accepts, which the DELETEs of its
// forgotten sessions carry.
func (u *Upstream) SetProtocolVersion(v string) { storeIfChanged(&u.version, v) }

// ProtocolVersion returns the version recorded by
// [Upstream.SetProtocolVersion]; "" before any.
func (u *Upstream) ProtocolVersion() string { return loadString(&u.version) }

// storeIfChanged stores v in p unless p holds it already: the common case
// reads only.
func storeIfChanged(p *atomic.Pointer[string], v string) {
	if v == "" {
		return
	}
	if cur := p.Load(); cur == nil || *cur != v {
		c := strings.Clone(v) // not the request's buffer; c, not v, escapes
		p.Store(&c)
	}
}

func loadString(p *atomic.Pointer[string]) string {
	if s := p.Load(); s != nil {
		return *s
	}
	return ""
}
