package session

import (
	"sync"
	"sync/atomic"
	"time"
)

// timebase is a table's clock: the time of its records, in nanoseconds
// since its epoch.
type timebase struct {
	now   func() time.Time
	epoch time.Time
	// monotonic is true when now is time.Now: clock then reads only the
	// monotonic clock (time.Since), one clock read per call instead of two.
	monotonic bool
}

// Registry is a table's record of its upstreams, by dial address: their
// live sessions here and on every instance, open streams, draining flags
// and deadlines, cool-offs (cooloff.go), and when they were last used
// here and elsewhere. A [Table] embeds it; it is safe for concurrent use.
type Registry struct {
	timebase

	upMu       sync.RWMutex
	ups        map[string]*Upstream
	draining   atomic.Int32 // how many upstreams are draining
	stuckUntil atomic.Int64 // the latest stuckUntil of its upstreams (cooloff.go)
	// refusingUntil is the latest refusingUntil of its upstreams (cooloff.go).
	refusingUntil atomic.Int64
	upstreamTTL   atomic.Int64 // nanoseconds; see DefaultUpstreamTTL
}

// init makes r an empty registry reading time from tb, keeping unused
// records for DefaultUpstreamTTL.
func (r *Registry) init(tb timebase) {
	r.timebase, r.ups = tb, make(map[string]*Upstream)
	r.upstreamTTL.Store(int64(DefaultUpstreamTTL))
}

// clock returns the current time in nanoseconds since the table's epoch.
func (b *timebase) clock() int64 {
	if b.monotonic {
		return int64(time.Since(b.epoch))
	}
	return int64(b.now().Sub(b.epoch))
}

// Upstreams returns the table's upstream records, in no particular order.
func (r *Registry) Upstreams() []*Upstream {
	r.upMu.RLock()
	defer r.upMu.RUnlock()
	ups := make([]*Upstream, 0, len(r.ups))
	for _, u := range r.ups {
		ups = append(ups, u)
	}
	return ups
}

// upstream returns the record of dial, creating it on first use, and
// counts the call as use of the upstream.
func (r *Registry) UseUpstream(dial string) *Upstream {
	u := r.KnownUpstream(dial)
	if u == nil {
		r.upMu.Lock()
		if u = r.ups[dial]; u == nil {
			u = &Upstream{dial: dial}
			r.ups[dial] = u
		}
		r.upMu.Unlock()
	}
	u.lastSeen.Store(r.clock())
	return u
}

// knownUpstream returns the record of dial, or nil if the table has none.
func (r *Registry) KnownUpstream(dial string) *Upstream {
	r.upMu.RLock()
	defer r.upMu.RUnlock()
	return r.ups[dial]
}

// drainHere sets u's draining flag in this process's table, without
// counting it as use of u.
func (r *Registry) DrainHere(u *Upstream, on bool) *Upstream {
	if u.draining.Swap(on) != on {
		if on {
			r.draining.Add(1)
		} else {
			r.draining.Add(-1)
		}
	}
	return u
}

// AnyDraining reports whether any upstream of the table is draining.
func (r *Registry) AnyDraining() bool { return r.draining.Load() > 0 }

// markStuck records that the upstream dialed at dial let a request wait
// past its bound: it gets no new sessions for stuckCooloff, unless it
// answers a request meanwhile.
func (r *Registry) MarkStuck(dial string) {
	until := r.clock() + int64(stuckCooloff)
	r.UseUpstream(dial).stuckUntil.Store(until)
	for {
		last := r.stuckUntil.Load()
		if last >= until || r.stuckUntil.CompareAndSwap(last, until) {
			return
		}
	}
}

// anyStuck reports whether an upstream of the table may be stuck.
func (r *Registry) AnyStuck() bool { return r.clock() < r.stuckUntil.Load() }

// stuck reports whether u let a request wait past its bound within the
// last stuckCooloff, and has answered no request since.
func (r *Registry) Stuck(u *Upstream) bool { return r.clock() < u.stuckUntil.Load() }

