package caddymodule

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Values of [Handler.Failover].
const (
	// FailoverOff ends a session whose upstream is gone: its requests get 404.
	FailoverOff = "off"
	// FailoverReinitialize moves a session whose upstream is gone to another
	// upstream by replaying the session's initialize request there.
	FailoverReinitialize = "reinitialize"
)

// DefaultMaxInitializeSize is the default bound, in bytes, of the
// initialize request body a table keeps per session for failover. The MCP
// SDK clients send 150 to 500 bytes (go-sdk 190, the TypeScript SDK 150,
// VS Code about 450 with its capabilities); 4 KiB leaves room for long
// clientInfo and capabilities while bounding the table at 100000 sessions
// to 400 MiB in the worst case.
const DefaultMaxInitializeSize = 4096

// failoverSettings are a table's failover settings.
type failoverSettings struct {
	on      bool          // failover reinitialize
	maxInit int           // max_initialize_size, bytes
	maxAge  time.Duration // failover_max_age; 0: the table's session_ttl
}

// sessionInit is what a table keeps of a session for failover: the
// initialize request that opened it, without credentials, and the ID the
// session's current upstream knows it by. It is immutable: a failover
// replaces it.
type sessionInit struct {
	body        []byte
	accept      string // the request's Accept
	contentType string // its Content-Type
	version     string // its MCP-Protocol-Version, usually empty on initialize
	// upstreamID is the session's ID on its current upstream once a
	// failover changed it; "" while the upstream knows the client's ID.
	upstreamID string
	// stored is the sealed record of all the above in the session's value
	// in the shared store (sharedfailover.go); "" without a store.
	stored string
}

// movedTo returns a copy of s for the session's new upstream, which knows
// it as id.
func (s *sessionInit) movedTo(id string) *sessionInit {
	c := *s
	c.upstreamID, c.stored = id, ""
	return &c
}

// FailoverCause says why a session was moved to another upstream: one of
// the Failover constants. Its String is the `cause` label of the failovers
// metric.
type FailoverCause uint8

// The causes of a failover.
const (
	// FailoverGone: the session's upstream was removed from the config, or
	// failed active health checks for longer than unhealthy_grace.
	FailoverGone FailoverCause = iota + 1
	// FailoverRefused: connecting to the session's upstream failed.
	FailoverRefused
	// FailoverUpstream404: the upstream answered a POST of the session with 404.
	FailoverUpstream404
	// FailoverDrainDeadline: the session's upstream is draining past its deadline.
	FailoverDrainDeadline
)

// failoverCauseNames holds the label of each cause at its value's index.
var failoverCauseNames = [...]string{"", "upstream_gone", "refused", "upstream_404", "drain_deadline"}

// failoverCauses lists every valid FailoverCause.
var failoverCauses = [...]FailoverCause{FailoverGone, FailoverRefused, FailoverUpstream404, FailoverDrainDeadline}

// String returns the cause's metric label, e.g. "refused".
func (c FailoverCause) String() string {
	if c == 0 || int(c) >= len(failoverCauseNames) {
		return fmt.Sprintf("FailoverCause(%d)", c)
	}
	return failoverCauseNames[c]
}

// The results of a failover, the `result` label of the failovers metric.
const (
	failoverMoved    = "moved"    // moved to another upstream
	failoverFollowed = "followed" // another instance had moved it: it followed that move (shared store)
	failoverFailed   = "failed"   // no upstream took the replayed initialize
	// failoverRefused: the session may not fail over: it ended or expired
	// (a tombstone, or the shared store holds it no more), or its sealed
	// ID is older than failover_max_age. Nothing was replayed.
	failoverRefused = "refused"
)

// failoverStats count failovers by cause and result.
type failoverStats struct {
	moved, followed, failed, refused [len(failoverCauseNames)]atomic.Uint64
}

// failoverOutcome returns the result of a failover that ended in res and err.
func failoverOutcome(res failoverResult, err error) string {
	var refused failoverRefusal
	switch {
	case errors.As(err, &refused):
		return failoverRefused
	case err != nil:
		return failoverFailed
	case res.followed:
		return failoverFollowed
	}
	return failoverMoved
}

// count records one failover of cause with result.
func (s *failoverStats) count(cause FailoverCause, result string) {
	switch result {
	case failoverMoved:
		s.moved[cause].Add(1)
	case failoverFollowed:
		s.followed[cause].Add(1)
	case failoverRefused:
		s.refused[cause].Add(1)
	default:
		s.failed[cause].Add(1)
	}
}

// FailoversFollowed returns how many sessions of an upstream gone for
// cause this instance found moved by another instance, as the shared
// store said, and followed, since the table was created.
func (s *Stats) FailoversFollowed(cause FailoverCause) uint64 {
	if cause == 0 || int(cause) >= len(failoverCauseNames) {
		return 0
	}
	return s.failovers.followed[cause].Load()
}

