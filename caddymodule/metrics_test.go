package caddymodule

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// metricNames are the families the collector exports, with their types.
var metricNames = map[string]dto.MetricType{
	"caddy_mcp_sessions_live":              dto.MetricType_GAUGE,
	"caddy_mcp_upstream_draining":          dto.MetricType_GAUGE,
	"caddy_mcp_upstream_refusing":          dto.MetricType_GAUGE,
	"caddy_mcp_upstream_refusals_total":    dto.MetricType_COUNTER,
	"caddy_mcp_sessions_max":               dto.MetricType_GAUGE,
	"caddy_mcp_sessions_unconfirmed":       dto.MetricType_GAUGE,
	"caddy_mcp_sessions_learned_total":     dto.MetricType_COUNTER,
	"caddy_mcp_sessions_adopted_total":     dto.MetricType_COUNTER,
	"caddy_mcp_requests_pinned_total":      dto.MetricType_COUNTER,
	"caddy_mcp_unknown_session_total":      dto.MetricType_COUNTER,
	"caddy_mcp_upstream_gone_total":        dto.MetricType_COUNTER,
	"caddy_mcp_principal_mismatch_total":   dto.MetricType_COUNTER,
	"caddy_mcp_upstream_unavailable_total": dto.MetricType_COUNTER,
	"caddy_mcp_sessions_evicted_total":     dto.MetricType_COUNTER,
	"caddy_mcp_requests_total":             dto.MetricType_COUNTER,
	// methods.go
	"caddy_mcp_requests_by_method_total": dto.MetricType_COUNTER,
	"caddy_mcp_streams_open":             dto.MetricType_GAUGE,
	"caddy_mcp_sessions_cluster_live":    dto.MetricType_GAUGE,
	"caddy_mcp_sessions_shared_total":    dto.MetricType_COUNTER,
	"caddy_mcp_store_up":                 dto.MetricType_GAUGE,
	"caddy_mcp_store_errors_total":       dto.MetricType_COUNTER,
	// the redis store's health (storeHealth)
	"caddy_mcp_store_write_backs_total":       dto.MetricType_COUNTER,
	"caddy_mcp_store_sessions_restored_total": dto.MetricType_COUNTER,
	"caddy_mcp_store_hash_key_clash":          dto.MetricType_GAUGE,
	"caddy_mcp_store_writable":                dto.MetricType_GAUGE,
	"caddy_mcp_failovers_total":               dto.MetricType_COUNTER,
	// reclaim.go
	"caddy_mcp_reclaim_sent_total":    dto.MetricType_COUNTER,
	"caddy_mcp_reclaim_results_total": dto.MetricType_COUNTER,
	"caddy_mcp_reclaim_dropped_total": dto.MetricType_COUNTER,
	// bodymemory.go
	"caddy_mcp_body_memory_bytes":         dto.MetricType_GAUGE,
	"caddy_mcp_body_memory_refused_total": dto.MetricType_COUNTER,
	// journalmetrics.go
	"caddy_mcp_journal_bytes":         dto.MetricType_GAUGE,
	"caddy_mcp_journal_limit":         dto.MetricType_GAUGE,
	"caddy_mcp_journal_sessions":      dto.MetricType_GAUGE,
	"caddy_mcp_journal_events_total":  dto.MetricType_COUNTER,
	"caddy_mcp_journal_trimmed_total": dto.MetricType_COUNTER,
	"caddy_mcp_journal_resumes_total": dto.MetricType_COUNTER,
}

// gathered is one scrape: every series of the plugin's families, keyed
// name{label="value",...} with labels sorted by name.
type gathered map[string]float64

