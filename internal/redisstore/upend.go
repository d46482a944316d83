package redisstore

import (
	"context"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/redis/go-redis/v9"
)

// Evicting every session of an upstream (an operator's call: the admin
// API's {"upstream": …}) ends the sessions the upstream's set holds in
// Redis when the evicting instance reads it, before that instance answers:
// those are the sessions learned before the eviction, on any instance.
// Each is ended by upEndScript, which tells every instance that session
// ended (msgEnded, not msgUpstream: a session learned after the read is
// not among them, and stays, in Redis and on every instance) and hands
// back the session's reclaim record when it removed it; the instance that
// took the record reclaims the session (reclaim.go), so each is DELETEd
// upstream exactly once. A session that ended or moved to another upstream
// meanwhile is not ended again.
//
// When Redis does not answer the eviction in time, it is queued, and the
// flush that writes it later (writeUpstreamEnds) removes every session the
// set holds then and reclaims none: some may have been learned after the
// eviction, and their upstreams must keep them.

// upEndScript ends one session of an evicted upstream, in the session's
// slot, unless its value names another upstream (a failover moved it): it
// leaves the session's tombstone if it has one, removes its value and its
// reclaim record, and tells the instances (a channel is no key). It
// returns the reclaim record it removed; nil when there was none, or the
// session moved. The member in the upstream's set, in the table's slot,
// goes in endTableScript (legacy.go) in the same pipeline, also for a
// session that moved (its member in this set is stale). A crash between
// the two leaves the member, which the next reap removes (the record is
// gone: it reclaims nothing). A session only a replica of the older
// version wrote (layout 1) is ended by endTableScript without its DELETE:
// during a rolling upgrade only.
//
//	KEYS: the session, its tombstone, its reclaim record
//	ARGV: the upstream's dial address, the tombstone's reason, its life (ms; 0: none), the channel, the message
var upEndScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] and string.sub(v, 1, #ARGV[1] + 1) ~= ARGV[1] .. ' ' then
  return false
end
if tonumber(ARGV[3]) > 0 then redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3]) end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[4], ARGV[5])
return redis.call('GETDEL', KEYS[3])`)

// upEndBatch is the most sessions of an evicted upstream one pipeline ends.
const upEndBatch = 512

// EndUpstream removes every session of dial that Redis holds from Redis
// and from every instance's table; with a tomb life, it leaves a tombstone
// of each for that long. It returns once Redis has it, and reclaims the
// sessions whose reclaim record it removed; when Redis does not answer in
// time, the eviction is written later, and reclaims none (see above).
func (c *Conn) EndUpstream(dial string, tomb time.Duration) {
	if c.healthy.Load() && c.endUpstreamNow(dial, tomb) {
		return
	}
	c.queueUpstreamEnd(dial, tomb)
}

// endUpstreamNow reads the sessions of dial's set and ends each, in
// batches, and reports whether Redis took every batch.
func (c *Conn) endUpstreamNow(dial string, tomb time.Duration) bool {
	ctx, cancel := c.call()
	members, err := upstreamMembers(ctx, c.client, c.ks, dial)
	cancel()
	if err != nil {
		c.fail(opFlush, err)
		return false
	}
	for len(members) > 0 {
		batch := members[:min(upEndBatch, len(members))]
		members = members[len(batch):]
		if !c.endMembers(dial, tomb, batch) {
			return false
		}
	}
	return true
}

// endMembers ends the sessions of dial whose members are batch, and
// reclaims those whose record this write took.
func (c *Conn) endMembers(dial string, tomb time.Duration, batch []string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*c.timeout)
	defer cancel()
	reason := upEndReason(tomb)
	pipe := c.client.Pipeline()
	taken := make(map[*redis.Cmd]takenEnd, len(batch))
	for _, m := range batch {
		taken[c.writeUpEnd(ctx, pipe, dial, m, reason, tomb)] = takenEnd{member: m, f: session.Forgotten{Dial: dial, Reason: reason}}
	}
	if err, refusal := exec(ctx, pipe); err != nil || refusal != nil {
		c.failWrite(opFlush, orErr(err, refusal))
		return false
	}
	c.reclaimTaken(taken)
	return true
}

// writeUpEnd queues upEndScript for member m of dial's set, and the
// removal of m from the set (endTableScript).
func (l *layout) writeUpEnd(ctx context.Context, pipe redis.Pipeliner, dial, m string, reason session.EvictReason, tomb time.Duration) *redis.Cmd {
	keys := []string{l.ks.sessionOf(m), l.ks.tombOf(m), l.ks.recordOf(m)}
	cmd := upEndScript.Eval(ctx, pipe, keys, dial, reason.String(), tomb.Milliseconds(),
		l.ks.events(), msgEnded+" "+reason.String()+" "+m)
	l.writeEndTable(ctx, pipe, m, dial)
	return cmd
}

// upEndReason is why the sessions of an evicted upstream ended: an
// operator's eviction leaves tombstones, and an upstream gone none.
func upEndReason(tomb time.Duration) session.EvictReason {
	if tomb > 0 {
		return session.EvictAdmin
	}
	return session.EvictUpstreamGone
}

// queueUpstreamEnd queues the eviction of every session of dial, with
// tombstones of life tomb, for the flush (writeUpstreamEnds).
func (qu *queue) queueUpstreamEnd(dial string, tomb time.Duration) {
	qu.mu.Lock()
	qu.upEnds[dial] = max(qu.upEnds[dial], tomb)
	qu.mu.Unlock()
	qu.wake()
}
