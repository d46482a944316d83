package caddymodule

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

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
