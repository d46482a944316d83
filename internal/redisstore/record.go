package redisstore

import (
	"cmp"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"strings"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/seal"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
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
// key hash is h, as a Redis value carries it: an envelope of internal/seal
// of version recordVersion, with h as associated data, whose fields are
//
//	upstreamID, accept, contentType, version, body
func (ks *keyspace) sealRecord(h keyHash, init *session.Init) string {
	fields := [...]string{init.UpstreamID, init.Accept, init.ContentType, init.Version, string(init.Body)}
	return seal.Under(ks.records).Seal(recordVersion, h[:], seal.Message{Fields: fields[:]})
}

// openRecord returns the failover record rec of the session whose key hash
// is h, with rec as its stored form; false when it does not open.
func (ks *keyspace) openRecord(h keyHash, rec string) (*session.Init, bool) {
	_, plain, ok := seal.Under(ks.records).Open(rec, h[:], func(v byte) bool { return v == recordVersion })
	if !ok {
		return nil, false
	}
	var f [5]string
	if _, ok := seal.Split(plain, false, f[:]); !ok {
		return nil, false
	}
	// Clones, so that the table keeps the fields and not the plaintext.
	return &session.Init{UpstreamID: strings.Clone(f[0]), Accept: strings.Clone(f[1]), ContentType: strings.Clone(f[2]),
		Version: strings.Clone(f[3]), Body: []byte(f[4]), StoreRecord: rec}, true
}

// WithRecord returns a copy of init that carries its sealed record for
// session id, as the table keeps it: a touch or a move compares Redis's
// value with it byte for byte.
func (l *layout) WithRecord(id string, init *session.Init) *session.Init {
	s := *init
	s.StoreRecord = l.ks.sealRecord(l.ks.hash(id), init)
	return &s
}

// Parse returns what value v of session id holds.
func (l *layout) Parse(id, v string) session.Stored {
	dial, bound, rec := session.ParseValue(v)
	s := session.Stored{Dial: dial, Bound: bound, Value: v}
	if rec != "" {
		s.Init, _ = l.ks.openRecord(l.ks.hash(id), rec)
	}
	return s
}

// Current reads session id from Redis for a failover: what it holds, and
// what Redis says of it (storeUnknown when Redis did not answer).
func (c *Conn) Current(id string) (session.Stored, session.StoreState) {
	if !c.healthy.Load() {
		return session.Stored{}, session.StoreUnknown
	}
	ctx, cancel := c.call()
	defer cancel()
	s, st, err := c.read(ctx, id, c.ks.hash(id))
	if err != nil {
		c.fail(OpMove, err)
	}
	return s, st
}

// moveScript moves a session in Redis if its value is still the one the
// caller failed over from (or is gone, without a tombstone), and tells
// every instance; else it returns the value another instance wrote, or
// movedEnded for a session that ended for good meanwhile, and changes
// nothing. It touches the session's slot only (a channel is no key); the
// upstreams' sets follow in moveTable.
//
//	KEYS: the session, its tombstone, its reclaim record
//	ARGV: the old value, the new value, the TTL (ms), the channel, the message, the record's TTL (ms)
var moveScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return cur end
local tomb = redis.call('GET', KEYS[2])
if not cur and tomb then return '` + movedEnded + `' .. tomb end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[6])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return ''`)

// movedEnded begins what moveScript returns for a session that ended for
// good, followed by its tombstone's reason: no value is empty or begins
// with a space.
const movedEnded = " ended "

// Move is moveValue, with what Redis holds instead parsed: the zero
// storedSession once Redis holds new, the session another instance moved
// it to, or only the reason of its tombstone when it ended for good.
func (c *Conn) Move(id, old, new string) (session.Stored, error) {
	cur, err := c.moveValue(id, old, new)
	if err != nil || cur == "" {
		return session.Stored{}, err
	}
	if reason, ended := strings.CutPrefix(cur, movedEnded); ended {
		return session.Stored{Ended: cmp.Or(session.ReasonNamed(reason), session.EvictDelete)}, nil
	}
	return c.Parse(id, cur), nil
}

// moveValue records that session id moved from the value old to the value
// new. It returns "" once Redis holds new, or the value Redis holds
// instead when another instance moved the session first, or movedEnded
// when the session ended for good meanwhile; an error when Redis did not
// answer, and then new is written when it answers again.
func (c *Conn) moveValue(id, old, new string) (string, error) {
	h := c.ks.hash(id)
	if !c.healthy.Load() {
		c.errs[opIndex(OpMove)].Add(1) // the outage is logged once already
		c.queueMove(h, pendingMove{id, old, new})
		return "", errors.New("redis store unreachable")
	}
	from, _, _ := session.ParseValue(old)
	to, _, _ := session.ParseValue(new)
	now := time.Now()
	ctx, cancel := c.call()
	defer cancel()
	cur, err := moveScript.Run(ctx, c.client, []string{c.ks.session(h), c.ks.tomb(h), c.ks.record(h)}, old, new, c.ttl().Milliseconds(),
		c.ks.events(), msgMoved+" "+h.String()+" "+new, c.recordLife().Milliseconds()).Text()
	if err != nil {
		c.failWrite(OpMove, err)
		c.queueMove(h, pendingMove{id, old, new})
		return "", err
	}
	if cur == "" {
		c.moveTable(ctx, h, from, to, now)
	}
	return cur, nil
}

// moveTable moves the member of session h, which moveScript moved from
// upstream from to upstream to, between the upstreams' sets: in the
// sets' slot (the table's, or in a cluster the session's bucket's), so
// after the script and apart from it. What a crash (or a
// failed call) between the two leaves is harmless: the member stays in
// the old upstream's set, counted there until its expiry score passes,
// then removed by the reap once the session is gone (its record, if any,
// is taken by the end or the reap as usual); the new upstream's set lacks
// it until the first touch of the session, which adds it, so that the new
// upstream's live count is one short meanwhile.
func (c *Conn) moveTable(ctx context.Context, h keyHash, from, to string, now time.Time) {
	pipe := c.client.Pipeline()
	m := h.String()
	pipe.ZRem(ctx, c.ks.upstream(from, m), m)
	if c.ks.bucketed() {
		pipe.ZRem(ctx, c.ks.legacyUpstream(from), m) // an older replica may have written it there
	}
	pipe.ZAdd(ctx, c.ks.upstream(to, m), redis.Z{Score: float64(now.Add(c.ttl()).UnixMilli()), Member: m})
	c.recorded.write(ctx, pipe, c.ks, to, now)
	if err, refusal := exec(ctx, pipe); err != nil || refusal != nil {
		c.errs[opIndex(OpMove)].Add(1) // the session moved; its counts catch up (above)
	}
}

// pendingMove is a failover this instance recorded while Redis did not
// answer: session id moved from value old to value new.
type pendingMove struct{ id, old, new string }

// queueMove queues move m of session h for when Redis answers again. It
// replaces a queued put of the session (a move of a session learned during
// the outage), and is written as a move: with the compare-and-set of
// moveScript, so that of the instances that moved the session during one
// outage, the first to write wins and the others follow it (flushMoves).
func (qu *queue) queueMove(h keyHash, m pendingMove) {
	qu.mu.Lock()
	defer qu.mu.Unlock()
	delete(qu.puts, h)
	if prev, ok := qu.moves[h]; ok {
		m.old = prev.old // moved twice: from where Redis last had it
	}
	if _, ok := qu.moves[h]; ok || len(qu.moves) < qu.maxQueued {
		qu.moves[h] = m
	}
}

// flushMoves writes the moves queued during an outage, each with moveScript,
// and makes a session that another instance moved first, or that ended
// meanwhile, follow what Redis holds. It returns false when Redis did not
// answer; the moves left are queued again.
func (c *Conn) flushMoves() bool {
	c.mu.Lock()
	moves := c.moves
	c.moves = map[keyHash]pendingMove{}
	c.mu.Unlock()
	for h, m := range moves {
		cur, err := c.moveValue(m.id, m.old, m.new) // queues the move again on failure
		if err != nil {
			c.mu.Lock()
			for h2, m2 := range moves {
				if _, newer := c.moves[h2]; !newer && h2 != h {
					c.moves[h2] = m2
				}
			}
			c.mu.Unlock()
			return false
		}
		switch reason, ended := strings.CutPrefix(cur, movedEnded); {
		case cur == "" || cur == m.new:
		case ended:
			c.t.EvictHere(m.id, cmp.Or(session.ReasonNamed(reason), session.EvictDelete))
		default:
			c.t.Follow(m.id, c.Parse(m.id, cur))
		}
	}
	return true
}

// touchScript refreshes a session's TTL, as a touch does, unless another
// instance changed its value (moved it), or the session ended for good (a
// tombstone): a touch of an instance that has not yet heard of a move or
// an end must not undo it. It touches the session's slot only: the
// upstream's set follows in touchTable, for the touches it took.
//
//	KEYS: the session, its tombstone, its reclaim record
//	ARGV: the value, the TTL (ms), the record's TTL (ms)
var touchScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
if not cur and redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[3], ARGV[3])
return 1`)

