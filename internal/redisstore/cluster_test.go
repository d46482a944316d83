package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// TestClusterSpreadsSessions: on a Redis Cluster of three masters, the
// sessions one instance learns spread over the masters (each session's
// keys hash on its own tag), while the table's shared keys stay together
// on one (negative control: what shares a tag shares a master). Another
// instance finds them; an end on two instances at once, moves, touches of
// sessions with failover records and the reap of expired sessions, whose
// scripts each touch one slot, run without an error, and every ended or
// expired session is reclaimed by exactly one instance.
func TestClusterSpreadsSessions(t *testing.T) {
	nodes := redistest.StartCluster(t, 3, 0)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr
	}
	name := "spread"
	log := &reclaimLog{got: map[string][]string{}}
	tbls := make([]*session.Table, 2)
	for i := range tbls {
		tbl, err := session.NewTable(name, 1<<20, time.Hour, nil)
		if err != nil {
			t.Fatal(err)
		}
		attachStoreAt(t, tbl, addrs, name, testHashKey, time.Second)
		tbl.SetForgetHook(log.hook(fmt.Sprint("c", i)))
		tbls[i] = tbl
	}
	a, b := tbls[0], tbls[1]
	const learned = 3000
	for i := range learned {
		a.Learn(fmt.Sprintf("spread-%05d", i), "10.0.0.1:80")
	}
	perMaster := make([]int, len(nodes))
	total := 0
	for i, n := range nodes {
		perMaster[i], _ = strconv.Atoi(n.Do("DBSIZE"))
		total += perMaster[i]
	}
	shared := map[string]string{}
	for _, n := range nodes {
		if keys := n.Do("EVAL", "return #redis.call('KEYS', ARGV[1])", "0", "{caddy-mcp:"+name+"}*"); keys != "0" {
			shared[n.Addr] = keys
		}
	}
	t.Logf("after learning %d sessions: keys per master %v of %d; the table's shared keys: %v", learned, perMaster, total, shared)
	for i, n := range perMaster {
		if n < total/4 || n > total*42/100 {
			t.Errorf("master %s holds %d of the table's %d keys, want about a third", nodes[i].Addr, n, total)
		}
	}
	if len(shared) != 1 {
		t.Errorf("the table's shared keys lie on %d masters, want 1 (they share a tag): %v", len(shared), shared)
	}
	for i := 0; i < learned; i += 97 {
		if up := b.Lookup(fmt.Sprintf("spread-%05d", i)); up == nil || up.Dial() != "10.0.0.1:80" {
			t.Fatalf("b does not find session %d that a learned: %v", i, up)
		}
	}

	// A reclaim record lives as long as its value, and a minute more: what
	// nobody takes does not stay.
	ca := storeOf(a)
	rec := ca.ks.record(ca.ks.hash("spread-00003"))
	if ttl := ca.client.PTTL(context.Background(), rec).Val(); ttl <= ca.ttl() || ttl > ca.recordLife() {
		t.Errorf("a reclaim record's TTL is %s, want above the session's %s, at most %s", ttl, ca.ttl(), ca.recordLife())
	}

	// An end on both instances at once: reclaimed once.
	const ended = "spread-00007"
	b.Lookup(ended)
	var wg sync.WaitGroup
	for _, tbl := range tbls {
		wg.Go(func() { tbl.Evict(ended, session.EvictAdmin) })
	}
	wg.Wait()
	time.Sleep(2 * flushEvery)
	if got := log.of(ended); len(got) != 1 {
		t.Errorf("a session evicted on two instances at once was reclaimed by %v; want one", got)
	}
	if st := storeOf(b).Get(ended); st.Dial != "" {
		t.Errorf("the ended session reads as %+v, want gone", st)
	}

	// A move, then touches of the moved value (a failover record's CAS).
	moving := "spread-00011"
	oldV := session.EncodeValue("10.0.0.1:80", session.PrincipalSum{}, "")
	newV := session.EncodeValue("10.0.0.2:80", session.PrincipalSum{}, ca.ks.sealRecord(ca.ks.hash(moving), &session.Init{UpstreamID: "up-2", Body: []byte("{}")}))
	if cur, err := ca.moveValue(moving, oldV, newV); err != nil || cur != "" {
		t.Fatalf("moving a session: %q, %v", cur, err)
	}
	if cur, err := storeOf(b).moveValue(moving, oldV, session.EncodeValue("10.0.0.3:80", session.PrincipalSum{}, "")); err != nil || cur != newV {
		t.Errorf("a second move from the same value: %q, %v; want the first move's value", cur, err)
	}
	ca.Touch(moving, newV)
	ca.Flush()
	if s, st := storeOf(b).Current(moving); st != session.StoreHolds || s.Dial != "10.0.0.2:80" || s.Init == nil || s.Init.UpstreamID != "up-2" {
		t.Errorf("the moved session reads %+v (%v), want 10.0.0.2:80 with its record", s, st)
	}

	// Sessions that expire in Redis: reaped, and reclaimed once each.
	reapName := "spread-reap"
	rtbls := make([]*session.Table, 2)
	for i := range rtbls {
		tbl, err := session.NewTable(reapName, 1000, 2*time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		attachStoreAt(t, tbl, addrs, reapName, testHashKey, time.Second)
		tbl.SetForgetHook(log.hook(fmt.Sprint("r", i)))
		rtbls[i] = tbl
	}
	const expiring = 60
	for i := range expiring {
		rtbls[0].Learn(fmt.Sprintf("reap-%03d", i), "10.0.0.1:80")
	}
	reclaimed := func() int {
		n := 0
		for i := range expiring {
			if len(log.of(fmt.Sprintf("reap-%03d", i))) > 0 {
				n++
			}
		}
		return n
	}
	if !waitFor(20*time.Second, func() bool { return reclaimed() == expiring }) {
		t.Fatalf("%d of %d sessions that expired in Redis reclaimed within 20 s", reclaimed(), expiring)
	}
	time.Sleep(2 * syncEvery)
	for i := range expiring {
		if got := log.of(fmt.Sprintf("reap-%03d", i)); len(got) != 1 {
			t.Errorf("expired session %d reclaimed by %v, want one instance", i, got)
		}
	}
	for _, tbl := range append(tbls, rtbls...) {
		storeOf(tbl).Errors(func(op string, n uint64) {
			if n != 0 && op != OpHashKey {
				t.Errorf("table %s: %d errors on %s (a cross-slot script?)", tbl.Name(), n, op)
			}
		})
	}
}