// gatherPlugin scrapes g, which must not error (a pedantic registry checks
// Describe/Collect consistency here), checks the families' types, and
// returns the plugin's series. It also returns every label value seen.
func gatherPlugin(t *testing.T, g prometheus.Gatherer) (gathered, []string) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	series := gathered{}
	var values []string
	for _, mf := range mfs {
		want, ours := metricNames[mf.GetName()]
		if !ours {
			if strings.HasPrefix(mf.GetName(), "caddy_mcp_") {
				t.Errorf("unexpected family %s", mf.GetName())
			}
			continue
		}
		if mf.GetType() != want {
			t.Errorf("%s has type %v, want %v", mf.GetName(), mf.GetType(), want)
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
				values = append(values, lp.GetValue())
			}
			slices.Sort(labels)
			v := m.GetGauge().GetValue()
			if mf.GetType() == dto.MetricType_COUNTER {
				v = m.GetCounter().GetValue()
			}
			series[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	return series, values
}

// ofTable returns the series of table name only.
func (g gathered) ofTable(name string) gathered {
	out := gathered{}
	for k, v := range g {
		if strings.Contains(k, fmt.Sprintf("table=%q", name)) {
			out[k] = v
		}
	}
	return out
}

// wantSeries compares got with want and reports the differences.
func wantSeries(t *testing.T, got, want gathered) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if g, ok := got[k]; !ok {
			t.Errorf("missing series %s (want %v)", k, want[k])
		} else if g != want[k] {
			t.Errorf("%s = %v, want %v", k, g, want[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected series %s = %v", k, got[k])
		}
	}
}

// tableSeries returns the series a table with no activity exports: its
// bound and every counter at 0, and no upstream series.
func tableSeries(name string, maxSessions int) gathered {
	g := gathered{}
	l := fmt.Sprintf("table=%q", name)
	g["caddy_mcp_sessions_max{"+l+"}"] = float64(maxSessions)
	g["caddy_mcp_sessions_unconfirmed{"+l+"}"] = 0
	for _, n := range []string{"caddy_mcp_sessions_learned_total", "caddy_mcp_sessions_adopted_total", "caddy_mcp_requests_pinned_total", "caddy_mcp_unknown_session_total", "caddy_mcp_upstream_gone_total", "caddy_mcp_principal_mismatch_total", "caddy_mcp_upstream_unavailable_total", "caddy_mcp_reclaim_sent_total", "caddy_mcp_reclaim_dropped_total"} {
		g[n+"{"+l+"}"] = 0
	}
	for _, r := range session.EvictReasons {
		g[fmt.Sprintf("caddy_mcp_sessions_evicted_total{reason=%q,%s}", r, l)] = 0
	}
	for _, e := range session.Eras {
		g[fmt.Sprintf("caddy_mcp_requests_total{era=%q,%s}", e, l)] = 0
	}
	for _, c := range session.FailoverCauses {
		for _, res := range []string{"moved", "followed", "failed", "refused"} {
			g[fmt.Sprintf("caddy_mcp_failovers_total{cause=%q,result=%q,%s}", c, res, l)] = 0
		}
	}
	for _, k := range []string{"get", "listen"} {
		g[fmt.Sprintf("caddy_mcp_streams_open{kind=%q,%s}", k, l)] = 0
	}
	for _, res := range []string{"ok", "not_found", "failed"} {
		g[fmt.Sprintf("caddy_mcp_reclaim_results_total{result=%q,%s}", res, l)] = 0
	}
	return g
}

func upstreamSeries(g gathered, table, dial string, live int64, draining bool) {
	l := fmt.Sprintf("table=%q,upstream=%q", table, dial)
	g["caddy_mcp_sessions_live{"+l+"}"] = float64(live)
	d := 0.0
	if draining {
		d = 1
	}
	g["caddy_mcp_upstream_draining{"+l+"}"] = d
	g["caddy_mcp_upstream_refusing{"+l+"}"] = 0
	g["caddy_mcp_upstream_refusals_total{"+l+"}"] = 0
}

func TestRegisterMetrics(t *testing.T) {
	tbl := adminTable(t, "", 5, time.Hour)
	if err := registerMetrics(nil); err != nil {
		t.Errorf("registerMetrics(nil) = %v", err)
	}
	reg := prometheus.NewPedanticRegistry()
	for i := range 3 {
		if err := registerMetrics(reg); err != nil {
			t.Fatalf("registration %d: %v", i+1, err)
		}
	}
	// A reload provisions into a new registry; the collector joins it too.
	reg2 := prometheus.NewPedanticRegistry()
	if err := registerMetrics(reg2); err != nil {
		t.Fatalf("registration into a second registry: %v", err)
	}
	for i, r := range []*prometheus.Registry{reg, reg2} {
		got, _ := gatherPlugin(t, r)
		wantSeries(t, got.ofTable(tbl.Name()), tableSeries(tbl.Name(), 5))
		if _, ok := got[fmt.Sprintf("caddy_mcp_sessions_max{table=%q}", tbl.Name())]; !ok {
			t.Errorf("registry %d lacks caddy_mcp_sessions_max of %q", i, tbl.Name())
		}
	}
	// Registered once, though registered three times: unregistering it once removes it.
	if !reg.Unregister(collector) {
		t.Fatal("Unregister = false")
	}
	if got, _ := gatherPlugin(t, reg); len(got) != 0 {
		t.Errorf("after Unregister the registry still exports %d series", len(got))
	}
}

// TestRegisterMetricsConflict checks that a registration error other than
// AlreadyRegistered is returned.
func TestRegisterMetricsConflict(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	other := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "caddy_mcp_sessions_live", Help: "something else"}, []string{"x"})
	reg.MustRegister(other)
	err := registerMetrics(reg)
	if err == nil {
		t.Fatal("registerMetrics into a registry with a conflicting family succeeded")
	}
	if errors.As(err, new(prometheus.AlreadyRegisteredError)) {
		t.Errorf("error %v is AlreadyRegistered, want a conflict", err)
	}
}

