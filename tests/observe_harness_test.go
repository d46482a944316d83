package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
)

// Observability helpers: metrics scraping (scrape, scrapeAt, metricValue),
// the log readers, and the dashboard checks.

// dashboard is the part of a Grafana dashboard (classic JSON model) the checks read.
type dashboard struct {
	Inputs        []dashInput `json:"__inputs"`
	Requires      []dashInput `json:"__requires"`
	SchemaVersion int         `json:"schemaVersion"`
	Panels        []dashPanel `json:"panels"`
	Templating    struct {
		List []dashVar `json:"list"`
	} `json:"templating"`
}

// dashInput is an entry of __inputs or __requires.
type dashInput struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	ID       string `json:"id"`
	PluginID string `json:"pluginId"`
}

// dashDatasource is a panel's, query's or variable's data source reference.
type dashDatasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// dashPanel is one panel; rows are panels of type "row".
type dashPanel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource *dashDatasource `json:"datasource"`
	GridPos    struct{ X, Y, W, H int }
	Targets    []dashTarget `json:"targets"`
}

// dashTarget is one PromQL query of a panel.
type dashTarget struct {
	RefID      string          `json:"refId"`
	Expr       string          `json:"expr"`
	Legend     string          `json:"legendFormat"`
	Datasource *dashDatasource `json:"datasource"`
}

// dashVar is a template variable; Definition is its label_values(...) query.
type dashVar struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Definition string          `json:"definition"`
	Datasource *dashDatasource `json:"datasource"`
}

// dashQuery is a PromQL expression of the dashboard and where it is.
type dashQuery struct {
	where  string
	expr   string
	legend string
}

// scrapeAfterScenario runs a few sessions through mcp_proxy over real MCP
// servers, drains an upstream, and returns the label names of every metric
// family Caddy's /metrics then exports.
func scrapeAfterScenario(t *testing.T) map[string]map[string]bool {
	t.Helper()
	bs := startBackends(t, 2, false)
	p := startProxy(t, "mcp_proxy "+upstreams(bs)+" {\n\t\ttable dashboard\n\t}")
	if r := runSessions(t, p.url(), 4, sessionPlan{calls: 2}); r.ok != 4 {
		t.Fatalf("scenario: %s", r)
	}
	drain := map[string]string{"table": "dashboard", "upstream": bs[0].Addr()}
	if st := adminCall(t, http.MethodPost, "/mcp_sessions/drain", drain, nil); st != http.StatusOK {
		t.Fatalf("drain: %d", st)
	}
	families, _ := scrape(t)
	if v := metricValue(families, "caddy_mcp_sessions_learned_total", map[string]string{"table": "dashboard"}); v != 4 {
		t.Fatalf("the scrape does not show the scenario: %v sessions learned, want 4", v)
	}
	return familyLabels(families)
}

// familyLabels maps each metric family to the label names its samples carry,
// plus the target labels Prometheus adds when it scrapes (instance, job).
func familyLabels(families map[string]*dto.MetricFamily) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for name, f := range families {
		labels := map[string]bool{"instance": true, "job": true}
		for _, m := range f.Metric {
			for _, l := range m.Label {
				labels[l.GetName()] = true
			}
		}
		out[name] = labels
	}
	return out
}

// dashboardProblems returns everything wrong with the dashboard raw, given
// the metric families exported (name → label names); none means it is fine.
func dashboardProblems(raw []byte, exported map[string]map[string]bool) []string {
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		return []string{fmt.Sprintf("%s is not valid JSON: %v", grafanaDashboard, err)}
	}
	problems := importProblems(d)
	problems = append(problems, layoutProblems(d)...)
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	named := map[string]bool{}
	for _, q := range d.queries() {
		problems = append(problems, queryProblems(q, vars, exported, named)...)
	}
	return append(problems, coverageProblems(exported, named)...)
}

// queries returns every PromQL expression of the dashboard: panel targets,
// and the selectors of label_values(...) variable queries.
func (d dashboard) queries() []dashQuery {
	var qs []dashQuery
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			qs = append(qs, dashQuery{fmt.Sprintf("panel %q query %s", p.Title, tg.RefID), tg.Expr, tg.Legend})
		}
	}
	for _, v := range d.Templating.List {
		qs = append(qs, dashQuery{fmt.Sprintf("variable %q", v.Name), labelValuesSelector(v.Definition), ""})
	}
	return qs
}

