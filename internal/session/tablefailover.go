package session

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// keepInitHere is keepInit for a session the table holds; the index lock is held.
func (ix *index) keepInitHere(id string, init *Init) {
	if ix.inits == nil {
		ix.inits = map[string]*Init{}
	}
	ix.inits[id] = init
}

// adoptInit records the initialize request of session id, which the table
// holds, unless it keeps one already: a session adopted from a sealed ID
// by concurrent requests, or moved by a failover meanwhile, keeps the
// first. It reports whether it recorded init.
func (ix *index) AdoptInit(id string, init *Init) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if _, _, ok := ix.peek(id); !ok || ix.inits[id] != nil {
		return false
	}
	if ix.inits == nil {
		ix.inits = map[string]*Init{}
	}
	ix.inits[id] = init
	return true
}

// initOf returns the session's upstream and what the table keeps of it for
// failover, without counting it as use; a nil init when the table has none.
func (ix *index) InitOf(id string) (*Upstream, *Init) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	e, _, ok := ix.peek(id)
	if !ok {
		return nil, nil
	}
	return e.up, ix.inits[id]
}

// keepInit records the initialize request of session id, which the table
// holds, for failover. It reports whether the table held the session. The
// kept requests live beside the LRU, not in its entries, so that tables
// without failover pay nothing for them; the eviction callback drops them.
func (ix *index) KeepInit(id string, init *Init) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if _, _, ok := ix.peek(id); !ok {
		return false
	}
	ix.keepInitHere(id, init)
	return true
}

// moveSession pins session id to upstream to, which knows it by init's
// upstream ID, and reports whether the table still held the session.
func (ix *index) moveSession(id string, to *Upstream, init *Init) bool {
	now := ix.now()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	e, list, ok := ix.peek(id)
	if !ok {
		return false
	}
	if e.up != to {
		e.up.live.Add(-1)
		to.live.Add(1)
		e.up = to
	}
	e.lastUsed = now
	ix.use(id, e, list) // a request of the session moves it
	ix.inits[id] = init
	return true
}

// Values of the failover option.
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
type FailoverSettings struct {
	On      bool          // failover reinitialize
	MaxInit int           // max_initialize_size, bytes
	MaxAge  time.Duration // failover_max_age; 0: the table's session_ttl
}

// sessionInit is what a table keeps of a session for failover: the
// initialize request that opened it, without credentials, and the ID the
// session's current upstream knows it by. It is immutable: a failover
// replaces it.
type Init struct {
	Body        []byte
	Accept      string // the request's Accept
	ContentType string // its Content-Type
	Version     string // its MCP-Protocol-Version, usually empty on initialize
	// upstreamID is the session's ID on its current upstream once a
	// failover changed it; "" while the upstream knows the client's ID.
	UpstreamID string
	// stored is the sealed record of all the above in the session's value
	// in the shared store (see [Shared.WithRecord]); "" without a store.
	StoreRecord string
}

