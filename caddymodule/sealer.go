package caddymodule

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/seal"
	"github.com/caddyserver/caddy/v2"
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
