package caddymodule

import (
	"cmp"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Failover through the shared store: with `failover reinitialize` and the
// redis store, a session's value in Redis carries its failover record (the
// kept initialize and the ID its current upstream knows it by), so that any
// instance can fail it over; a failover records the move with a
// compare-and-set, so that instances failing the same session over at once
// agree on one new upstream session; and the move is published, so that
// instances holding the old upstream follow at once.

// recordVersion is the first byte of a sealed failover record, and with
// the session's key hash its AEAD's associated data: a record of another
// version, or moved to another session's key, never opens.
const recordVersion byte = 1

// recordEncoding encodes sealed failover records in Redis values.
var recordEncoding = base64.RawURLEncoding

// newRecordAEAD returns the AEAD of failover records: AES-256-GCM with
// random nonces (NIST SP 800-38D) under a key derived from hash_key. The
// record holds an upstream session ID, a bearer credential that Redis must
// not see, and an initialize the proxy replays with a client's credentials,
// which only a holder of hash_key may write.
func newRecordAEAD(hashKey []byte) cipher.AEAD {
	m := hmac.New(sha256.New, hashKey)
	m.Write([]byte("mcp_sessions failover record key"))
	block, err := aes.NewCipher(m.Sum(nil))
	if err != nil {
		panic(err) // a 32-byte key never fails
	}
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		panic(err)
	}
	return aead
}

// sealRecord returns the failover record of init for the session whose
// key hash is h, as a Redis value carries it:
//
//	base64url( 0x01 || nonce || AES-256-GCM( upstreamID, accept, contentType, version, body ) || tag )
//
// each field but the body preceded by its length as a uvarint.
func (ks *keyspace) sealRecord(h keyHash, init *sessionInit) string {
	var plain []byte
	for _, f := range []string{init.upstreamID, init.accept, init.contentType, init.version} {
		plain = append(binary.AppendUvarint(plain, uint64(len(f))), f...)
	}
	plain = append(plain, init.body...)
	sealed := ks.records.Seal([]byte{recordVersion}, nil, plain, recordAD(h))
	return recordEncoding.EncodeToString(sealed)
}

// openRecord returns the failover record rec of the session whose key hash
// is h, with rec as its stored form; false when it does not open.
func (ks *keyspace) openRecord(h keyHash, rec string) (*sessionInit, bool) {
	raw, err := recordEncoding.DecodeString(rec)
	if err != nil || len(raw) == 0 || raw[0] != recordVersion {
		return nil, false
	}
	plain, err := ks.records.Open(nil, nil, raw[1:], recordAD(h))
	if err != nil {
		return nil, false
	}
	var f [4]string
	for i := range f {
		n, k := binary.Uvarint(plain)
		if k <= 0 || n > uint64(len(plain)-k) {
			return nil, false
		}
		f[i], plain = string(plain[k:k+int(n)]), plain[k+int(n):]
	}
	return &sessionInit{upstreamID: f[0], accept: f[1], contentType: f[2], version: f[3], body: plain, stored: rec}, true
}

func recordAD(h keyHash) []byte { return append([]byte{recordVersion}, h[:]...) }

// WithRecord returns a copy of init that carries its sealed record for
// session id, as the table keeps it: a touch or a move compares Redis's
// value with it byte for byte.
func (c *redisConn) WithRecord(id string, init *sessionInit) *sessionInit {
	s := *init
	s.stored = c.ks.sealRecord(c.ks.hash(id), init)
	return &s
}

// storedSession is a session as a Redis value describes it.
type storedSession struct {
	dial  string
	bound principalSum
	init  *sessionInit // nil without a failover record, or one that did not open
	value string       // the value itself
	// ended is the reason of the session's tombstone; 0 for none, and then
	// the fields above describe the session.
	ended EvictReason
}

// parse returns what value v of session id holds.
func (c *redisConn) parse(id, v string) storedSession {
	dial, bound, rec := parseValue(v)
	s := storedSession{dial: dial, bound: bound, value: v}
	if rec != "" {
		s.init, _ = c.ks.openRecord(c.ks.hash(id), rec)
	}
	return s
}

// Current reads session id from Redis for a failover: what it holds, and
// what Redis says of it (storeUnknown when Redis did not answer).
func (c *redisConn) Current(id string) (storedSession, storeState) {
	if !c.healthy.Load() {
		return storedSession{}, storeUnknown
	}
	ctx, cancel := c.call()
	defer cancel()
	s, st, err := c.read(ctx, id, c.ks.hash(id))
	if err != nil {
		c.fail(opMove, err)
	}
	return s, st
}

