package session

import (
	"math"
	"sync/atomic"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// index holds a table's sessions in this process: two LRU lists of
// golang-lru's simplelru (see [Table]), the kept initialize requests, the
// bounds, and the striped lock that guards them. Its methods read and
// change the lists alone; what an eviction means to the rest of the table
// (its counters, tombstones, the shared store) is the Table's, through the
// lists' eviction callbacks. A Table embeds it.
type index struct {
	mu stripedLock // a session's read lock serves lookups that record nothing (lookupRecorded)
	// unconfirmed holds the sessions not used since they were learned,
	// confirmed the others. Their own size bounds are never reached: the
	// table enforces max itself (admission.go).
	unconfirmed *simplelru.LRU[string, entry]
	confirmed   *simplelru.LRU[string, entry]
	max         int         // the bound on both lists together; guarded by mu
	reason      EvictReason // why an eviction callback is being called; guarded by mu
	moving      bool        // the callback is for a session moving to confirmed; guarded by mu
	perClient   clientCap   // guarded by mu

	inits map[string]*Init // by session; guarded by mu; nil until one is kept

	idleTTL *atomic.Int64 // the table's TTL, in nanoseconds (see [lifetimes])
	now     func() int64  // the table's clock (see [Registry])
}

// HoldUses records the next uses of sessions ids as made already, far
// into the future, so that their lookups write nothing: for benchmarks of
// the lookup path without its once-per-touch-interval writes. Sessions the
// table does not hold in its confirmed list are left out.
func (ix *index) HoldUses(ids []string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, id := range ids {
		if e, ok := ix.confirmed.Peek(id); ok {
			e.lastUsed = math.MaxInt64 / 2
			ix.confirmed.Add(id, e)
		}
	}
}

// Holds reports whether this process's table holds session id, expired
// or not, without asking the shared store or counting it as use.
func (ix *index) Holds(id string) bool {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	_, _, ok := ix.peek(id)
	return ok
}

// Purge forgets every session of this process's table, as the eviction
// callbacks see them (the shared store forgets them too, but ends none):
// for benchmarks of lookups that the table misses.
func (ix *index) Purge() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.unconfirmed.Purge()
	ix.confirmed.Purge()
}

// Unconfirmed returns the number of sessions not used since they were learned.
func (ix *index) Unconfirmed() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.unconfirmed.Len()
}

// Len returns the number of sessions in the table, expired ones not yet swept included.
func (ix *index) Len() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.len()
}

// MaxSessions returns the table's bound.
func (ix *index) MaxSessions() int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.max
}

// EvictHere removes session id from this process's table only, and returns
// its upstream's dial address and whether the table held it.
func (ix *index) EvictHere(id string, reason EvictReason) (string, bool) {
	dial, _, held := ix.evictHere(id, reason)
	return dial, held
}

// evictHere is EvictHere that also returns the ID the session's upstream
// knows it by, when a failover changed it (see [Forgotten]).
func (ix *index) evictHere(id string, reason EvictReason) (dial, upstreamID string, held bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	e, list, ok := ix.peek(id)
	if !ok {
		return "", "", false
	}
	upstreamID = ix.inits[id].upstreamID()
	ix.reason = reason
	list.Remove(id)
	return e.up.dial, upstreamID, true
}

// expired reports whether e has been idle longer than the TTL at time now.
func (ix *index) expired(e entry, now int64) bool {
	return e.streams == 0 && now-e.lastUsed > ix.idleTTL.Load()
}

func (ix *index) sweepBatch(list *simplelru.LRU[string, entry]) (removed int, more bool) {
	now := ix.now()
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for range sweepBatch {
		id, e, ok := list.GetOldest()
		if !ok || now-e.lastUsed <= ix.idleTTL.Load() {
			return removed, false
		}
		if e.streams > 0 {
			e.lastUsed = now // in use: move it to the front
			list.Add(id, e)
			continue
		}
		ix.reason = EvictTTL
		list.RemoveOldest()
		removed++
	}
	return removed, true
}
