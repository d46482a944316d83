package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// A Redis that answers but refuses writes, and sessions that have not been
// used since their initialize.
//
// A Redis at maxmemory under noeviction answers writes with OOM, and a
// replica (a Sentinel failover in progress, an address that names a
// replica) with READONLY. Neither is unreachable: reads go on (a session
// learned elsewhere is still found), and only the writes wait. The store
// keeps what it could not write queued, bounded by its table (a session
// that leaves the table leaves the queue), retries it with the next sync,
// logs the refusal once with its fix, and shows it in Writable.
//
// A session not yet used since its initialize (unconfirmed) is written
// with unconfirmedTTL instead of the table's TTL, and removed from Redis
// when the table that learned it drops it unconfirmed (a flood of
// initialize requests pushes it out); its first use on any instance gives
// it the table's TTL. So a flood holds Redis to about the instances'
// tables' bounds, and what a crashed instance leaves lasts unconfirmedTTL.

// unconfirmedTTL is the life in Redis of a session not yet used since its
// initialize. Clients send their first request right after initialize;
// one that waits longer still finds the session on the instance that
// learned it.
const unconfirmedTTL = 30 * time.Second

// refusesWrites reports whether Redis answered err because it takes no
// writes now: OOM (maxmemory under noeviction) or READONLY (a replica).
func refusesWrites(err error) bool {
	return redis.IsOOMError(err) || redis.IsReadOnlyError(err)
}

// Writable reports whether Redis took the store's last writes; false while
// it answers them with OOM or READONLY.
func (h *health) Writable() bool { return !h.refusing.Load() }

// refused counts a write Redis refused for op and, on the first of a
// burst, logs it with its fix. Redis stays reachable.
func (h *health) refused(op string, err error) {
	h.errs[opIndex(op)].Add(1)
	if !h.refusing.CompareAndSwap(false, true) {
		return
	}
	if redis.IsReadOnlyError(err) {
		h.logger.Error("redis store: Redis refuses writes with READONLY: this address is a replica. "+
			"Sessions are still read from Redis; new sessions, ends and drains are kept on this instance and written "+
			"when Redis takes writes again. Point address at the master, or give the Sentinels' addresses with master_name "+
			"(during a Sentinel failover this lasts until the client follows the new master)",
			zap.String("op", op), zap.Error(err))
		return
	}
	h.logger.Error("redis store: Redis is full (OOM: maxmemory reached under maxmemory-policy noeviction). "+
		"Sessions are still read from Redis; new sessions are kept on the instance that learned them, and written when Redis "+
		"takes writes again. Raise maxmemory (docs/replicas.md#sizing), lower the tables' max_sessions, or move other data off "+
		"this Redis", zap.String("op", op), zap.Error(err))
}

// accepted notes that Redis took a write, and logs the end of a refusal once.
func (h *health) accepted() {
	if h.refusing.CompareAndSwap(true, false) {
		h.logger.Info("redis store: Redis takes writes again")
	}
}

// failWrite is fail for a write: a refusal keeps Redis reachable.
func (c *Conn) failWrite(op string, err error) {
	if refusesWrites(err) {
		c.refused(op, err)
		return
	}
	c.fail(op, err)
}

// firstError returns the first error among cmds other than redis.Nil (a
// GET of a missing key), and apart the first refused write (refusesWrites).
func firstError(cmds []redis.Cmder) (err, refusal error) {
	for _, cmd := range cmds {
		e := cmd.Err()
		switch {
		case e == nil || errors.Is(e, redis.Nil):
		case refusesWrites(e):
			refusal = orErr(refusal, e)
		default:
			err = orErr(err, e)
		}
	}
	return err, refusal
}

// orErr returns a unless it is nil, else b.
func orErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// exec sends pipe and returns its first error other than redis.Nil and
// refused writes, and the first refused write.
func exec(ctx context.Context, pipe redis.Pipeliner) (err, refusal error) {
	cmds, err := pipe.Exec(ctx)
	if err == nil {
		return nil, nil
	}
	if len(cmds) == 0 {
		return err, nil
	}
	return firstError(cmds)
}

// unconfirmedLife returns the TTL of a session not yet used since its
// initialize: unconfirmedTTL, or the table's when that is not much longer.
func (l *layout) unconfirmedLife() time.Duration {
	if ttl := l.ttl(); ttl < 4*unconfirmedTTL {
		return ttl
	}
	return unconfirmedTTL
}

// shortLived reports whether unconfirmed sessions get a shorter TTL in
// Redis than confirmed ones.
func (l *layout) shortLived() bool { return l.unconfirmedLife() < l.ttl() }

// confirmWrites queues, in a flush's pipeline, the table's TTL for each
// session first used since its initialize (hash -> dial), in its key and
// its upstream's set (only if still there: a move or an end wins).
func (l *layout) confirmWrites(ctx context.Context, pipe redis.Pipeliner, confirms map[keyHash]string) {
	ttl := l.ttl()
	expiry := float64(time.Now().Add(ttl).UnixMilli())
	for h, dial := range confirms {
		pipe.PExpire(ctx, l.ks.session(h), ttl)
		m := h.String()
		pipe.ZAddXX(ctx, l.ks.upstream(dial, m), redis.Z{Score: expiry, Member: m})
	}
}

// dropScript removes an unconfirmed session from Redis unless an instance
// confirmed it meanwhile (its TTL is then longer than an unconfirmed one's),
// with its reclaim record (reclaim.go): keys of the session's slot only. It
// returns 0 when it kept the session; else the reclaim record it removed,
// or 1 without one. dropTable then removes the member from the upstream's
// set.
//
//	KEYS: the session, its reclaim record
//	ARGV: the unconfirmed TTL (ms)
var dropScript = redis.NewScript(`
local ttl = redis.call('PTTL', KEYS[1])
if ttl > tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[1])
local rec = redis.call('GETDEL', KEYS[2])
if rec then return rec end
return 1`)

// dropWrites queues, in a flush's pipeline, the removal of each session the
// table dropped before its first use (hash -> dial).
// It returns each drop's command, with what the table reclaims if this
// drop removed the session (all but its key, which the record holds).
func (l *layout) dropWrites(ctx context.Context, pipe redis.Pipeliner, drops map[keyHash]string) map[*redis.Cmd]takenEnd {
	life := l.unconfirmedLife().Milliseconds()
	out := make(map[*redis.Cmd]takenEnd, len(drops))
	for h, dial := range drops {
		cmd := dropScript.Eval(ctx, pipe, []string{l.ks.session(h), l.ks.record(h)}, life)
		out[cmd] = takenEnd{member: h.String(), f: session.Forgotten{Dial: dial, Reason: session.EvictUnconfirmed}}
	}
	return out
}

// dropTable removes, after a flush, the members of the sessions its
// dropScripts removed from their upstreams' sets; a kept session keeps its
// member. A crash (or a failed call) between the two leaves the member
// with its unconfirmed expiry score: counted as live for at most
// unconfirmedTTL, then removed by the reap, which finds the value gone.
func (l *layout) dropTable(ctx context.Context, drops map[*redis.Cmd]takenEnd) {
	pipe := l.client.Pipeline()
	for cmd, te := range drops {
		if n, ok := cmd.Val().(int64); cmd.Err() != nil || ok && n == 0 {
			continue
		}
		pipe.ZRem(ctx, l.ks.upstream(te.f.Dial, te.member), te.member)
	}
	if pipe.Len() > 0 {
		_, _ = exec(ctx, pipe) // the reap removes what this leaves
	}
}