// moveScript moves a session in Redis if its value is still the one the
// caller failed over from (or is gone, without a tombstone), and tells
// every instance; else it returns the value another instance wrote, or
// movedEnded for a session that ended for good meanwhile, and changes
// nothing.
//
//	KEYS: the session, its old upstream's set, its new upstream's set, the upstreams, its tombstone
//	ARGV: the old value, the new value, the TTL (ms), the session's member,
//	      its expiry (Unix ms), now (Unix ms), the new dial, the channel, the message
var moveScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return cur end
local tomb = redis.call('GET', KEYS[5])
if not cur and tomb then return '` + movedEnded + `' .. tomb end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4])
redis.call('ZADD', KEYS[4], 'GT', ARGV[6], ARGV[7])
redis.call('PUBLISH', ARGV[8], ARGV[9])
return ''`)

// movedEnded begins what moveScript returns for a session that ended for
// good, followed by its tombstone's reason: no value is empty or begins
// with a space.
const movedEnded = " ended "

// Move is moveValue, with what Redis holds instead parsed: the zero
// storedSession once Redis holds new, the session another instance moved
// it to, or only the reason of its tombstone when it ended for good.
func (c *redisConn) Move(id, old, new string) (storedSession, error) {
	cur, err := c.moveValue(id, old, new)
	if err != nil || cur == "" {
		return storedSession{}, err
	}
	if reason, ended := strings.CutPrefix(cur, movedEnded); ended {
		return storedSession{ended: cmp.Or(reasonNamed(reason), EvictDelete)}, nil
	}
	return c.parse(id, cur), nil
}

// moveValue records that session id moved from the value old to the value
// new. It returns "" once Redis holds new, or the value Redis holds
// instead when another instance moved the session first, or movedEnded
// when the session ended for good meanwhile; an error when Redis did not
// answer, and then new is written when it answers again.
func (c *redisConn) moveValue(id, old, new string) (string, error) {
	h := c.ks.hash(id)
	if !c.healthy.Load() {
		c.errs[opIndex(opMove)].Add(1) // the outage is logged once already
		c.queuePut(h, new)
		return "", errors.New("redis store unreachable")
	}
	from, _, _ := parseValue(old)
	to, _, _ := parseValue(new)
	now := time.Now()
	ctx, cancel := c.call()
	defer cancel()
	keys := []string{c.ks.session(h), c.ks.upstream(from), c.ks.upstream(to), c.ks.upstreams(), c.ks.tomb(h)}
	cur, err := moveScript.Run(ctx, c.client, keys, old, new, c.ttl().Milliseconds(), h.String(),
		now.Add(c.ttl()).UnixMilli(), now.UnixMilli(), to, c.ks.events(), msgMoved+" "+h.String()+" "+new).Text()
	if err != nil {
		c.fail(opMove, err)
		c.queuePut(h, new)
		return "", err
	}
	return cur, nil
}

// touchScript refreshes a session's TTL, as a touch does, unless another
// instance changed its value (moved it), or the session ended for good (a
// tombstone): a touch of an instance that has not yet heard of a move or
// an end must not undo it.
//
//	KEYS: the session, its upstream's set, the upstreams, its tombstone
//	ARGV: the value, the TTL (ms), the session's member, its expiry (Unix ms), now (Unix ms), the dial
var touchScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
if not cur and redis.call('EXISTS', KEYS[4]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
redis.call('ZADD', KEYS[3], 'GT', ARGV[5], ARGV[6])
return 1`)

// writeTouch queues the refresh of session h, whose value is v: as
// writeSession, or, for a value with a failover record, by touchScript,
// whose command it returns (nil for the other).
func (c *redisConn) writeTouch(ctx context.Context, pipe redis.Pipeliner, h keyHash, v string) *redis.Cmd {
	dial, _, rec := parseValue(v)
	if rec == "" {
		c.writeSession(ctx, pipe, h, v, false)
		return nil
	}
	now := time.Now()
	keys := []string{c.ks.session(h), c.ks.upstream(dial), c.ks.upstreams(), c.ks.tomb(h)}
	return touchScript.Eval(ctx, pipe, keys, v, c.ttl().Milliseconds(), h.String(), now.Add(c.ttl()).UnixMilli(), now.UnixMilli(), dial)
}

