package caddymodule

import (
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"

	"sync"
	"time"
)

// The status page's "last minutes" figures: a sampler reads each table's
// counters every activityStep and keeps activityWindow of samples, so that
// the page shows differences, not totals since the process started.

const (
	// activityStep is how often the counters are sampled.
	activityStep = 10 * time.Second
	// activityWindow is how far back the page's recent figures reach.
	activityWindow = 5 * time.Minute
)

// tableCounters is one sample of a table's counters.
type tableCounters struct {
	at         time.Time
	evictions  [len(session.EvictReasons)]uint64 // by evictReasons' order
	failedOver uint64                            // sessions moved to another upstream, or followed a move
	failed     uint64                            // failovers that failed or were refused
	eras       [len(session.Eras)]uint64         // requests, by eras' order
	upstreams  map[string]upstreamCounters       // by dial address
}

// upstreamCounters is one sample of an upstream's counters.
type upstreamCounters struct{ evicted, movedAway uint64 }

// countersOf samples t's counters now.
func countersOf(t *session.Table, now time.Time) tableCounters {
	c := tableCounters{at: now}
	for i, r := range session.EvictReasons {
		c.evictions[i] = t.Evictions(r)
	}
	for _, cause := range session.FailoverCauses {
		c.failedOver += t.Stats.Failovers(cause, true) + t.Stats.FailoversFollowed(cause)
		c.failed += t.Stats.Failovers(cause, false) + t.Stats.FailoversRefused(cause)
	}
	for i, e := range session.Eras {
		c.eras[i] = t.Stats.Requests(e)
	}
	ups := t.Upstreams()
	c.upstreams = make(map[string]upstreamCounters, len(ups))
	for _, u := range ups {
		c.upstreams[u.Dial()] = upstreamCounters{evicted: u.Evicted(), movedAway: u.MovedAway()}
	}
	return c
}

// Recent is what happened in a table over the last minutes, as the status
// page shows it.
type Recent struct {
	// Minutes is how far back the figures reach: the window, or less while
	// the process is younger than it.
	Minutes int
	// Evictions counts sessions that left the table, by reason label
	// ("ttl", "delete", …); reasons with none are left out.
	Evictions map[string]uint64
	// Failovers counts sessions moved to another upstream; FailoversFailed
	// those that could not be.
	Failovers, FailoversFailed uint64
	// Requests counts requests by era label ("legacy_session", …).
	Requests map[string]uint64
	// Upstreams holds, by dial address, how many sessions of each upstream
	// were evicted and failed over away from it.
	Upstreams map[string]UpstreamRecent
}

// UpstreamRecent is what happened to one upstream's sessions over the last
// minutes.
type UpstreamRecent struct {
	// Evicted counts its sessions that left the table, for any reason.
	Evicted uint64
	// FailedOver counts its sessions this instance moved to another
	// upstream.
	FailedOver uint64
}

// since returns what changed from the sample old to now.
func (now tableCounters) since(old tableCounters) Recent {
	r := Recent{
		Minutes:   max(1, int((now.at.Sub(old.at)+time.Minute/2)/time.Minute)),
		Evictions: map[string]uint64{}, Requests: map[string]uint64{}, Upstreams: map[string]UpstreamRecent{},
		Failovers: now.failedOver - old.failedOver, FailoversFailed: now.failed - old.failed,
	}
	for i, reason := range session.EvictReasons {
		if n := now.evictions[i] - old.evictions[i]; n > 0 {
			r.Evictions[reason.String()] = n
		}
	}
	for i, e := range session.Eras {
		r.Requests[e.String()] = now.eras[i] - old.eras[i]
	}
	for dial, c := range now.upstreams {
		was := old.upstreams[dial] // zero for an upstream the table learned since
		r.Upstreams[dial] = UpstreamRecent{Evicted: c.evicted - was.evicted, FailedOver: c.movedAway - was.movedAway}
	}
	return r
}

// activity holds the samples of every table, by table name.
type activity struct {
	mu      sync.Mutex
	samples map[string][]tableCounters // oldest first, at most activityWindow apart
	start   sync.Once
}

// recentActivity is the process's sampler; the status page starts it the
// first time it is provisioned.
var recentActivity = &activity{samples: map[string][]tableCounters{}}

// run starts sampling every activityStep, once per process. It reads only
// counters, so it costs a few microseconds per table per step.
func (a *activity) run() {
	a.start.Do(func() {
		go func() {
			for ; ; time.Sleep(activityStep) {
				if app, err := runningApp(); err == nil {
					a.sample(app.tables(), time.Now())
				}
			}
		}()
	})
}

// sample records the counters of tables at now, drops samples older than
// the window and forgets tables that are gone.
func (a *activity) sample(tables map[string]*session.Table, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name, t := range tables {
		s := a.samples[name]
		if len(s) == 0 { // the table's counters started at zero when it was created
			s = append(s, tableCounters{at: t.Created()})
		}
		s = append(s, countersOf(t, now))
		for len(s) > 1 && now.Sub(s[1].at) >= activityWindow {
			s = s[1:]
		}
		a.samples[name] = s
	}
	for name := range a.samples {
		if tables[name] == nil {
			delete(a.samples, name)
		}
	}
}

// recent returns what happened in t since the oldest sample kept, or,
// before the first sample, since the table was created.
func (a *activity) recent(t *session.Table, now time.Time) Recent {
	cur := countersOf(t, now)
	a.mu.Lock()
	s := a.samples[t.Name()]
	a.mu.Unlock()
	if len(s) == 0 {
		return cur.since(tableCounters{at: t.Created()})
	}
	return cur.since(s[0])
}
