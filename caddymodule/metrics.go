package caddymodule

import (
	"errors"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/prometheus/client_golang/prometheus"
)

// Metric descriptors. Labels never carry session IDs: `table` is a table's
// name, `upstream` a dial address, `reason` an EvictReason, `era` an Era.
var (
	descLive = prometheus.NewDesc("caddy_mcp_sessions_live",
		"Sessions the table pins to the upstream.", []string{"table", "upstream"}, nil)
	descDraining = prometheus.NewDesc("caddy_mcp_upstream_draining",
		"1 while the upstream is draining: it gets no new sessions but serves its pinned ones.", []string{"table", "upstream"}, nil)
	descRefusing = prometheus.NewDesc("caddy_mcp_upstream_refusing",
		"1 while the upstream gets no new sessions because it refused one (429, or 5xx without a session); it serves its pinned ones.", []string{"table", "upstream"}, nil)
	descRefusals = prometheus.NewDesc("caddy_mcp_upstream_refusals_total",
		"New sessions the upstream refused (429, or 5xx without a session) that the proxy sent to another upstream, or answered with the refusal when none took them.", []string{"table", "upstream"}, nil)
	descUnconfirmed = prometheus.NewDesc("caddy_mcp_sessions_unconfirmed",
		"Sessions not used since the initialize that created them; a flood of initialize requests shows here, and never pushes out used sessions.", []string{"table"}, nil)
	descMax = prometheus.NewDesc("caddy_mcp_sessions_max",
		"The table's max_sessions.", []string{"table"}, nil)
	descLearned = prometheus.NewDesc("caddy_mcp_sessions_learned_total",
		"Sessions learned from upstream responses.", []string{"table"}, nil)
	descAdopted = prometheus.NewDesc("caddy_mcp_sessions_adopted_total",
		"Sessions recorded from sealed session IDs the table had not learned: learned by another replica, before a restart, or forgotten since.", []string{"table"}, nil)
	descPinned = prometheus.NewDesc("caddy_mcp_requests_pinned_total",
		"Requests sent to the upstream that owns their session.", []string{"table"}, nil)
	descUnknown = prometheus.NewDesc("caddy_mcp_unknown_session_total",
		"Requests carrying a session the table does not hold (answered 404 unless unknown_session is forward).", []string{"table"}, nil)
	descGone = prometheus.NewDesc("caddy_mcp_upstream_gone_total",
		"Requests answered 404 because their session's upstream was removed, unhealthy for longer than unhealthy_grace, or refused the connection.", []string{"table"}, nil)
	descMismatch = prometheus.NewDesc("caddy_mcp_principal_mismatch_total",
		"Requests answered 404 because their principal was not the one their session is bound to (bind_principal).", []string{"table"}, nil)
	descUnavailable = prometheus.NewDesc("caddy_mcp_upstream_unavailable_total",
		"Requests answered 503 because their session's upstream was failing active health checks, within unhealthy_grace.", []string{"table"}, nil)
	descEvicted = prometheus.NewDesc("caddy_mcp_sessions_evicted_total",
		"Sessions removed from the table, by reason.", []string{"table", "reason"}, nil)
	descRequests = prometheus.NewDesc("caddy_mcp_requests_total",
		"Requests seen by the mcp_session handler, by MCP protocol era.", []string{"table", "era"}, nil)
	descFailovers = prometheus.NewDesc("caddy_mcp_failovers_total",
		"Sessions whose upstream was gone, by cause (upstream_gone, refused, upstream_404, drain_deadline) and result: moved to another upstream by replaying their initialize (failover reinitialize); followed, when another instance sharing the redis store had moved the session already and this one followed that move; failed, when no upstream took it and the session ended; or refused, when the session had ended (DELETE, admin eviction) or expired, or its sealed ID was older than failover_max_age, so that nothing was replayed and the session ended.", []string{"table", "cause", "result"}, nil)
	descClusterLive = prometheus.NewDesc("caddy_mcp_sessions_cluster_live",
		"Sessions pinned to the upstream on every instance sharing the table's store.", []string{"table", "upstream"}, nil)
	descShared = prometheus.NewDesc("caddy_mcp_sessions_shared_total",
		"Sessions taken from the shared store at the first request this instance saw of them.", []string{"table"}, nil)
	descStoreUp = prometheus.NewDesc("caddy_mcp_store_up",
		"1 while the table's shared store answers, 0 while the instance serves from its own table alone.", []string{"table"}, nil)
	descWriteBacks = prometheus.NewDesc("caddy_mcp_store_write_backs_total",
		"Write-backs of the whole table to the shared store, which lost keys while this instance held them, by cause: restart (a Redis master answered with another run_id: restarted, or promoted by a failover), flush (the table's marker key was gone: FLUSHALL, FLUSHDB, a deleted or evicted key), eviction (Redis evicted keys), retry.", []string{"table", "cause"}, nil)
	descRestored = prometheus.NewDesc("caddy_mcp_store_sessions_restored_total",
		"Sessions the write-backs wrote that the shared store no longer held.", []string{"table"}, nil)
	descWritable = prometheus.NewDesc("caddy_mcp_store_writable",
		"1 while the table's shared store takes writes, 0 while Redis answers them with OOM (full under noeviction) or READONLY (a replica): reads go on.", []string{"table"}, nil)
	descHashKeyClash = prometheus.NewDesc("caddy_mcp_store_hash_key_clash",
		"1 while another instance on the table's store and key_prefix uses another hash_key (neither finds the other's sessions), else 0.", []string{"table"}, nil)
	descStoreErrors = prometheus.NewDesc("caddy_mcp_store_errors_total",
		"Failed calls to the table's shared store, by operation.", []string{"table", "op"}, nil)
	descReclaimSent = prometheus.NewDesc("caddy_mcp_reclaim_sent_total",
		"DELETEs the proxy sent to upstreams for sessions its table forgot while the upstream may still hold them (reclaim).", []string{"table"}, nil)
	descReclaimResults = prometheus.NewDesc("caddy_mcp_reclaim_results_total",
		"Outcomes of reclaim DELETEs: ok (answered 2xx), not_found (answered 404: the upstream held the session no more), failed (no answer within 3s, another status, or not sendable: the upstream's path or session ID unknown).", []string{"table", "result"}, nil)
	descReclaimDropped = prometheus.NewDesc("caddy_mcp_reclaim_dropped_total",
		"Forgotten sessions whose DELETE was not sent because the reclaim queue (4096) was full.", []string{"table"}, nil)
	descBodyMemory = prometheus.NewDesc("caddy_mcp_body_memory_bytes",
		"Bytes of request bodies the proxy holds in memory to inspect them, over all requests in flight; at most 64 MiB.", nil, nil)
	descBodyRefused = prometheus.NewDesc("caddy_mcp_body_memory_refused_total",
		"Requests answered 503 because reading their body would have held more than 64 MiB of request bodies in memory.", nil, nil)
)

