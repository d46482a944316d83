package redisstore

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Timing of the redis store's background work.
const (
	// flushEvery is how often queued writes (idle timers, ended sessions,
	// drain flags) go to Redis; an ended session or a drain goes at once.
	flushEvery = 200 * time.Millisecond
	// syncEvery is how often an instance reads the cluster's view from
	// Redis: live sessions per upstream, draining flags.
	syncEvery = time.Second
	// probeEvery is how often an instance tries to reach Redis again while
	// it is unreachable.
	probeEvery = 250 * time.Millisecond
	// writeBackBatch is the most sessions written back in one pipeline.
	writeBackBatch = 512
	// maxCounted is the most upstreams whose live sessions a learn reads back.
	maxCounted = 64
)

// The operations on Redis, the `op` label of the store errors metric.
const (
	opGet       = "get"        // a request's session, not seen by this instance
	opPut       = "put"        // a session learned by this instance
	opFlush     = "flush"      // queued writes: idle timers, ended sessions, drain flags; a session ended for good at once
	opSync      = "sync"       // the periodic read of the cluster's view
	opProbe     = "probe"      // reaching Redis again after a failure
	opWriteBack = "write_back" // what was learned while Redis was unreachable, or lost by it
	OpHashKey   = "hash_key"   // another instance uses another hash_key on the same table (keycheck.go)
	OpMove      = "move"       // a failover: reading where the session is, recording its move (record.go)
)

var storeOps = [...]string{opGet, opPut, opFlush, opSync, opProbe, opWriteBack, OpHashKey, OpMove}

func opIndex(op string) int {
	for i, o := range storeOps {
		if o == op {
			return i
		}
	}
	return 0
}

// pendingEnd is a session ended on this instance, not yet removed from Redis.
type pendingEnd struct {
	dial   string
	reason session.EvictReason
	// tomb is the life of the session's tombstone in Redis; 0 leaves none.
	tomb time.Duration
	// reclaim is what the table reclaims if this end ends the session in
	// Redis (reclaim.go); nil for none.
	reclaim *session.Forgotten
}

