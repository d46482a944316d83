package session

import "time"

// Cool-offs of upstreams: an upstream that let a request wait past its
// bound (pinned_timeout, initialize_timeout) or refused a new session gets no new
// sessions for a while. The table keeps when each cool-off ends.

// stuckCooloff is how long an upstream that let a request wait past its
// bound gets no new sessions, unless it answers a request meanwhile.
const stuckCooloff = 30 * time.Second

// markStuck records that the upstream dialed at dial let a request wait
// past its bound: it gets no new sessions for stuckCooloff, unless it
// answers a request meanwhile.
func (t *Table) MarkStuck(dial string) {
	until := t.clock() + int64(stuckCooloff)
	t.UseUpstream(dial).stuckUntil.Store(until)
	for {
		last := t.stuckUntil.Load()
		if last >= until || t.stuckUntil.CompareAndSwap(last, until) {
			return
		}
	}
}

// anyStuck reports whether an upstream of the table may be stuck.
func (t *Table) AnyStuck() bool { return t.clock() < t.stuckUntil.Load() }

// stuck reports whether u let a request wait past its bound within the
// last stuckCooloff, and has answered no request since.
func (t *Table) Stuck(u *Upstream) bool { return t.clock() < u.stuckUntil.Load() }

// answered records that u sent response headers: it is not stuck.
func (u *Upstream) Answered() {
	if u.stuckUntil.Load() != 0 {
		u.stuckUntil.Store(0)
	}
}

// markRefusing records that the upstream dialed at dial refused a new
// session: it gets none for d, and the refusal is counted.
func (t *Table) MarkRefusing(dial string, d time.Duration) {
	u := t.UseUpstream(dial)
	until := t.clock() + int64(d)
	u.refusingUntil.Store(until)
	u.refusals.Add(1)
	for {
		last := t.refusingUntil.Load()
		if last >= until || t.refusingUntil.CompareAndSwap(last, until) {
			return
		}
	}
}

// anyRefusing reports whether an upstream of the table may be refusing new
// sessions.
func (t *Table) AnyRefusing() bool { return t.clock() < t.refusingUntil.Load() }

// refusing reports whether u refused a new session within its cooloff.
func (t *Table) Refusing(u *Upstream) bool { return t.clock() < u.refusingUntil.Load() }

// RefusingUntil returns when u takes new sessions again after refusing one,
// and whether it is refusing now.
func (t *Table) RefusingUntil(u *Upstream) (time.Time, bool) {
	until := u.refusingUntil.Load()
	if t.clock() >= until {
		return time.Time{}, false
	}
	return t.epoch.Add(time.Duration(until)), true
}

// Refusals returns how many new sessions u refused (429, or 5xx without a
// session) that the proxy sent to another upstream.
func (u *Upstream) Refusals() uint64 { return u.refusals.Load() }
