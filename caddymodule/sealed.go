package caddymodule

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
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

// The format versions of sealed session IDs: the first byte of every
// sealed session ID, and the associated data its AEAD authenticates, so
// that a value never opens as another version than it was sealed in. A new
// format takes a new version.
//
// The proxy seals versions 3 and 4; it still opens values of versions 1
// and 2, minted before sealed IDs carried their issue time: they route,
// and never fail over (their age is unknown, see [Handler.FailoverMaxAge]).
const (
	// sealVersion: the upstream's dial address, a principal's digest and
	// the upstream's session ID.
	sealVersion byte = 1
	// sealVersionInit: those, and the session's initialize request, kept
	// for failover (a table with both seal_session_ids and failover
	// reinitialize).
	sealVersionInit byte = 2
	// sealVersionIssued: the time the value was issued, then what
	// version 1 carries.
	sealVersionIssued byte = 3
	// sealVersionIssuedInit: the time the value was issued, then what
	// version 2 carries.
	sealVersionIssuedInit byte = 4
)

// sealKeySize is the size of a sealing key in bytes (AES-256).
const sealKeySize = 32

// sealEncoding encodes sealed session IDs: base64url without padding (RFC
// 4648 §5), whose characters are all visible ASCII, as `Mcp-Session-Id`
// requires. Strict decoding rejects non-zero padding bits, so every sealed
// ID has exactly one spelling.
var sealEncoding = base64.RawURLEncoding.Strict()

// SessionSealer seals and opens session IDs.
//
// A sealed session ID is
//
//	base64url-nopad( version || nonce (12 bytes) || ciphertext || tag (16 bytes) )
//
// where nonce, ciphertext and tag are AES-256-GCM's (NIST SP 800-38D), as
// produced by [cipher.NewGCMWithRandomNonce]: a random 96-bit nonce per
// seal, and the version byte as additional authenticated data. The
// plaintext of version 3 is
//
//	uvarint(issued) || field(dial) || field(bound) || upstream session ID
//
// and that of version 4, which also carries the session's initialize
// request for failover,
//
//	uvarint(issued) || field(dial) || field(bound) || field(upstream session ID) ||
//	field(Accept) || field(Content-Type) || field(MCP-Protocol-Version) || initialize body
//
// where issued is the time the value was sealed, in seconds since the Unix
// epoch (never 0), field(x) is uvarint(len(x)) || x, and uvarint is
// [binary.AppendUvarint]'s. Versions 1 and 2, which the proxy no longer
// seals but still opens, are versions 3 and 4 without the issue time.
// The issue time is authenticated like the rest: no one without the key
// can make a value look younger. bound is empty for a session not bound to
// a principal, and otherwise the first 16 bytes of the SHA-256 of the
// principal of the request that opened the session (see the handler's
// bind_principal): the sealed ID then carries its binding to any replica.
// The headers are the initialize request's (never its credentials); the
// body is never empty. A version 3 ID is therefore 36 bytes (52 when
// bound) plus the dial address and the upstream's ID before encoding (the
// issue time takes 5 bytes until the year 3058), and 4/3 of that after:
// 102 characters for a 26-byte go-sdk ID on `127.0.0.1:9001`, 115 for a
// 36-byte UUID (123 and 136 when bound). Version 4 adds the initialize
// request, its headers and 4 bytes of lengths: 428 characters for the
// go-sdk client's 190-byte initialize with a 26-byte ID on
// `127.0.0.1:9001` (docs/replicas.md, "Length"). Random nonces keep one key safe for
// 2^32 seals (NIST SP 800-38D §8.3); rotate keys well before that many
// sessions.
//
// A SessionSealer is safe for concurrent use.
type SessionSealer struct {
	aeads []cipher.AEAD // aeads[0] seals; all open
}

// NewSessionSealer returns a sealer whose first key seals and whose every
// key opens. Each key must be 32 bytes; it errors on a key of another
// length or on no keys.
func NewSessionSealer(keys ...[]byte) (*SessionSealer, error) {
	if len(keys) == 0 {
		return nil, errors.New("no sealing key")
	}
	s := &SessionSealer{}
	for i, k := range keys {
		if len(k) != sealKeySize {
			return nil, fmt.Errorf("key %d is %d bytes; it must be %d", i+1, len(k), sealKeySize)
		}
		block, err := aes.NewCipher(k)
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCMWithRandomNonce(block)
		if err != nil {
			return nil, err
		}
		s.aeads = append(s.aeads, aead)
	}
	return s, nil
}