// redisConn is one table's connection to Redis: it answers the table's
// misses, writes what the table learns and ends, tells the other instances,
// applies what they tell, and keeps the cluster's view (live sessions per
// upstream, draining flags) current. While Redis cannot be reached it fails
// fast and queues the writes, and writes them back when Redis answers.
type Conn struct {
	// layout is the table as it lies in Redis: the client, the keyspace
	// and the commands that read and write the table's keys.
	layout
	// health is what Redis's answers say of it: reachable, writable, the
	// errors by operation, a hash_key clash, the write-backs.
	health
	// queue holds the writes Redis has not taken yet, and the index of the
	// table's sessions by key hash, under one lock.
	queue

	journal journalOnce // the table's event journal in Redis (journal.go)

	// Guarded by queue's mu:
	runIDs       map[string]string // each master's run_id, by address, to notice a restart (lost.go); nil before the first sync
	evicted      int64             // the masters' evicted_keys at the last sync
	marker       string            // the token of the table's marker key last seen
	policy       string            // Redis's maxmemory-policy, once read
	writeBackDue bool              // a write-back failed: the next sync does it again
	outage       time.Time         // when the current outage began
	outErrs      uint64            // errors before the current outage

	stop   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// layout is a table's keys in Redis and the commands on them that need
// nothing of the connection's state.
type layout struct {
	t        *session.Table
	client   redis.UniversalClient
	ks       *keyspace
	timeout  time.Duration
	recorded *upstreamRecords
}

// health is what a connection knows of Redis from its answers.
type health struct {
	logger   *zap.Logger
	healthy  atomic.Bool
	errs     [len(storeOps)]atomic.Uint64
	keyClash atomic.Bool // another hash_key is in use on this table (keycheck.go)
	refusing atomic.Bool // Redis answers writes with OOM or READONLY (full.go)

	writeBacks [len(writeBackCauses)]atomic.Uint64 // write-backs of the whole table, by cause (lost.go)
	restored   atomic.Uint64                       // sessions they wrote that Redis no longer held
}

// queue is what a connection has to write to Redis and has not yet, and
// the sessions of its table by key hash. mu guards it, and the fields of
// Conn that say so.
type queue struct {
	mu        sync.Mutex
	keys      *keyspace                // the layout's keyspace
	byHash    map[keyHash]string       // session ID of each hash, for sessions of t
	puts      map[keyHash]string       // learned here, not yet in Redis: hash -> value
	ends      map[keyHash]pendingEnd   // ended here, not yet removed from Redis
	touches   map[string]string        // used since the last flush: session ID -> value
	drains    map[string]bool          // drain flags set here, not yet in Redis
	upEnds    map[string]time.Duration // upstreams evicted here, not yet in Redis: the life of their sessions' tombstones (0: none)
	streams   map[string]string        // sessions with a GET stream open here: ID -> value
	fresh     map[keyHash]string       // put here with the unconfirmed TTL, not yet used: hash -> dial (full.go)
	confirms  map[keyHash]string       // first used since put, TTL not yet raised in Redis: hash -> dial
	drops     map[keyHash]string       // dropped unconfirmed from the table, not yet from Redis: hash -> dial
	moves     map[keyHash]pendingMove  // failovers recorded here while Redis did not answer (record.go)
	maxQueued int                      // the most puts queued: the table's bound
	touched   time.Time                // when the open streams' sessions were last touched
	kick      chan struct{}            // wakes the flush loop
}

// New connects table t to Redis through a client with opts, under keys
// that begin with prefix and table (the table's name), hashing session IDs with
// hashKey (at least 32 bytes, the same on every instance), and starts the
// connection's background work. It does not wait for Redis. Each wait for
// a reply is bounded by timeout. Destruct stops it.
func New(t *session.Table, opts *redis.UniversalOptions, prefix, table string, hashKey []byte, timeout time.Duration, logger *zap.Logger) *Conn {
	client, ks := redis.NewUniversalClient(opts), newKeyspace(prefix, table, hashKey)
	if _, ok := client.(*redis.ClusterClient); ok {
		ks.inCluster()
	}
	return newConn(t, client, ks, timeout, logger)
}

// Events returns the name of the table's events channel, on which the
// instances publish ends, drains and moves.
func (l *layout) Events() string { return l.ks.events() }

// SessionKey returns the Redis key of session id's value.
func (l *layout) SessionKey(id string) string { return l.ks.session(l.ks.hash(id)) }

// newConn connects table t to Redis through client, under the keys of ks,
// and starts the connection's background work. It does not wait for Redis.
func newConn(t *session.Table, client redis.UniversalClient, ks *keyspace, timeout time.Duration, logger *zap.Logger) *Conn {
	c := &Conn{
		layout: layout{t: t, client: client, ks: ks, timeout: timeout, recorded: &upstreamRecords{}},
		health: health{logger: logger.With(zap.String("table", t.Name()))},
		queue: queue{
			keys:   ks,
			byHash: map[keyHash]string{}, puts: map[keyHash]string{}, ends: map[keyHash]pendingEnd{},
			touches: map[string]string{}, drains: map[string]bool{}, upEnds: map[string]time.Duration{}, streams: map[string]string{},
			fresh: map[keyHash]string{}, confirms: map[keyHash]string{}, drops: map[keyHash]string{}, moves: map[keyHash]pendingMove{},
			maxQueued: max(t.MaxSessions(), writeBackBatch), kick: make(chan struct{}, 1),
		},
		stop: make(chan struct{}),
	}
	c.healthy.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.wg.Add(3)
	go c.flushLoop()
	go c.syncLoop()
	go c.subscribe(ctx)
	return c
}

// Destruct stops the background work and closes the connection.
func (c *Conn) Destruct() error {
	close(c.stop)
	c.cancel()
	c.wg.Wait()
	return c.client.Close()
}

// call returns a context bounded by the store's timeout.
func (l *layout) call() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), l.timeout)
}

