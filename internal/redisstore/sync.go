package redisstore

import (
	"context"
	"maps"
	"strings"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// The messages instances publish on a table's events channel:
//
//	e <reason> <hash>   a session ended (reason as in EvictReason)
//	u <dial>            every session of an upstream was evicted
//	d 1 <dial>          an upstream started draining ("d 0": stopped)
//	m <hash> <value>    a failover moved a session; value is its new value (record.go)
const (
	msgEnded    = "e"
	msgUpstream = "u"
	msgDrain    = "d"
	msgMoved    = "m"
)

// flushLoop sends the queued writes every flushEvery, or when woken.
func (c *Conn) flushLoop() {
	defer c.wg.Done()
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	var flushed time.Time
	for {
		select {
		case <-c.stop:
			return
		case <-c.kick:
		case <-tick.C:
		}
		// While Redis refuses writes, retry once per sync, not per flush.
		if c.healthy.Load() && (!c.refusing.Load() || time.Since(flushed) >= syncEvery) {
			flushed = time.Now()
			c.Flush()
		}
	}
}

// queued is a snapshot of the writes queued for Redis.
type queued struct {
	puts    map[keyHash]string
	ends    map[keyHash]pendingEnd
	touches map[string]string
	drains  map[string]bool
	upEnds  map[string]time.Duration
	confirm map[keyHash]string
	drops   map[keyHash]string
}

func (q queued) empty() bool {
	return len(q.puts)+len(q.ends)+len(q.touches)+len(q.drains)+len(q.upEnds)+len(q.confirm)+len(q.drops) == 0
}

// take empties the queues and returns what they held.
func (qu *queue) take() queued {
	qu.mu.Lock()
	defer qu.mu.Unlock()
	q := queued{qu.puts, qu.ends, qu.touches, qu.drains, qu.upEnds, qu.confirms, qu.drops}
	qu.puts, qu.ends, qu.touches = map[keyHash]string{}, map[keyHash]pendingEnd{}, map[string]string{}
	qu.drains, qu.upEnds = map[string]bool{}, map[string]time.Duration{}
	qu.confirms, qu.drops = map[keyHash]string{}, map[keyHash]string{}
	return q
}

// requeue puts back what a failed flush did not write, unless something
// newer was queued meanwhile. Idle timers are dropped: the write-back
// rewrites every session it queued.
func (qu *queue) requeue(q queued) {
	qu.mu.Lock()
	defer qu.mu.Unlock()
	for h, dial := range q.puts {
		if _, ended := qu.ends[h]; !ended {
			qu.puts[h] = dial
		}
	}
	for h, e := range q.ends {
		if _, put := qu.puts[h]; !put {
			qu.ends[h] = e
		}
	}
	for dial, on := range q.drains {
		if _, newer := qu.drains[dial]; !newer {
			qu.drains[dial] = on
		}
	}
	maps.Copy(qu.upEnds, q.upEnds)
	for h, dial := range q.confirm {
		if _, ended := qu.ends[h]; !ended {
			qu.confirms[h] = dial
		}
	}
	for h, dial := range q.drops {
		if _, put := qu.puts[h]; !put {
			qu.drops[h] = dial
		}
	}
}

// Flush writes the queued writes in one pipeline, after reading the
// sessions of evicted upstreams.
func (c *Conn) Flush() {
	if !c.flushMoves() {
		return
	}
	q := c.take()
	if q.empty() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*c.timeout)
	defer cancel()
	pipe := c.client.Pipeline()
	for h, v := range q.puts {
		c.writeSession(ctx, pipe, h, v, false)
	}
	touches := map[string]touched{}
	for id, v := range q.touches {
		if cmd := c.writeTouch(ctx, pipe, c.ks.hash(id), v); cmd != nil {
			touches[id] = touched{v, cmd}
		}
	}
	ended := make(map[endCmds]*session.Forgotten, len(q.ends))
	for h, e := range q.ends {
		ended[c.writeEnd(ctx, pipe, h, e)] = e.reclaim
	}
	c.writeDrains(ctx, pipe, q.drains)
	c.confirmWrites(ctx, pipe, q.confirm)
	dropped := c.dropWrites(ctx, pipe, q.drops)
	taken, err := c.writeUpstreamEnds(ctx, pipe, q.upEnds)
	if err != nil {
		c.fail(opFlush, err)
		c.requeue(q)
		return
	}
	if err, refusal := exec(ctx, pipe); err != nil || refusal != nil {
		c.failWrite(opFlush, orErr(err, refusal))
		c.requeue(q) // writes that went through are written again: each is idempotent
		return
	}
	c.accepted()
	c.touchTable(ctx, touches)
	c.dropTable(ctx, dropped)
	c.followTouched(touches)
	c.reclaimEnded(ended)
	c.reclaimTaken(taken)
	c.reclaimTaken(dropped)
}

