package redisstore

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// An upstream's set of sessions (member: a session's key hash, score: its
// expiry) is one sorted set outside a Redis Cluster. In a cluster, one set
// per upstream would keep a member of every session on one master, about
// 40 % of what a session costs Redis: the masters would not hold N times
// the sessions of one. There, each upstream's sessions are split over
// upstreamBuckets sets by the first character of their key hash; bucket
// k's tag is chosen so that its slot lies in the k-th of upstreamBuckets
// equal ranges of the 16,384 slots, so that masters that own equal ranges
// of slots (as `redis-cli --cluster create` assigns them) own equal shares
// of the buckets. A session's bucket is the same for every upstream: a
// move between two upstreams' sets stays on one master.
//
// A replica of the older version (layout 1, and the version before the
// buckets) writes the one set {p:t}:u:<dial>. In a cluster this version
// counts and reaps that set too, and moves the members whose sessions it
// holds in its own keys into their buckets (moveLegacyMembers, sync.go), so
// that a session counted twice during a rolling upgrade is counted once a
// sync later.

// upstreamBuckets is how many sets hold an upstream's sessions in a Redis
// Cluster: with three masters, each holds 5 or 6 of them (at most 6 % more
// than a third of the members).
const upstreamBuckets = 16

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// inCluster splits the upstreams' sets in buckets spread over the slots.
func (ks *keyspace) inCluster() {
	inner := strings.Trim(ks.tag, "{}")
	ks.buckets = make([]string, upstreamBuckets)
	width := clusterSlots / upstreamBuckets
	for k := range ks.buckets {
		for n := 0; ; n++ {
			t := inner + ":" + strconv.Itoa(k) + "." + strconv.Itoa(n)
			if keySlot(t)/width == k {
				ks.buckets[k] = "{" + t + "}"
				break
			}
		}
	}
}

// bucketed reports whether the upstreams' sets are split in buckets.
func (ks *keyspace) bucketed() bool { return len(ks.buckets) > 1 }

// upstream returns the key of the set of dial that holds member m.
func (ks *keyspace) upstream(dial, m string) string {
	return ks.buckets[bucketOf(m, len(ks.buckets))] + ":u:" + dial
}

// upstreamSets returns the keys of every set of dial: its buckets, then,
// in a cluster, the set older replicas write (legacyUpstream).
func (ks *keyspace) upstreamSets(dial string) []string {
	keys := make([]string, 0, len(ks.buckets)+1)
	for _, b := range ks.buckets {
		keys = append(keys, b+":u:"+dial)
	}
	if ks.bucketed() {
		keys = append(keys, ks.legacyUpstream(dial))
	}
	return keys
}

// legacyUpstream returns the key of dial's set before the buckets, which
// outside a cluster is its only set.
func (ks *keyspace) legacyUpstream(dial string) string { return ks.tag + ":u:" + dial }

// bucketOf returns the bucket, of n, of the session whose member (its key
// hash, unpadded base64url) is m: by its first character, uniform over the
// 64 of the alphabet, so over n buckets when n divides 64.
func bucketOf(m string, n int) int {
	if n == 1 || m == "" {
		return 0
	}
	return b64Index(m[0]) % n
}

// b64Index returns the value of a base64url character (0 for another).
func b64Index(c byte) int {
	switch {
	case c >= 'A' && c <= 'Z':
		return int(c - 'A')
	case c >= 'a' && c <= 'z':
		return int(c-'a') + 26
	case c >= '0' && c <= '9':
		return int(c-'0') + 52
	case c == '-':
		return 62
	case c == '_':
		return 63
	}
	return 0
}

// keySlot returns the Redis Cluster hash slot of a key with no hash tag
// (or of a tag's contents): CRC16 (XMODEM) modulo 16,384, as the Redis
// Cluster specification's "Keys distribution model" and its Appendix A
// define it.
func keySlot(key string) int {
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}

// upstreamMembers returns the members of every set of dial, each once.
func upstreamMembers(ctx context.Context, client redis.UniversalClient, ks *keyspace, dial string) ([]string, error) {
	pipe := client.Pipeline()
	sets := ks.upstreamSets(dial)
	cmds := make([]*redis.StringSliceCmd, len(sets))
	for i, set := range sets {
		cmds[i] = pipe.ZRange(ctx, set, 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	if len(cmds) == 1 {
		return cmds[0].Val(), nil
	}
	seen := map[string]bool{}
	var out []string
	for _, cmd := range cmds {
		for _, m := range cmd.Val() {
			if !seen[m] {
				seen[m] = true
				out = append(out, m)
			}
		}
	}
	return out, nil
}

// legacyMembers queues, in a cluster, the read of a batch of each
// upstream's members in the set older replicas write; nil outside one.
func (ks *keyspace) legacyMembers(ctx context.Context, pipe redis.Pipeliner, dials map[string]int64) map[string]*redis.ZSliceCmd {
	if !ks.bucketed() {
		return nil
	}
	out := make(map[string]*redis.ZSliceCmd, len(dials))
	for dial := range dials {
		out[dial] = pipe.ZRangeWithScores(ctx, ks.legacyUpstream(dial), 0, reapBatch-1)
	}
	return out
}

// moveLegacyMembers moves, in a cluster, the members read by legacyMembers
// whose sessions have keys of this version into their buckets: first the
// bucket's ZADD GT (the later expiry wins), then the ZREM from the older
// set, so that a crash between the two leaves the session counted twice
// until the next sync, never lost. The members of sessions held only in
// layout 1 stay, for the older replicas' reap (legacy.go).
func moveLegacyMembers(ctx context.Context, client redis.UniversalClient, ks *keyspace, legacy map[string]*redis.ZSliceCmd) error {
	pipe := client.Pipeline()
	type read struct {
		dial string
		z    redis.Z
		held *redis.IntCmd
	}
	var reads []read
	for dial, cmd := range legacy {
		for _, z := range cmd.Val() {
			m, _ := z.Member.(string)
			reads = append(reads, read{dial, z, pipe.Exists(ctx, ks.sessionOf(m))})
		}
	}
	if len(reads) == 0 {
		return nil
	}
	if err, _ := exec(ctx, pipe); err != nil {
		return err
	}
	pipe = client.Pipeline()
	moved := map[string][]any{}
	for _, r := range reads {
		if r.held.Val() == 1 {
			m := r.z.Member.(string)
			pipe.ZAddGT(ctx, ks.upstream(r.dial, m), r.z)
			moved[r.dial] = append(moved[r.dial], m)
		}
	}
	if len(moved) == 0 {
		return nil
	}
	if err, _ := exec(ctx, pipe); err != nil {
		return err
	}
	pipe = client.Pipeline()
	for dial, ms := range moved {
		pipe.ZRem(ctx, ks.legacyUpstream(dial), ms...)
	}
	err, _ := exec(ctx, pipe)
	return err
}