// ttl is how long Redis keeps an unused session: the table's TTL plus one
// touch interval, because an instance refreshes the TTL once per touch
// interval of use. A session unused on every instance is so forgotten
// between session_ttl and session_ttl plus a touch interval after its last use.
func (l *layout) ttl() time.Duration {
	return l.t.TTL() + session.TouchInterval(l.t.TTL())
}

// Get returns session id as Redis holds it: its upstream ("" when Redis
// does not hold it or did not answer in time), the principal it is bound
// to, and its failover record; or, for a session that ended for good, only
// the reason its tombstone holds.
func (c *Conn) Get(id string) session.Stored {
	if !c.healthy.Load() {
		return session.Stored{}
	}
	h := c.ks.hash(id)
	ctx, cancel := c.call()
	defer cancel()
	s, st, err := c.read(ctx, id, h)
	if err != nil {
		c.fail(opGet, err)
		return session.Stored{}
	}
	if st != session.StoreHolds {
		return s
	}
	c.mu.Lock()
	c.byHash[h] = id
	if c.shortLived() && s.Dial != "" {
		c.confirms[h] = s.Dial // this request is a use: the session may be unconfirmed in Redis
	}
	c.mu.Unlock()
	return s
}

// read reads session id, whose key hash is h, and its tombstone, in one
// round trip: its own keys and its layout-1 keys (legacy.go), which count
// only when its own are both absent. A tombstone wins over a value (which
// a touch of an instance that missed the end may have written back).
func (l *layout) read(ctx context.Context, id string, h keyHash) (session.Stored, session.StoreState, error) {
	pipe := l.client.Pipeline()
	own := pipe.MGet(ctx, l.ks.session(h), l.ks.tomb(h)) // one slot: the session's
	old := pipe.MGet(ctx, l.ks.legacySession(h.String()), l.ks.legacyTomb(h.String()))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return session.Stored{}, session.StoreUnknown, err
	}
	for _, cmd := range [...]*redis.SliceCmd{own, old} {
		vals := cmd.Val()
		if len(vals) != 2 {
			return session.Stored{}, session.StoreUnknown, errors.New("redis store: MGET answered " + strconv.Itoa(len(vals)) + " values, want 2")
		}
		if reason, ok := vals[1].(string); ok {
			return session.Stored{Ended: cmp.Or(session.ReasonNamed(reason), session.EvictDelete)}, session.StoreEnded, nil
		}
		if v, ok := vals[0].(string); ok {
			return l.Parse(id, v), session.StoreHolds, nil
		}
	}
	return session.Stored{}, session.StoreAbsent, nil
}

// Peek is get without remembering the session: for the admin API.
func (c *Conn) Peek(id string) (string, session.PrincipalSum) {
	ctx, cancel := c.call()
	defer cancel()
	h := c.ks.hash(id)
	v, err := c.client.Get(ctx, c.ks.session(h)).Result()
	if errors.Is(err, redis.Nil) {
		v, err = c.client.Get(ctx, c.ks.legacySession(h.String())).Result() // a replica of the older version learned it
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		c.fail(opGet, err)
	}
	if v == "" {
		return "", session.PrincipalSum{}
	}
	dial, bound, _ := session.ParseValue(v)
	return dial, bound
}

// Put writes that dial owns session id, bound to bound, with its failover
// record, if any, and reads back the live sessions of the table's
// upstreams. It returns once Redis answered, or failed to in time; then
// the session is written back later.
func (c *Conn) Put(id, dial string, bound session.PrincipalSum, record string) {
	h, v := c.ks.hash(id), session.EncodeValue(dial, bound, record)
	life := c.unconfirmedLife()
	c.mu.Lock()
	c.byHash[h] = id
	delete(c.ends, h)
	if life < c.ttl() {
		c.fresh[h] = dial
	}
	c.mu.Unlock()
	if !c.healthy.Load() {
		c.queuePut(h, v)
		return
	}
	ctx, cancel := c.call()
	defer cancel()
	pipe := c.client.Pipeline()
	pipe.Del(ctx, c.ks.tomb(h)) // an upstream opened a session with this ID again
	c.writeSessionFor(ctx, pipe, h, v, false, life)
	c.queueReclaimRecord(ctx, pipe, h, id)
	counts := c.countSessions(ctx, pipe, c.t.Upstreams())
	err, refusal := exec(ctx, pipe)
	switch {
	case err != nil:
		c.fail(opPut, err)
		c.queuePut(h, v)
		return
	case refusal != nil:
		c.refused(opPut, refusal)
		c.queuePut(h, v)
	default:
		c.accepted()
	}
	c.applyCounts(counts, dial)
}