// labelValuesSelector turns label_values(sel, label) into the PromQL
// `count by (label) (sel)`, which names the same metric and label.
func labelValuesSelector(def string) string {
	m := labelValuesRe.FindStringSubmatch(strings.TrimSpace(def))
	if m == nil {
		return def // not label_values: parse as is, and fail if it is not PromQL
	}
	return fmt.Sprintf("count by (%s) (%s)", m[2], m[1])
}

// importProblems checks what importing into Grafana 11 or 12 relies on: the
// schema version, the DS_PROMETHEUS input, and every query using it.
func importProblems(d dashboard) []string {
	var problems []string
	if d.SchemaVersion < 39 || d.SchemaVersion > 42 {
		problems = append(problems, fmt.Sprintf("schemaVersion %d is not one of Grafana 11 or 12 (39–42)", d.SchemaVersion))
	}
	if !slices.ContainsFunc(d.Inputs, func(in dashInput) bool {
		return in.Name == "DS_PROMETHEUS" && in.Type == "datasource" && in.PluginID == "prometheus"
	}) {
		problems = append(problems, "__inputs has no Prometheus data source input DS_PROMETHEUS")
	}
	check := func(where string, ds *dashDatasource) {
		if ds == nil || ds.Type != "prometheus" || ds.UID != "${DS_PROMETHEUS}" {
			problems = append(problems, fmt.Sprintf("%s: data source %+v is not the DS_PROMETHEUS input", where, ds))
		}
	}
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		check(fmt.Sprintf("panel %q", p.Title), p.Datasource)
		for _, tg := range p.Targets {
			check(fmt.Sprintf("panel %q query %s", p.Title, tg.RefID), tg.Datasource)
		}
		if !slices.ContainsFunc(d.Requires, func(r dashInput) bool { return r.Type == "panel" && r.ID == p.Type }) {
			problems = append(problems, fmt.Sprintf("panel %q: type %q is not in __requires", p.Title, p.Type))
		}
	}
	for _, v := range d.Templating.List {
		check(fmt.Sprintf("variable %q", v.Name), v.Datasource)
	}
	for _, name := range []string{"table", "upstream"} {
		if !slices.ContainsFunc(d.Templating.List, func(v dashVar) bool { return v.Name == name && v.Type == "query" }) {
			problems = append(problems, fmt.Sprintf("no %q query variable in templating", name))
		}
	}
	return problems
}

// layoutProblems checks panel IDs are unique and panels fit Grafana's
// 24-column grid without overlapping.
func layoutProblems(d dashboard) []string {
	var problems []string
	ids := map[int]bool{}
	cells := map[[2]int]string{}
	for _, p := range d.Panels {
		g := p.GridPos
		if ids[p.ID] {
			problems = append(problems, fmt.Sprintf("panel %q: id %d used twice", p.Title, p.ID))
		}
		ids[p.ID] = true
		if g.W < 1 || g.H < 1 || g.X < 0 || g.X+g.W > 24 {
			problems = append(problems, fmt.Sprintf("panel %q: gridPos %+v does not fit 24 columns", p.Title, g))
		}
	grid:
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := cells[[2]int{x, y}]; ok {
					problems = append(problems, fmt.Sprintf("panel %q overlaps panel %q", p.Title, other))
					break grid
				}
				cells[[2]int{x, y}] = p.Title
			}
		}
	}
	return problems
}

// expandVars replaces Grafana variables as Grafana would before sending the
// query: durations by 5m, template variables (all values) by .*.
func expandVars(expr string, vars map[string]bool) (string, []string) {
	var undefined []string
	out := grafanaVarRe.ReplaceAllStringFunc(expr, func(ref string) string {
		m := grafanaVarRe.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		switch {
		case grafanaIntervals[name]:
			return "5m"
		case vars[name]:
			return ".*"
		}
		undefined = append(undefined, name)
		return ref
	})
	return out, undefined
}

