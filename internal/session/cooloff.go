package session

import "time"

// Cool-offs of upstreams: an upstream that let a request wait past its
// bound (pinned_timeout, initialize_timeout) or refused a new session gets no new
// sessions for a while. The table keeps when each cool-off ends.

// stuckCooloff is how long an upstream that let a request wait past its
// bound gets no new sessions, unless it answers a request meanwhile.
const stuckCooloff = 30 * time.Second

// answered records that u sent response headers: it is not stuck.
func (u *Upstream) Answered() {
	if u.stuckUntil.Load() != 0 {
		u.stuckUntil.Store(0)
	}
}

// Refusals returns how many new sessions u refused (429, or 5xx without a
// session) that the proxy sent to another upstream.
func (u *Upstream) Refusals() uint64 { return u.refusals.Load() }
