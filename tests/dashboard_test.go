package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/promql/parser"
)

// grafanaDashboard is the dashboard shipped for the plugin's metrics.
const grafanaDashboard = "../examples/grafana/mcp-affinity.json"

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

// TestGrafanaDashboard checks examples/grafana against a real Caddy: every
// PromQL expression parses (Prometheus' own parser), every metric and label
// it names is exported after a short scenario, every metric the plugin
// exports has a panel, and the JSON has what Grafana's import needs. Mutated
// copies of the dashboard show that each check catches its kind of drift.
func TestGrafanaDashboard(t *testing.T) {
	raw, err := os.ReadFile(grafanaDashboard)
	if err != nil {
		t.Fatal(err)
	}
	exported := scrapeAfterScenario(t)
	for _, p := range dashboardProblems(raw, exported) {
		t.Error(p)
	}
	t.Run("negative controls", func(t *testing.T) {
		for _, m := range dashboardMutations {
			if !strings.Contains(string(raw), m.old) {
				t.Fatalf("%s: the dashboard no longer contains %q; choose another mutation", m.name, m.old)
			}
			mutated := strings.Replace(string(raw), m.old, m.new, 1)
			problems := strings.Join(dashboardProblems([]byte(mutated), exported), "\n")
			if !strings.Contains(problems, m.want) {
				t.Errorf("%s: no problem mentions %q; problems:\n%s", m.name, m.want, problems)
			}
		}
	})
}

// dashboardMutations each break the dashboard in one way the checks must report.
var dashboardMutations = []struct{ name, old, new, want string }{
	{"metric renamed", "caddy_mcp_upstream_gone_total", "caddy_mcp_upstream_gone_count", "caddy_mcp_upstream_gone_count is not exported"},
	{"exported metric without a panel", "caddy_mcp_upstream_gone_total", "caddy_mcp_upstream_gone_count", "no panel shows caddy_mcp_upstream_gone_total"},
	{"label renamed", "sum by (upstream) (caddy_mcp_sessions_live", "sum by (upstreams) (caddy_mcp_sessions_live", `label "upstreams"`},
	{"matcher on a missing label", `era=\"legacy_session\"`, `phase=\"legacy_session\"`, `label "phase"`},
	{"syntax error", "[$__rate_interval]))", "[$__rate_interval))", "parse error"},
	{"undefined variable", `table=~\"$table\"`, `table=~\"$tabel\"`, `undefined variable "tabel"`},
	{"fixed data source", `"uid": "${DS_PROMETHEUS}"`, `"uid": "prometheus"`, "data source"},
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

// labelValuesRe matches Grafana's label_values(<selector>, <label>) variable query.
var labelValuesRe = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

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

// grafanaVarRe matches Grafana variable references: $name, ${name}, ${name:format}, [[name]].
var grafanaVarRe = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// grafanaIntervals are Grafana's built-in duration variables.
var grafanaIntervals = map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}

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
