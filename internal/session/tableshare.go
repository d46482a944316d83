package session

import (
	"encoding/hex"
	"strings"
	"time"
)

// snapshot returns every session of the table, for writing back to a store.
func (ix *index) Snapshot() []SessionRecord {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	out := make([]SessionRecord, 0, ix.len())
	for _, list := range ix.lists() {
		for _, id := range list.Keys() {
			if e, ok := list.Peek(id); ok {
				out = append(out, SessionRecord{id, e.up.dial, e.principal, ix.inits[id].record()})
			}
		}
	}
	return out
}

// touchInterval is how often a session in use has its idle timer refreshed
// in the shared store: an eighth of the TTL, between 1 s and 1 min.
func TouchInterval(ttl time.Duration) time.Duration { return JanitorInterval(ttl) }

// Shared is a table's connection to a store that it shares its sessions
// through with other instances (a module of the `mcp_sessions.stores`
// namespace opens it). The table calls it outside its own locks, and a
// store calls back into the table only through the table's exported
// methods. A session's value, as the table hands it to the store, is
// [EncodeValue]'s encoding of its upstream, principal and failover record.
type Shared interface {
	// Get returns session id as the store holds it, for a request this
	// table has no entry for: its upstream ("" when the store does not
	// hold it or did not answer in time), its principal and its failover
	// record; or, for a session that ended for good, only the reason of
	// its tombstone. The store remembers the session as one of this table.
	Get(id string) Stored
	// Peek is Get without remembering the session: for the admin API. It
	// returns the session's upstream ("" for none) and principal.
	Peek(id string) (dial string, bound PrincipalSum)
	// Put records that dial owns session id, bound to bound, with its
	// failover record (see [Shared.WithRecord]; "" for none). It returns
	// once the store has it, or failed to take it in time.
	Put(id, dial string, bound PrincipalSum, record string)
	// Rekey tells the store that the table now holds session id by this
	// copy of its ID (see [Table.confirm]).
	Rekey(id string)
	// Touch refreshes the idle timer of session id, whose value is v, soon.
	Touch(id, v string)
	// Streaming records whether session id, whose value is v, has GET
	// streams open here: while it has, its idle timer is kept fresh.
	Streaming(id, v string, open bool)
	// End removes session id of dial from the store and from every
	// instance's table, for reason; with a tomb life above 0 it leaves a
	// tombstone for that long, and returns once the store has it. With
	// reclaim not nil, the store hands it to [Table.Reclaim] if its write
	// ended the session in the store (another instance's write, or the
	// store's expiry, may have come first).
	End(id, dial string, reason EvictReason, tomb time.Duration, reclaim *Forgotten)
	// EndUpstream removes every session of dial from the store and from
	// every instance's table; with a tomb life, each leaves a tombstone for
	// that long. The sessions it removes are those the store holds when it
	// takes the eviction: one learned after it stays. It returns once the
	// store has it, or failed to take it in time (then it is written
	// later), and hands [Table.Reclaim] each session whose end its write
	// made.
	EndUpstream(dial string, tomb time.Duration)
	// Drain sets dial's draining flag in the store and on every instance, soon.
	Drain(dial string, on bool)
	// Forget drops what the store remembers of session id for this table,
	// which forgot the session (TTL, LRU, or ended elsewhere).
	Forget(id string)
	// Reachable reports whether the store answered its last call.
	Reachable() bool
	// Current reads session id for a failover: what the store holds, and
	// what it says of the session (storeUnknown when it did not answer).
	Current(id string) (Stored, StoreState)
	// Move records that session id moved from value old to value new. It
	// returns the zero storedSession once the store holds new; what the
	// store holds instead when another instance moved the session first;
	// or one with only ended set when the session ended for good meanwhile.
	// It errors when the store did not answer, and then writes new when it
	// answers again.
	Move(id, old, new string) (Stored, error)
	// WithRecord returns a copy of init carrying its sealed record for
	// session id in the store (sessionInit.stored).
	WithRecord(id string, init *Init) *Init
	// PrincipalKey returns the key principals are hashed under, the same
	// on every instance sharing the store (at least 32 bytes).
	PrincipalKey() []byte
	// Errors calls fn with each of the store's operations, the `op` label
	// of the store errors metric, and its failed calls so far.
	Errors(fn func(op string, n uint64))
}

