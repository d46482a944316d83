package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"golang.org/x/sys/unix"
)

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string][]int{"1": {1}, "0-1": {0, 1}, "3,0-1": {0, 1, 3}, " 2 , 2": {2}, "0-2,1": {0, 1, 2}} {
		got, err := parseCPUList(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "a", "2-1", "-1", "1-", "1,,2"} {
		if got, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) = %v, want an error", bad, got)
		}
	}
	if s := formatCPUList([]int{0, 1, 2, 5, 7, 8}); s != "0-2,5,7-8" {
		t.Errorf("formatCPUList = %q", s)
	}
}

func TestDefaultPlacement(t *testing.T) {
	pl, err := defaultPlacement("", "", []int{0, 1})
	if err != nil || !slices.Equal(pl.proxy, []int{1}) || !slices.Equal(pl.rest, []int{0}) {
		t.Fatalf("2 CPUs: %+v, %v; want proxy 1, rest 0", pl, err)
	}
	pl, err = defaultPlacement("0-1", "", []int{0, 1, 2, 3})
	if err != nil || !slices.Equal(pl.rest, []int{2, 3}) {
		t.Fatalf("proxy 0-1 of 4: %+v, %v; want rest 2-3", pl, err)
	}
	for _, c := range []struct{ proxy, rest string }{{"1", "0-1"}, {"2", "0"}, {"0-1", ""}, {"x", ""}} {
		if pl, err := defaultPlacement(c.proxy, c.rest, []int{0, 1}); err == nil {
			t.Errorf("proxy %q rest %q on 2 CPUs: %+v, want an error", c.proxy, c.rest, pl)
		}
	}
	if _, err := defaultPlacement("", "", []int{0}); err == nil || !strings.Contains(err.Error(), "2 CPUs") {
		t.Errorf("1 CPU: %v, want an error asking for 2 CPUs", err)
	}
}

// TestStartPinned starts a real child on one CPU and checks that all its
// threads stay there and that the starting thread gets its affinity back.
func TestStartPinned(t *testing.T) {
	allowed, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	one := allowed[len(allowed)-1:]
	cmd := exec.Command("sleep", "5")
	if err := startPinned(one, cmd.Start); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if ok, err := threadsOn(cmd.Process.Pid, one); err != nil || !ok {
		t.Errorf("child threads on CPU %v only: %v, %v", one, ok, err)
	}
	if ok, _ := threadsOn(cmd.Process.Pid, allowed); len(allowed) > 1 && ok {
		t.Errorf("threadsOn reports the child on every CPU: the check cannot tell")
	}
	if now, _ := allowedCPUs(); !slices.Equal(now, allowed) {
		t.Errorf("after startPinned this thread runs on %v, want %v back", now, allowed)
	}
}

// TestPinSelf pins every thread of the test process and undoes it.
func TestPinSelf(t *testing.T) {
	allowed, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	one := allowed[:1]
	restore, err := pinSelf(one)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := threadsOn(unix.Getpid(), one); err != nil || !ok {
		t.Errorf("threads on %v only after pinSelf: %v, %v", one, ok, err)
	}
	restore()
	if ok, _ := threadsOn(unix.Getpid(), allowed); !ok {
		t.Errorf("threads not back on %v after restore", allowed)
	}
}

// TestVariants parses a -variants list and adapts each variant's
// Caddyfile with the plugin, so that every setting is one Caddy accepts.
func TestVariants(t *testing.T) {
	vs, err := parseVariants("gogc=200, gogc=400+memlimit=1GiB,keepalive_idle_conns=64+read_buffer=8KiB,flush_interval=-1,h2c,proxy_log=off,transport=http")
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 7 || !slices.Equal(vs[1].env, []string{"GOGC=400", "GOMEMLIMIT=1GiB"}) {
		t.Fatalf("variants: %+v", vs)
	}
	base := scenarios[slices.IndexFunc(scenarios, func(s scenario) bool { return s.key == "mcp_proxy3" })]
	if sc := vs[4].scenario(base); !sc.h2c || sc.key != "mcp_proxy3+h2c" || sc.label != "Caddy mcp_proxy (3) versions h2c" {
		t.Errorf("h2c scenario: %+v", sc)
	}
	ups := []string{"127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"}
	want := []string{"", "", `"max_idle_conns":64},"protocol":"mcp","read_buffer_size":8192`, `"flush_interval":-1`, `"versions":["h2c"]`, `"exclude":["http.handlers.reverse_proxy"]`, `"idle_timeout":1000000000},"protocol":"http"}`}
	for i, v := range vs {
		sc := v.scenario(base)
		cfg := caddyfileWith(8080, 2019, sc.global, sc.route(ups))
		js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), nil)
		if err != nil {
			t.Errorf("variant %s: %v\n%s", v.name, err, cfg)
			continue
		}
		if !json.Valid(js) || !bytes.Contains(js, []byte(want[i])) {
			t.Errorf("variant %s: config lacks %s: %s", v.name, want[i], js)
		}
	}
	for _, bad := range []string{"gogc", "gc=100", "keepalive_idle_conns=", "h2c=1", "proxy_log=on", "transport=fastcgi"} {
		if _, err := parseVariants(bad); err == nil {
			t.Errorf("parseVariants(%q): no error", bad)
		}
	}
	o := &options{scenarios: []string{"direct3", "mcp_proxy3", "haproxy3"}, variants: vs[:2]}
	var keys []string
	for _, sc := range o.rows() {
		keys = append(keys, sc.key)
	}
	if want := []string{"direct3", "mcp_proxy3", "mcp_proxy3+gogc=200", "mcp_proxy3+gogc=400+memlimit=1GiB", "haproxy3"}; !slices.Equal(keys, want) {
		t.Errorf("rows %v, want %v", keys, want)
	}
}