// TestHandlerProvisionRegistersMetrics checks that provisioning handlers
// registers the collector in the config's registry, once, without error.
func TestHandlerProvisionRegistersMetrics(t *testing.T) {
	ctx := newContext(t)
	name := "metrics/" + t.Name()
	for range 2 { // two handlers in one config
		h := &Handler{TableSettings: TableSettings{MaxSessions: 42}, Table: name}
		if err := h.Provision(ctx); err != nil {
			t.Fatalf("Provision: %v", err)
		}
	}
	startApp(t, ctx)
	got, _ := gatherPlugin(t, ctx.GetMetricsRegistry())
	wantSeries(t, got.ofTable(name), tableSeries(name, 42))

	// A reload: a new config, a new registry, the same table.
	ctx2 := newContext(t)
	h := &Handler{TableSettings: TableSettings{MaxSessions: 43}, Table: name}
	if err := h.Provision(ctx2); err != nil {
		t.Fatalf("Provision in a second config: %v", err)
	}
	startApp(t, ctx2)
	for _, reg := range []*prometheus.Registry{ctx.GetMetricsRegistry(), ctx2.GetMetricsRegistry()} {
		got, _ := gatherPlugin(t, reg)
		wantSeries(t, got.ofTable(name), tableSeries(name, 43))
	}
}

