package caddymodule

import (
	"math"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"go.uber.org/zap"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/seal"
)

// sealing is a handler's side of sealed session IDs: its sealer, and what
// sealing a response needs of the handler's table and settings. A nil
// *sealing is sealing off.
type sealing struct {
	*SessionSealer
	table          *session.Table
	logger         *zap.Logger
	maxIDLen       int         // the handler's max_session_id_length
	warnedInitSize atomic.Bool // the warning of an initialize too large to seal was logged
}

// tableKey returns the key under which the table holds the session id:
// for a sealed ID, its decoded bytes, and otherwise id itself. Decoded
// sealed IDs begin with the version byte, which no plain session ID can
// (they are visible ASCII), so a handler without sealing never finds a
// sealed session in a shared table, nor one with sealing a session under
// the upstream's own ID.
func (s *sealing) tableKey(id string) string {
	if s == nil {
		return id
	}
	if key, ok := decodeSealed(id); ok {
		return key
	}
	return id
}

// sealResponse replaces every Mcp-Session-Id of a response with a value
// for the client, so that no upstream session ID reaches the client in
// the clear. On a pinned request (up set) whose table key is key, the
// session ID the upstream received becomes the client's own value again
// (not a fresh seal, so clients that compare IDs see no change); any other
// ID is sealed with the pinned upstream. Without a session, IDs are sealed
// with the upstream the policy selected; with none selected, they are
// removed.
func (s *sealing) sealResponse(r *http.Request, header http.Header, key string, up *session.Upstream) {
	vals := header[HeaderSessionID]
	if len(vals) == 0 {
		return
	}
	dial, sent := s.sealDial(r, up)
	if len(vals) == 1 && up != nil && vals[0] == sent {
		vals[0] = clientID(key) // the common case: the response repeats the request's ID
		return
	}
	out := make([]string, 0, len(vals))
	for _, v := range vals {
		switch {
		case up != nil && v == sent:
			out = append(out, clientID(key))
		case dial == "" || mcpwire.CheckSessionID(v, math.MaxInt) != "":
			s.logger.Warn("removed an Mcp-Session-Id the proxy cannot seal from the response",
				zap.Bool("upstream_known", dial != ""), zap.Int("length", len(v)))
		default:
			ss := seal.Session{Dial: dial, Bound: principalDigest(principalOf(r, s.table.BindPrincipal())), ID: v}
			if up == nil {
				ss.Init = s.initToSeal(r, ss)
			}
			out = append(out, s.seal(ss))
		}
	}
	if len(out) == 0 {
		header.Del(HeaderSessionID)
		return
	}
	header[HeaderSessionID] = out
}

// initToSeal returns what the sealed ID of ss, a session the response to r
// creates, carries of its initialize request: the request the table keeps
// for failover, so that any replica can fail the session over, or nothing
// when the table keeps none or the sealed ID would then be longer than
// max_session_id_length, which the proxy would refuse. Such a session fails
// over only on the replica that learned it.
func (s *sealing) initToSeal(r *http.Request, ss seal.Session) seal.Init {
	init := exchangeOf(r).init
	if init == nil {
		return seal.Init{}
	}
	ss.Init = seal.Init{Accept: init.Accept, ContentType: init.ContentType, Version: init.Version, Body: string(init.Body)}
	if n := sealedLength(ss); n > s.maxIDLen {
		if s.warnedInitSize.CompareAndSwap(false, true) { // once per handler: it is a matter of config
			s.logger.Warn("an initialize request is too large to seal into the session ID: such sessions fail over "+
				"only on the Caddy instance that learned them; raise max_session_id_length to seal them",
				zap.Int("sealed_length", n), zap.Int("max_session_id_length", s.maxIDLen))
		}
		return seal.Init{}
	}
	return ss.Init
}

// sessionInitOf returns the initialize request si carries, for the table;
// nil if none. Its strings are copied: si's share the opened value's
// buffer.
func sessionInitOf(si seal.Init) *session.Init {
	if si.Body == "" {
		return nil
	}
	return &session.Init{Body: []byte(si.Body), Accept: strings.Clone(si.Accept),
		ContentType: strings.Clone(si.ContentType), Version: strings.Clone(si.Version)}
}

// sealDial returns the dial address to seal a response's session IDs with,
// and the session ID the request carried to the upstream, if pinned.
func (s *sealing) sealDial(r *http.Request, up *session.Upstream) (dial, sent string) {
	if up != nil {
		return up.Dial(), r.Header.Get(HeaderSessionID)
	}
	if sel := selectedUpstream(r); sel != nil {
		return sel.Dial, ""
	}
	return "", ""
}
