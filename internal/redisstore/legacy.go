package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Layout 1: before sessions had hash tags of their own, every key of a
// table shared the tag {<prefix>:<table>}, so that in a Redis Cluster the
// whole table lay in one slot, on one master. A replica of this version
// reads a session's layout-1 keys when its own are absent (a replica of
// the older version wrote it during a rolling upgrade), refreshes such a
// session in its own keys at its first touch (which migrates it), and
// removes the layout-1 keys of a session that ends. The upstreams' sets,
// the flags, the marker and the channel kept their names: both versions
// share them.
//
// A replica of the older version does not read this layout's keys: a
// session learned by a new replica is unknown there (docs/replicas.md:
// Rolling upgrades).

func (ks *keyspace) legacySession(member string) string { return ks.tag + ":s:" + member }
func (ks *keyspace) legacyTomb(member string) string    { return ks.tag + ":x:" + member }
func (ks *keyspace) legacyReclaims() string             { return ks.tag + ":r" }

// endTableScript is the part of an end in the table's slot: it removes
// the session's member from its upstream's set (the one outside a
// cluster, the older replicas' in one: buckets.go), and its layout-1 value
// and reclaim record. It returns 1 when it removed the layout-1 value or
// record (a session a replica of the older version learned), else 0.
//
//	KEYS: the layout-1 session, the layout-1 reclaim hash, the upstream's set
//	ARGV: the session's member
var endTableScript = redis.NewScript(`
local del = redis.call('DEL', KEYS[1])
local rec = redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if del + rec > 0 then return 1 end
return 0`)

// writeEndTable queues endTableScript for the session of dial whose
// member (its key hash as written) is m, and, in a cluster, the removal of
// m from its bucket of dial's sets.
func (l *layout) writeEndTable(ctx context.Context, pipe redis.Pipeliner, m, dial string) *redis.Cmd {
	if l.ks.bucketed() {
		pipe.ZRem(ctx, l.ks.upstream(dial, m), m)
	}
	return endTableScript.Eval(ctx, pipe, []string{l.ks.legacySession(m), l.ks.legacyReclaims(), l.ks.legacyUpstream(dial)}, m)
}

// reapTableScript removes from an upstream's set the members whose
// session is gone in layout 1 too (the caller saw its own value gone),
// with their layout-1 reclaim records, and returns member and record of
// each it removed that had one. It is layout 1's reap, which replicas of
// the older version still run: the one whose ZREM removes a member takes
// its layout-1 record.
//
//	KEYS: the upstream's set, the layout-1 reclaim hash, then the layout-1 session of each member
//	ARGV: the members, in the order of their sessions in KEYS
var reapTableScript = redis.NewScript(`
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
