package redisstore

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// hashKeyInUse is how long after its last sync an instance's hash_key
// counts as in use; records older than hashKeyForgotten are removed, so
// that a hash_key rotated on every instance stops counting.
const (
	hashKeyInUse     = 5 * syncEvery
	hashKeyForgotten = time.Minute
)

// announceHashKey queues, in the sync's pipeline, this instance's
// hash_key fingerprint with the time, the removal of fingerprints nobody
// announced for hashKeyForgotten, and the read of those left.
func (l *layout) announceHashKey(ctx context.Context, pipe redis.Pipeliner) *redis.ZSliceCmd {
	now := time.Now()
	pipe.ZAdd(ctx, l.ks.hashKeys(), redis.Z{Score: float64(now.UnixMilli()), Member: l.ks.fingerprint})
	pipe.ZRemRangeByScore(ctx, l.ks.hashKeys(), "-inf", itoa(now.Add(-hashKeyForgotten).UnixMilli()))
	return pipe.ZRangeWithScores(ctx, l.ks.hashKeys(), 0, -1)
}

// checkHashKeys logs, once per clash, that another instance announced
// another hash_key on this table recently: the instances then hash session
// IDs to different keys and do not find each other's sessions.
func (c *Conn) checkHashKeys(announced []redis.Z) {
	others := 0
	since := float64(time.Now().Add(-hashKeyInUse).UnixMilli())
	for _, z := range announced {
		if z.Member != c.ks.fingerprint && z.Score >= since {
			others++
		}
	}
	if others == 0 {
		if c.keyClash.CompareAndSwap(true, false) {
			c.logger.Info("redis store: every instance on this table uses this instance's hash_key again")
		}
		return
	}
	c.errs[opIndex(OpHashKey)].Add(1)
	if c.keyClash.CompareAndSwap(false, true) {
		c.logger.Error("redis store: another Caddy instance uses a different hash_key on this table and key_prefix, "+
			"so neither finds the sessions the other learned; give every instance the same hash_key",
			zap.Int("other_hash_keys", others), zap.String("this_hash_key_fingerprint", c.ks.fingerprint))
	}
}

// HashKeyClash reports whether another instance announced another
// hash_key on this table within the last five syncs.
func (h *health) HashKeyClash() bool { return h.keyClash.Load() }

// misconfigured reports whether Redis refused a call for a reason that
// lasts until the configuration changes: authentication, permissions or
// the database index.
func misconfigured(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	for _, p := range []string{"WRONGPASS", "NOAUTH", "NOPERM", "ERR DB index", "ERR invalid password", "ERR AUTH"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}
