package redisstore

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
)

// reclaimLog collects what the forget hooks of several tables hear.
type reclaimLog struct {
	mu  sync.Mutex
	got map[string][]string // session key -> the tables that reclaimed it
}

func (l *reclaimLog) hook(table string) *session.ForgetHook {
	return &session.ForgetHook{Fn: func(f session.Forgotten) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.got[f.Key] = append(l.got[f.Key], table+" "+f.Dial+" "+f.Reason.String())
	}}
}

func (l *reclaimLog) of(key string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got[key]...)
}

// TestReclaimExactlyOnce: three tables share one Redis, each with a forget
// hook. A session ended on two instances at once (an admin eviction) and
// one that expires on every instance are each reclaimed by exactly one
// instance; so is a session pushed out of one instance's table before its
// first use, which that instance drops from Redis too.
func TestReclaimExactlyOnce(t *testing.T) {
	srv := redistest.Start(t)
	name := "reclaim/" + t.Name()
	log := &reclaimLog{got: map[string][]string{}}
	tbls := make([]*session.Table, 3)
	for i := range tbls {
		tbl, err := session.NewTable(name, 2, 2*time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		attachStore(t, tbl, srv.Addr, name, testHashKey, time.Second)
		tbl.SetForgetHook(log.hook(fmt.Sprint("c", i)))
		tbls[i] = tbl
	}
	const ended, expiring, pushed = "ENDEDBYADMIN00000000000000", "EXPIRES0000000000000000000", "PUSHEDOUT00000000000000000"
	tbls[0].Learn(ended, "10.0.0.1:80")
	tbls[1].Lookup(ended) // the second instance holds it too
	var wg sync.WaitGroup
	for _, tbl := range tbls[:2] {
		wg.Go(func() { tbl.Evict(ended, session.EvictAdmin) })
	}
	wg.Wait()
	waitFor(5*time.Second, func() bool { return len(log.of(ended)) > 0 })
	time.Sleep(2 * flushEvery) // both ends written
	if got := log.of(ended); len(got) != 1 || got[0][2:] != " 10.0.0.1:80 admin" {
		t.Errorf("a session evicted on two instances at once was reclaimed by %v; want one, for admin", got)
	}

	tbls[0].Learn(expiring, "10.0.0.1:80")
	tbls[0].Learn(pushed, "10.0.0.2:80")
	tbls[0].Learn("PUSHER0000000000000000000A", "10.0.0.2:80") // the table holds 2: pushed out, unconfirmed
	if !waitFor(15*time.Second, func() bool { return len(log.of(expiring)) > 0 && len(log.of(pushed)) > 0 }) {
		t.Fatalf("expired sessions never reclaimed: %v", log.got)
	}
	time.Sleep(2 * syncEvery) // every instance has reaped once more
	for _, key := range []string{expiring, pushed} {
		if got := log.of(key); len(got) != 1 || got[0][2:] == "" {
			t.Errorf("session %s, expired in Redis, reclaimed by %v; want exactly one instance", key, got)
		}
	}
}

func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// TestReclaimEvictedUpstreamOnce: three tables share one Redis, each with
// a forget hook, and each holds every session of an upstream. Evicting
// the upstream through one of them reclaims each session once, by the
// evicting instance, for admin, and ends it on every instance; a session
// learned on the upstream right after the eviction, and a session of
// another upstream, stay on every instance and are not reclaimed. Evicted
// through two instances at once, a session is still reclaimed once.
func TestReclaimEvictedUpstreamOnce(t *testing.T) {
	srv := redistest.Start(t)
	name := "reclaim/" + t.Name()
	log := &reclaimLog{got: map[string][]string{}}
	tbls := make([]*session.Table, 3)
	for i := range tbls {
		tbl, err := session.NewTable(name, 100, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		attachStore(t, tbl, srv.Addr, name, testHashKey, time.Second)
		tbl.SetForgetHook(log.hook(fmt.Sprint("c", i)))
		tbls[i] = tbl
	}
	const gone, kept = "10.0.0.1:80", "10.0.0.2:80"
	var evicted []string
	for i := range 6 {
		id := fmt.Sprintf("EVICTEDUPSTREAM%011d", i)
		tbls[1+i%2].Learn(id, gone)
		evicted = append(evicted, id)
	}
	const other, after = "OTHERUPSTREAM0000000000000", "LEARNEDAFTERTHEEVICTION000"
	tbls[1].Learn(other, kept)
	for _, tbl := range tbls {
		for _, id := range append([]string{other}, evicted...) {
			if tbl.Lookup(id) == nil {
				t.Fatalf("%s not held on every instance", id)
			}
		}
	}
	if n := tbls[0].EvictUpstream(gone, session.EvictAdmin); n != len(evicted) {
		t.Fatalf("EvictUpstream evicted %d here; want %d", n, len(evicted))
	}
	tbls[2].Learn(after, gone)
	if !waitFor(5*time.Second, func() bool {
		for _, id := range evicted {
			if len(log.of(id)) == 0 || tbls[1].Lookup(id) != nil || tbls[2].Lookup(id) != nil {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the evicted upstream's sessions not all reclaimed and ended everywhere: %v", log.got)
	}
	time.Sleep(2 * syncEvery) // every instance has flushed and reaped again
	for _, id := range evicted {
		if got := log.of(id); len(got) != 1 || got[0] != "c0 "+gone+" admin" {
			t.Errorf("session %s of the evicted upstream reclaimed by %v; want once, by the evicting instance", id, got)
		}
	}
	for _, id := range []string{other, after} {
		if got := log.of(id); len(got) != 0 {
			t.Errorf("session %s reclaimed by %v; want none", id, got)
		}
		for i, tbl := range tbls {
			if tbl.Lookup(id) == nil {
				t.Errorf("session %s gone from instance c%d; want it kept", id, i)
			}
		}
	}

	// Two operators evict the upstream at once, through two instances:
	// each session is still reclaimed once.
	var wg sync.WaitGroup
	for _, tbl := range tbls[:2] {
		wg.Go(func() { tbl.EvictUpstream(gone, session.EvictAdmin) })
	}
	wg.Wait()
	time.Sleep(2 * syncEvery)
	if got := log.of(after); len(got) != 1 || got[0][2:] != " "+gone+" admin" {
		t.Errorf("a session evicted by two instances at once reclaimed by %v; want once", got)
	}
}