// markRefusing records that the upstream dialed at dial refused a new
// session: it gets none for d, and the refusal is counted.
func (r *Registry) MarkRefusing(dial string, d time.Duration) {
	u := r.UseUpstream(dial)
	until := r.clock() + int64(d)
	u.refusingUntil.Store(until)
	u.refusals.Add(1)
	for {
		last := r.refusingUntil.Load()
		if last >= until || r.refusingUntil.CompareAndSwap(last, until) {
			return
		}
	}
}

// anyRefusing reports whether an upstream of the table may be refusing new
// sessions.
func (r *Registry) AnyRefusing() bool { return r.clock() < r.refusingUntil.Load() }

// refusing reports whether u refused a new session within its cooloff.
func (r *Registry) Refusing(u *Upstream) bool { return r.clock() < u.refusingUntil.Load() }

// RefusingUntil returns when u takes new sessions again after refusing one,
// and whether it is refusing now.
func (r *Registry) RefusingUntil(u *Upstream) (time.Time, bool) {
	until := u.refusingUntil.Load()
	if r.clock() >= until {
		return time.Time{}, false
	}
	return r.epoch.Add(time.Duration(until)), true
}

// UpstreamTTL returns how long the table keeps the record of an upstream
// that no config lists, that owns no session and that nothing used.
func (r *Registry) UpstreamTTL() time.Duration { return time.Duration(r.upstreamTTL.Load()) }

// setConfigured marks the upstreams a reverse_proxy of the running config
// lists, creating their records, and unmarks the others.
func (r *Registry) SetConfigured(dials map[string]bool) {
	for dial := range dials {
		r.UseUpstream(dial)
	}
	for _, u := range r.Upstreams() {
		u.configured.Store(dials[u.dial])
	}
}

// inUse reports whether this instance uses upstream u: a config lists it,
// it owns sessions here, or it was used here within the upstream TTL.
func (r *Registry) InUse(u *Upstream) bool {
	return u.configured.Load() || u.live.Load() > 0 || u.streams.Load() > 0 ||
		r.clock()-u.lastSeen.Load() < r.upstreamTTL.Load()
}

// kept reports whether the table keeps the record of u: this instance
// uses it, or, with a shared store, another instance used it within the
// upstream TTL or it owns sessions there.
func (r *Registry) kept(u *Upstream) bool {
	return r.InUse(u) || u.cluster.Load() > 0 || r.clock()-u.seenAway.Load() < r.upstreamTTL.Load()
}

// storeUpstream returns the record of dial, creating it, as known from the
// shared store only, if the table has none: its creation is no use here.
func (r *Registry) StoreUpstream(dial string) *Upstream {
	if u := r.KnownUpstream(dial); u != nil {
		return u
	}
	u := r.UseUpstream(dial)
	u.lastSeen.CompareAndSwap(u.lastSeen.Load(), 0)
	return u
}

// seenElsewhere records that another instance used u at when, as the
// shared store says, and returns u.
func (r *Registry) SeenElsewhere(u *Upstream, when time.Time) *Upstream {
	u.seenAway.Store(int64(when.Sub(r.now()) + time.Duration(r.clock())))
	return u
}

// setDrainDeadline sets when the draining of u ends for its remaining
// sessions, which then fail over; the zero time sets none.
func (r *Registry) SetDrainDeadline(u *Upstream, at time.Time) {
	if at.IsZero() {
		u.drainDeadline.Store(0)
		return
	}
	u.drainDeadline.Store(int64(at.Sub(r.epoch)))
}

// pastDrainDeadline reports whether u is draining and its deadline has passed.
func (r *Registry) PastDrainDeadline(u *Upstream) bool {
	d := u.drainDeadline.Load()
	return d != 0 && u.Draining() && r.clock() >= d
}

// DrainDeadline returns when the draining of u ends for its remaining
// sessions, and false if it has no deadline.
func (r *Registry) DrainDeadline(u *Upstream) (time.Time, bool) {
	d := u.drainDeadline.Load()
	if d == 0 {
		return time.Time{}, false
	}
	return r.epoch.Add(time.Duration(d)), true
}

// Created returns when the table was created: the start of its counters.
func (tb *timebase) Created() time.Time { return tb.epoch }
