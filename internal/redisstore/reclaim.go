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
// session_ttl) is found by the reap, which each instance runs in its
// sync: the instance whose reapScript takes the session's reclaim record
// (GETDEL, in the session's own slot) reclaims it.
//
// Redis holds the session's key only as a keyed hash, so the instance that
// learned the session keeps its key, sealed, in the session's reclaim
// record (<p>:<t>:r:{<hash>}) while it has a forget hook (reclaim on): what
// a reaping instance needs to name the session upstream.

// reclaimVersion is the first byte of a sealed reclaim record and, with
// the session's key hash, its associated data.
const reclaimVersion byte = 2

// reapBatch is the most expired sessions of one upstream one sync reaps.
const reapBatch = 512

// recordGrace is how much longer than its session's value a reclaim
// record lives in Redis: long enough for a sync's reap to find the value
// gone and take the record, and a bound on what a record nobody takes
// holds (a member lost between two commands, an older replica's reap).
const recordGrace = time.Minute

// recordLife is the TTL of a reclaim record, refreshed with its session's.
func (l *layout) recordLife() time.Duration { return l.ttl() + recordGrace }

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

// endScript removes an ended session from Redis, with its reclaim record,
// leaves its tombstone if it has one, and tells the instances: keys of the
// session's slot only (a channel is no key). It returns 1 when it removed
// the session's value or its reclaim record, which makes the caller the one
// instance whose write ended the session; else 0. The member in the
// upstream's set goes in endTableScript (legacy.go), in the same pipeline:
// on another master, in either order. A crash (or a failed call) between
// them leaves the member: the upstream counts the session as live until
// its expiry score passes, and the reap then removes it (the record is
// gone, so it reclaims nothing). A session written by a replica of the
// older version (layout 1) has its value and record in the table's slot:
// endTableScript removes them, and its 1 makes this instance reclaim. A
// session held in both layouts, ended by two instances at once, may so be
// reclaimed by both: a second DELETE of a session the upstream ended
// already, answered 404, during a rolling upgrade only.
//
//	KEYS: the session, its reclaim record, its tombstone
//	ARGV: the tombstone's reason, its life (ms; 0: none), the channel, the message
var endScript = redis.NewScript(`
if tonumber(ARGV[2]) > 0 then redis.call('SET', KEYS[3], ARGV[1], 'PX', ARGV[2]) end
local del = redis.call('DEL', KEYS[1])
local rec = redis.call('DEL', KEYS[2])
redis.call('PUBLISH', ARGV[3], ARGV[4])
if del + rec > 0 then return 1 end
return 0`)