// TestClusterSpreadsMemory: on a Redis Cluster of three masters, each
// master holds about a third of the memory a table's sessions take, their
// upstream's set included (split in buckets, buckets.go); negative control
// in the same cluster: a table whose upstream's set is one key (the layout
// before the buckets) puts about half its memory on one master. The bucket
// tags' slots, computed here, are the cluster's; the live count reads
// every bucket; members an older replica wrote to the one set move into
// their buckets and are counted once.
func TestClusterSpreadsMemory(t *testing.T) {
	nodes := redistest.StartCluster(t, 3, 0)
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.Addr
	}
	const dial, learned = "10.0.0.1:80", 5000
	used := func() []int {
		out := make([]int, len(nodes))
		for i, n := range nodes {
			out[i], _ = strconv.Atoi(n.Info("memory", "used_memory"))
		}
		return out
	}
	shares := func(name string, tbl *session.Table) ([]float64, int) {
		before := used()
		for i := range learned {
			tbl.Learn(fmt.Sprintf("%s-%05d", name, i), dial)
		}
		after, total := used(), 0
		grew := make([]int, len(nodes))
		for i := range nodes {
			grew[i] = after[i] - before[i]
			total += grew[i]
		}
		out := make([]float64, len(nodes))
		for i := range nodes {
			out[i] = float64(grew[i]) / float64(total)
		}
		t.Logf("%s: %d sessions took %d bytes of Redis memory (%d per session), per master %v: shares %.2f", name, learned, total, total/learned, grew, out)
		return out, total
	}
	newTable := func(name string) *session.Table {
		tbl, err := session.NewTable(name, 1<<20, time.Hour, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tbl
	}

	spread := newTable("buckets")
	attachStoreAt(t, spread, addrs, "buckets", testHashKey, time.Second)
	cs := storeOf(spread)
	if !cs.ks.bucketed() {
		t.Fatal("a cluster connection does not split the upstreams' sets")
	}
	for k, tag := range cs.ks.buckets {
		inner := strings.Trim(tag, "{}")
		got, _ := strconv.Atoi(nodes[0].Do("CLUSTER", "KEYSLOT", tag+":u:"+dial))
		if got != keySlot(inner) || got/(clusterSlots/upstreamBuckets) != k {
			t.Errorf("bucket %d (%s): Redis puts it in slot %d, computed %d, want in the %d-th sixteenth", k, tag, got, keySlot(inner), k)
		}
	}
	sharesSpread, _ := shares("buckets", spread)

	// The control: the same cluster, one set for the upstream.
	control := newTable("onetag")
	opts := &redis.UniversalOptions{Addrs: addrs, IsClusterMode: true, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, MaxRetries: -1}
	cc := newConn(control, redis.NewUniversalClient(opts), newKeyspace("caddy-mcp", "onetag", []byte(testHashKey)), time.Second, zap.NewNop())
	t.Cleanup(func() { _ = cc.Destruct() })
	control.SetStore(cc)
	sharesControl, _ := shares("onetag", control)

	for i, s := range sharesSpread {
		if s < 0.27 || s > 0.40 {
			t.Errorf("master %s holds %.2f of the bucketed table's memory, want about a third", nodes[i].Addr, s)
		}
	}
	if slices.Max(sharesControl) < 0.45 {
		t.Errorf("control: with one set per upstream the fullest master holds %.2f of the memory; want at least 0.45 (what the buckets fix)", slices.Max(sharesControl))
	}

	// The live count reads every bucket: another instance counts them all.
	other := newTable("buckets")
	attachStoreAt(t, other, addrs, "buckets", testHashKey, time.Second)
	up := other.StoreUpstream(dial)
	if !waitFor(5*time.Second, func() bool { return other.ClusterSessions(up) == learned }) {
		t.Errorf("another instance counts %d live sessions of %s, want %d", other.ClusterSessions(up), dial, learned)
	}

	// An older replica's writes: members of live sessions in the one set
	// move into their buckets (counted once), a layout-1 session's stays.
	ctx := context.Background()
	legacy := cs.ks.legacyUpstream(dial)
	for i := range 40 {
		m := cs.ks.hash(fmt.Sprintf("buckets-%05d", i)).String()
		cs.client.ZAdd(ctx, legacy, redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: m})
	}
	onlyOld := cs.ks.hash("layout1-only").String()
	cs.client.Set(ctx, cs.ks.legacySession(onlyOld), dial, time.Hour)
	cs.client.ZAdd(ctx, legacy, redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: onlyOld})
	if !waitFor(5*time.Second, func() bool { return cs.client.ZCard(ctx, legacy).Val() == 1 }) {
		t.Errorf("the older replicas' set holds %d members after the syncs, want 1 (the layout-1 session's)", cs.client.ZCard(ctx, legacy).Val())
	}
	if ok, _ := cs.client.ZScore(ctx, legacy, onlyOld).Result(); ok == 0 {
		t.Errorf("the layout-1 session's member left the older replicas' set")
	}
	time.Sleep(2 * syncEvery)
	if n := other.ClusterSessions(up); n != learned+1 {
		t.Errorf("after the move into buckets, %d live sessions counted, want %d (each once, and the layout-1 one)", n, learned+1)
	}
}
