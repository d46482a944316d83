package tests

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// grafanaDashboard is the dashboard shipped for the plugin's metrics.
const grafanaDashboard = "../examples/grafana/mcp-affinity.json"

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

// labelValuesRe matches Grafana's label_values(<selector>, <label>) variable query.
var labelValuesRe = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

// grafanaVarRe matches Grafana variable references: $name, ${name}, ${name:format}, [[name]].
var grafanaVarRe = regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]`)

// grafanaIntervals are Grafana's built-in duration variables.
var grafanaIntervals = map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