// reapScript takes the reclaim record of a session whose upstream's set
// holds it with an expiry past: in the session's slot, it returns 0 while
// the session's value lives (the member stays), else the record it took
// (GETDEL), or 1 without one. The instance that takes the record reclaims
// the session: GETDEL gives it to one instance only.
//
//	KEYS: the session, its reclaim record
var reapScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local rec = redis.call('GETDEL', KEYS[2])
if rec then return rec end
return 1`)

// endCmds are the commands of one end: endScript's, in the session's slot,
// and endTableScript's, in the table's.
type endCmds struct{ own, table *redis.Cmd }

// ended reports whether the end's writes ended the session in Redis.
func (e endCmds) ended() bool {
	own, err := e.own.Int()
	table, err2 := e.table.Int()
	return err == nil && own == 1 || err2 == nil && table == 1
}

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
	keys := []string{l.ks.session(h), l.ks.record(h), l.ks.tomb(h)}
	return endScript.Eval(ctx, pipe, keys, e.reason.String(), e.tomb.Milliseconds(),
		l.ks.events(), msgEnded+" "+e.reason.String()+" "+h.String())
}

// reclaimEnded hands the table the sessions whose end this instance's
// write made, once the pipeline ran.
func (l *layout) reclaimEnded(cmds map[endCmds]*session.Forgotten) {
	for cmd, f := range cmds {
		if f != nil && cmd.ended() {
			l.t.Reclaim(*f)
		}
	}
}

// queueReclaimRecord queues, in pipe, the reclaim record of session id,
// whose key hash is h, when the table reclaims sessions.
func (l *layout) queueReclaimRecord(ctx context.Context, pipe redis.Pipeliner, h keyHash, id string) {
	if l.t.Reclaiming() {
		pipe.Set(ctx, l.ks.record(h), l.ks.sealReclaim(h, id), l.recordLife())
	}
}

// upstreamSet names one set of an upstream's sessions (buckets.go).
type upstreamSet struct{ dial, key string }

// expiredMembers queues, per set of each upstream, the read of its
// members whose expiry is past at now.
func (l *layout) expiredMembers(ctx context.Context, pipe redis.Pipeliner, dials map[string]int64, now time.Time) map[upstreamSet]*redis.StringSliceCmd {
	out := make(map[upstreamSet]*redis.StringSliceCmd, len(dials)*len(l.ks.buckets))
	for dial := range dials {
		for _, key := range l.ks.upstreamSets(dial) {
			out[upstreamSet{dial, key}] = pipe.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "-inf", Max: itoa(now.UnixMilli()), Count: reapBatch})
		}
	}
	return out
}

// reap removes the expired members read by expiredMembers, and reclaims
// the sessions whose reclaim record this instance took. Per member,
// reapScript runs in the session's slot; then, for the members whose value
// is gone, reapTableScript removes them from the upstream's set in the
// table's slot (and takes the records of layout-1 sessions), or, from a
// cluster's bucket, a ZREM. A crash (or a failed call) between the two
// leaves the member, whose record is taken: the next sync's reap finds it
// again, takes nothing, and removes it.
func (l *layout) reap(ctx context.Context, expired map[upstreamSet]*redis.StringSliceCmd) error {
	pipe := l.client.Pipeline()
	taken := map[upstreamSet][]*redis.Cmd{}
	for set, cmd := range expired {
		for _, m := range cmd.Val() {
			taken[set] = append(taken[set], reapScript.Eval(ctx, pipe, []string{l.ks.sessionOf(m), l.ks.recordOf(m)}))
		}
	}
	if pipe.Len() == 0 {
		return nil
	}
	if err, _ := exec(ctx, pipe); err != nil {
		return err
	}
	for set, cmds := range taken {
		members := expired[set].Val()
		gone := make([]string, 0, len(members))
		for i, cmd := range cmds {
			switch v := cmd.Val().(type) {
			case int64:
				if v == 0 {
					continue // the session lives
				}
			case string:
				l.reclaimRecord(members[i], v, set.dial)
			}
			gone = append(gone, members[i])
		}
		if err := l.reapTable(ctx, set, gone); err != nil {
			return err
		}
	}
	return nil
}

// reapTable removes from set the members whose value is gone: from a
// cluster's bucket with ZREM, from the table's set with reapTableScript,
// reclaiming the layout-1 sessions whose record it took.
func (l *layout) reapTable(ctx context.Context, set upstreamSet, members []string) error {
	switch {
	case len(members) == 0:
		return nil
	case set.key != l.ks.legacyUpstream(set.dial):
		args := make([]any, len(members))
		for i, m := range members {
			args[i] = m
		}
		return l.client.ZRem(ctx, set.key, args...).Err()
	}
	dial := set.dial
	keys := make([]string, 0, len(members)+2)
	keys = append(keys, set.key, l.ks.legacyReclaims())
	args := make([]any, len(members))
	for i, m := range members {
		keys = append(keys, l.ks.legacySession(m))
		args[i] = m
	}
	got, err := reapTableScript.Run(ctx, l.client, keys, args...).StringSlice()
	if err != nil {
		return err
	}
	for i := 0; i+1 < len(got); i += 2 {
		l.reclaimRecord(got[i], got[i+1], dial)
	}
	return nil
}

// reclaimRecord reclaims the expired session of dial whose member is m and
// whose reclaim record is rec.
func (l *layout) reclaimRecord(m, rec, dial string) {
	h, ok := parseKeyHash(m)
	if !ok {
		return
	}
	if key, ok := l.ks.openReclaim(h, rec); ok {
		l.t.Reclaim(session.Forgotten{Key: key, Dial: dial, Reason: session.EvictTTL})
	}
}