// FailoversRefused returns how many sessions of an upstream gone for cause
// were refused failover since the table was created: they had ended or
// expired, or their sealed session ID was older than failover_max_age, so
// they ended with 404 instead.
func (s *Stats) FailoversRefused(cause FailoverCause) uint64 {
	if cause == 0 || int(cause) >= len(failoverCauseNames) {
		return 0
	}
	return s.failovers.refused[cause].Load()
}

// Failovers returns how many sessions were moved to another upstream for
// cause (ok), or could not be (!ok), since the table was created.
func (s *Stats) Failovers(cause FailoverCause, ok bool) uint64 {
	if cause == 0 || int(cause) >= len(failoverCauseNames) {
		return 0
	}
	if ok {
		return s.failovers.moved[cause].Load()
	}
	return s.failovers.failed[cause].Load()
}

// setFailover sets the table's failover mode and max_initialize_size,
// keeping its failover_max_age.
func (t *Table) setFailover(mode string, maxInit int) {
	if maxInit <= 0 {
		maxInit = DefaultMaxInitializeSize
	}
	t.failover.Store(&failoverSettings{on: mode == FailoverReinitialize, maxInit: maxInit, maxAge: t.failoverSettings().maxAge})
}

// setFailoverMaxAge sets the table's failover_max_age; 0 or less makes it
// the table's session_ttl.
func (t *Table) setFailoverMaxAge(d time.Duration) {
	fs := t.failoverSettings()
	fs.maxAge = max(d, 0)
	t.failover.Store(&fs)
}

// failoverMaxAge returns the age past which a sealed session ID fails over
// no more: failover_max_age, or the table's session_ttl.
func (t *Table) failoverMaxAge() time.Duration {
	if d := t.failoverSettings().maxAge; d > 0 {
		return d
	}
	return t.TTL()
}

// failoverSettings returns the table's failover settings; off when unset.
func (t *Table) failoverSettings() failoverSettings {
	if s := t.failover.Load(); s != nil {
		return *s
	}
	return failoverSettings{maxInit: DefaultMaxInitializeSize}
}

// keepInit records the initialize request of session id, which the table
// holds, for failover. It reports whether the table held the session. The
// kept requests live beside the LRU, not in its entries, so that tables
// without failover pay nothing for them; the eviction callback drops them.
func (t *Table) keepInit(id string, init *sessionInit) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, _, ok := t.peek(id); !ok {
		return false
	}
	t.keepInitHere(id, init)
	return true
}

// keepInitHere is keepInit for a session the table holds; t.mu is held.
func (t *Table) keepInitHere(id string, init *sessionInit) {
	if t.inits == nil {
		t.inits = map[string]*sessionInit{}
	}
	t.inits[id] = init
}

// adoptInit records the initialize request of session id, which the table
// holds, unless it keeps one already: a session adopted from a sealed ID
// by concurrent requests, or moved by a failover meanwhile, keeps the
// first. It reports whether it recorded init.
func (t *Table) adoptInit(id string, init *sessionInit) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, _, ok := t.peek(id); !ok || t.inits[id] != nil {
		return false
	}
	if t.inits == nil {
		t.inits = map[string]*sessionInit{}
	}
	t.inits[id] = init
	return true
}

// initOf returns the session's upstream and what the table keeps of it for
// failover, without counting it as use; a nil init when the table has none.
func (t *Table) initOf(id string) (*Upstream, *sessionInit) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	e, _, ok := t.peek(id)
	if !ok {
		return nil, nil
	}
	return e.up, t.inits[id]
}

// moveSession pins session id to upstream to, which knows it by init's
// upstream ID, and reports whether the table still held the session.
func (t *Table) moveSession(id string, to *Upstream, init *sessionInit) bool {
	now := t.clock()
	t.mu.Lock()
	defer t.mu.Unlock()
	e, list, ok := t.peek(id)
	if !ok {
		return false
	}
	if e.up != to {
		e.up.live.Add(-1)
		to.live.Add(1)
		e.up = to
	}
	e.lastUsed = now
	t.use(id, e, list) // a request of the session moves it
	t.inits[id] = init
	return true
}

// setDrainDeadline sets when the draining of u ends for its remaining
// sessions, which then fail over; the zero time sets none.
func (t *Table) setDrainDeadline(u *Upstream, at time.Time) {
	if at.IsZero() {
		u.drainDeadline.Store(0)
		return
	}
	u.drainDeadline.Store(int64(at.Sub(t.epoch)))
}

// pastDrainDeadline reports whether u is draining and its deadline has passed.
func (t *Table) pastDrainDeadline(u *Upstream) bool {
	d := u.drainDeadline.Load()
	return d != 0 && u.Draining() && t.clock() >= d
}

// DrainDeadline returns when the draining of u ends for its remaining
// sessions, and false if it has no deadline.
func (t *Table) DrainDeadline(u *Upstream) (time.Time, bool) {
	d := u.drainDeadline.Load()
	if d == 0 {
		return time.Time{}, false
	}
	return t.epoch.Add(time.Duration(d)), true
}