// queryProblems parses one query and checks every metric and label it names
// against exported; it adds the metrics it names to named.
func queryProblems(q dashQuery, vars map[string]bool, exported map[string]map[string]bool, named map[string]bool) []string {
	var problems []string
	expr, undefined := expandVars(q.expr, vars)
	for _, u := range undefined {
		problems = append(problems, fmt.Sprintf("%s: undefined variable %q in %s", q.where, u, q.expr))
	}
	ast, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return append(problems, fmt.Sprintf("%s: parse error: %v in %s", q.where, err, expr))
	}
	bad := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf("%s: ", q.where)+fmt.Sprintf(format, args...))
	}
	parser.Inspect(ast, func(node parser.Node, _ []parser.Node) error {
		checkNode(node, exported, named, bad)
		return nil
	})
	for _, m := range regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`).FindAllStringSubmatch(q.legend, -1) {
		if !labelsUnder(ast, exported)[m[1]] {
			bad("legend uses label %q, which no metric of the query has", m[1])
		}
	}
	return problems
}

// checkNode checks the metric and labels one syntax-tree node names.
func checkNode(node parser.Node, exported map[string]map[string]bool, named map[string]bool, bad func(string, ...any)) {
	switch n := node.(type) {
	case *parser.VectorSelector:
		named[n.Name] = true
		labels, ok := exported[n.Name]
		if !ok {
			bad("metric %s is not exported by Caddy with the plugin", n.Name)
			return
		}
		for _, m := range n.LabelMatchers {
			if m.Name != "__name__" && !labels[m.Name] {
				bad("%s has no label %q", n.Name, m.Name)
			}
		}
	case *parser.AggregateExpr:
		checkLabels(n.Grouping, n.Expr, exported, bad)
	case *parser.BinaryExpr:
		if n.VectorMatching != nil {
			both := parser.Expressions{n.LHS, n.RHS}
			checkLabels(append(n.VectorMatching.MatchingLabels, n.VectorMatching.Include...), both, exported, bad)
		}
	}
}

// checkLabels reports the labels of a grouping (by, without, on, ignoring,
// group_left) that no metric under node has.
func checkLabels(labels []string, node parser.Node, exported map[string]map[string]bool, bad func(string, ...any)) {
	have := labelsUnder(node, exported)
	for _, l := range labels {
		if !have[l] {
			bad("grouping by label %q, which no metric under it has", l)
		}
	}
}

// labelsUnder returns the label names of every exported metric selected under node.
func labelsUnder(node parser.Node, exported map[string]map[string]bool) map[string]bool {
	have := map[string]bool{}
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			for l := range exported[vs.Name] {
				have[l] = true
			}
		}
		return nil
	})
	return have
}

// coverageProblems reports every metric the plugin exports that no query names.
func coverageProblems(exported map[string]map[string]bool, named map[string]bool) []string {
	var problems []string
	for name := range exported {
		if strings.HasPrefix(name, "caddy_mcp_") && !named[name] {
			problems = append(problems, fmt.Sprintf("no panel shows %s, which the plugin exports: add one to %s", name, grafanaDashboard))
		}
	}
	sort.Strings(problems)
	return problems
}

// logsConfig returns a Caddyfile whose default log (at DEBUG, the most
// verbose level) and access log go to files in dir, with the Logs recipe
// when recipe is set, and whose site proxies to upstreams.
func logsConfig(dir string, port int, upstreams string, recipe bool) string {
	def, acc := "", ""
	if recipe {
		def, acc = defaultLogFilter, accessLogFilter
	}
	return fmt.Sprintf(`{
	admin %s
	log {
		output file %s
		level DEBUG
		%s
	}
	auto_https off
	persist_config off
	servers {
		protocols h1 h2c
	}
}

