package session

import (
	"hash/maphash"
	"sync"
	"time"
)

// Tombstones: what a table remembers of the sessions that ended, so that
// neither failover nor a sealed session ID brings one back. A session the
// client ended (DELETE), that an operator evicted, or that expired leaves
// the table, and its kept initialize with it; but a sealed ID still opens
// on every replica and carries the initialize, and a request in flight
// may still be failing the session over. A tombstone refuses both until
// the ID's natural end, past which nothing can bring the session back
// anyway: for a plain ID, session_ttl and one touch interval (the longest
// another replica sharing the store may still hold it); for a sealed ID,
// failover_max_age if that is longer (past it, failover refuses the ID by
// its issue time).
//
// Tombstones are per table and bounded: at most max_sessions, each a 64-bit
// keyed hash of the table key (never the ID) and an expiry, about 60
// bytes. When more sessions end within a tombstone's life, the oldest
// tombstones are dropped first. With the redis store, the tombstones of
// ended sessions are written to the shared store too (see [Shared.End]), so that every
// replica refuses them; expiry needs none there, since Redis forgets the
// session's value when it expires everywhere.

// tombKind says what a tombstone refuses.
type TombKind uint8

const (
	// tombExpired: the session expired here (session_ttl, without a shared
	// store). It fails over no more; a sealed ID of it still routes to its
	// own upstream, which decides whether the session lives.
	TombExpired TombKind = iota + 1
	// tombEnded: the client ended the session (DELETE) or an operator
	// evicted it. A sealed ID of it gets the unknown session's 404 and is
	// not adopted, and it fails over no more.
	TombEnded
)

// tomb is one tombstone: when it expires, in nanoseconds since the
// table's epoch, what it refuses, and the sequence number of its latest
// write, which tells its latest place in the ring.
type tomb struct {
	until int64
	seq   uint32
	kind  TombKind
}

// tombSlot is one place of the ring: a key hash and the sequence number
// it was written with.
type tombSlot struct {
	h   uint64
	seq uint32
}

// tombstones is a bounded set of tombstones, keyed by a keyed hash of the
// table key. It is safe for concurrent use.
type tombstones struct {
	seed maphash.Seed

	mu    sync.Mutex
	byKey map[uint64]tomb
	ring  []tombSlot // the writes in order, oldest at head; grows up to max
	head  int
	n     int // slots in use
	max   int
	seq   uint32
}

// newTombstones returns an empty set of at most max tombstones.
func newTombstones(max int) *tombstones {
	return &tombstones{seed: maphash.MakeSeed(), byKey: map[uint64]tomb{}, max: max}
}

// hash returns the key hash of table key id.
func (ts *tombstones) hash(id string) uint64 { return maphash.String(ts.seed, id) }

// setMax changes the bound, dropping the oldest tombstones past it.
func (ts *tombstones) setMax(max int) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for ts.n > max {
		ts.pop()
	}
	if max != ts.max {
		ts.relay()
		ts.max = max
	}
}

// relay lays the ring's slots in use out from index 0, oldest first, in a
// slice of their own; ts.mu is held.
func (ts *tombstones) relay() {
	slots := make([]tombSlot, ts.n, ts.n+1)
	for i := range ts.n {
		slots[i] = ts.ring[(ts.head+i)%len(ts.ring)]
	}
	ts.ring, ts.head = slots, 0
}

// add records a tombstone of kind for table key id until the given time
// (table clock), dropping expired tombstones at the head and, when the set
// is full, the oldest one. A key buried again keeps the later expiry and
// the stronger kind.
func (ts *tombstones) add(id string, kind TombKind, until, now int64) {
	h := ts.hash(id)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.max <= 0 {
		return
	}
	ts.expire(now)
	if ts.n == ts.max {
		ts.pop()
	}
	ts.seq++
	if old, ok := ts.byKey[h]; ok && old.until > now {
		until, kind = max(until, old.until), max(kind, old.kind)
	}
	ts.byKey[h] = tomb{until: until, seq: ts.seq, kind: kind}
	slot := tombSlot{h: h, seq: ts.seq}
	if ts.n == len(ts.ring) { // every slot in use, fewer than max: grow
		if ts.head != 0 {
			ts.relay()
		}
		ts.ring = append(ts.ring, slot)
	} else {
		ts.ring[(ts.head+ts.n)%len(ts.ring)] = slot
	}
	ts.n++
}

// pop drops the oldest slot, and its key's tombstone if that slot is the
// key's latest write; ts.mu is held and ts.n > 0.
func (ts *tombstones) pop() {
	s := ts.ring[ts.head]
	if t, ok := ts.byKey[s.h]; ok && t.seq == s.seq {
		delete(ts.byKey, s.h)
	}
	ts.head = (ts.head + 1) % len(ts.ring)
	ts.n--
	if ts.n == 0 {
		ts.head = 0
	}
}

// expire drops the tombstones at the head that expired by now; ts.mu is
// held. Tombstones of different lives are not in expiry order: one behind
// a longer-lived one waits for it, and lookups check the expiry anyway.
func (ts *tombstones) expire(now int64) {
	for ts.n > 0 {
		s := ts.ring[ts.head]
		if t, ok := ts.byKey[s.h]; ok && t.seq == s.seq && t.until > now {
			return
		}
		ts.pop()
	}
}

// get returns the kind of the live tombstone of table key id at now, or 0.
func (ts *tombstones) get(id string, now int64) TombKind {
	h := ts.hash(id)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if t, ok := ts.byKey[h]; ok && t.until > now {
		return t.kind
	}
	return 0
}

// remove drops the tombstone of table key id: an upstream opened a
// session with that ID again.
func (ts *tombstones) remove(id string) {
	h := ts.hash(id)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	delete(ts.byKey, h) // its slot goes when it reaches the head
}

// len returns the number of tombstones, expired ones not yet dropped included.
func (ts *tombstones) len() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.byKey)
}

// sweep drops the tombstones at the head that expired by now.
func (ts *tombstones) sweep(now int64) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.expire(now)
}

// bury records a tombstone of kind for table key id, if the table keeps
// tombstones of it.
func (t *Table) bury(id string, kind TombKind) {
	if !t.buries(id) {
		return
	}
	now := t.clock()
	t.tombs.add(id, kind, now+int64(t.tombLife(id)), now)
}

// buried returns the kind of the live tombstone of table key id, or 0 for none.
func (t *Table) Buried(id string) TombKind { return t.tombs.get(id, t.clock()) }

// Tombstones returns how many tombstones the table holds: sessions that
// ended or expired, which neither failover nor a sealed session ID brings
// back, until their ID's natural end. Expired ones not yet dropped count.
func (t *Table) Tombstones() int { return t.tombs.len() }

// buries reports whether the table keeps tombstones of key: a sealed ID,
// which any replica can adopt, or any session of a table that fails
// sessions over.
func (lt *lifetimes) buries(key string) bool {
	return lt.sealedKey(key) || lt.Failover().On
}

// tombLife returns how long the tombstone of table key key lives: the
// ID's natural end (see the top of this file).
func (lt *lifetimes) tombLife(key string) time.Duration {
	life := lt.TTL() + TouchInterval(lt.TTL())
	if lt.sealedKey(key) {
		life = max(life, lt.FailoverMaxAge())
	}
	return life
}

// tombLifeAny returns the longest a tombstone of the table lives, for
// sessions known only by their key hash.
func (lt *lifetimes) tombLifeAny() time.Duration {
	return max(lt.TTL()+TouchInterval(lt.TTL()), lt.FailoverMaxAge())
}
