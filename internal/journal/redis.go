package journal

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a [Journal] in Redis, shared by every Caddy replica that
// connects to it: each stream is a Redis Stream (XADD), trimmed to the
// window on every append (MINID) and expiring a window after its last
// event (PEXPIRE), so that a client resumes through any replica, and
// follows the live rest of a stream another replica records (XREAD
// BLOCK).
//
// The byte bounds are kept by counters of bytes appended per slice of the
// window (a fifth of it), per session and per journal, which expire with
// the window: an append that takes a session or the journal past its
// bound is the stream's last recorded event (the writer is told by
// [ErrFull]); the rest of the stream passes unrecorded.
//
// Keys: `<session key>:<stream>` (a stream), `<session key>:streams` (the
// session's streams), `<session key>:b:<slice>` and `<prefix>b:<slice>`
// (bytes counters). The session key is what sessionKey gives: built from
// a hash, never the session ID itself; with a Redis Cluster hash tag of
// its own, the sessions' streams spread over a cluster's masters, while
// the journal's counters share prefix's.
type Redis struct {
	client     redis.UniversalClient
	prefix     string
	sessionKey func(session string) string
	limits     atomic.Pointer[Limits]
	timeout    time.Duration
	now        func() time.Time

	appended               atomic.Uint64
	fullSession, fullTotal atomic.Uint64
}

// ErrFull is returned by [Redis.Append] when the event took its session
// or the journal past a byte bound: it is recorded, the stream's later
// events are not to be.
var ErrFull = errors.New("journal: byte bound reached; the rest of the stream is not recorded")

// NewRedis returns a journal in Redis through client, with its byte
// counters under prefix, each session's keys under what sessionKey
// returns for its ID, each call bounded by timeout.
func NewRedis(client redis.UniversalClient, prefix string, sessionKey func(string) string, l Limits, timeout time.Duration) *Redis {
	r := &Redis{client: client, prefix: prefix, sessionKey: sessionKey, timeout: timeout, now: time.Now}
	r.SetLimits(l)
	return r
}

// SetLimits changes the journal's bounds.
func (r *Redis) SetLimits(l Limits) {
	l = l.WithDefaults()
	r.limits.Store(&l)
}

// slices is how many slices of the window the byte counters cover: the
// window, and the slice being written.
const slices = 6

// slice returns the width of a counter's slice of the window.
func sliceOf(window time.Duration) time.Duration { return max(window/(slices-1), time.Second) }

func (r *Redis) streamKey(session, stream string) string {
	return r.sessionKey(session) + ":" + stream
}

// Append records ev with XADD, trimming the stream to the window. It
// returns [ErrFull] when a byte bound is reached, or Redis's error.
func (r *Redis) Append(ctx context.Context, session, stream string, ev Event) error {
	l := *r.limits.Load()
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	now := r.now()
	width := sliceOf(l.Window)
	cur := now.UnixMilli() / width.Milliseconds()
	sk := r.sessionKey(session)
	key := sk + ":" + stream
	size := ev.size()
	ttl := l.Window + width
	pipe := r.client.Pipeline()
	pipe.XAdd(ctx, &redis.XAddArgs{
		Stream: key, MinID: strconv.FormatInt(now.Add(-l.Window).UnixMilli(), 10), Approx: true,
		Values: []any{"s", ev.Seq, "u", ev.Upstream, "b", ev.Block},
	})
	pipe.PExpire(ctx, key, ttl)
	if ev.Seq == 1 {
		pipe.SAdd(ctx, sk+":streams", stream)
		pipe.PExpire(ctx, sk+":streams", ttl)
	}
	sessionNow := countBytes(ctx, pipe, sk+":b:", cur, size, ttl)
	totalNow := countBytes(ctx, pipe, r.prefix+"b:", cur, size, ttl)
	olderSession := pipe.MGet(ctx, olderSlices(sk+":b:", cur)...) // one slot each
	olderTotal := pipe.MGet(ctx, olderSlices(r.prefix+"b:", cur)...)
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	r.appended.Add(1)
	switch {
	case sessionNow.Val()+sum(olderSession.Val()) > l.SessionBytes:
		r.fullSession.Add(1)
		return ErrFull
	case totalNow.Val()+sum(olderTotal.Val()) > l.TotalBytes:
		r.fullTotal.Add(1)
		return ErrFull
	}
	return nil
}

