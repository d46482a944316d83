package caddymodule

import (
	"time"
)

// touchInterval is how often a session in use has its idle timer refreshed
// in the shared store: an eighth of the TTL, between 1 s and 1 min.
func touchInterval(ttl time.Duration) time.Duration { return janitorInterval(ttl) }

// setStore connects the table to a shared store; nil keeps its sessions in
// this process only. With a store, principals are hashed under a key
// derived from the store's secret, which every instance shares; sessions
// bound to a principal before a table changed stores are refused
// afterwards (their principal's hash was made under another key).
func (t *Table) setStore(c *redisConn) {
	if old := t.store.Swap(c); old == c {
		return
	}
	if c == nil {
		t.keys.Store(newPrincipalKeys(nil))
		return
	}
	t.keys.Store(newPrincipalKeys(c.ks.principal))
}

// Shared reports whether the table shares its sessions through a store.
func (t *Table) Shared() bool { return t.store.Load() != nil }

// StoreReachable reports whether the table's shared store answered its last
// call; true without a shared store.
func (t *Table) StoreReachable() bool {
	c := t.store.Load()
	return c == nil || c.reachable()
}

// ClusterSessions returns the live sessions of u on every instance sharing
// the table's store, as last read from the store plus what this instance
// learned since; without a shared store, its live sessions here.
func (t *Table) ClusterSessions(u *Upstream) int64 {
	if t.store.Load() == nil {
		return u.live.Load()
	}
	return max(u.cluster.Load(), u.live.Load())
}

// infoShared looks session id up in the shared store, if any.
func (t *Table) infoShared(id string) (SessionInfo, bool) {
	c := t.store.Load()
	if c == nil {
		return SessionInfo{}, false
	}
	dial, bound := c.peek(id)
	return SessionInfo{Upstream: dial, Bound: bound != principalSum{}, FromStore: true}, dial != ""
}

// UpstreamTTL returns how long the table keeps the record of an upstream
// that no config lists, that owns no session and that nothing used.
func (t *Table) UpstreamTTL() time.Duration { return time.Duration(t.upstreamTTL.Load()) }

// SetUpstreamTTL sets [Table.UpstreamTTL]; 0 or less leaves it as is.
func (t *Table) SetUpstreamTTL(d time.Duration) {
	if d > 0 {
		t.upstreamTTL.Store(int64(d))
		t.rearmJanitor()
	}
}

// setConfigured marks the upstreams a reverse_proxy of the running config
// lists, creating their records, and unmarks the others.
func (t *Table) setConfigured(dials map[string]bool) {
	for dial := range dials {
		t.upstream(dial)
	}
	for _, u := range t.Upstreams() {
		u.configured.Store(dials[u.dial])
	}
}

// inUse reports whether this instance uses upstream u: a config lists it,
// it owns sessions here, or it was used here within the upstream TTL.
func (t *Table) inUse(u *Upstream) bool {
	return u.configured.Load() || u.live.Load() > 0 || u.streams.Load() > 0 ||
		t.clock()-u.lastSeen.Load() < t.upstreamTTL.Load()
}

// kept reports whether the table keeps the record of u: this instance
// uses it, or, with a shared store, another instance used it within the
// upstream TTL or it owns sessions there.
func (t *Table) kept(u *Upstream) bool {
	return t.inUse(u) || u.cluster.Load() > 0 || t.clock()-u.seenAway.Load() < t.upstreamTTL.Load()
}

// storeUpstream returns the record of dial, creating it, as known from the
// shared store only, if the table has none: its creation is no use here.
func (t *Table) storeUpstream(dial string) *Upstream {
	if u := t.knownUpstream(dial); u != nil {
		return u
	}
	u := t.upstream(dial)
	u.lastSeen.CompareAndSwap(u.lastSeen.Load(), 0)
	return u
}

// seenElsewhere records that another instance used u at when, as the
// shared store says, and returns u.
func (t *Table) seenElsewhere(u *Upstream, when time.Time) *Upstream {
	u.seenAway.Store(int64(when.Sub(t.now()) + time.Duration(t.clock())))
	return u
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
type sessionDial struct {
	id, dial string
	bound    principalSum
	record   string
}

// snapshot returns every session of the table, for writing back to a store.
func (t *Table) snapshot() []sessionDial {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]sessionDial, 0, t.len())
	for _, list := range t.lists() {
		for _, id := range list.Keys() {
			if e, ok := list.Peek(id); ok {
				out = append(out, sessionDial{id, e.up.dial, e.principal, t.inits[id].record()})
			}
		}
	}
	return out
}