// writeEnd queues the removal of an ended session, with its reclaim
// record, and its tombstone if it has one, and tells the instances
// (endScript), and its removal from its upstream's set (endTableScript).
// Its commands say whether this write ended the session.
func (l *layout) writeEnd(ctx context.Context, pipe redis.Pipeliner, h keyHash, e pendingEnd) endCmds {
	return endCmds{l.writeEndScript(ctx, pipe, h, e), l.writeEndTable(ctx, pipe, h.String(), e.dial)}
}

// writeDrains queues the drain flags and tells the instances.
func (l *layout) writeDrains(ctx context.Context, pipe redis.Pipeliner, drains map[string]bool) {
	now := float64(time.Now().UnixMilli())
	for dial, on := range drains {
		flag := "0"
		if on {
			flag = "1"
			pipe.HSet(ctx, l.ks.draining(), dial, flag)
		} else {
			pipe.HDel(ctx, l.ks.draining(), dial)
		}
		pipe.ZAddGT(ctx, l.ks.upstreams(), redis.Z{Score: now, Member: dial})
		pipe.Publish(ctx, l.ks.events(), msgDrain+" "+flag+" "+dial)
	}
}

// writeUpstreamEnds reads the sessions of each upstream whose eviction
// Redis did not take at once (upend.go) and queues their removal, with
// their tombstones when they leave one and their reclaim records, then
// tells the instances. It reclaims none: the members read at flush time
// may include sessions learned after the eviction, which must not be
// DELETEd upstream.
func (l *layout) writeUpstreamEnds(ctx context.Context, pipe redis.Pipeliner, dials map[string]time.Duration) (map[*redis.Cmd]takenEnd, error) {
	for dial, tomb := range dials {
		members, err := upstreamMembers(ctx, l.client, l.ks, dial)
		if err != nil {
			return nil, err
		}
		for _, m := range members {
			// A session's keys share its slot, so its node runs these
			// in order: the tombstone first, so that a reader never
			// finds neither value nor tombstone.
			if tomb > 0 {
				pipe.Set(ctx, l.ks.tombOf(m), session.EvictAdmin.String(), tomb)
			}
			pipe.Del(ctx, l.ks.sessionOf(m))
			pipe.Del(ctx, l.ks.recordOf(m))
			pipe.Del(ctx, l.ks.legacySession(m))
			pipe.HDel(ctx, l.ks.legacyReclaims(), m)
		}
		for _, set := range l.ks.upstreamSets(dial) {
			pipe.Del(ctx, set)
		}
		pipe.Publish(ctx, l.ks.events(), msgUpstream+" "+dial)
	}
	return nil, nil
}

// syncLoop reads the cluster's view every syncEvery while Redis is
// reachable, and tries to reach it every probeEvery while it is not.
func (c *Conn) syncLoop() {
	defer c.wg.Done()
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	var synced time.Time
	for first := true; ; first = false {
		if !first {
			select {
			case <-c.stop:
				return
			case <-tick.C:
			}
		}
		switch {
		case !c.healthy.Load():
			c.probe()
		case time.Since(synced) >= syncEvery:
			synced = time.Now()
			c.touchStreams()
			c.sync()
		}
	}
}

// probe tries to reach Redis; when it answers, what was queued meanwhile
// is written back, all of the table if a master restarted.
func (c *Conn) probe() {
	ctx, cancel := c.call()
	defer cancel()
	st, err := c.readServers(ctx)
	if err != nil {
		c.errs[opIndex(opProbe)].Add(1)
		return
	}
	c.mu.Lock()
	marker := c.marker // the next sync reads the marker
	c.mu.Unlock()
	if cause := c.noticeLoss(st, marker); cause != "" {
		c.writeBackAll(cause)
	}
	c.recovered()
}

// clusterView is what sync reads from Redis.
type clusterView struct {
	marker   *redis.StringCmd
	records  *redis.ZSliceCmd
	draining *redis.MapStringStringCmd
	hashKeys *redis.ZSliceCmd
}

