package redisstore

import (
	"context"
	"strings"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/seal"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/redis/go-redis/v9"
)

// Reclaim through the shared store: a session that ends in Redis is
// DELETEd upstream by exactly one instance, the one whose write ended it
// there (session/forget.go). An end (a DELETE of the proxy's own, an admin
// eviction, an upstream gone) runs endScript, which reports whether it
// removed the session or its reclaim record: only then does the instance
// reclaim it. A session that expires in Redis (idle on every instance for
// session_ttl) is found by reapScript, which each instance runs in its
// sync: the instance whose script removes its member from the upstream's
// set gets its reclaim record, and reclaims it.
//
// Redis holds the session's key only as a keyed hash, so the instance that
// learned the session keeps its key, sealed, in the table's reclaim hash
// ({p:t}:r, field <hash>) while it has a forget hook (reclaim on): what a
// reaping instance needs to name the session upstream.

// reclaimVersion is the first byte of a sealed reclaim record and, with
// the session's key hash, its associated data.
const reclaimVersion byte = 2

// reapBatch is the most expired sessions of one upstream one sync reaps.
const reapBatch = 512

// sealReclaim returns the reclaim record of the session whose table key
// is key and whose key hash is h.
func (ks *keyspace) sealReclaim(h keyHash, key string) string {
	return seal.Under(ks.records).Seal(reclaimVersion, h[:], seal.Message{Fields: []string{key}})
}

// openReclaim returns the table key a reclaim record of h holds.
func (ks *keyspace) openReclaim(h keyHash, rec string) (string, bool) {
	_, plain, ok := seal.Under(ks.records).Open(rec, h[:], func(v byte) bool { return v == reclaimVersion })
	if !ok {
		return "", false
	}
	var f [1]string
	if _, ok := seal.Split(plain, false, f[:]); !ok {
		return "", false
	}
	return strings.Clone(f[0]), true
}

func (ks *keyspace) reclaims() string { return ks.tag + ":r" }

// endScript removes an ended session from Redis, with its reclaim record,
// leaves its tombstone if it has one, and tells the instances. It returns
// 1 when it removed the session's value or its reclaim record, which
// makes the caller the one instance whose write ended the session; else 0.
//
//	KEYS: the session, the reclaim hash, its tombstone, its upstream's set
//	ARGV: the session's member, the tombstone's reason, its life (ms; 0: none), the channel, the message
var endScript = redis.NewScript(`
if tonumber(ARGV[3]) > 0 then redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3]) end
local del = redis.call('DEL', KEYS[1])
local rec = redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('PUBLISH', ARGV[4], ARGV[5])
if del + rec > 0 then return 1 end
return 0`)

// reapScript removes from an upstream's set the members whose session
// expired (its value is gone), with their reclaim records, and returns
// member and record of each it removed that had one.
//
//	KEYS: the upstream's set, the reclaim hash, then the session of each member
//	ARGV: the members, in the order of their sessions in KEYS
var reapScript = redis.NewScript(`
local out = {}
for i, m in ipairs(ARGV) do
  if redis.call('EXISTS', KEYS[i + 2]) == 0 and redis.call('ZREM', KEYS[1], m) == 1 then
    local rec = redis.call('HGET', KEYS[2], m)
    if rec then
      redis.call('HDEL', KEYS[2], m)
      table.insert(out, m)
      table.insert(out, rec)
    end
  end
end
return out`)

// takenEnd is a session whose reclaim record a script (dropScript) may
// take: its member, and what the table reclaims but its key, which the
// record holds.
type takenEnd struct {
	member string
	f      session.Forgotten
}

// reclaimTaken hands the table the sessions whose reclaim record a script
// of this instance took, once the pipeline ran.
func (l *layout) reclaimTaken(taken map[*redis.Cmd]takenEnd) {
	for cmd, te := range taken {
		rec, ok := cmd.Val().(string) // the record; nil or a number without one
		if !ok {
			continue
		}
		h, ok := parseKeyHash(te.member)
		if !ok {
			continue
		}
		if te.f.Key, ok = l.ks.openReclaim(h, rec); ok {
			l.t.Reclaim(te.f)
		}
	}
}

// writeEndScript queues the end e of the session whose key hash is h, and
// returns its command: 1 when this write ended the session.
func (l *layout) writeEndScript(ctx context.Context, pipe redis.Pipeliner, h keyHash, e pendingEnd) *redis.Cmd {
	keys := []string{l.ks.session(h), l.ks.reclaims(), l.ks.tomb(h), l.ks.upstream(e.dial)}
	return endScript.Eval(ctx, pipe, keys, h.String(), e.reason.String(), e.tomb.Milliseconds(),
		l.ks.events(), msgEnded+" "+e.reason.String()+" "+h.String())
}

// reclaimEnded hands the table the sessions whose end this instance's
// write made, once the pipeline ran.
func (l *layout) reclaimEnded(cmds map[*redis.Cmd]*session.Forgotten) {
	for cmd, f := range cmds {
		if n, err := cmd.Int(); err == nil && n == 1 && f != nil {
			l.t.Reclaim(*f)
		}
	}
}

// queueReclaimRecord queues, in pipe, the reclaim record of session id,
// whose key hash is h, when the table reclaims sessions.
func (l *layout) queueReclaimRecord(ctx context.Context, pipe redis.Pipeliner, h keyHash, id string) {
	if l.t.Reclaiming() {
		pipe.HSet(ctx, l.ks.reclaims(), h.String(), l.ks.sealReclaim(h, id))
	}
}

// expiredMembers queues, per upstream, the read of its set's members
// whose expiry is past at now.
func (l *layout) expiredMembers(ctx context.Context, pipe redis.Pipeliner, dials map[string]int64, now time.Time) map[string]*redis.StringSliceCmd {
	out := make(map[string]*redis.StringSliceCmd, len(dials))
	for dial := range dials {
		out[dial] = pipe.ZRangeByScore(ctx, l.ks.upstream(dial), &redis.ZRangeBy{Min: "-inf", Max: itoa(now.UnixMilli()), Count: reapBatch})
	}
	return out
}

// reap removes the expired members read by expiredMembers, and reclaims
// the sessions whose member this instance removed.
func (l *layout) reap(ctx context.Context, expired map[string]*redis.StringSliceCmd) error {
	for dial, cmd := range expired {
		members := cmd.Val()
		if len(members) == 0 {
			continue
		}
		keys := make([]string, 0, len(members)+2)
		keys = append(keys, l.ks.upstream(dial), l.ks.reclaims())
		args := make([]any, len(members))
		for i, m := range members {
			keys = append(keys, l.ks.tag+":s:"+m)
			args[i] = m
		}
		got, err := reapScript.Run(ctx, l.client, keys, args...).StringSlice()
		if err != nil {
			return err
		}
		for i := 0; i+1 < len(got); i += 2 {
			h, ok := parseKeyHash(got[i])
			if !ok {
				continue
			}
			if key, ok := l.ks.openReclaim(h, got[i+1]); ok {
				l.t.Reclaim(session.Forgotten{Key: key, Dial: dial, Reason: session.EvictTTL})
			}
		}
	}
	return nil
}
