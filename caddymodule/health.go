package caddymodule

import (
	"context"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// DefaultUnhealthyGrace is how long, by default, the upstream of a session
// may fail active health checks before the session ends. It is two of
// Caddy's default health_interval (30s): one failed check keeps an upstream
// unhealthy until the next one passes, so a single failed check never ends
// a session.
const DefaultUnhealthyGrace = time.Minute

// health is what the policy can tell of an upstream's health checks.
type health int

const (
	// healthUp: the upstream is in service.
	healthUp health = iota
	// healthPassiveDown: out of service for its recent failed requests
	// (passive health checks) alone, as far as the policy can tell.
	healthPassiveDown
	// healthActiveDown: failing active health checks, or its circuit breaker is open.
	healthActiveDown
)

// healthOf returns the state of u. Caddy reports one health bit for active
// checks, passive checks and the circuit breaker together; an upstream with
// enough failed requests to be out of service by passive checks is taken
// to be down for them alone, even if active checks fail it too.
func (s *SessionSelection) healthOf(u *reverseproxy.Upstream) health {
	switch {
	case u.Healthy():
		return healthUp
	case s.passiveDown(u):
		return healthPassiveDown
	}
	return healthActiveDown
}

// passiveDown reports whether u has failed enough requests for passive
// health checks to take it out of service: max_fails, read from the
// reverse_proxy this policy serves (any failure outside one).
func (s *SessionSelection) passiveDown(u *reverseproxy.Upstream) bool {
	if s.proxy == nil {
		return u.Fails() > 0
	}
	hc := s.proxy.HealthChecks
	return hc != nil && hc.Passive != nil && u.Fails() >= hc.Passive.MaxFails
}

// unhealthyClock records, per upstream dial address, since when the policy
// has seen the upstream fail active health checks.
type unhealthyClock struct {
	since sync.Map // dial address -> *atomic.Int64, Unix nanoseconds; 0 while healthy
}

// note records whether the upstream dialed at dial is failing active health
// checks at now (Unix nanoseconds), and returns since when it has been, or
// 0 if it is not.
func (c *unhealthyClock) note(dial string, down bool, now int64) int64 {
	v, ok := c.since.Load(dial)
	if !ok {
		if !down {
			return 0
		}
		v, _ = c.since.LoadOrStore(dial, new(atomic.Int64))
	}
	since := v.(*atomic.Int64)
	if !down {
		since.Store(0)
		return 0
	}
	since.CompareAndSwap(0, now)
	return since.Load()
}

// noteHealth records the health of u in the policy's clock and returns it,
// with since when u has been failing active health checks (0 if it is not).
func (s *SessionSelection) noteHealth(u *reverseproxy.Upstream) (health, time.Time) {
	h := s.healthOf(u)
	down := h == healthActiveDown
	var now int64 // read only for an upstream that is down: the clock costs more than the rest
	if down {
		now = time.Now().UnixNano()
	}
	since := s.unhealthy.note(u.Dial, down, now)
	if since == 0 {
		return h, time.Time{}
	}
	return h, time.Unix(0, since)
}

// Handle notes the health of every upstream of the policy's reverse_proxy
// when Caddy's active health checker reports that one became healthy or
// unhealthy (the `healthy` and `unhealthy` events), so that the clock of an
// upstream no session is using stays true.
func (s *SessionSelection) Handle(context.Context, caddy.Event) error {
	if s.proxy != nil {
		for _, u := range s.proxy.Upstreams {
			s.noteHealth(u)
		}
	}
	return nil
}

// subscribeHealthEvents has Handle called on the health checker's events,
// when the policy serves a reverse_proxy.
func (s *SessionSelection) subscribeHealthEvents(ctx caddy.Context) error {
	if s.proxy == nil {
		return nil
	}
	app, err := ctx.App("events")
	if err != nil {
		return err
	}
	events := app.(*caddyevents.App)
	for _, name := range []string{"healthy", "unhealthy"} {
		if err := events.On(name, s); err != nil {
			return err
		}
	}
	return nil
}

// parentProxy returns the reverse_proxy handler being provisioned around
// the policy, or nil if there is none.
func parentProxy(ctx caddy.Context) *reverseproxy.Handler {
	mods := ctx.Modules()
	for i := len(mods) - 1; i >= 0; i-- {
		if h, ok := mods[i].(*reverseproxy.Handler); ok {
			return h
		}
	}
	return nil
}

// unavailable marks the request's pinned upstream unavailable: failing
// active health checks since since, within the grace. Its Retry-After is
// the time to the next active health check, but no later than the end of
// the grace, and at least a second.
func (s *SessionSelection) unavailable(r *http.Request, since time.Time) {
	wait := time.Until(since.Add(time.Duration(s.UnhealthyGrace)))
	if hc := s.proxy; hc != nil && hc.HealthChecks != nil && hc.HealthChecks.Active != nil {
		wait = min(wait, time.Duration(hc.HealthChecks.Active.Interval))
	}
	seconds := max(int(math.Ceil(wait.Seconds())), 1)
	exchangeOf(r).unavailable = seconds
}

// Interface guards
var _ caddyevents.Handler = (*SessionSelection)(nil)