// sync reads the cluster's view: which upstreams any instance knows,
// their live sessions and draining flags; writes the table back when Redis
// lost keys (lost.go); refreshes this instance's upstream records in
// Redis; and drops records of upstreams gone from every instance.
func (c *Conn) sync() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*c.timeout)
	defer cancel()
	st, err := c.readServers(ctx)
	if err != nil {
		c.fail(opSync, err)
		return
	}
	pipe := c.client.Pipeline()
	v := clusterView{
		marker:   pipe.Get(ctx, c.ks.alive()), // before the flags: an instance plants it once it wrote its flags back
		records:  pipe.ZRangeWithScores(ctx, c.ks.upstreams(), 0, -1),
		draining: pipe.HGetAll(ctx, c.ks.draining()),
		hashKeys: c.announceHashKey(ctx, pipe),
	}
	err, refusal := exec(ctx, pipe)
	if err != nil {
		c.fail(opSync, err)
		return
	}
	if refusal != nil {
		c.refused(opSync, refusal) // the reads went through: the view is current
	} else {
		c.accepted()
	}
	marker := v.marker.Val()
	cause := c.noticeLoss(st, marker)
	if cause != "" {
		c.writeBackAll(cause)
	}
	if c.policyUnread() || cause == CauseRestart {
		c.checkPolicy(ctx)
	}
	c.checkHashKeys(v.hashKeys.Val())
	if marker == "" {
		// Redis lost the flags with the marker, or never had either: this
		// instance wrote its flags back, and reads Redis's at the next sync.
		if err := c.plantMarker(ctx); err != nil {
			c.fail(opSync, err)
			return
		}
	} else {
		c.applyDraining(v.draining.Val())
	}
	if err := c.syncUpstreams(ctx, v.records.Val()); err != nil {
		c.fail(opSync, err)
	}
}

// applyDraining sets the local draining flags to Redis's, except those set
// here and not yet written.
func (c *Conn) applyDraining(flags map[string]string) {
	c.mu.Lock()
	pending := maps.Clone(c.drains)
	c.mu.Unlock()
	for dial := range flags {
		if _, ok := pending[dial]; !ok {
			c.t.DrainHere(c.t.StoreUpstream(dial), true)
		}
	}
	for _, u := range c.t.Upstreams() {
		if _, ok := pending[u.Dial()]; !ok && u.Draining() && flags[u.Dial()] == "" {
			c.t.DrainHere(u, false)
		}
	}
}

// syncUpstreams counts the live sessions of every upstream any instance
// knows (dropping expired ones), refreshes the records of upstreams this
// instance uses, and drops records no instance has used for the table's
// upstream_ttl and that own no session.
func (l *layout) syncUpstreams(ctx context.Context, records []redis.Z) error {
	now := time.Now()
	seen := map[string]int64{}
	for _, z := range records {
		seen[z.Member.(string)] = int64(z.Score)
	}
	for _, u := range l.t.Upstreams() {
		if _, ok := seen[u.Dial()]; !ok {
			seen[u.Dial()] = 0
		}
	}
	pipe := l.client.Pipeline()
	counts := map[string]liveCount{}
	expired := l.expiredMembers(ctx, pipe, seen, now)
	for dial := range seen {
		counts[dial] = l.ks.countLive(ctx, pipe, dial, "("+itoa(now.UnixMilli()))
	}
	legacy := l.ks.legacyMembers(ctx, pipe, seen)
	for _, u := range l.t.Upstreams() {
		if l.t.InUse(u) {
			pipe.ZAddGT(ctx, l.ks.upstreams(), redis.Z{Score: float64(now.UnixMilli()), Member: u.Dial()})
		}
	}
	if err, _ := exec(ctx, pipe); err != nil { // a refused ZADD leaves the counts read
		return err
	}
	if err := l.reap(ctx, expired); err != nil {
		return err
	}
	if err := moveLegacyMembers(ctx, l.client, l.ks, legacy); err != nil {
		return err
	}
	return l.applyRecords(ctx, seen, counts, now)
}

// applyRecords brings the local records in line with Redis's: counts and
// last use by other instances; and drops from Redis the records of
// upstreams that own no session and that no instance used within the
// upstream TTL (this instance's janitor then drops its own record).
func (l *layout) applyRecords(ctx context.Context, seen map[string]int64, counts map[string]liveCount, now time.Time) error {
	stale := now.Add(-l.t.UpstreamTTL()).UnixMilli()
	pipe := l.client.Pipeline()
	for dial, ms := range seen {
		n, _ := counts[dial].result()
		u := l.t.KnownUpstream(dial)
		if n == 0 && ms != 0 && ms <= stale && (u == nil || !l.t.InUse(u)) {
			pipe.ZRem(ctx, l.ks.upstreams(), dial)
			pipe.HDel(ctx, l.ks.draining(), dial)
			continue
		}
		if u == nil && n == 0 && ms <= stale {
			continue
		}
		if u == nil {
			u = l.t.StoreUpstream(dial)
		}
		u.SetClusterSessions(n)
		if ms != 0 {
			l.t.SeenElsewhere(u, time.UnixMilli(ms))
		}
	}
	if pipe.Len() == 0 {
		return nil
	}
	err, _ := exec(ctx, pipe)
	return err
}