// tableCollector exports every session table's state at scrape time. It
// reads the package-level pool, so it stays current across reloads, which
// replace Caddy's metrics registry but keep the tables.
type tableCollector struct{}

// collector is registered in the registry of every config that provisions a handler.
var collector tableCollector

// registerMetrics registers the collector in reg; registering it again in
// the same registry is not an error.
func registerMetrics(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	err := reg.Register(collector)
	if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
		return nil
	}
	return err
}

// Describe sends the descriptors of all the plugin's metrics.
func (tableCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLive, descDraining, descRefusing, descRefusals, descUnconfirmed, descMax, descLearned, descAdopted, descPinned, descUnknown, descGone, descMismatch, descUnavailable, descEvicted, descRequests, descByMethod, descStreams, descFailovers,
		descClusterLive, descShared, descStoreUp, descStoreErrors, descWriteBacks, descRestored, descWritable, descHashKeyClash, descBodyMemory, descBodyRefused, descReclaimSent, descReclaimResults, descReclaimDropped} {
		ch <- d
	}
	for _, d := range journalDescs {
		ch <- d
	}
}

// Collect sends the current values of every table, and of the request
// body budget (bodymemory.go).
func (tableCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descBodyMemory, prometheus.GaugeValue, float64(bodyMemory.Held()))
	ch <- prometheus.MustNewConstMetric(descBodyRefused, prometheus.CounterValue, float64(bodyMemory.Refused()))
	tables.Range(func(_, v any) bool {
		collectTable(ch, v.(*session.Table))
		collectJournal(ch, v.(*session.Table))
		return true
	})
}