// movedTo returns a copy of s for the session's new upstream, which knows
// it as id.
func (s *Init) MovedTo(id string) *Init {
	c := *s
	c.UpstreamID, c.StoreRecord = id, ""
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
var FailoverCauses = [...]FailoverCause{FailoverGone, FailoverRefused, FailoverUpstream404, FailoverDrainDeadline}

// String returns the cause's metric label, e.g. "refused".
func (c FailoverCause) String() string {
	if c == 0 || int(c) >= len(failoverCauseNames) {
		return fmt.Sprintf("FailoverCause(%d)", c)
	}
	return failoverCauseNames[c]
}

// The results of a failover, the `result` label of the failovers metric.
const (
	ResultMoved    = "moved"    // moved to another upstream
	ResultFollowed = "followed" // another instance had moved it: it followed that move (shared store)
	ResultFailed   = "failed"   // no upstream took the replayed initialize
	// failoverRefused: the session may not fail over: it ended or expired
	// (a tombstone, or the shared store holds it no more), or its sealed
	// ID is older than failover_max_age. Nothing was replayed.
	ResultRefused = "refused"
)

// failoverStats count failovers by cause and result.
type failoverStats struct {
	moved, followed, failed, refused [len(failoverCauseNames)]atomic.Uint64
}

// failoverOutcome returns the result of a failover that ended in res and err.
func FailoverOutcome(res FailoverResult, err error) string {
	var refused Refusal
	switch {
	case errors.As(err, &refused):
		return ResultRefused
	case err != nil:
		return ResultFailed
	case res.Followed:
		return ResultFollowed
	}
	return ResultMoved
}

// count records one failover of cause with result.
func (s *failoverStats) count(cause FailoverCause, result string) {
	switch result {
	case ResultMoved:
		s.moved[cause].Add(1)
	case ResultFollowed:
		s.followed[cause].Add(1)
	case ResultRefused:
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

// storedSession is a session as a Redis value describes it.
type Stored struct {
	Dial  string
	Bound PrincipalSum
	Init  *Init  // nil without a failover record, or one that did not open
	Value string // the value itself
	// ended is the reason of the session's tombstone; 0 for none, and then
	// the fields above describe the session.
	Ended EvictReason
}

// follow pins session id, which the table holds, to the upstream and
// failover record of s, which another instance moved it to; it returns
// the session's upstream and record, and false when the table does not
// hold the session or s carries no record.
func (t *Table) Follow(id string, s Stored) (*Upstream, *Init, bool) {
	if s.Init == nil || !t.Failover().On {
		return nil, nil, false
	}
	to := t.UseUpstream(s.Dial)
	if !t.moveSession(id, to, s.Init) {
		return nil, nil, false
	}
	return to, s.Init, true
}

// record returns the stored failover record of s; "" for none.
func (s *Init) record() string {
	if s == nil {
		return ""
	}
	return s.StoreRecord
}

// movedInStore returns where another instance moved session id, which this
// table holds on from with record init, when the shared store says it is
// elsewhere: the request then follows it instead of failing the session
// over again. False without a store, or when the store has it where this
// table has it, or nowhere. ended reports that the store holds the session
// no more, which a reachable store says only of a session that ended or
// expired on every instance: it must not fail over.
func (t *Table) MovedInStore(id string, from *Upstream, init *Init) (res FailoverResult, moved, ended bool) {
	c := t.shared()
	if c == nil {
		return FailoverResult{}, false, false
	}
	s, st := c.Current(id)
	if st == StoreAbsent || st == StoreEnded {
		return FailoverResult{}, false, true
	}
	if st != StoreHolds || s.Init == nil || s.Dial == from.dial && s.Init.UpstreamID == init.UpstreamID {
		return FailoverResult{}, false, false
	}
	to, rec, ok := t.Follow(id, s)
	return FailoverResult{Up: to, Init: rec, Followed: true}, ok, false
}

// recordMove pins session id, which a failover moved from upstream from
// with record init to upstream to with record moved, here and in the
// shared store. When another instance moved the session first, the
// session follows that move instead: the result says so, and is where the
// session is. Without a store, or when it does not answer in
// time, the move is recorded here only (and written to the store when it
// answers again). It errors when the session left the table.
func (t *Table) RecordMove(id string, from *Upstream, init *Init, to *Upstream, moved *Init) (FailoverResult, error) {
	c := t.shared()
	if c != nil {
		moved = c.WithRecord(id, moved)
	}
	if !t.moveSession(id, to, moved) {
		return FailoverResult{}, errors.New("the session left the table during its failover")
	}
	from.movedAway.Add(1)
	res := FailoverResult{Up: to, Init: moved}
	if c == nil {
		return res, nil
	}
	t.mu.Lock()
	e, _, _ := t.peek(id)
	t.mu.Unlock()
	old, next := EncodeValue(from.dial, e.principal, init.record()), EncodeValue(to.dial, e.principal, moved.StoreRecord)
	for range 2 { // once more when the store has the session unmoved under another record
		s, err := c.Move(id, old, next)
		if err != nil || s.Value == "" && s.Ended == 0 {
			return res, nil
		}
		if s.Ended != 0 {
			t.EvictHere(id, s.Ended)
			return FailoverResult{}, Refusal(RefusedEnded)
		}
		if s.Init == nil || s.Dial == from.dial && s.Init.UpstreamID == init.UpstreamID {
			old = s.Value // where this instance found it, under other bytes
			continue
		}
		if up, won, ok := t.Follow(id, s); ok { // moved: to the same upstream too, after its restart
			return FailoverResult{Up: up, Init: won, Followed: true}, nil
		}
		break
	}
	return res, nil
}

// failoverRefusal is why a session may not fail over: one of the refused
// constants, which say it to the client after "Session not found: ".
type Refusal string

func (f Refusal) Error() string { return "failover refused: " + string(f) }

// Why a session may not fail over (tombstone.go): replaying its initialize
// would bring back a session that ended, as a fresh upstream session.
const (
	RefusedEnded      Refusal = "the session was ended (DELETE, or evicted by an operator), so it does not fail over"
	RefusedExpired    Refusal = "the session expired (session_ttl), so it does not fail over"
	RefusedGone       Refusal = "the shared store holds the session no more: it ended or expired, so it does not fail over"
	RefusedTooOld     Refusal = "its sealed session ID is older than failover_max_age, so it does not fail over"
	RefusedUnknownAge Refusal = "its sealed session ID was issued by a version that did not seal its issue time, so it does not fail over"
)

// failoverResult is where a session went.
type FailoverResult struct {
	Up   *Upstream
	Init *Init
	// followed: another instance had moved the session, as the shared
	// store says, and the session followed that move.
	Followed bool
}