// SetUpstreamTTL sets [Table.UpstreamTTL]; 0 or less leaves it as is.
func (t *Table) SetUpstreamTTL(d time.Duration) {
	if d > 0 {
		t.upstreamTTL.Store(int64(d))
		t.rearmJanitor()
	}
}

// sweepUpstreams drops the records of upstreams that no config lists, that
// own no session on any instance, and that nothing used for the upstream
// TTL (dynamic upstreams come and go), with their draining flags and metric
// series. It returns how many it dropped.
func (t *Table) sweepUpstreams() int {
	t.mu.Lock() // no session is learned onto a record while it may be dropped
	defer t.mu.Unlock()
	t.upMu.Lock()
	defer t.upMu.Unlock()
	n := 0
	for dial, u := range t.ups {
		if t.kept(u) {
			continue
		}
		if u.draining.Load() {
			t.draining.Add(-1)
		}
		delete(t.ups, dial)
		n++
	}
	return n
}

// sessionDial is one session of the table, its upstream, its principal,
// and its failover record in the store.
type SessionRecord struct {
	ID, Dial string
	Bound    PrincipalSum
	Record   string
}

// storeState is what Redis says of a session.
type StoreState uint8

const (
	// storeUnknown: Redis did not answer.
	StoreUnknown StoreState = iota
	// storeHolds: Redis holds the session.
	StoreHolds
	// storeAbsent: Redis holds no such session: it ended or expired on
	// every instance (or Redis lost it, restarting without persistence).
	StoreAbsent
	// storeEnded: a tombstone: the session ended for good.
	StoreEnded
)

// value is what Redis holds for a session: its upstream; the keyed hash
// of its principal when it is bound to one; and its sealed failover record,
// if any, marked by "~". A value without a record is the same as before
// failover records existed.
func EncodeValue(dial string, bound PrincipalSum, record string) string {
	v := dial
	if bound != (PrincipalSum{}) {
		v += " " + hex.EncodeToString(bound[:])
	}
	if record != "" {
		v += " ~" + record
	}
	return v
}

// parseValue splits a session's value in Redis; a malformed principal
// hash reads as bound to a principal no request has (never as unbound).
func ParseValue(v string) (dial string, bound PrincipalSum, record string) {
	dial, rest, _ := strings.Cut(v, " ")
	if i := strings.Index(rest, "~"); i >= 0 && (i == 0 || rest[i-1] == ' ') {
		rest, record = strings.TrimSuffix(rest[:i], " "), rest[i+1:]
	}
	if rest == "" {
		return dial, PrincipalSum{}, record
	}
	if n, err := hex.Decode(bound[:], []byte(rest)); err != nil || n != len(bound) || bound == (PrincipalSum{}) {
		bound = PrincipalSum{0xff}
	}
	return dial, bound, record
}

// ClusterSessions returns the live sessions of u on every instance sharing
// the table's store, as last read from the store plus what this instance
// learned since; without a shared store, its live sessions here.
func (l *storeLink) ClusterSessions(u *Upstream) int64 {
	if l.shared() == nil {
		return u.live.Load()
	}
	return max(u.cluster.Load(), u.live.Load())
}

// infoShared looks session id up in the shared store, if any.
func (l *storeLink) infoShared(id string) (SessionInfo, bool) {
	c := l.shared()
	if c == nil {
		return SessionInfo{}, false
	}
	dial, bound := c.Peek(id)
	return SessionInfo{Upstream: dial, Bound: bound != PrincipalSum{}, FromStore: true}, dial != ""
}