http://:%d {
	bind 127.0.0.1
	log {
		output file %s
		%s
	}
	mcp_proxy %s
}
`, adminAddr, filepath.Join(dir, "caddy.log"), def, port, filepath.Join(dir, "access.log"), acc, upstreams)
}

// linesWith returns the lines of file that contain any of ids, and the
// number of lines.
func linesWith(t *testing.T, file string, ids []string) (hits []string, lines int) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines++
		for _, id := range ids {
			if strings.Contains(sc.Text(), id) {
				hits = append(hits, sc.Text())
				break
			}
		}
	}
	return hits, lines
}

// logTraffic runs the traffic of TestLogRecipeRemovesSessionIDs through url
// to bs (s1 answering with SSE, s2 in JSON mode) and returns every session
// ID it used.
func logTraffic(t *testing.T, url string, hc *http.Client, bs []*testproc.Proc) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	on := map[string]string{} // server -> session ID
	var ids []string
	// least_sessions spreads sessions, but what else the shared Caddy holds
	// (a request in flight to a reused port) can tip one choice: open
	// sessions until each server has one.
	for i := 0; i < 8 && (on["s1"] == "" || on["s2"] == ""); i++ {
		cs, err := connect(ctx, url, hc)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		id, err := whoami(ctx, cs)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, cs.ID())
		if on[id.Server] == "" {
			on[id.Server] = cs.ID()
		}
	}
	if on["s1"] == "" || on["s2"] == "" {
		t.Fatalf("want a session on each server after %d sessions, got %v", len(ids), on)
	}
	dropMidStream(t, url, on["s1"])
	done := make(chan int, 1)
	go func() { done <- slowCallStatus(url, on["s2"]) }()
	time.Sleep(500 * time.Millisecond)
	bs[1].Kill()
	if status := <-done; status != http.StatusBadGateway {
		t.Errorf("a call whose server died: %d, want 502", status)
	}
	return ids
}

// dropMidStream makes a slow call of session through url, reads its first
// SSE event and hangs up, then waits for the proxy to write into the closed
// connection.
func dropMidStream(t *testing.T, url, session string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(slowCall))
	req.Header = mcpPOSTHeaders(session)
	hc := &http.Client{Transport: &http.Transport{}}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readSSEBlock(bufio.NewReader(resp.Body)); err != nil {
		t.Fatalf("first event: %v", err)
	}
	cancel()
	resp.Body.Close()
	hc.CloseIdleConnections()
	time.Sleep(1500 * time.Millisecond) // two more progress events reach the closed connection
}

// slowCallStatus makes a slow call of session through url and returns the
// status it got, 0 for none.
func slowCallStatus(url, session string) int {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(slowCall))
	req.Header = mcpPOSTHeaders(session)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// scrape fetches Caddy's metrics from the admin endpoint.
func scrape(t testing.TB) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	return scrapeAt(t, adminAddr)
}

// scrapeAt fetches the metrics of the Caddy whose admin endpoint is admin.
func scrapeAt(t testing.TB, admin string) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parsing metrics: %v", err)
	}
	return families, string(body)
}

// metricValue returns the value of the sample of family name whose labels
// include want, or -1 if there is none.
func metricValue(families map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := families[name]
	if f == nil {
		return -1
	}
	for _, m := range f.Metric {
		if v, ok := sampleValue(m); ok && hasLabels(m, want) {
			return v
		}
	}
	return -1
}

// hasLabels reports whether the labels of sample m include want.
func hasLabels(m *dto.Metric, want map[string]string) bool {
	labels := map[string]string{}
	for _, l := range m.Label {
		labels[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// sampleValue returns the value of a counter or gauge sample.
func sampleValue(m *dto.Metric) (float64, bool) {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue(), true
	case m.Gauge != nil:
		return m.Gauge.GetValue(), true
	}
	return 0, false
}

// spreadRun replays a fixed schedule of sessions of uneven length through
// a proxy with the given fallback policy and returns the mean and worst gap
// between the busiest and the idlest upstream (live sessions, counted by
// the upstreams themselves) seen at each arrival.
func spreadRun(t *testing.T, fallback string, schedule []int) (mean float64, worst int) {
	ds := startDoubles(t, 3)
	p := startProxy(t, fmt.Sprintf("mcp_proxy %s {\n\t\ttable spread-%s\n\t\tfallback %s\n\t}", upstreams(ds), fallback, fallback))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	ends := map[int][]string{} // step -> sessions that end then
	total := 0
	for step, length := range schedule {
		for _, id := range ends[step] {
			if ex := send(t, hc, http.MethodDelete, p.url(), sid(id), ""); ex.status != http.StatusNoContent {
				t.Fatalf("DELETE: %d", ex.status)
			}
		}
		id := initialize(t, hc, p.url())
		ends[step+length] = append(ends[step+length], id)
		live := make([]int, len(ds))
		for i, d := range ds {
			d.mu.Lock()
			live[i] = len(d.sessions)
			d.mu.Unlock()
		}
		gap := slices.Max(live) - slices.Min(live)
		total += gap
		worst = max(worst, gap)
	}
	return float64(total) / float64(len(schedule)), worst
}

// waitLogLines returns the JSON log lines of file once done accepts them,
// or after 5 s: Caddy writes a request's access log line after the
// client has its response, so a test that counts lines right after its
// last call may read one short.
func waitLogLines(t testing.TB, file string, done func([]map[string]any) bool) []map[string]any {
	t.Helper()
	var lines []map[string]any
	waitFor(5*time.Second, func() bool { lines = readLogLines(t, file); return done(lines) })
	return lines
}

// readLogLines returns the JSON log lines of file (none if it does not exist).
func readLogLines(t testing.TB, file string) []map[string]any {
	t.Helper()
	raw, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	return lines
}