// countBytes adds size to the counter of slice cur under prefix.
func countBytes(ctx context.Context, pipe redis.Pipeliner, prefix string, cur, size int64, ttl time.Duration) *redis.IntCmd {
	key := prefix + strconv.FormatInt(cur, 10)
	cmd := pipe.IncrBy(ctx, key, size)
	pipe.PExpire(ctx, key, ttl)
	return cmd
}

// olderSlices returns the keys of the counters under prefix of the slices
// of the window before cur.
func olderSlices(prefix string, cur int64) []string {
	keys := make([]string, 0, slices-1)
	for i := int64(1); i < slices; i++ {
		keys = append(keys, prefix+strconv.FormatInt(cur-i, 10))
	}
	return keys
}

// sum adds the counters read by MGET (nil for a missing one).
func sum(vals []any) int64 {
	var n int64
	for _, v := range vals {
		if s, ok := v.(string); ok {
			x, _ := strconv.ParseInt(s, 10, 64)
			n += x
		}
	}
	return n
}

// End appends the stream's end marker.
func (r *Redis) End(ctx context.Context, session, stream string) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	return r.client.XAdd(ctx, &redis.XAddArgs{Stream: r.streamKey(session, stream), NoMkStream: true, Values: []any{"e", 1}}).Err()
}

// Drop deletes the session's streams.
func (r *Redis) Drop(ctx context.Context, session string) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	sk := r.sessionKey(session)
	streams, err := r.client.SMembers(ctx, sk+":streams").Result()
	if err != nil {
		return err
	}
	keys := []string{sk + ":streams"}
	for _, s := range streams {
		keys = append(keys, sk+":"+s)
	}
	return r.client.Del(ctx, keys...).Err()
}

// Follow reads the stream with XRANGE, then follows it with XREAD BLOCK
// until its end marker.
func (r *Redis) Follow(ctx context.Context, session, stream string, after uint64, fn func(Event) error) error {
	key := r.streamKey(session, stream)
	rctx, cancel := context.WithTimeout(ctx, r.timeout)
	msgs, err := r.client.XRange(rctx, key, "-", "+").Result()
	cancel()
	if err != nil {
		return err
	}
	if len(msgs) == 0 {
		return ErrNotHeld
	}
	if first, ok := parseEntry(msgs[0]); !ok || first.Seq > after+1 {
		return ErrNotHeld // the window took the events after the one asked for
	}
	last := "0"
	for {
		for _, m := range msgs {
			last = m.ID
			if _, end := m.Values["e"]; end {
				return nil
			}
			ev, ok := parseEntry(m)
			if !ok || ev.Seq <= after {
				continue
			}
			if err := fn(ev); err != nil {
				return err
			}
			after = ev.Seq
		}
		msgs, err = r.next(ctx, key, last)
		if err != nil {
			return err
		}
	}
}

// followBlock is how long one XREAD waits for a new event.
const followBlock = time.Second

// next waits for the entries of key after id.
func (r *Redis) next(ctx context.Context, key, id string) ([]redis.XMessage, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		res, err := r.client.XRead(ctx, &redis.XReadArgs{Streams: []string{key, id}, Block: followBlock}).Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue
		case err != nil:
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, err
		case len(res) > 0 && len(res[0].Messages) > 0:
			return res[0].Messages, nil
		}
	}
}

// parseEntry reads an event from a stream entry.
func parseEntry(m redis.XMessage) (Event, bool) {
	s, _ := m.Values["s"].(string)
	seq, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return Event{}, false
	}
	u, _ := m.Values["u"].(string)
	b, _ := m.Values["b"].(string)
	return Event{Seq: seq, Upstream: u, Block: []byte(b)}, true
}

// Stats returns what this process appended and the appends that reached
// a byte bound (Trimmed, by bound). What Redis holds is Redis's to say
// (INFO memory); Bytes and Sessions are 0.
func (r *Redis) Stats() Stats {
	return Stats{Appended: r.appended.Load(), Trimmed: map[string]uint64{
		TrimWindow: 0, TrimSessionBytes: r.fullSession.Load(), TrimTotalBytes: r.fullTotal.Load(),
	}}
}

// Interface guards
var _ Journal = (*Redis)(nil)