// Rekey makes id, the key the table now holds a session by (see
// [Table.confirm]), the session ID of its hash here, so that the table and
// this index share one copy of it; a session this index does not hold is
// left out.
func (qu *queue) Rekey(id string) {
	h := qu.keys.hash(id)
	qu.mu.Lock()
	if _, ok := qu.byHash[h]; ok {
		qu.byHash[h] = id
	}
	if dial, ok := qu.fresh[h]; ok { // confirmed: the table's TTL in Redis too
		delete(qu.fresh, h)
		qu.confirms[h] = dial
	}
	qu.mu.Unlock()
}

// queuePut queues the write of session h, whose value is v, for when Redis
// takes it; at most maxQueued are queued.
func (qu *queue) queuePut(h keyHash, v string) {
	qu.mu.Lock()
	if _, ok := qu.puts[h]; ok || len(qu.puts) < qu.maxQueued {
		qu.puts[h] = v
	}
	qu.mu.Unlock()
}

// writeSession queues the writes of one session, whose value is v: its
// key, its place in its upstream's set, and the upstream's record. With
// onlyNew, a session Redis holds already is left as it is.
func (l *layout) writeSession(ctx context.Context, pipe redis.Pipeliner, h keyHash, v string, onlyNew bool) *redis.StatusCmd {
	return l.writeSessionFor(ctx, pipe, h, v, onlyNew, l.ttl())
}

// writeSessionFor is writeSession with the session's TTL in Redis.
func (l *layout) writeSessionFor(ctx context.Context, pipe redis.Pipeliner, h keyHash, v string, onlyNew bool, ttl time.Duration) *redis.StatusCmd {
	now := time.Now()
	args := redis.SetArgs{TTL: ttl}
	if onlyNew {
		args.Mode = "NX"
	}
	dial, _, _ := session.ParseValue(v)
	set := pipe.SetArgs(ctx, l.ks.session(h), v, args)
	if l.t.Reclaiming() {
		pipe.PExpire(ctx, l.ks.record(h), l.recordLife()) // the record outlives the value (reclaim.go)
	}
	m := h.String()
	pipe.ZAdd(ctx, l.ks.upstream(dial, m), redis.Z{Score: float64(now.Add(ttl).UnixMilli()), Member: m})
	l.recorded.write(ctx, pipe, l.ks, dial, now)
	return set
}

// upstreamRecords is when this instance last wrote each upstream's record
// in the table's set of upstreams: dial -> Unix ms (int64).
type upstreamRecords struct{ m sync.Map }

// write queues the refresh of dial's record in the table's set of
// upstreams, at most once per syncEvery per upstream: every sync refreshes
// the records of the upstreams in use here (syncUpstreams), so a write
// needs it only for an upstream this instance has not recorded lately.
// Per write, it would send every learn and touch to the master of the
// table's slot too.
func (ur *upstreamRecords) write(ctx context.Context, pipe redis.Pipeliner, ks *keyspace, dial string, now time.Time) {
	ms := now.UnixMilli()
	if last, ok := ur.m.Load(dial); ok && ms-last.(int64) < syncEvery.Milliseconds() {
		return
	}
	ur.m.Store(dial, ms)
	pipe.ZAddGT(ctx, ks.upstreams(), redis.Z{Score: float64(ms), Member: dial})
}