// TestDoubleAnswersLoad runs the load generator against an upstream double
// in JSON and SSE mode: every call must count as a success. The negative
// control sends the calls to a second double: the generator must count
// them as misroutes, so a double that answered wrongly would show.
func TestDoubleAnswersLoad(t *testing.T) {
	for _, sse := range []bool{false, true} {
		a, b := &double{name: "d1", sse: sse}, &double{name: "d2", sse: sse}
		for _, c := range []struct {
			name     string
			h        http.Handler
			misroute bool
		}{
			{"d1", a, false},
			{"initialize on d1, calls on d2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Mcp-Session-Id") == "" {
					a.ServeHTTP(w, r)
				} else {
					b.ServeHTTP(w, r)
				}
			}), true},
		} {
			srv := httptest.NewServer(c.h)
			res := runLoad(loadConfig{addrs: []string{srv.Listener.Addr().String()}, sessions: 2, warmup: 10 * time.Millisecond, duration: 200 * time.Millisecond})
			srv.Close()
			ok := res.calls > 0 && res.errors == 0 && res.setupErrs == 0 && res.misroutes == 0
			if c.misroute {
				ok = res.calls == 0 && res.misroutes > 0
			}
			if !ok {
				t.Errorf("sse=%v %s: %d calls, %d errors, %d setup errors, %d misroutes; first error %q",
					sse, c.name, res.calls, res.errors, res.setupErrs, res.misroutes, res.firstErr)
			}
		}
	}
}

func TestRPCID(t *testing.T) {
	for in, want := range map[string]string{
		`{"jsonrpc":"2.0","id":17,"method":"tools/call"}`: "17",
		`{"jsonrpc":"2.0","id": "a-1" }`:                  `"a-1"`,
		`{"jsonrpc":"2.0","method":"notifications/x"}`:    "",
	} {
		if got := string(rpcID([]byte(in))); got != want {
			t.Errorf("rpcID(%s) = %q, want %q", in, got, want)
		}
	}
}

// samplePprofTop is `go tool pprof -top` output as Go 1.26 prints it.
const samplePprofTop = `File: caddy
Type: cpu
Duration: 9s, Total samples = 8.50s (94.44%)
Showing nodes accounting for 8.50s, 100% of 8.50s total
      flat  flat%   sum%        cum   cum%
     3.40s 40.00% 40.00%      3.40s 40.00%  internal/runtime/syscall/linux.Syscall6
     0.85s 10.00% 50.00%      1.70s 20.00%  runtime.mallocgc
     0.17s  2.00% 52.00%      0.17s  2.00%  runtime.futex
     0.17s  2.00% 54.00%      0.34s  4.00%  github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule.(*Table).Lookup
         0     0% 54.00%      0.43s  5.00%  go.uber.org/zap.(*Logger).With
         0     0% 54.00%      0.26s  3.00%  net/http.Header.Clone (inline)
         0     0% 54.00%      0.09s  1.00%  github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy.copyHeader
         0     0% 54.00%      0.85s 10.00%  runtime.gcBgMarkWorker
         0     0% 54.00%      6.80s 80.00%  net/http.(*conn).serve
`