// Seal returns the sealed session ID, not bound to a principal, that
// carries the upstream's dial address and its session ID, issued now,
// under the first key. Each call draws a fresh nonce, so sealing the same
// pair twice gives two different values.
func (s *SessionSealer) Seal(dial, id string) string {
	return s.seal(sealedSession{dial: dial, id: id})
}

// sealedSession is what a sealed session ID carries.
type sealedSession struct {
	// issued is when the value was sealed, in seconds since the Unix
	// epoch; 0 in versions 1 and 2, which do not carry it. seal fills in
	// the current time when it is 0.
	issued int64
	dial   string     // the upstream's dial address
	bound  string     // principalDigest of the session's principal; "" if unbound
	id     string     // the upstream's own session ID
	init   sealedInit // the session's initialize request; empty in versions 1 and 3
}

// issuedAt returns the issue time to seal ss with: its own, or now.
func (ss *sealedSession) issuedAt() uint64 {
	if ss.issued > 0 {
		return uint64(ss.issued)
	}
	return uint64(time.Now().Unix())
}

// sealedInit is what a sealed session ID carries of the session's
// initialize request: the fields of a [sessionInit] but its upstream ID.
// An empty body means none.
type sealedInit struct {
	accept, contentType, version, body string
}

// fields returns what ss carries after its issue time, in the order of
// its plaintext, in buf, and the format version that carries it: every
// field but the last is length-prefixed.
func (ss *sealedSession) fields(buf *[7]string) ([]string, byte) {
	buf[0], buf[1], buf[2] = ss.dial, ss.bound, ss.id
	if ss.init.body == "" {
		return buf[:3], sealVersionIssued
	}
	buf[3], buf[4], buf[5], buf[6] = ss.init.accept, ss.init.contentType, ss.init.version, ss.init.body
	return buf[:7], sealVersionIssuedInit
}

// plainLength returns the length of the plaintext of an issue time and
// fields, in bytes.
func plainLength(issued uint64, fields []string) int {
	n := uvarintLen(issued) + len(fields[len(fields)-1])
	for _, f := range fields[:len(fields)-1] {
		n += uvarintLen(uint64(len(f))) + len(f)
	}
	return n
}

// seal returns the sealed session ID of ss under the first key.
func (s *SessionSealer) seal(ss sealedSession) string {
	var buf [7]string
	fields, version := ss.fields(&buf)
	issued := ss.issuedAt()
	plainLen := plainLength(issued, fields)
	sealedLen := 1 + s.aeads[0].Overhead() + plainLen
	// One buffer: the plaintext, the sealed value, its encoding.
	out := make([]byte, plainLen+sealedLen+sealEncoding.EncodedLen(sealedLen))
	plain := binary.AppendUvarint(out[:0], issued)
	for _, f := range fields[:len(fields)-1] {
		plain = append(binary.AppendUvarint(plain, uint64(len(f))), f...)
	}
	plain = append(plain, fields[len(fields)-1]...)
	sealed := append(out[plainLen:plainLen], version)
	sealed = s.aeads[0].Seal(sealed, nil, plain, sealAD[version])
	enc := out[plainLen+sealedLen:]
	sealEncoding.Encode(enc, sealed)
	return string(enc)
}

// principalDigest returns what a sealed ID carries of a principal: the
// first 16 bytes of its SHA-256, or "" for no principal. The sealed ID is
// encrypted, so the digest is seen only by the replicas.
func principalDigest(principal string) string {
	if principal == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(principal))
	return string(sum[:16])
}

// sealAD holds, at each format version, the additional data sealed IDs of
// that version authenticate: the version byte.
var sealAD = [...][]byte{
	sealVersion: {sealVersion}, sealVersionInit: {sealVersionInit},
	sealVersionIssued: {sealVersionIssued}, sealVersionIssuedInit: {sealVersionIssuedInit},
}

// uvarintLen returns the length of n as a uvarint, in bytes.
func uvarintLen(n uint64) int {
	return len(binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64), n))
}

// Open returns the dial address and upstream session ID sealed in v, and
// whether v opened: it is a sealed ID of a known format version, under one
// of the keys, unmodified, with a non-empty dial address and session ID.
func (s *SessionSealer) Open(v string) (dial, id string, ok bool) {
	_, ss, ok := s.open(v)
	return ss.dial, ss.id, ok
}