// countSessions queues a count of the live sessions of each of ups (at most
// maxCounted) and returns the counts' commands, by dial. In a cluster it
// queues none: a count there reads every bucket of every upstream
// (buckets.go), which a sync does once a second; a put adds its session to
// the count read last (applyCounts).
func (l *layout) countSessions(ctx context.Context, pipe redis.Pipeliner, ups []*session.Upstream) map[string]liveCount {
	if l.ks.bucketed() {
		return nil
	}
	cmds := make(map[string]liveCount, min(len(ups), maxCounted))
	now := time.Now().UnixMilli()
	for _, u := range ups {
		if len(cmds) == maxCounted {
			break
		}
		cmds[u.Dial()] = l.ks.countLive(ctx, pipe, u.Dial(), itoa(now))
	}
	return cmds
}

// liveCount is the count of an upstream's live sessions: one ZCOUNT per
// set of the upstream.
type liveCount []*redis.IntCmd

// countLive queues the count of dial's sessions whose expiry is at least
// from (a ZCOUNT bound: Unix ms, "(" before it for after).
func (ks *keyspace) countLive(ctx context.Context, pipe redis.Pipeliner, dial, from string) liveCount {
	sets := ks.upstreamSets(dial)
	cmds := make(liveCount, len(sets))
	for i, set := range sets {
		cmds[i] = pipe.ZCount(ctx, set, from, "+inf")
	}
	return cmds
}

// result returns the count, or the first set's error.
func (lc liveCount) result() (int64, error) {
	var n int64
	for _, cmd := range lc {
		v, err := cmd.Result()
		if err != nil {
			return 0, err
		}
		n += v
	}
	return n, nil
}

// applyCounts sets the cluster-wide live sessions of upstreams from
// counts; without counts (a cluster's put), it adds the session put to
// dial's count until the next sync reads it.
func (c *Conn) applyCounts(counts map[string]liveCount, dial string) {
	if counts == nil {
		c.t.StoreUpstream(dial).AddClusterSessions(1)
		return
	}
	for dial, lc := range counts {
		if n, err := lc.result(); err == nil {
			c.t.StoreUpstream(dial).SetClusterSessions(n)
		}
	}
}

// Touch queues a refresh of session id's idle timer in Redis, where its
// value is v.
func (c *Conn) Touch(id, v string) {
	if !c.healthy.Load() {
		return // the write-back after the outage refreshes it
	}
	c.mu.Lock()
	c.touches[id] = v
	c.mu.Unlock()
}

// Streaming records whether session id, whose value is v, has GET streams
// open here: while it has, its idle timer in Redis is refreshed every
// touch interval.
func (qu *queue) Streaming(id, v string, open bool) {
	qu.mu.Lock()
	defer qu.mu.Unlock()
	if open {
		qu.streams[id] = v
	} else {
		delete(qu.streams, id)
	}
}

// touchStreams queues a refresh of the sessions with open streams, once
// per touch interval.
func (c *Conn) touchStreams() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.touched) < session.TouchInterval(c.t.TTL()) {
		return
	}
	c.touched = time.Now()
	maps.Copy(c.touches, c.streams)
}

// End removes session id of dial from Redis and from every instance's
// table, for reason, soon. With a tomb life, it leaves a tombstone there
// for that long (the table's tombstones), and returns once Redis has it, or failed
// to take it in time: the client that ended the session gets its answer
// only then, so that no replica it asks next finds the session in Redis.
func (c *Conn) End(id, dial string, reason session.EvictReason, tomb time.Duration, reclaim *session.Forgotten) {
	h := c.ks.hash(id)
	e := pendingEnd{dial: dial, reason: reason, tomb: tomb, reclaim: reclaim}
	c.mu.Lock()
	delete(c.byHash, h)
	delete(c.puts, h)
	delete(c.touches, id)
	delete(c.streams, id)
	delete(c.fresh, h)
	delete(c.confirms, h)
	delete(c.drops, h)
	delete(c.moves, h)
	c.mu.Unlock()
	if tomb > 0 && c.healthy.Load() && c.endNow(h, e) {
		return
	}
	c.mu.Lock()
	c.ends[h] = e
	c.mu.Unlock()
	c.wake()
}