// followTouched makes the sessions whose touch found another value in
// Redis follow it: another instance moved them, and this one missed the
// message; or ended them for good, and then they end here too.
func (c *redisConn) followTouched(cmds map[string]*redis.Cmd) {
	for id, cmd := range cmds {
		if n, err := cmd.Int(); err == nil && n == 0 {
			switch s, st := c.Current(id); st {
			case storeHolds:
				c.t.follow(id, s)
			case storeEnded:
				c.t.evictHere(id, s.ended)
			}
		}
	}
}

// applyMoved applies another instance's move of the session whose key hash
// is hs to new: this instance, if it holds the session, sends its requests
// to the new upstream under the new upstream ID from now on.
func (c *redisConn) applyMoved(hs, v string) {
	h, ok := parseKeyHash(hs)
	if !ok {
		return
	}
	c.mu.Lock()
	id := c.byHash[h]
	c.mu.Unlock()
	if id != "" {
		c.t.follow(id, c.parse(id, v))
	}
}

// follow pins session id, which the table holds, to the upstream and
// failover record of s, which another instance moved it to; it returns
// the session's upstream and record, and false when the table does not
// hold the session or s carries no record.
func (t *Table) follow(id string, s storedSession) (*Upstream, *sessionInit, bool) {
	if s.init == nil || !t.failoverSettings().on {
		return nil, nil, false
	}
	to := t.upstream(s.dial)
	if !t.moveSession(id, to, s.init) {
		return nil, nil, false
	}
	return to, s.init, true
}

// record returns the stored failover record of s; "" for none.
func (s *sessionInit) record() string {
	if s == nil {
		return ""
	}
	return s.stored
}

// movedInStore returns where another instance moved session id, which this
// table holds on from with record init, when the shared store says it is
// elsewhere: the request then follows it instead of failing the session
// over again. False without a store, or when the store has it where this
// table has it, or nowhere. ended reports that the store holds the session
// no more, which a reachable store says only of a session that ended or
// expired on every instance: it must not fail over.
func (t *Table) movedInStore(id string, from *Upstream, init *sessionInit) (res failoverResult, moved, ended bool) {
	c := t.shared()
	if c == nil {
		return failoverResult{}, false, false
	}
	s, st := c.Current(id)
	if st == storeAbsent || st == storeEnded {
		return failoverResult{}, false, true
	}
	if st != storeHolds || s.init == nil || s.dial == from.dial && s.init.upstreamID == init.upstreamID {
		return failoverResult{}, false, false
	}
	to, rec, ok := t.follow(id, s)
	return failoverResult{up: to, init: rec, followed: true}, ok, false
}

// recordMove pins session id, which a failover moved from upstream from
// with record init to upstream to with record moved, here and in the
// shared store. When another instance moved the session first, the
// session follows that move instead: the result says so, and is where the
// session is. Without a store, or when it does not answer in
// time, the move is recorded here only (and written to the store when it
// answers again). It errors when the session left the table.
func (t *Table) recordMove(id string, from *Upstream, init *sessionInit, to *Upstream, moved *sessionInit) (failoverResult, error) {
	c := t.shared()
	if c != nil {
		moved = c.WithRecord(id, moved)
	}
	if !t.moveSession(id, to, moved) {
		return failoverResult{}, errors.New("the session left the table during its failover")
	}
	res := failoverResult{up: to, init: moved}
	if c == nil {
		return res, nil
	}
	t.mu.Lock()
	e, _, _ := t.peek(id)
	t.mu.Unlock()
	old, next := value(from.dial, e.principal, init.record()), value(to.dial, e.principal, moved.stored)
	for range 2 { // once more when the store has the session unmoved under another record
		s, err := c.Move(id, old, next)
		if err != nil || s.value == "" && s.ended == 0 {
			return res, nil
		}
		if s.ended != 0 {
			t.evictHere(id, s.ended)
			return failoverResult{}, failoverRefusal(refusedEnded)
		}
		if s.init == nil || s.dial == from.dial && s.init.upstreamID == init.upstreamID {
			old = s.value // where this instance found it, under other bytes
			continue
		}
		if up, won, ok := t.follow(id, s); ok { // moved: to the same upstream too, after its restart
			return failoverResult{up: up, init: won, followed: true}, nil
		}
		break
	}
	return res, nil
}
