package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Noticing what Redis lost while this instance kept the sessions: each sync
// compares three things with what the previous one saw, and when one of
// them changed, the instance writes every session it holds back (SET NX:
// what Redis still holds is left alone), with its drain flags.
//
//   - the run_id of every master (INFO server), which changes when a Redis
//     restarts, empty unless it persists, or when a failover promotes a
//     replica, which lacks what the old master acknowledged last;
//   - the table's marker key ({p:t}:alive), which carries a random token and
//     no TTL: its absence, or another token, means FLUSHALL, FLUSHDB, or a
//     deleted or evicted key;
//   - evicted_keys (INFO stats), which grows when Redis evicts keys under
//     maxmemory: perhaps the table's sessions.

// The causes of a write-back of the whole table, the `cause` label of the
// write-backs metric.
const (
	CauseRestart  = "restart"  // a master answers with another run_id: restarted, or promoted by a failover
	CauseFlush    = "flush"    // the table's marker key is gone: FLUSHALL, FLUSHDB, a deleted or evicted key
	CauseEviction = "eviction" // Redis evicted keys (evicted_keys grew), perhaps the table's
	CauseRetry    = "retry"    // the previous write-back failed
)

var writeBackCauses = [...]string{CauseRestart, CauseFlush, CauseEviction, CauseRetry}

func causeIndex(cause string) int { return max(slices.Index(writeBackCauses[:], cause), 0) }

// serverState is what sync reads of the Redis servers: the run_id of each
// master, by address ("" for a standalone server or Sentinel's master,
// whose address the client hides), and the keys they evicted, summed.
type serverState struct {
	runIDs  map[string]string
	evicted int64
}

// readServers reads the state of every master: the one server, or with a
// Redis Cluster each master in turn (ForEachMaster), so that a node's run_id
// is only ever compared with the same node's. A master of a cluster that
// does not answer is left out (the keys' own reads tell whether the
// table's are reachable); it errs only when none answers.
func (l *layout) readServers(ctx context.Context) (serverState, error) {
	st := serverState{runIDs: map[string]string{}}
	cc, ok := l.client.(*redis.ClusterClient)
	if !ok {
		id, ev, err := infoOf(ctx, l.client)
		st.runIDs[""], st.evicted = id, ev
		return st, err
	}
	var mu sync.Mutex
	var failed error
	_ = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		id, ev, err := infoOf(ctx, node)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failed = err
			return nil
		}
		st.runIDs[node.Options().Addr], st.evicted = id, st.evicted+ev
		return nil
	})
	if len(st.runIDs) == 0 {
		return st, orErr(failed, errors.New("redis cluster: no master answered"))
	}
	return st, nil
}

// infoOf reads one server's run_id and evicted_keys in one round trip.
func infoOf(ctx context.Context, c redis.Cmdable) (string, int64, error) {
	pipe := c.Pipeline()
	server, stats := pipe.Info(ctx, "server"), pipe.Info(ctx, "stats")
	if _, err := pipe.Exec(ctx); err != nil {
		return "", 0, err
	}
	ev, _ := strconv.ParseInt(infoField(stats.Val(), "evicted_keys"), 10, 64)
	return infoField(server.Val(), "run_id"), ev, nil
}

// infoField returns the value of field in an INFO reply ("" when absent).
func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// policyUnread reports whether Redis's maxmemory-policy is still to be read.
func (c *Conn) policyUnread() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.policy == ""
}

// noticeLoss records st and the marker token Redis holds ("" for none),
// and returns why the table must be written back ("" when it need not).
// The first sync of a connection only records.
func (c *Conn) noticeLoss(st serverState, marker string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	prev, prevEvicted, prevMarker, due, seen := c.runIDs, c.evicted, c.marker, c.writeBackDue, c.runIDs != nil
	c.runIDs, c.evicted, c.writeBackDue = st.runIDs, st.evicted, false
	if marker != "" {
		c.marker = marker
	}
	switch {
	case !seen:
		return ""
	case restartedNode(prev, st.runIDs):
		return CauseRestart
	case prevMarker != "" && marker != prevMarker:
		return CauseFlush
	case st.evicted > prevEvicted:
		return CauseEviction
	case due:
		return CauseRetry
	}
	return ""
}

// restartedNode reports whether a master of now answers with another
// run_id than before, or is a master that was not one before (a failover
// promoted it) while the set of masters was known.
func restartedNode(before, now map[string]string) bool {
	for addr, id := range now {
		old, ok := before[addr]
		if id == "" {
			continue
		}
		if ok && old != "" && old != id || !ok && len(before) > 0 {
			return true
		}
	}
	return false
}

// plantMarker writes the table's marker with a new token unless one is
// there, and remembers the token Redis then holds. Instances that saw
// another token write the table back at their next sync.
func (c *Conn) plantMarker(ctx context.Context) error {
	var b [8]byte
	_, _ = rand.Read(b[:])
	pipe := c.client.Pipeline()
	pipe.SetNX(ctx, c.ks.alive(), hex.EncodeToString(b[:]), 0)
	got := pipe.Get(ctx, c.ks.alive())
	if err, refusal := exec(ctx, pipe); err != nil {
		return err
	} else if refusal != nil {
		c.refused(opSync, refusal)
		return nil
	}
	c.mu.Lock()
	c.marker = got.Val()
	c.mu.Unlock()
	return nil
}

// WriteBacks calls fn with each cause of a write-back of the whole table
// and how many ran, then with "" and the sessions they restored (those
// Redis no longer held).
func (h *health) WriteBacks(fn func(cause string, n uint64)) {
	for i, cause := range writeBackCauses {
		fn(cause, h.writeBacks[i].Load())
	}
	fn("", h.restored.Load())
}

// evictingPolicies are the maxmemory-policy values under which Redis may
// evict the table's keys: volatile-* its sessions and tombstones (the keys
// with a TTL), allkeys-* any of them.
func evictingPolicy(policy string) bool {
	return strings.HasPrefix(policy, "volatile-") || strings.HasPrefix(policy, "allkeys-")
}

// checkPolicy logs, once per connection and master, a warning when Redis
// may evict the table's keys: maxmemory is set and maxmemory-policy is one
// that evicts. Redis that hides INFO memory is not checked.
func (c *Conn) checkPolicy(ctx context.Context) {
	info, err := c.client.Info(ctx, "memory").Result()
	if err != nil {
		if !errors.Is(err, context.DeadlineExceeded) {
			c.logger.Debug("redis store: cannot read maxmemory-policy", zap.Error(err))
			c.mu.Lock()
			c.policy = "unknown" // not asked again
			c.mu.Unlock()
		}
		return
	}
	policy, maxmem := infoField(info, "maxmemory_policy"), infoField(info, "maxmemory")
	c.mu.Lock()
	c.policy = policy
	c.mu.Unlock()
	if maxmem == "0" || !evictingPolicy(policy) {
		return
	}
	c.logger.Warn("redis store: Redis may evict this table's keys (maxmemory is set, and maxmemory-policy evicts): "+
		"the instances holding an evicted session write it back within about a second, but other instances answer 404 for it meanwhile; "+
		"give the sessions a Redis of their own with maxmemory-policy noeviction and maxmemory sized for the tables' max_sessions "+
		"(docs/replicas.md: Redis memory)",
		zap.String("maxmemory_policy", policy), zap.String("maxmemory", maxmem))
}