// endNow writes the end e of the session whose key hash is h to Redis,
// and reports whether Redis took it.
func (c *Conn) endNow(h keyHash, e pendingEnd) bool {
	ctx, cancel := c.call()
	defer cancel()
	pipe := c.client.Pipeline()
	cmd := c.writeEnd(ctx, pipe, h, e)
	if err, refusal := exec(ctx, pipe); err != nil || refusal != nil {
		c.failWrite(opFlush, orErr(err, refusal))
		return false
	}
	c.reclaimEnded(map[endCmds]*session.Forgotten{cmd: e.reclaim})
	return true
}

// Drain sets dial's draining flag in Redis and on every instance, soon.
func (qu *queue) Drain(dial string, on bool) {
	qu.mu.Lock()
	qu.drains[dial] = on
	qu.mu.Unlock()
	qu.wake()
}

// Forget drops what the connection remembers of session id, which left
// this instance's table only (TTL, LRU, or ended elsewhere).
func (qu *queue) Forget(id string) {
	h := qu.keys.hash(id)
	qu.mu.Lock()
	delete(qu.byHash, h)
	delete(qu.streams, id)
	if dial, ok := qu.fresh[h]; ok { // dropped before its first use: from Redis too, unless used elsewhere
		delete(qu.fresh, h)
		if _, queued := qu.puts[h]; queued {
			delete(qu.puts, h)
		} else {
			qu.drops[h] = dial
		}
	}
	qu.mu.Unlock()
}

// wake makes the flusher run now.
func (qu *queue) wake() {
	select {
	case qu.kick <- struct{}{}:
	default:
	}
}

// Reachable reports whether the last call to Redis succeeded.
func (h *health) Reachable() bool { return h.healthy.Load() }

// PrincipalKey returns the key of principal hashes, derived from hash_key.
func (l *layout) PrincipalKey() []byte { return l.ks.principal }

// Errors calls fn with each operation on Redis and its failed calls.
func (h *health) Errors(fn func(op string, n uint64)) {
	for _, op := range storeOps {
		fn(op, h.ErrorCount(op))
	}
}

// ErrorCount returns the number of failed calls of op.
func (h *health) ErrorCount(op string) uint64 { return h.errs[opIndex(op)].Load() }

// fail counts a failed call and, on the first of a burst, marks Redis
// unreachable and logs it once.
func (c *Conn) fail(op string, err error) {
	c.errs[opIndex(op)].Add(1)
	if !c.healthy.CompareAndSwap(true, false) {
		return
	}
	c.mu.Lock()
	c.outage, c.outErrs = time.Now(), c.totalErrors()-1
	c.mu.Unlock()
	if misconfigured(err) {
		c.logger.Error("redis store refuses this instance: check the store's username, password and db; "+
			"meanwhile serving sessions from this instance's table, and trying again every 250ms",
			zap.String("op", op), zap.Error(err))
		return
	}
	c.logger.Warn("redis store unreachable: serving sessions from this instance's table, "+
		"and writing what it learns back to Redis when Redis answers again",
		zap.String("op", op), zap.Error(err))
}

func (h *health) totalErrors() uint64 {
	var n uint64
	for i := range h.errs {
		n += h.errs[i].Load()
	}
	return n
}

// recovered marks Redis reachable again and logs the outage once.
func (c *Conn) recovered() {
	c.mu.Lock()
	since, before, queued := c.outage, c.outErrs, len(c.puts)+len(c.ends)+len(c.drains)+len(c.moves)
	c.mu.Unlock()
	c.healthy.Store(true)
	c.logger.Info("redis store reachable again", zap.Duration("unreachable_for", time.Since(since).Round(time.Millisecond)),
		zap.Uint64("errors", c.totalErrors()-before), zap.Int("writes_to_write_back", queued))
	c.wake()
}

// itoa formats a Unix time in milliseconds for a score range.
func itoa(ms int64) string { return strconv.FormatInt(ms, 10) }

// Interface guards
var _ session.Shared = (*Conn)(nil)