// writeTouch queues the refresh of session h, whose value is v: as
// writeSession, or, for a value with a failover record, by touchScript,
// whose command it returns (nil for the other).
func (l *layout) writeTouch(ctx context.Context, pipe redis.Pipeliner, h keyHash, v string) *redis.Cmd {
	_, _, rec := session.ParseValue(v)
	if rec == "" {
		l.writeSession(ctx, pipe, h, v, false)
		return nil
	}
	return touchScript.Eval(ctx, pipe, []string{l.ks.session(h), l.ks.tomb(h), l.ks.record(h)}, v, l.ttl().Milliseconds(), l.recordLife().Milliseconds())
}

// touched is a touch by touchScript queued in a flush: the session's ID,
// its value, and the script's command.
type touched struct {
	v   string
	cmd *redis.Cmd
}

// touchTable refreshes, after a flush, the upstream's set and record of
// each session whose touchScript took the touch; those it did not take
// are left out, so that a touch that lost to a move or an end puts no
// member back. A crash (or a failed call) between the flush and this
// leaves the member's expiry score older than the session's TTL: the
// session counts as live until that score passes, and the reap keeps its
// member while its value lives; the next touch refreshes it.
func (l *layout) touchTable(ctx context.Context, cmds map[string]touched) {
	pipe := l.client.Pipeline()
	now := time.Now()
	for id, tc := range cmds {
		if n, err := tc.cmd.Int(); err != nil || n != 1 {
			continue
		}
		dial, _, _ := session.ParseValue(tc.v)
		m := l.ks.hash(id).String()
		pipe.ZAdd(ctx, l.ks.upstream(dial, m), redis.Z{Score: float64(now.Add(l.ttl()).UnixMilli()), Member: m})
		l.recorded.write(ctx, pipe, l.ks, dial, now)
	}
	if pipe.Len() > 0 {
		_, _ = exec(ctx, pipe) // the next touch writes it again
	}
}

// followTouched makes the sessions whose touch found another value in
// Redis follow it: another instance moved them, and this one missed the
// message; or ended them for good, and then they end here too.
func (c *Conn) followTouched(cmds map[string]touched) {
	for id, tc := range cmds {
		if n, err := tc.cmd.Int(); err == nil && n == 0 {
			switch s, st := c.Current(id); st {
			case session.StoreHolds:
				c.t.Follow(id, s)
			case session.StoreEnded:
				c.t.EvictHere(id, s.Ended)
			}
		}
	}
}

// applyMoved applies another instance's move of the session whose key hash
// is hs to new: this instance, if it holds the session, sends its requests
// to the new upstream under the new upstream ID from now on.
func (c *Conn) applyMoved(hs, v string) {
	h, ok := parseKeyHash(hs)
	if !ok {
		return
	}
	c.mu.Lock()
	id := c.byHash[h]
	c.mu.Unlock()
	if id != "" {
		c.t.Follow(id, c.Parse(id, v))
	}
}