// writeBackAll writes every session of the table, and its draining flags,
// to Redis, which lost them (cause, lost.go): sessions Redis holds already
// are left as they are.
func (c *Conn) writeBackAll(cause string) {
	c.writeBacks[causeIndex(cause)].Add(1)
	sessions := c.t.Snapshot()
	held, restored := len(sessions), 0
	for len(sessions) > 0 {
		batch := sessions[:min(writeBackBatch, len(sessions))]
		sessions = sessions[len(batch):]
		n, err := c.writeBatch(batch)
		restored += n
		if err != nil {
			c.writeBackFailed(err)
			return
		}
	}
	if err := c.writeBackDrains(); err != nil {
		c.writeBackFailed(err)
		return
	}
	c.restored.Add(uint64(restored))
	level := zap.InfoLevel
	if cause == CauseEviction && restored == 0 {
		level = zap.DebugLevel // another application's keys were evicted
	}
	if ce := c.logger.Check(level, "redis store: Redis lost keys of the table; wrote this instance's sessions back"); ce != nil {
		ce.Write(zap.String("cause", cause), zap.Int("sessions_held", held), zap.Int("sessions_restored", restored))
	}
}

// writeBackFailed counts a failed write-back, which the next sync retries.
func (c *Conn) writeBackFailed(err error) {
	if refusesWrites(err) {
		c.refused(opWriteBack, err)
	} else {
		c.errs[opIndex(opWriteBack)].Add(1)
		c.logger.Warn("writing sessions back to redis failed; the next sync retries", zap.Error(err))
	}
	c.mu.Lock()
	c.writeBackDue = true
	c.mu.Unlock()
}

// writeBatch writes sessions that Redis does not hold, and returns how
// many it wrote.
func (l *layout) writeBatch(batch []session.SessionRecord) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*l.timeout)
	defer cancel()
	pipe := l.client.Pipeline()
	sets := make([]*redis.StatusCmd, 0, len(batch))
	for _, s := range batch {
		sets = append(sets, l.writeSession(ctx, pipe, l.ks.hash(s.ID), session.EncodeValue(s.Dial, s.Bound, s.Record), true))
	}
	if err, refusal := exec(ctx, pipe); err != nil || refusal != nil { // nil: Redis held the session already
		return 0, orErr(err, refusal)
	}
	n := 0
	for _, cmd := range sets {
		if cmd.Val() == "OK" {
			n++
		}
	}
	return n, nil
}

// writeBackDrains writes the draining flags this instance holds, before
// the marker is planted again: an instance that sees the new marker reads
// them, rather than taking their absence for an undrain.
func (c *Conn) writeBackDrains() error {
	drains := map[string]bool{}
	for _, u := range c.t.Upstreams() {
		if u.Draining() {
			drains[u.Dial()] = true
		}
	}
	if len(drains) == 0 {
		return nil
	}
	ctx, cancel := c.call()
	defer cancel()
	pipe := c.client.Pipeline()
	c.writeDrains(ctx, pipe, drains)
	err, refusal := exec(ctx, pipe)
	return orErr(err, refusal)
}

// subscribe applies what the other instances publish until the connection
// is destructed. go-redis resubscribes after a lost connection; messages
// published meanwhile are lost, which is safe: a drain flag is read again
// by sync, and a session ended elsewhere is still pinned to its own
// upstream, whose 404 ends it here too.
func (c *Conn) subscribe(ctx context.Context) {
	defer c.wg.Done()
	ps := c.client.Subscribe(ctx, c.ks.events())
	defer ps.Close()
	ch := ps.Channel(redis.WithChannelHealthCheckInterval(5 * time.Second))
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			c.apply(msg.Payload)
		}
	}
}

// apply applies one message of another instance (or this one's own, which
// changes nothing) to the table.
func (c *Conn) apply(msg string) {
	kind, rest, _ := strings.Cut(msg, " ")
	switch kind {
	case msgEnded:
		reason, hs, _ := strings.Cut(rest, " ")
		h, ok := parseKeyHash(hs)
		r := session.ReasonNamed(reason)
		if !ok || !r.Valid() {
			return
		}
		c.mu.Lock()
		id := c.byHash[h]
		c.mu.Unlock()
		if id != "" {
			c.t.EvictHere(id, r)
		}
	case msgUpstream:
		c.t.EvictUpstreamHere(rest, session.EvictAdmin)
	case msgDrain:
		flag, dial, _ := strings.Cut(rest, " ")
		c.t.DrainHere(c.t.StoreUpstream(dial), flag == "1")
	case msgMoved:
		hs, v, _ := strings.Cut(rest, " ")
		c.applyMoved(hs, v)
	}
}
