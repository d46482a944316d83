package caddymodule

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/seal"
)

// SealedSessionIDs turns on sealed session IDs: the client receives, in
// place of the upstream's `Mcp-Session-Id`, a value that carries the
// upstream's dial address, its own session ID and its issue time, encrypted and
// authenticated with AES-256-GCM under a key the Caddy replicas share. Any
// replica with the key opens the value and routes the request to its
// upstream without a shared store, and a restarted Caddy loses no session.
// The upstream always sees its own session ID: the proxy restores it on
// every request. A value that does not open (forged, truncated, edited,
// sealed under another key or format version) gets the same 404 as an
// unknown session, without any upstream being contacted; a value naming an
// upstream that is no longer configured gets the upstream-gone 404. The
// table still records the sessions this replica has seen, for
// `least_sessions`, draining, the admin API and metrics. With `failover
// reinitialize` on the same table, the value also carries the session's
// initialize request, when the value then stays within
// max_session_id_length, so that every replica can fail the session over
// on its own (docs/failover.md), while the value is younger than
// failover_max_age. A value of a session that was DELETEd or evicted on a
// replica gets the unknown session's 404 there (docs/replicas.md, "Ending and
// revoking sessions").
type SealedSessionIDs struct {
	// The keys, each 32 random bytes encoded in base64 (standard or URL
	// alphabet, padding optional), such as the output of
	// `openssl rand -base64 32`. The first key seals new session IDs; every
	// key opens them, which lets a new key be rolled through the replicas
	// with no session lost (docs/replicas.md, "Rotating the key"). Give keys as
	// placeholders, such as `{env.MCP_SESSION_KEY}` or
	// `{file./run/secrets/mcp_session_key}`, so that they stay out of the
	// config. Required: at least one key.
	Keys []string `json:"keys,omitempty"`
}

// The format versions of sealed session IDs ([seal.VersionPlain] to
// [seal.VersionIssuedInit]): the proxy seals versions 3 and 4; it still
// opens values of versions 1 and 2, minted before sealed IDs carried their
// issue time: they route, and never fail over (their age is unknown, see
// [Handler.FailoverMaxAge]).
const (
	sealVersion           = seal.VersionPlain
	sealVersionInit       = seal.VersionInit
	sealVersionIssued     = seal.VersionIssued
	sealVersionIssuedInit = seal.VersionIssuedInit
)

// sealKeySize is the size of a sealing key in bytes (AES-256).
const sealKeySize = seal.KeySize

// SessionSealer seals and opens session IDs: an envelope of internal/seal
// (AES-256-GCM, a random nonce, base64url), whose byte format and the
// fields of each version that package documents. The sealed ID carries
// the upstream's dial address, the upstream's session ID, its issue time,
// the principal digest of a bound session, and with failover the session's
// initialize request (docs/replicas.md, "Length"). Rotate keys well before
// 2^32 sessions (NIST SP 800-38D §8.3).
//
// A SessionSealer is safe for concurrent use.
type SessionSealer struct {
	s seal.Sealer // its first key seals; all open
}

// NewSessionSealer returns a sealer whose first key seals and whose every
// key opens. Each key must be 32 bytes; it errors on a key of another
// length or on no keys.
func NewSessionSealer(keys ...[]byte) (*SessionSealer, error) {
	s, err := seal.New(keys...)
	if err != nil {
		return nil, err
	}
	return &SessionSealer{s: s}, nil
}

// Seal returns the sealed session ID, not bound to a principal, that
// carries the upstream's dial address and its session ID, issued now,
// under the first key. Each call draws a fresh nonce, so sealing the same
// pair twice gives two different values.
func (s *SessionSealer) Seal(dial, id string) string {
	return s.seal(seal.Session{Dial: dial, ID: id})
}

// seal returns the sealed session ID of ss under the first key.
func (s *SessionSealer) seal(ss seal.Session) string { return s.s.SealSession(ss) }

// principalDigest returns what a sealed ID carries of a principal: the
// first 16 bytes of its SHA-256, or "" for no principal. The sealed ID is
// encrypted, so the digest is seen only by the replicas.
func principalDigest(principal string) string {
	if principal == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(principal))
	return string(sum[:seal.BoundSize])
}

// Open returns the dial address and upstream session ID sealed in v, and
// whether v opened: it is a sealed ID of a known format version, under one
// of the keys, unmodified, with a non-empty dial address and session ID.
func (s *SessionSealer) Open(v string) (dial, id string, ok bool) {
	_, ss, ok := s.open(v)
	return ss.Dial, ss.ID, ok
}