// TestMetricsScripted drives a table through the handler and checks every
// series the collector exports for it.
func TestMetricsScripted(t *testing.T) {
	name := "metrics/" + t.Name()
	h, _ := provisionHandler(t, &Handler{TableSettings: TableSettings{MaxSessions: 10}, Table: name})
	policy := provisionPolicy(t, &SessionSelection{Table: name})
	pool := testPool()[:2]
	a, b := pool[0].Dial, pool[1].Dial
	proxy := &fakeProxy{policy: policy, pool: pool}
	serve := func(r *http.Request, respond func(http.ResponseWriter, *http.Request, *reverseproxy.Upstream)) {
		t.Helper()
		proxy.respond = respond
		rec := httptest.NewRecorder()
		if err := h.ServeHTTP(rec, r, proxy); err != nil {
			t.Fatalf("ServeHTTP: %v", err)
		}
	}

	ids := []string{testSessionID, "Q7LMXW3C2B5NPZKRJ4HTYDVE6A", "K2PNRW7ZD4XQ3LCTJ5HVYE6MBA"}
	h.table.Learn(ids[0], a)
	h.table.Learn(ids[1], a)
	h.table.Learn(ids[2], b)
	serve(newRequest(http.MethodDelete, ids[0]), answer(200))             // pinned, evicted: delete
	serve(newRequest(http.MethodPost, ids[1]), answer(200))               // pinned
	serve(newRequest(http.MethodGet, ids[2]), answer(200))                // pinned
	serve(newRequest(http.MethodPost, "UNKNOWNSESSIONID7Q2XW4C3B5"), nil) // unknown: 404
	modern := newRequest(http.MethodPost)
	modern.Header.Set("Mcp-Method", "tools/list")
	modern.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	serve(modern, answer(200))                      // modern era, no session
	serve(newRequest(http.MethodPost), answer(202)) // other era
	proxy.pool = pool[:1]                           // b leaves the pool
	serve(newRequest(http.MethodPost, ids[2]), nil) // pinned, gone: 404, evicted: upstream_gone
	h.table.SetDraining(b, true)

	want := tableSeries(name, 10)
	upstreamSeries(want, name, a, 1, false)
	upstreamSeries(want, name, b, 0, true)
	l := fmt.Sprintf("table=%q", name)
	want["caddy_mcp_sessions_learned_total{"+l+"}"] = 3
	want["caddy_mcp_requests_pinned_total{"+l+"}"] = 4
	want["caddy_mcp_unknown_session_total{"+l+"}"] = 1
	want["caddy_mcp_upstream_gone_total{"+l+"}"] = 1
	want[`caddy_mcp_sessions_evicted_total{reason="delete",`+l+"}"] = 1
	want[`caddy_mcp_sessions_evicted_total{reason="upstream_gone",`+l+"}"] = 1
	want[`caddy_mcp_requests_total{era="legacy_session",`+l+"}"] = 5
	want[`caddy_mcp_requests_total{era="modern_sessionless",`+l+"}"] = 1
	want[`caddy_mcp_requests_total{era="other_sessionless",`+l+"}"] = 1
	want[`caddy_mcp_requests_by_method_total{code="200",method="unknown",`+l+"}"] = 3 // legacy: the body was not read
	want[`caddy_mcp_requests_by_method_total{code="404",method="unknown",`+l+"}"] = 2
	// a POST without a session: the proxy read its body to see whether it opens a session (initialize_timeout)
	want[`caddy_mcp_requests_by_method_total{code="202",method="ping",`+l+"}"] = 1
	want[`caddy_mcp_requests_by_method_total{code="200",method="tools/list",`+l+"}"] = 1

	reg := prometheus.NewPedanticRegistry()
	if err := registerMetrics(reg); err != nil {
		t.Fatal(err)
	}
	got, values := gatherPlugin(t, reg)
	wantSeries(t, got.ofTable(name), want)

	// No label value is, or contains, a session ID.
	for _, v := range values {
		for _, id := range append(ids, "UNKNOWNSESSIONID7Q2XW4C3B5") {
			if strings.Contains(v, id) {
				t.Errorf("label value %q carries session ID %q", v, id)
			}
		}
	}

	// The same in the text exposition format, on this table alone.
	expected := fmt.Sprintf(`# HELP caddy_mcp_sessions_live Sessions the table pins to the upstream.
# TYPE caddy_mcp_sessions_live gauge
caddy_mcp_sessions_live{table=%[1]q,upstream=%[2]q} 1
caddy_mcp_sessions_live{table=%[1]q,upstream=%[3]q} 0
# HELP caddy_mcp_upstream_draining 1 while the upstream is draining: it gets no new sessions but serves its pinned ones.
# TYPE caddy_mcp_upstream_draining gauge
caddy_mcp_upstream_draining{table=%[1]q,upstream=%[2]q} 0
caddy_mcp_upstream_draining{table=%[1]q,upstream=%[3]q} 1
# HELP caddy_mcp_requests_total Requests seen by the mcp_session handler, by MCP protocol era.
# TYPE caddy_mcp_requests_total counter
caddy_mcp_requests_total{era="legacy_session",table=%[1]q} 5
caddy_mcp_requests_total{era="modern_sessionless",table=%[1]q} 1
caddy_mcp_requests_total{era="other_sessionless",table=%[1]q} 1
`, name, a, b)
	if text := exposition(t, oneTable{h.table}, "caddy_mcp_sessions_live", "caddy_mcp_upstream_draining", "caddy_mcp_requests_total"); text != expected {
		t.Errorf("exposition:\n%s\nwant:\n%s", text, expected)
	}
	if got, _ := gatherPlugin(t, registryOf(t, oneTable{h.table})); len(got) != len(want) {
		t.Errorf("the table exports %d series, want %d", len(got), len(want))
	}
}

// registryOf returns a pedantic registry holding c.
func registryOf(t *testing.T, c prometheus.Collector) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	return reg
}