func TestProfileSummary(t *testing.T) {
	total, es := parsePprofTop(samplePprofTop)
	if total != "Total samples = 8.50s (94.44%)" || len(es) != 9 {
		t.Fatalf("total %q, %d entries", total, len(es))
	}
	got := map[string]float64{}
	for _, g := range groupProfile(es) {
		got[strings.Fields(g.name)[0]] = g.share
	}
	want := map[string]float64{"system": 42, "allocation:": 20, "background": 10, "reverse_proxy's": 5, "header": 4, "the": 2}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("group %s: %.1f %%, want %.1f %%", k, got[k], v)
		}
	}
	if top := topEntries(es, 2, true); top[0].name != "net/http.(*conn).serve" || top[1].name != "internal/runtime/syscall/linux.Syscall6" {
		t.Errorf("top cum: %+v", top)
	}
	if top := topParts(es, 3); len(top) != 3 || top[0].name != "runtime.mallocgc" || top[1].name != "runtime.gcBgMarkWorker" || top[2].name != "go.uber.org/zap.(*Logger).With" {
		t.Errorf("top parts: %+v, want mallocgc, gcBgMarkWorker (one of the two 10 %% entries), zap.With; not the serving chain", top)
	}
	if s := shortName(es[3].name); s != "caddymodule.(*Table).Lookup" {
		t.Errorf("shortName = %q", s)
	}
}

// TestPlacedReport writes a sidecar part with a variant and checks the
// figures a reader takes from it; the charts' parser must not mistake its
// table for the throughput table.
func TestPlacedReport(t *testing.T) {
	r := sampleReport()
	row := func(key, label, kind string, calls int, p50 time.Duration, proxyCPU time.Duration) tpResult {
		return tpResult{mode: "json", sc: scenario{key: key, label: label, kind: kind, group: "3"}, proxyCPU: proxyCPU,
			serversCPU: 6 * time.Second, otherOnProxy: 1010 * time.Millisecond,
			load: loadResult{window: 10 * time.Second, calls: calls, lat: latencies(1001, p50/2, p50*3/2)}}
	}
	r.o.modes = []string{"json"}
	r.o.variants, _ = parseVariants("gogc=400")
	r.throughput, r.firstEvent = nil, nil
	r.placement = placement{proxy: []int{1}, rest: []int{0}}
	r.placed = []placedResult{{part: "sidecar", sessions: 32, rows: []tpResult{
		row("direct3", "direct (3 servers)", "direct", 40000, 4*time.Millisecond, 0),
		row("mcp_proxy3", "Caddy mcp_proxy (3)", "caddy", 50000, 5*time.Millisecond, 9*time.Second),
		row("mcp_proxy3+gogc=400", "Caddy mcp_proxy (3) GOGC=400", "caddy", 55000, 5*time.Millisecond, 8800*time.Millisecond),
		row("haproxy3", "HAProxy stick table (3)", "haproxy", 52000, 4500*time.Microsecond, 2*time.Second),
	}}}
	// three rounds: 1.10, 1.20 and 1.00 the default row's calls/s
	r.placed[0].rows[1].byRound = []float64{5000, 4000, 6000}
	r.placed[0].rows[2].byRound = []float64{5500, 4800, 6000}
	var md bytes.Buffer
	r.write(&md)
	out := md.String()
	for _, want := range []string{
		"32 sessions, 10s measured",
		"Cores given to each process: sidecar and proxy-bound parts: proxy process on CPU 1 (Caddy GOMAXPROCS=1",
		"| json | Caddy mcp_proxy (3) | 5000 | 1.25 | 0.96 | 5.00 ms | +1000 µs | 7.45 ms | +1490 µs | 0.90 | 180.0 | 4.68 | 5556 | 0.60 | 120.0 | 0.10 / 0.00 | 0 | 0 |",
		"mcp_proxy calls/s ≥ 0.98× HAProxy: 0.962× — **missed**",
		"mcp_proxy p50 added over direct ≤ 2× HAProxy's: +1000 µs vs +500 µs — met",
		"| json | `gogc=400` | 5500 | 1.10 | 1.10 (1.00–1.20, 3 rounds) | 5.00 ms | 1.00 | 160.0 | 0.89 |",
		"**Noisy run**: other processes used up to 0.10 cores",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	for i := range r.placed[0].rows {
		r.placed[0].rows[i].otherOnProxy = 0
	}
	md.Reset()
	r.write(&md)
	if strings.Contains(md.String(), "Noisy run") {
		t.Errorf("a run without other load on the proxy's CPU is called noisy")
	}
	if _, err := parseReport(out); err == nil {
		t.Errorf("parseReport read a throughput table from a report with the sidecar part only")
	}
}