// open is Open that returns everything v carries, and v's table key: its
// decoded bytes (see [sealing.tableKey]). The strings share one allocation.
func (s *SessionSealer) open(v string) (key string, ss seal.Session, ok bool) {
	return s.s.OpenSession(v)
}

// sealedLength returns the length of the sealed session ID of ss, in bytes.
func sealedLength(ss seal.Session) int { return seal.SessionLength(ss) }

// provisionSealer builds the handler's sealer, if sealed session IDs are on.
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

// provision builds the sealer from the configured keys, resolving
// placeholders such as {env.MCP_SESSION_KEY}.
func (c *SealedSessionIDs) provision() (*SessionSealer, error) {
	if len(c.Keys) == 0 {
		return nil, errors.New("seal_session_ids: no key; give at least one key, such as {env.MCP_SESSION_KEY} " +
			"holding the output of `openssl rand -base64 32`")
	}
	repl := caddy.NewReplacer()
	keys := make([][]byte, len(c.Keys))
	for i, k := range c.Keys {
		key, err := decodeSealKey(repl, k)
		if err != nil {
			return nil, fmt.Errorf("seal_session_ids: key %d (%s): %v", i+1, redactKey(k), err)
		}
		for j := range i {
			if string(keys[j]) == string(key) {
				return nil, fmt.Errorf("seal_session_ids: key %d is the same as key %d; list each key once", i+1, j+1)
			}
		}
		keys[i] = key
	}
	return NewSessionSealer(keys...)
}

// decodeSealKey resolves placeholders in k and decodes it from base64.
func decodeSealKey(repl *caddy.Replacer, k string) ([]byte, error) {
	v, err := repl.ReplaceOrErr(k, true, true)
	if err != nil {
		return nil, fmt.Errorf("%v; is the environment variable or file set?", err)
	}
	v = strings.TrimSpace(v)
	if v == "" {
		return nil, errors.New("is empty; is the environment variable or file set?")
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if key, err := enc.DecodeString(v); err == nil {
			if len(key) != sealKeySize {
				return nil, fmt.Errorf("decodes to %d bytes; a key is %d random bytes, base64-encoded: `openssl rand -base64 32`", len(key), sealKeySize)
			}
			return key, nil
		}
	}
	return nil, errors.New("is not base64; a key is 32 random bytes, base64-encoded: `openssl rand -base64 32`")
}

// redactKey returns k for an error message if it is a placeholder, and a
// mark that hides it otherwise: a key written into the config must not be
// echoed into logs.
func redactKey(k string) string {
	if strings.HasPrefix(k, "{") && strings.HasSuffix(k, "}") && !strings.Contains(k[1:], "{") {
		return k
	}
	return "given inline, not shown"
}

// serveSealed proxies a request whose Mcp-Session-Id opened to ss; key is
// its table key. A session bound to another principal than the request's
// gets the unknown session's 404, as in the table. A replica that has not
// seen the session yet records it in its table, with the initialize
// request the value carries when the table fails sessions over: the
// replica can then fail the session over on its own, once, after which its
// table routes it. A session that ended for good (a DELETE, an operator's
// eviction), as a tombstone here or in the shared store says, is not
// adopted: it is answered as an unknown session. The upstream receives its
// own session ID (or, once the session moved, the one its new upstream
// knows).
func (h *Handler) serveSealed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, key string, ss seal.Session) error {
	bind := h.table.BindPrincipal()
	principal := principalOf(r, bind)
	if ss.Bound != "" && bind != session.BindPrincipalOff && ss.Bound != principalDigest(principal) {
		return h.serveMismatch(w, r, key)
	}
	ex := exchangeOf(r)
	ex.sealed, ex.issued = true, ss.Issued
	up, mismatch, ended := h.table.LookupEnded(key, principal)
	if mismatch {
		return h.serveMismatch(w, r, key)
	}
	if up == nil && !ended {
		origin := session.Origin{}
		if ss.Bound != "" {
			origin.Principal = principal
		}
		key = strings.Clone(key) // not the buffer that holds the plaintext too
		if up = h.table.Adopt(key, ss.Dial, origin); up != nil {
			h.debug("adopted", key, ss.Dial)
			if init := sessionInitOf(ss.Init); init != nil && h.table.Failover().On {
				h.table.AdoptInit(key, init)
			}
		}
	}
	if up == nil { // ended for good, here or as the shared store says
		h.debug("ended", key, "")
		return h.serveUnknown(w, r, next, key)
	}
	r.Header[HeaderSessionID] = []string{ss.ID}
	return h.servePinned(w, r, next, key, up)
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
	init, _ := caddyhttp.GetVar(r.Context(), varInit).(*session.Init)
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