// exposition returns the families names of c in the text exposition
// format, in the order of names.
func exposition(t *testing.T, c prometheus.Collector, names ...string) string {
	t.Helper()
	mfs, err := registryOf(t, c).Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	var b strings.Builder
	for _, name := range names {
		for _, mf := range mfs {
			if mf.GetName() == name {
				if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return b.String()
}

// oneTable collects a single table, for exact comparisons that other
// tests' tables in the package pool would disturb.
type oneTable struct{ t *session.Table }

func (oneTable) Describe(ch chan<- *prometheus.Desc)   { collector.Describe(ch) }
func (c oneTable) Collect(ch chan<- prometheus.Metric) { collectTable(ch, c.t) }

// TestMetricsFollowPool checks that the collector reads the pool at scrape
// time: a table appears once acquired, changes show without re-registering,
// and it disappears after its last release, in every registry.
func TestMetricsFollowPool(t *testing.T) {
	regs := []*prometheus.Registry{prometheus.NewPedanticRegistry(), prometheus.NewPedanticRegistry()}
	for _, reg := range regs {
		if err := registerMetrics(reg); err != nil {
			t.Fatal(err)
		}
	}
	name := "metrics/" + t.Name()
	for _, reg := range regs {
		if got, _ := gatherPlugin(t, reg); len(got.ofTable(name)) != 0 {
			t.Fatalf("series of %q before it exists: %v", name, got.ofTable(name))
		}
	}
	tbl, err := acquireTable(name, 3, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	released := false
	t.Cleanup(func() {
		if !released {
			releaseTable(name)
		}
	})
	tbl.Learn("S1", "10.0.0.1:80")
	want := tableSeries(name, 3)
	upstreamSeries(want, name, "10.0.0.1:80", 1, false)
	want[fmt.Sprintf("caddy_mcp_sessions_learned_total{table=%q}", name)] = 1
	want[fmt.Sprintf("caddy_mcp_sessions_unconfirmed{table=%q}", name)] = 1
	for _, reg := range regs {
		got, _ := gatherPlugin(t, reg)
		wantSeries(t, got.ofTable(name), want)
	}
	tbl.Configure(2, 0)
	tbl.Learn("S2", "10.0.0.1:80")
	tbl.Learn("S3", "10.0.0.1:80") // evicts S1, never used: unconfirmed
	want[fmt.Sprintf("caddy_mcp_sessions_max{table=%q}", name)] = 2
	upstreamSeries(want, name, "10.0.0.1:80", 2, false)
	want[fmt.Sprintf("caddy_mcp_sessions_learned_total{table=%q}", name)] = 3
	want[fmt.Sprintf(`caddy_mcp_sessions_evicted_total{reason="unconfirmed",table=%q}`, name)] = 1
	want[fmt.Sprintf("caddy_mcp_sessions_unconfirmed{table=%q}", name)] = 2
	for _, reg := range regs {
		got, _ := gatherPlugin(t, reg)
		wantSeries(t, got.ofTable(name), want)
	}
	releaseTable(name)
	released = true
	for _, reg := range regs {
		if got, _ := gatherPlugin(t, reg); len(got.ofTable(name)) != 0 {
			t.Errorf("series of %q after its last release: %v", name, got.ofTable(name))
		}
	}
}

// TestMetricsLint runs promlint over what the collector exports.
func TestMetricsLint(t *testing.T) {
	tbl := adminTable(t, "", 5, time.Hour)
	tbl.Learn("S1", "10.0.0.1:80")
	tbl.SetDraining("10.0.0.1:80", true)
	mfs, err := registryOf(t, oneTable{tbl}).Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestMetricsDescribe checks that Describe sends one descriptor per family.
func TestMetricsDescribe(t *testing.T) {
	ch := make(chan *prometheus.Desc, 100)
	collector.Describe(ch)
	close(ch)
	var got []string
	for d := range ch {
		got = append(got, d.String())
	}
	if len(got) != len(metricNames) {
		t.Errorf("Describe sent %d descriptors, want %d", len(got), len(metricNames))
	}
	for name := range metricNames {
		found := false
		for _, d := range got {
			found = found || strings.Contains(d, `fqName: "`+name+`"`)
		}
		if !found {
			t.Errorf("Describe did not send %s", name)
		}
	}
}