// open is Open that returns everything v carries, and v's table key: its
// decoded bytes (see [Handler.tableKey]). The strings share one allocation.
func (s *SessionSealer) open(v string) (key string, ss sealedSession, ok bool) {
	n := sealEncoding.DecodedLen(len(v))
	overhead := 1 + s.aeads[0].Overhead()
	if n < overhead+4 { // version, nonce, tag; two 1-byte lengths, dial and ID
		return "", ss, false
	}
	// One allocation: the encoded value, the decoded value, the plaintext.
	buf := make([]byte, len(v)+n+n-overhead)
	enc, raw := buf[:len(v)], buf[len(v):len(v)+n]
	copy(enc, v)
	if m, err := sealEncoding.Decode(raw, enc); err != nil || m != n || !isSealVersion(raw[0]) {
		return "", ss, false
	}
	for _, aead := range s.aeads {
		if plain, err := aead.Open(buf[len(v)+n:len(v)+n], nil, raw[1:], raw[:1]); err == nil {
			all := string(buf[len(v) : len(v)+n+len(plain)])
			ss, ok = splitSealed(all[n:], raw[0])
			return all[:n], ss, ok
		}
	}
	return "", ss, false
}

// isSealVersion reports whether b is a format version of sealed IDs.
func isSealVersion(b byte) bool { return b >= sealVersion && b <= sealVersionIssuedInit }

// sealedLength returns the length of the sealed session ID of ss, in bytes.
func sealedLength(ss sealedSession) int {
	var buf [7]string
	fields, _ := ss.fields(&buf)
	return sealEncoding.EncodedLen(1 + gcmNonceSize + plainLength(ss.issuedAt(), fields) + gcmTagSize)
}

// AES-GCM's standard nonce and tag sizes (NIST SP 800-38D), in bytes.
const gcmNonceSize, gcmTagSize = 12, 16

// splitSealed splits the plaintext of a sealed ID of the given format
// version into what it carries; it reports false for a plaintext that is
// not one seal makes.
func splitSealed(plain string, version byte) (ss sealedSession, ok bool) {
	var issued uint64
	if version >= sealVersionIssued {
		k := 0
		if issued, k = binary.Uvarint([]byte(plain[:min(len(plain), binary.MaxVarintLen64)])); k <= 0 || issued == 0 || issued > math.MaxInt64 {
			return ss, false
		}
		plain = plain[k:]
	}
	withInit := version == sealVersionInit || version == sealVersionIssuedInit
	var f [7]string
	n := 3
	if withInit {
		n = 7
	}
	for i := range n - 1 {
		if f[i], plain, ok = cutField(plain); !ok {
			return ss, false
		}
	}
	f[n-1] = plain
	if f[0] == "" || f[2] == "" || f[1] != "" && len(f[1]) != 16 || withInit && f[6] == "" {
		return ss, false
	}
	return sealedSession{issued: int64(issued), dial: f[0], bound: f[1], id: f[2],
		init: sealedInit{accept: f[3], contentType: f[4], version: f[5], body: f[6]}}, true
}

// cutField splits a uvarint-length-prefixed field off the front of s.
func cutField(s string) (field, rest string, ok bool) {
	l, k := binary.Uvarint([]byte(s[:min(len(s), binary.MaxVarintLen64)]))
	if k <= 0 || l > uint64(len(s)-k) {
		return "", "", false
	}
	return s[k : k+int(l)], s[k+int(l):], true
}

