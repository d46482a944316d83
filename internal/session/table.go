package session

import (
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Defaults of the session table. The caddymodule package documents them on its modules.
const (
	// DefaultMaxSessions is the default bound of a session table (entries).
	DefaultMaxSessions = 100_000
	// DefaultSessionTTL is the default idle time after which a session is forgotten.
	DefaultSessionTTL = 24 * time.Hour
	// DefaultTableName names the table used when no table is configured.
	DefaultTableName = "default"
	// DefaultUpstreamTTL is how long a table keeps the record of an upstream
	// that no config lists, that owns no session and that nothing used.
	DefaultUpstreamTTL = 10 * time.Minute
)

// MinSessionTTL is the shortest session TTL accepted. A shorter one would
// forget sessions between a client's requests; MCP sessions live for
// minutes to hours.
const MinSessionTTL = time.Second

// sweepBatch is the most entries the janitor examines under one lock hold.
const sweepBatch = 1024

// EvictReason says why a session left the table: one of the Evict
// constants. Its String is the `reason` label of the evictions metric. The
// zero value is no reason; it and any other value that is none of the
// constants are invalid: Table methods given one evict and count nothing.
type EvictReason uint8

// The reasons a session leaves the table.
const (
	// EvictTTL: idle for longer than the table's TTL, with no open GET stream.
	EvictTTL EvictReason = iota + 1
	// EvictLRU: the least recently used session, pushed out of a full table.
	EvictLRU
	// EvictDelete: the upstream answered the session's DELETE with 2xx or 404.
	EvictDelete
	// EvictUpstream404: the upstream answered a POST or DELETE of the session with 404.
	EvictUpstream404
	// EvictUpstreamGone: the pinned upstream was removed, refused connections,
	// or failed active health checks for longer than the policy's grace.
	EvictUpstreamGone
	// EvictAdmin: an operator evicted the session through the admin API.
	EvictAdmin
	// EvictRelearned: another upstream answered an initialize with the same session ID.
	EvictRelearned
	// EvictUnconfirmed: a session not used since its initialize, pushed out
	// of a full table by a newer one (see [Table.LearnFrom]).
	EvictUnconfirmed
	// EvictClientCap: a session not used since its initialize, pushed out by
	// a newer one of the same client at max_unconfirmed_per_client.
	EvictClientCap
	// EvictStreamClosed: the SSE stream of a legacy HTTP+SSE session closed,
	// which ends the session (MCP 2024-11-05 transports, §HTTP with SSE).
	EvictStreamClosed
)

// evictReasonNames holds the label of each EvictReason at its value's index;
// index 0, the zero value, is no reason.
var evictReasonNames = [...]string{"", "ttl", "lru", "delete", "upstream_404", "upstream_gone", "admin", "relearned", "unconfirmed", "client_cap", "stream_closed"}

// evictReasons lists every valid EvictReason.
var EvictReasons = [...]EvictReason{EvictTTL, EvictLRU, EvictDelete, EvictUpstream404, EvictUpstreamGone, EvictAdmin, EvictRelearned, EvictUnconfirmed, EvictClientCap, EvictStreamClosed}

// Valid reports whether r is one of the Evict constants.
func (r EvictReason) Valid() bool { return r > 0 && int(r) < len(evictReasonNames) }

// leavesTombstone reports whether a session that leaves the table for r
// ended for good: the client ended it (DELETE) or an operator evicted it.
// Neither failover nor its sealed ID brings it back (tombstone.go).
func (r EvictReason) leavesTombstone() bool { return r == EvictDelete || r == EvictAdmin }

// local reports whether r is one of the table's own bounds, which forget a
// session here but do not end it.
func (r EvictReason) local() bool {
	return r == EvictTTL || r == EvictLRU || r == EvictUnconfirmed || r == EvictClientCap
}

// String returns the reason's metric label, e.g. "ttl", or
// "EvictReason(<n>)" for an invalid value.
func (r EvictReason) String() string {
	if !r.Valid() {
		return fmt.Sprintf("EvictReason(%d)", r)
	}
	return evictReasonNames[r]
}

// Era is the MCP protocol era of a request, as the proxy can tell it from
// its headers: one of the Era constants. Its String is the `era` label of
// the requests metric. The zero value and any value that is none of the
// constants are invalid, and count no requests.
type Era uint8

// The eras of MCP traffic.
const (
	// EraLegacySession: a request carrying Mcp-Session-Id, which exists only
	// in protocol versions 2025-03-26 to 2025-11-25.
	EraLegacySession Era = iota + 1
	// EraModern: a sessionless 2026-07-28 (or later) request, recognised by
	// its Mcp-Method header or an MCP-Protocol-Version of 2026-07-28 or later
	// (MCP 2026-07-28 transports, §Streamable HTTP headers).
	EraModern
	// EraOther: any other request without a session: a legacy initialize,
	// traffic of stateless servers, CORS preflights.
	EraOther
)

// eraNames holds the label of each Era at its value's index; index 0, the
// zero value, is no era.
var EraNames = [...]string{"", "legacy_session", "modern_sessionless", "other_sessionless"}

// eras lists every valid Era.
var Eras = [...]Era{EraLegacySession, EraModern, EraOther}

// Valid reports whether e is one of the Era constants.
func (e Era) Valid() bool { return e > 0 && int(e) < len(EraNames) }

// String returns the era's metric label, e.g. "legacy_session", or
// "Era(<n>)" for an invalid value.
func (e Era) String() string {
	if !e.Valid() {
		return fmt.Sprintf("Era(%d)", e)
	}
	return EraNames[e]
}

// Upstream is the table's record of one upstream that owns sessions. It is
// identified by its dial address (reverseproxy.Upstream.Dial), which stays the
// same across config reloads, unlike *reverseproxy.Upstream values.
type Upstream struct {
	dial    string
	live    atomic.Int64
	streams atomic.Int64 // GET streams of its sessions open through the proxy
	// servedStream: it answered a session's GET with a stream (200), so it
	// has a GET route, and a 404 to a GET there means the session is unknown.
	servedStream atomic.Bool
	draining     atomic.Bool
	cluster      atomic.Int64 // live sessions on every instance, with a shared store
	lastSeen     atomic.Int64 // last use here, in nanoseconds since the table's epoch
	seenAway     atomic.Int64 // last use by another instance, as the shared store says; same unit
	configured   atomic.Bool  // a reverse_proxy of the running config lists it
	// drainDeadline is when draining ends for the remaining sessions, which
	// then fail over, in nanoseconds since the table's epoch; 0 for none.
	drainDeadline atomic.Int64
	stuckUntil    atomic.Int64 // it gets no new sessions until then (see [Table.MarkStuck]); same unit as lastSeen
	refusingUntil atomic.Int64 // it refused a new session and gets none until then (see [Table.MarkRefusing]); same unit
	refusals      atomic.Uint64
	evicted       atomic.Uint64 // its sessions that left the table, for any reason
	movedAway     atomic.Uint64 // its sessions that this instance failed over to another upstream
	// mcpPath and version are the request path of its last initialize and
	// the last MCP-Protocol-Version its sessions used, for the DELETEs of
	// forgotten sessions (forget.go).
	mcpPath, version atomic.Pointer[string]
}

// Evicted returns how many of the upstream's sessions left the table, for
// any reason (see [EvictReason]), since the table learned the upstream.
func (u *Upstream) Evicted() uint64 { return u.evicted.Load() }

// MovedAway returns how many of the upstream's sessions this instance
// failed over to another upstream.
func (u *Upstream) MovedAway() uint64 { return u.movedAway.Load() }

// NewUpstream returns a record of the upstream dialed at dial that no
// table holds: for a request's owner outside any table, as in tests.
func NewUpstream(dial string) *Upstream { return &Upstream{dial: dial} }

// Dial returns the upstream's dial address, as written in the config.
func (u *Upstream) Dial() string { return u.dial }

// LiveSessions returns the number of sessions the table pins to the upstream.
func (u *Upstream) LiveSessions() int64 { return u.live.Load() }

// Draining reports whether the upstream is draining: it gets no new
// sessions but keeps serving its pinned ones.
func (u *Upstream) Draining() bool { return u.draining.Load() }

// OpenStreams returns the number of GET streams of the upstream's sessions
// open through the proxy.
func (u *Upstream) OpenStreams() int64 { return u.streams.Load() }

// AddStreams counts delta GET streams of the upstream's sessions opened
// (above 0) or closed (below 0) through the proxy.
func (u *Upstream) AddStreams(delta int64) { u.streams.Add(delta) }

// ServedStream reports whether the upstream answered a session's GET with
// a stream (200): it has a GET route, so a 404 to a GET there means the
// session is unknown.
func (u *Upstream) ServedStream() bool { return u.servedStream.Load() }

// MarkServedStream records that the upstream answered a session's GET
// with a stream (see [Upstream.ServedStream]).
func (u *Upstream) MarkServedStream() {
	if !u.servedStream.Load() {
		u.servedStream.Store(true)
	}
}

// SetClusterSessions records n, the live sessions of the upstream on
// every instance sharing the table's store, as the store counted them.
func (u *Upstream) SetClusterSessions(n int64) { u.cluster.Store(n) }

// AddClusterSessions adds n to the upstream's live sessions on every
// instance: a store that does not count them on each write adds what it
// wrote, until its next count.
func (u *Upstream) AddClusterSessions(n int64) { u.cluster.Add(n) }

// entry is the table's value for one session. It is kept small (40 bytes):
// it is stored inline in the LRU's list element, one per live session.
type entry struct {
	up *Upstream
	// lastUsed is the time of the last use in nanoseconds since the table's
	// epoch, as recorded per touch interval: up to the end of the current
	// interval (see [Table.usedAt]).
	lastUsed int64
	// created is when the session was learned, in seconds since the table's epoch.
	created uint32
	// streams counts GET streams of the session open through the proxy.
	streams int32
	// principal is the keyed hash of the principal the session is bound
	// to; zero when it is unbound.
	principal PrincipalSum
}

// Origin says who opened a session, as the handler evaluates its
// placeholders for the request that opened it.
type Origin struct {
	// Principal is what the session is bound to: later requests must carry
	// the same principal. Empty leaves the session unbound.
	Principal string
	// Client identifies the client for the cap on unconfirmed sessions per
	// client; empty is not capped.
	Client string
}

// SessionInfo describes one session of a table.
type SessionInfo struct {
	// Upstream is the dial address of the upstream that owns the session.
	Upstream string
	// Age is the time since the session was learned, at 1 s resolution.
	Age time.Duration
	// Idle is the time since the session was last used, at 1 s resolution.
	// Uses are recorded per touch interval (see [Table.LookupAs]): it is 0
	// until the end of an interval in which the session was used twice.
	Idle time.Duration
	// OpenStreams is the number of GET streams of the session open through the proxy.
	OpenStreams int
	// Bound reports whether the session is bound to a principal.
	Bound bool
	// FromStore reports that only the shared store knows the session: this
	// instance has not served it, so Age, Idle and OpenStreams are zero.
	FromStore bool
}

// Stats are a table's counters since it was created. They are read by the
// metrics collector and the admin API.
type Stats struct {
	learned, pinned, unknown, gone, mismatch, unavailable atomic.Uint64
	shared                                                atomic.Uint64                        // sessions taken from the shared store
	eras                                                  [len(EraNames)]atomic.Uint64         // indexed by Era
	evictions                                             [len(evictReasonNames)]atomic.Uint64 // indexed by EvictReason
	methods                                               MethodStats                          // by method and status; methodstats.go

	adopted atomic.Uint64 // sessions recorded from sealed session IDs

	// Reclaims count the DELETEs sent for sessions the table forgot (forget.go).
	Reclaims ReclaimStats

	failovers failoverStats // tablefailover.go
}

// CountRequest counts one request of era, a valid Era.
func (s *Stats) CountRequest(era Era) { s.eras[era].Add(1) }

// CountPinned counts one request sent to its session's upstream.
func (s *Stats) CountPinned() { s.pinned.Add(1) }

// CountUnknown counts one request answered 404 for an unknown session.
func (s *Stats) CountUnknown() { s.unknown.Add(1) }

// CountGone counts one request answered 404 because its session's
// upstream was gone.
func (s *Stats) CountGone() { s.gone.Add(1) }

// CountMismatch counts one request answered 404 because its principal was
// not the one its session is bound to.
func (s *Stats) CountMismatch() { s.mismatch.Add(1) }

// CountUnavailable counts one request answered 503 because its session's
// upstream was failing active health checks, within the grace.
func (s *Stats) CountUnavailable() { s.unavailable.Add(1) }

// CountFailover counts one failover of cause that ended in result, one of
// the failover results (see [FailoverOutcome]).
func (s *Stats) CountFailover(cause FailoverCause, result string) { s.failovers.count(cause, result) }

// Methods returns the table's per-method counters.
func (s *Stats) Methods() *MethodStats { return &s.methods }

// Learned returns the number of sessions learned.
func (s *Stats) Learned() uint64 { return s.learned.Load() }

// Adopted returns the number of sessions recorded from sealed session IDs
// the table had not learned (see [Table.Adopt]).
func (s *Stats) Adopted() uint64 { return s.adopted.Load() }

// Pinned returns the number of requests sent to their session's upstream.
func (s *Stats) Pinned() uint64 { return s.pinned.Load() }

// Unknown returns the number of requests answered 404 for an unknown session.
func (s *Stats) Unknown() uint64 { return s.unknown.Load() }

// Gone returns the number of requests answered 404 because their session's upstream was gone.
func (s *Stats) Gone() uint64 { return s.gone.Load() }

// Shared returns the number of sessions the table took from its shared
// store: sessions learned by another instance (or before a restart), at the
// first request this instance saw of each.
func (s *Stats) Shared() uint64 { return s.shared.Load() }

// PrincipalMismatches returns the number of requests answered 404 because
// their principal was not the one their session is bound to.
func (s *Stats) PrincipalMismatches() uint64 { return s.mismatch.Load() }

// Unavailable returns the number of requests answered 503 because their
// session's upstream was failing active health checks, within the grace.
func (s *Stats) Unavailable() uint64 { return s.unavailable.Load() }

// Requests returns the number of requests of era; 0 for an invalid era.
func (s *Stats) Requests(era Era) uint64 {
	if !era.Valid() {
		return 0
	}
	return s.eras[era].Load()
}

// Table maps MCP session IDs to the upstream that created them. It is safe
// for concurrent use. It is bounded by a maximum number of sessions, and
// forgets sessions idle for longer than its TTL unless a GET stream of the
// session is open. The mcp_sessions app keeps tables across config
// reloads, by table name.
//
// It keeps sessions in two LRU lists of golang-lru's simplelru, in the
// spirit of its 2Q cache: a session starts unconfirmed (learned from an
// initialize response, not used since) and is confirmed by its first
// request. A new session pushes out the oldest unconfirmed one when the
// table is full, never a confirmed one while any unconfirmed session is
// left, so a flood of initialize requests cannot evict sessions in use;
// see [Table.LearnFrom]. A session with an open GET stream is never evicted
// to make room.
type Table struct {
	name string
	// Registry holds the table's upstream records and its clock.
	Registry
	// templates holds the bind_principal and client_key templates.
	templates
	// storeLink holds the shared store and the key of principal hashes.
	storeLink
	// lifetimes holds the TTL, the failover settings and what the table's
	// keys are: how long sessions and their tombstones live.
	lifetimes
	// forgetHooks holds the hook told of sessions the upstream may still hold (forget.go).
	forgetHooks
	// journalLink holds the table's event journal, nil while it is off.
	journalLink

	// index holds the sessions of this process, their kept initialize
	// requests and the lock that guards them (index.go, admission.go).
	index

	// tombs remembers the sessions that ended, which neither failover nor
	// a sealed ID brings back (tombstone.go).
	tombs *tombstones

	// Stats are the table's counters.
	Stats Stats

	// janitor sweeps expired sessions (janitor.go).
	janitor
}

// newSessionTable returns a table bounded to maxSessions entries with the given idle
// TTL, reading time from now (time.Now when nil). It errors when maxSessions
// is not positive. It starts no goroutine; see [Table.StartJanitor].
func NewTable(name string, maxSessions int, ttl time.Duration, now func() time.Time) (*Table, error) {
	monotonic := now == nil
	if now == nil {
		now = time.Now
	}
	if maxSessions < 1 {
		return nil, fmt.Errorf("session table %q: max_sessions must be at least 1, got %d", name, maxSessions)
	}
	t := &Table{name: name, janitor: newJanitor(), tombs: newTombstones(maxSessions)}
	t.Registry.init(timebase{now: now, epoch: now(), monotonic: monotonic})
	t.keys.Store(newPrincipalKeys(nil))
	t.unconfirmed, _ = simplelru.NewLRU(math.MaxInt, t.onEvictUnconfirmed)
	t.confirmed, _ = simplelru.NewLRU(math.MaxInt, t.onEvict)
	t.max = maxSessions
	t.ttl.Store(int64(ttl))
	t.index.now, t.index.idleTTL = t.clock, &t.lifetimes.ttl

	return t, nil
}

// Name returns the table's name.
func (t *Table) Name() string { return t.name }

// Configure changes the table's bounds in place. Shrinking evicts
// unconfirmed sessions first, oldest first (reason unconfirmed), then the
// least recently used confirmed ones without an open GET stream (reason
// lru). A ttl of 0 or less leaves the TTL as is. maxSessions bounds the
// table's tombstones too (tombstone.go).
// See also [Table.SetUpstreamTTL].
func (t *Table) Configure(maxSessions int, ttl time.Duration) {
	if ttl > 0 {
		t.ttl.Store(int64(ttl))
		t.rearmJanitor()
	}
	if maxSessions > 0 {
		t.mu.Lock()
		t.max = maxSessions
		t.makeRoom(0, "")
		t.mu.Unlock()
		t.tombs.setMax(maxSessions)
	}
}

// Lookup returns the upstream that owns the session id, for a request
// without a principal: see [Table.LookupAs].
func (t *Table) Lookup(id string) *Upstream {
	up, _ := t.LookupAs(id, "")
	return up
}

// LookupAs returns the upstream that owns the session id, or nil if the
// table does not hold it (never learned, expired, evicted) or if principal
// may not use it. A session bound to a principal may be used only by
// requests carrying the same principal; an unbound one by any request.
// mismatch reports a held session refused for its principal. A hit counts
// as use: it refreshes the idle TTL and the session's LRU position, at the
// resolution of one touch interval (see [Table.usedAt]); a mismatch
// changes nothing. With a shared store, a session this table does
// not hold is looked up in the store, once: the table keeps it from then on.
func (t *Table) LookupAs(id, principal string) (up *Upstream, mismatch bool) {
	up, mismatch, _ = t.LookupEnded(id, principal)
	return up, mismatch
}

// lookup is LookupAs that also reports, for a session the table does not
// hold, whether it ended for good: a tombstone here or, with a shared
// store, in the store (tombstone.go).
func (t *Table) LookupEnded(id, principal string) (up *Upstream, mismatch, ended bool) {
	sum := t.keys.Load().sum(principal) // outside the lock: it costs about a microsecond
	e, mismatch, touch, confirmed := t.lookupHere(id, sum)
	if e.up != nil || mismatch {
		if confirmed != "" {
			if c := t.shared(); c != nil {
				c.Rekey(confirmed) // outside the lock: hashing costs about a microsecond
			}
		}
		if touch != "" {
			t.shared().Touch(id, touch)
		}
		return e.up, mismatch, false
	}
	if t.Buried(id) == TombEnded {
		return nil, false, true
	}
	if c := t.shared(); c != nil {
		s := c.Get(id)
		if s.Ended != 0 {
			return nil, false, true
		}
		up, mismatch = t.AdoptShared(id, s, sum)
		return up, mismatch, false
	}
	return nil, false, false
}

// lookupHere is LookupAs in this process's table: the session's entry (a
// zero entry when the table does not hold it). When the shared store's
// idle timer of the session is due for a refresh, touch is the session's
// value in the store. When this lookup confirmed the session, confirmed is
// the key the table now holds it by (see [Table.confirm]).
func (t *Table) lookupHere(id string, sum PrincipalSum) (e entry, mismatch bool, touch, confirmed string) {
	now := t.clock()
	if e, mismatch, ok := t.lookupRecorded(id, sum, now); ok {
		return e, mismatch, "", ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, list, ok := t.peek(id)
	if !ok {
		return entry{}, false, "", ""
	}
	if t.expired(e, now) {
		t.reason = EvictTTL
		list.Remove(id)
		return entry{}, false, "", ""
	}
	if t.refused(e.principal, sum) {
		return entry{}, true, "", ""
	}
	if t.shared() != nil && crossed(e.lastUsed, now, TouchInterval(t.TTL())) {
		touch = EncodeValue(e.up.dial, e.principal, t.inits[id].record())
	}
	if list == t.confirmed {
		e.lastUsed = t.usedAt(e.lastUsed, now)
	} else {
		e.lastUsed = now // its first use, which confirms it, is recorded exactly
	}
	confirmed = t.use(id, e, list)
	return e, false, touch, confirmed
}

// lookupRecorded is lookupHere under the read lock, for the lookups that
// change nothing: a session the table does not hold, one refused for its
// principal, and a confirmed session whose use at now is already recorded
// (see [Table.usedAt]). ok is false when the lookup must record a use.
func (t *Table) lookupRecorded(id string, sum PrincipalSum, now int64) (e entry, mismatch, ok bool) {
	l := t.mu.stripe(id)
	l.RLock()
	defer l.RUnlock()
	e, held := t.confirmed.Peek(id)
	switch {
	case !held:
		return entry{}, false, !t.unconfirmed.Contains(id)
	case t.expired(e, now):
		return entry{}, false, false
	case t.refused(e.principal, sum):
		return entry{}, true, true
	}
	return e, false, now <= e.lastUsed
}

// usedAt returns the lastUsed to record for a use at now of a confirmed
// session whose recorded lastUsed is last. Uses are recorded per touch
// interval (an eighth of the TTL, 1 s to 1 min), which also orders the
// LRU lists: the first use in an interval (and the first use of a
// session) is recorded exactly and moves the session to the front; a
// second one records the end of the interval instead, so that the uses
// after it, up to then, are recorded already and neither write nor move
// anything. A session is therefore never forgotten before it was idle for
// the TTL; one used more than once within its last interval is forgotten
// up to one interval later.
func (t *Table) usedAt(last, now int64) int64 {
	every := int64(TouchInterval(t.TTL()))
	if now > last && now/every != last/every {
		return now
	}
	return max(last, (now/every+1)*every-1)
}

// crossed reports whether a use at now falls in another interval than the
// use at last: the store's idle timer is refreshed once per interval.
func crossed(last, now int64, interval time.Duration) bool {
	return last/int64(interval) != now/int64(interval)
}

// adoptShared puts session id, as the shared store holds it (its
// upstream, its principal, its failover record), in the table, and returns
// its upstream for a request with principal sum; nil when the store does
// not hold it, or, with mismatch, when the principal may not use the
// session. The session enters confirmed (see [Table.adoptHere]).
func (t *Table) AdoptShared(id string, s Stored, sum PrincipalSum) (*Upstream, bool) {
	if s.Dial == "" {
		return nil, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, _, ok := t.peek(id)
	if !ok { // else learned meanwhile
		id = strings.Clone(id) // the request's, which may share a larger buffer (see [Table.confirm])
		e = t.adoptHere(id, t.UseUpstream(s.Dial), s.Bound)
		t.Stats.shared.Add(1)
		if _, held := t.confirmed.Peek(id); held && s.Init != nil {
			t.keepInitHere(id, s.Init)
		}
	}
	if t.refused(e.principal, sum) {
		return nil, true
	}
	return e.up, false
}

// Learn records that upstream dial owns session id, opened by a request
// without a principal: see [Table.LearnFrom].
func (t *Table) Learn(id, dial string) bool { return t.LearnFrom(id, dial, Origin{}) }

// LearnFrom records that upstream dial owns session id, opened by origin,
// and reports whether the table changed. Learning is for responses to
// requests without a session (initialize): when such a response names a
// session the table already holds for another upstream or principal, the
// newer answer wins. With a shared store, LearnFrom returns once the store
// has the session too, or failed to take it in time.
//
// The session starts unconfirmed. To make room it pushes out, in order:
// the oldest unconfirmed session of the same client when that client is at
// its cap (reason client_cap); when the table is full, the oldest
// unconfirmed session (reason unconfirmed); only when no unconfirmed
// session is left, the least recently used confirmed session without an
// open GET stream (reason lru). When every session has an open GET stream
// there is no room: the new session is counted as learned and evicted
// (reason lru) at once, and LearnFrom returns false.
func (t *Table) LearnFrom(id, dial string, origin Origin) bool {
	return t.LearnInit(id, dial, origin, nil)
}

// learnInit is LearnFrom that keeps init, the session's initialize, for
// failover, when not nil; with a shared store, the session's value there
// carries it.
func (t *Table) LearnInit(id, dial string, origin Origin, init *Init) bool {
	sum := t.keys.Load().sum(origin.Principal)
	up, changed := t.learnHere(id, dial, sum, origin.Client)
	if !changed {
		return false
	}
	c := t.shared()
	if c != nil && init != nil {
		init = c.WithRecord(id, init)
	}
	if init != nil {
		t.KeepInit(id, init)
	}
	if c != nil {
		up.cluster.Add(1)
		c.Put(id, dial, sum, init.record())
	}
	return true
}

func (t *Table) learnHere(id, dial string, sum PrincipalSum, client string) (*Upstream, bool) {
	now := t.clock()
	t.mu.Lock()
	defer t.mu.Unlock()
	up := t.UseUpstream(dial)
	if e, list, ok := t.peek(id); ok {
		if e.up == up && e.principal == sum && !t.expired(e, now) {
			return up, false
		}
		t.reason = EvictTTL
		if e.up != up || e.principal != sum {
			t.reason = EvictRelearned
		}
		list.Remove(id)
	}
	t.Stats.learned.Add(1)
	if !t.makeRoom(1, client) {
		t.refuse(id, up)
		return up, false
	}
	t.unconfirmed.Add(id, entry{up: up, lastUsed: now, created: uint32(now / int64(time.Second)), principal: sum})
	t.perClient.add(id, client)
	up.live.Add(1)
	t.tombs.remove(id) // an upstream opened a session with this ID again
	return up, true
}

// Adopt records that upstream dial owns session id, opened by origin,
// unless the table holds the session already, and returns the owner's
// record. It is for sessions whose request names their upstream itself
// (sealed session IDs) and that this table has not learned: learned on
// another replica, before a restart, or forgotten since. The session
// enters confirmed (see [Table.adoptHere]). It returns nil, adopting
// nothing, for a session that ended here for good: the client ended it
// (DELETE) or an operator evicted it, not long ago (tombstone.go).
func (t *Table) Adopt(id, dial string, origin Origin) *Upstream {
	up := t.UseUpstream(dial)
	sum := t.keys.Load().sum(origin.Principal)
	now := t.clock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, list, ok := t.peek(id); ok {
		if !t.expired(e, now) {
			return e.up
		}
		t.reason = EvictTTL
		list.Remove(id)
	}
	if t.tombs.get(id, now) == TombEnded {
		return nil
	}
	t.adoptHere(id, up, sum)
	t.Stats.adopted.Add(1)
	return up
}

// adoptHere puts session id, owned by up and bound to sum, in the
// confirmed list, and returns its entry; t.mu is held. An adopted session
// is confirmed at once: the request that names it is its use, and only a
// session someone opened can be adopted (a sealed ID is authenticated, a
// shared store's entry was learned by an instance), so a flood of
// initialize responses never adds to the confirmed list this way. To make
// room it evicts like [Table.LearnFrom]; when every session has an open
// GET stream, the session is not kept, and the request is served anyway.
func (t *Table) adoptHere(id string, up *Upstream, sum PrincipalSum) entry {
	now := t.clock()
	e := entry{up: up, lastUsed: now, created: uint32(now / int64(time.Second)), principal: sum}
	if !t.makeRoom(1, "") {
		t.refuse(id, up)
		return e
	}
	t.confirmed.Add(id, e)
	up.live.Add(1)
	return e
}

// Evict removes session id for the given reason and reports whether the
// table held it. An invalid reason evicts nothing and returns false. With a
// shared store, a session that ended (any reason but ttl, lru, unconfirmed
// and client_cap, which are this table's own bounds) is removed from the
// store and from every instance's table too, even if this table did not
// hold it. A session that ended for good (reasons delete and admin) leaves
// a tombstone, here and in the store (tombstone.go).
func (t *Table) Evict(id string, reason EvictReason) bool {
	return t.evict(id, reason, reason.leavesTombstone())
}

// endByClient evicts session id for reason, a DELETE of the client ended
// it, whatever the reason: a tombstone stays, here and in the store.
func (t *Table) EndByClient(id string, reason EvictReason) bool {
	return t.evict(id, reason, true)
}

// evict is Evict that leaves a tombstone with bury.
func (t *Table) evict(id string, reason EvictReason, bury bool) bool {
	if !reason.Valid() {
		return false
	}
	dial, upstreamID, held := t.evictHere(id, reason)
	if bury && (!held || !reason.leavesTombstone()) { // else the eviction callback buried it
		t.bury(id, TombEnded)
	}
	c := t.shared()
	if c == nil || reason.local() {
		return held
	}
	if !held {
		if dial, _ = c.Peek(id); dial == "" {
			return false
		}
	}
	if u := t.KnownUpstream(dial); u != nil && u.cluster.Add(-1) < 0 {
		u.cluster.Store(0)
	}
	var life time.Duration
	if bury && t.buries(id) {
		life = t.tombLife(id)
	}
	var reclaim *Forgotten
	if reason.Reclaims() && t.Reclaiming() {
		reclaim = &Forgotten{Key: strings.Clone(id), Dial: dial, UpstreamID: upstreamID, Reason: reason}
	}
	c.End(id, dial, reason, life, reclaim)
	return true
}

// EvictUpstream removes every session of the upstream dialed at dial, for
// reason, and returns how many it removed (0 for an upstream the table does
// not know, or an invalid reason). It walks the whole table under its lock:
// an operator's call, not a request path. With a shared store, the sessions
// the store holds are removed from it and every instance's table too, and
// it returns once the store has that (see [Shared.EndUpstream]).
func (t *Table) EvictUpstream(dial string, reason EvictReason) int {
	if !reason.Valid() {
		return 0
	}
	n := t.EvictUpstreamHere(dial, reason)
	if c := t.shared(); c != nil {
		var life time.Duration
		if reason.leavesTombstone() {
			life = t.tombLifeAny()
		}
		c.EndUpstream(dial, life)
		if u := t.KnownUpstream(dial); u != nil {
			u.cluster.Store(0)
		}
	}
	return n
}

func (t *Table) EvictUpstreamHere(dial string, reason EvictReason) int {
	u := t.KnownUpstream(dial)
	if u == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reason = reason
	n := 0
	for _, list := range t.lists() {
		for _, id := range list.Keys() {
			if e, ok := list.Peek(id); ok && e.up == u {
				list.Remove(id)
				n++
			}
		}
	}
	return n
}

// StreamOpened marks a GET stream of session id as open: the session does not
// expire until every opened stream is closed with [Table.StreamClosed].
func (t *Table) StreamOpened(id string) { t.addStreams(id, 1) }

// StreamClosed undoes one [Table.StreamOpened] and counts as use of the session.
func (t *Table) StreamClosed(id string) { t.addStreams(id, -1) }

func (t *Table) addStreams(id string, delta int32) {
	now := t.clock()
	t.mu.Lock()
	defer t.mu.Unlock()
	e, list, ok := t.peek(id)
	if !ok {
		return
	}
	e.streams = max(e.streams+delta, 0)
	e.lastUsed = now
	t.use(id, e, list) // a stream is use
	if c := t.shared(); c != nil {
		c.Streaming(id, EncodeValue(e.up.dial, e.principal, t.inits[id].record()), e.streams > 0)
	}
}

// Evictions returns how many sessions left the table for reason since it
// was created; 0 for an invalid reason.
func (t *Table) Evictions(reason EvictReason) uint64 {
	if !reason.Valid() {
		return 0
	}
	return t.Stats.evictions[reason].Load()
}

// SetDraining starts (on) or ends (!on) draining the upstream dialed at
// dial, and returns its record. A draining upstream gets no new sessions
// from the mcp_session policy but keeps serving its pinned ones. With a
// shared store, every instance drains it.
func (t *Table) SetDraining(dial string, on bool) *Upstream {
	u := t.DrainHere(t.UseUpstream(dial), on)
	if c := t.shared(); c != nil {
		c.Drain(dial, on)
	}
	return u
}

// Info returns what the table knows of session id, without counting it as
// use. With a shared store, a session this table does not hold is looked up
// in the store, which knows its upstream and whether it is bound.
func (t *Table) Info(id string) (SessionInfo, bool) {
	now := t.clock()
	t.mu.RLock()
	e, _, ok := t.peek(id)
	t.mu.RUnlock()
	if !ok || t.expired(e, now) {
		return t.infoShared(id)
	}
	return SessionInfo{
		Upstream:    e.up.dial,
		Age:         time.Duration(now/int64(time.Second)-int64(e.created)) * time.Second,
		Idle:        time.Duration(max(now-e.lastUsed, 0)).Truncate(time.Second),
		OpenStreams: int(e.streams),
		Bound:       e.principal != PrincipalSum{},
	}, true
}

// onEvictUnconfirmed is the unconfirmed list's eviction callback; it runs
// with t.mu held. A session moving to the confirmed list is not leaving.
func (t *Table) onEvictUnconfirmed(id string, e entry) {
	t.perClient.remove(id)
	if !t.moving {
		t.onEvict(id, e)
	}
}

// onEvict is the eviction callback of the confirmed list, and of the
// unconfirmed one for sessions leaving the table; it runs with t.mu held.
func (t *Table) onEvict(id string, e entry) {
	if l := t.logger.Load(); l != nil {
		if c := l.Check(zapcore.DebugLevel, "evicted"); c != nil {
			c.Write(zap.Stringer("reason", t.reason), zap.String("session", t.fingerprint(id)), zap.String("upstream", e.up.dial))
		}
	}
	e.up.live.Add(-1)
	e.up.evicted.Add(1)
	if t.shared() == nil && t.reason.Reclaims() {
		t.Reclaim(Forgotten{Key: id, Dial: e.up.dial, UpstreamID: t.inits[id].upstreamID(), Reason: t.reason})
	}
	delete(t.inits, id)
	t.Stats.evictions[t.reason].Add(1) // valid: only the table's own code and Evict's checked reasons set it
	switch {
	case t.reason.leavesTombstone():
		t.bury(id, TombEnded)
	case t.reason == EvictTTL && t.sealedKey(id) && t.shared() == nil && t.Failover().On:
		t.bury(id, TombExpired) // with a store, the store says when it expired everywhere
	}
	if c := t.shared(); c != nil {
		c.Forget(id)
	}
}

// Sweep removes the sessions that have been idle longer than the TTL and
// returns how many it removed. Sessions with an open GET stream are kept and
// count as used. It holds the table's lock for at most sweepBatch entries at
// a time.
func (t *Table) Sweep() int {
	removed := 0
	for _, list := range t.lists() {
		for {
			n, more := t.sweepBatch(list)
			removed += n
			if !more {
				break
			}
		}
	}
	t.sweepUpstreams()
	t.tombs.sweep(t.clock())
	return removed
}

// reasonNamed returns the EvictReason whose label is name; an invalid one
// for an unknown name.
func ReasonNamed(name string) EvictReason {
	for _, r := range EvictReasons {
		if r.String() == name {
			return r
		}
	}
	return 0
}

// KeyKinds tell a table what its keys are, which the layer that makes
// them knows: a plain Mcp-Session-Id, or the decoded form of a sealed
// session ID, which any replica can adopt.
type KeyKinds struct {
	// Sealed reports whether key is a sealed session ID's; nil: none is.
	Sealed func(key string) bool
	// Fingerprint names key in logs without revealing it: a short hex
	// string. Nil: the first 6 bytes of the key's SHA-256, in hex.
	Fingerprint func(key string) string
}