func collectTable(ch chan<- prometheus.Metric, t *session.Table) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for _, u := range t.Upstreams() {
		gauge(descLive, float64(u.LiveSessions()), t.Name(), u.Dial())
		draining := 0.0
		if u.Draining() {
			draining = 1
		}
		gauge(descDraining, draining, t.Name(), u.Dial())
		refusing := 0.0
		if t.Refusing(u) {
			refusing = 1
		}
		gauge(descRefusing, refusing, t.Name(), u.Dial())
		counter(descRefusals, u.Refusals(), t.Name(), u.Dial())
	}
	gauge(descUnconfirmed, float64(t.Unconfirmed()), t.Name())
	gauge(descMax, float64(t.MaxSessions()), t.Name())
	s := &t.Stats
	counter(descLearned, s.Learned(), t.Name())
	counter(descAdopted, s.Adopted(), t.Name())
	counter(descPinned, s.Pinned(), t.Name())
	counter(descUnknown, s.Unknown(), t.Name())
	counter(descGone, s.Gone(), t.Name())
	counter(descMismatch, s.PrincipalMismatches(), t.Name())
	counter(descUnavailable, s.Unavailable(), t.Name())
	for _, r := range session.EvictReasons {
		counter(descEvicted, t.Evictions(r), t.Name(), r.String())
	}
	for _, e := range session.Eras {
		counter(descRequests, s.Requests(e), t.Name(), e.String())
	}
	for _, c := range session.FailoverCauses {
		counter(descFailovers, s.Failovers(c, true), t.Name(), c.String(), session.ResultMoved)
		counter(descFailovers, s.FailoversFollowed(c), t.Name(), c.String(), session.ResultFollowed)
		counter(descFailovers, s.Failovers(c, false), t.Name(), c.String(), session.ResultFailed)
		counter(descFailovers, s.FailoversRefused(c), t.Name(), c.String(), session.ResultRefused)
	}
	rc := &s.Reclaims
	counter(descReclaimSent, rc.Sent.Load(), t.Name())
	counter(descReclaimResults, rc.OK.Load(), t.Name(), "ok")
	counter(descReclaimResults, rc.NotFound.Load(), t.Name(), "not_found")
	counter(descReclaimResults, rc.Failed.Load(), t.Name(), "failed")
	counter(descReclaimDropped, rc.Dropped.Load(), t.Name())
	collectMethods(ch, t)
	collectStore(ch, t)
}

// collectStore sends the series of a table's shared store, if it has one.
func collectStore(ch chan<- prometheus.Metric, t *session.Table) {
	c := t.Store()
	if c == nil {
		return
	}
	for _, u := range t.Upstreams() {
		ch <- prometheus.MustNewConstMetric(descClusterLive, prometheus.GaugeValue, float64(t.ClusterSessions(u)), t.Name(), u.Dial())
	}
	ch <- prometheus.MustNewConstMetric(descShared, prometheus.CounterValue, float64(t.Stats.Shared()), t.Name())
	up := 0.0
	if c.Reachable() {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(descStoreUp, prometheus.GaugeValue, up, t.Name())
	c.Errors(func(op string, n uint64) {
		ch <- prometheus.MustNewConstMetric(descStoreErrors, prometheus.CounterValue, float64(n), t.Name(), op)
	})
	if h, ok := c.(storeHealth); ok {
		collectStoreHealth(ch, t.Name(), h)
	}
}

// storeHealth is what a shared store reports beyond [session.Shared]: the
// redis store's write-backs, refused writes and hash_key clash.
type storeHealth interface {
	WriteBacks(fn func(cause string, n uint64))
	Writable() bool
	HashKeyClash() bool
}

// collectStoreHealth sends the series of a store's health.
func collectStoreHealth(ch chan<- prometheus.Metric, table string, h storeHealth) {
	h.WriteBacks(func(cause string, n uint64) {
		if cause == "" {
			ch <- prometheus.MustNewConstMetric(descRestored, prometheus.CounterValue, float64(n), table)
			return
		}
		ch <- prometheus.MustNewConstMetric(descWriteBacks, prometheus.CounterValue, float64(n), table, cause)
	})
	ch <- prometheus.MustNewConstMetric(descWritable, prometheus.GaugeValue, gauge(h.Writable()), table)
	ch <- prometheus.MustNewConstMetric(descHashKeyClash, prometheus.GaugeValue, gauge(h.HashKeyClash()), table)
}

// gauge is 1 for true, 0 for false.
func gauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Interface guards
var _ prometheus.Collector = tableCollector{}