// provisionSealer builds the handler's sealer, if sealed session IDs are on.
func (h *Handler) provisionSealer() error {
	if h.SealSessionIDs == nil {
		return nil
	}
	s, err := h.SealSessionIDs.provision()
	h.sealer = s
	return err
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
func (h *Handler) serveSealed(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, key string, ss sealedSession) error {
	bind := h.table.BindPrincipal()
	principal := principalOf(r, bind)
	if ss.bound != "" && bind != session.BindPrincipalOff && ss.bound != principalDigest(principal) {
		return h.serveMismatch(w, r, key)
	}
	ex := exchangeOf(r)
	ex.sealed, ex.issued = true, ss.issued
	up, mismatch, ended := h.table.LookupEnded(key, principal)
	if mismatch {
		return h.serveMismatch(w, r, key)
	}
	if up == nil && !ended {
		origin := session.Origin{}
		if ss.bound != "" {
			origin.Principal = principal
		}
		key = strings.Clone(key) // not the buffer that holds the plaintext too
		if up = h.table.Adopt(key, ss.dial, origin); up != nil {
			h.debug("adopted", key, ss.dial)
			if init := ss.init.sessionInit(); init != nil && h.table.Failover().On {
				h.table.AdoptInit(key, init)
			}
		}
	}
	if up == nil { // ended for good, here or as the shared store says
		h.debug("ended", key, "")
		return h.serveUnknown(w, r, next, key)
	}
	r.Header[HeaderSessionID] = []string{ss.id}
	return h.servePinned(w, r, next, key, up)
}

// tableKey returns the key under which the table holds the session id:
// for a sealed ID, its decoded bytes, and otherwise id itself. Decoded
// sealed IDs begin with the version byte, which no plain session ID can
// (they are visible ASCII), so a handler without sealing never finds a
// sealed session in a shared table, nor one with sealing a session under
// the upstream's own ID.
func (h *Handler) tableKey(id string) string {
	if h.sealer == nil {
		return id
	}
	if key, ok := decodeSealed(id); ok {
		return key
	}
	return id
}

// decodeSealed returns the decoded bytes of id if it has the encoding and
// version of a sealed ID, without opening it.
func decodeSealed(id string) (string, bool) {
	raw, err := sealEncoding.DecodeString(id)
	if err != nil || len(raw) == 0 || !isSealVersion(raw[0]) {
		return "", false
	}
	return string(raw), true
}

// clientID returns the Mcp-Session-Id the client holds for a table key.
func clientID(key string) string {
	if len(key) > 0 && isSealVersion(key[0]) {
		return sealEncoding.EncodeToString([]byte(key))
	}
	return key
}

// sealResponse replaces every Mcp-Session-Id of a response with a value
// for the client, so that no upstream session ID reaches the client in
// the clear. On a pinned request (up set) whose table key is key, the
// session ID the upstream received becomes the client's own value again
// (not a fresh seal, so clients that compare IDs see no change); any other
// ID is sealed with the pinned upstream. Without a session, IDs are sealed
// with the upstream the policy selected; with none selected, they are
// removed.
func (h *Handler) sealResponse(r *http.Request, header http.Header, key string, up *session.Upstream) {
	vals := header[HeaderSessionID]
	if len(vals) == 0 {
		return
	}
	dial, sent := h.sealDial(r, up)
	if len(vals) == 1 && up != nil && vals[0] == sent {
		vals[0] = clientID(key) // the common case: the response repeats the request's ID
		return
	}
	out := make([]string, 0, len(vals))
	for _, v := range vals {
		switch {
		case up != nil && v == sent:
			out = append(out, clientID(key))
		case dial == "" || checkSessionID(v, math.MaxInt) != "":
			h.logger.Warn("removed an Mcp-Session-Id the proxy cannot seal from the response",
				zap.Bool("upstream_known", dial != ""), zap.Int("length", len(v)))
		default:
			ss := sealedSession{dial: dial, bound: principalDigest(principalOf(r, h.table.BindPrincipal())), id: v}
			if up == nil {
				ss.init = h.initToSeal(r, ss)
			}
			out = append(out, h.sealer.seal(ss))
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
func (h *Handler) initToSeal(r *http.Request, ss sealedSession) sealedInit {
	init, _ := caddyhttp.GetVar(r.Context(), varInit).(*session.Init)
	if init == nil {
		return sealedInit{}
	}
	ss.init = sealedInit{accept: init.Accept, contentType: init.ContentType, version: init.Version, body: string(init.Body)}
	if n := sealedLength(ss); n > h.MaxSessionIDLength {
		if h.warnedInitSize.CompareAndSwap(false, true) { // once per handler: it is a matter of config
			h.logger.Warn("an initialize request is too large to seal into the session ID: such sessions fail over "+
				"only on the Caddy instance that learned them; raise max_session_id_length to seal them",
				zap.Int("sealed_length", n), zap.Int("max_session_id_length", h.MaxSessionIDLength))
		}
		return sealedInit{}
	}
	return ss.init
}

// sessionInit returns the initialize request si carries, for the table;
// nil if none. Its strings are copied: si's share the opened value's
// buffer.
func (si sealedInit) sessionInit() *session.Init {
	if si.body == "" {
		return nil
	}
	return &session.Init{Body: []byte(si.body), Accept: strings.Clone(si.accept),
		ContentType: strings.Clone(si.contentType), Version: strings.Clone(si.version)}
}

// sealDial returns the dial address to seal a response's session IDs with,
// and the session ID the request carried to the upstream, if pinned.
func (h *Handler) sealDial(r *http.Request, up *session.Upstream) (dial, sent string) {
	if up != nil {
		return up.Dial(), r.Header.Get(HeaderSessionID)
	}
	if sel := selectedUpstream(r); sel != nil {
		return sel.Dial, ""
	}
	return "", ""
}

// selectedUpstream returns the upstream the selection policy picked last
// for r, or nil.
func selectedUpstream(r *http.Request) *reverseproxy.Upstream {
	return exchangeOf(r).selected
}

// adminKey returns the table key of a session ID given to the admin API:
// the ID itself if the table holds it, else a sealed ID's decoded bytes.
func adminKey(t *session.Table, id string) string {
	if _, ok := t.Info(id); ok {
		return id
	}
	if key, ok := decodeSealed(id); ok {
		return key
	}
	return id
}
