// Command bench measures the MCP session affinity plugin against direct
// access and HAProxy, on loopback, in one go:
//
//	go run ./bench [-duration 10s] [-sessions 32] [-o results.md]
//
// It builds Caddy with the plugin (./cmd/caddy) and the whoami MCP server
// (./examples/whoami-server), then runs, each as separate processes:
//
//   - throughput: N concurrent MCP sessions calling a tool in a loop,
//     direct, through Caddy mcp_proxy, through HAProxy with a learning stick
//     table, and through stock Caddy reverse_proxy, with JSON and SSE
//     server modes; one table of calls/s, latency, errors, misroutes, proxy
//     peak RSS and the ratios to direct and to HAProxy;
//   - sidecar (not run by default): the same rows with the proxy pinned to
//     its own CPUs (-proxy-cpus) and everything else to the others
//     (-rest-cpus);
//   - proxybound (not run by default): the proxy pinned alone in front of
//     upstream doubles that cost almost nothing: calls/s per proxy core;
//     with -pprof, where Caddy's CPU goes;
//   - firstevent: latency of the first SSE event of a GET stream through
//     the proxies vs direct;
//   - streams: 10,000 concurrent GET SSE streams held open through mcp_proxy;
//   - memory: RSS and bytes per session of a table of 1,000,000 sessions;
//   - sizing (not run by default: minutes): memory per session in a real
//     Caddy (and Redis) for each session store, failover setting and
//     sealing, through 200,000 sessions each;
//   - decision: the caddymodule table benchmarks (ns/op, allocs/op at 1M
//     sessions, lock contention at -cpu 1,2,4);
//   - flood: 50,000 initializes from one client against max_sessions 1000
//     while 20 sessions are used every 2 s and 10 hold GET streams: how many
//     of those 30 stay pinned.
//
// -variants adds mcp_proxy (3) rows under other Caddy settings (GOGC,
// transport subdirectives, h2c) to every part that runs rows.
//
// With -o, it also writes SVG charts beside the report (results.md →
// results-calls.svg, …) and links them from it. `go run ./bench charts`
// renders them again from a recorded report, without running anything.
//
// See bench/README.md for the method.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"
)

// options are the command-line flags.
type options struct {
	duration  time.Duration
	warmup    time.Duration
	sessions  int
	modes     []string
	scenarios []string
	only      []string
	rounds    int
	out       string
	pprofDir  string
	keep      bool
	goBin     string
	haproxy   string

	streams     int
	streamHold  time.Duration
	streamPing  time.Duration
	streamProto string

	events      int
	eventConc   int
	eventDelay  time.Duration
	memSessions int

	sizingSessions int
	sizingConc     int
	sizingConfigs  []sizingConfig
	sizingConfirm  bool
	merge          bool
	flood          int
	decisionCPU    string
	benchtime      string
	cpuprofile     string

	variants      []variant
	boundSessions int    // sessions of the proxybound part
	proxyCPUs     string // sidecar and proxybound parts: the proxy's CPUs ("" = the last one)
	restCPUs      string // the load generator's and upstreams' CPUs ("" = all others)
}

var allParts = []string{"throughput", "sidecar", "proxybound", "firstevent", "streams", "memory", "sizing", "decision", "flood", "uploads"}

// defaultParts leaves out sizing, which takes minutes (200,000 sessions
// through Caddy for each of 8 configurations), and sidecar and proxybound, which
// take as long as throughput each and matter only on a quiet machine.
var defaultParts = []string{"throughput", "firstevent", "streams", "memory", "decision", "flood", "uploads"}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "double":
			if err := doubleMain(os.Args[2:]); err != nil {
				fmt.Fprintln(os.Stderr, "double:", err)
				os.Exit(1)
			}
			return
		case "charts":
			if err := chartsMain(os.Args[2:]); err != nil {
				fmt.Fprintln(os.Stderr, "charts:", err)
				os.Exit(1)
			}
			return
		case "memtable":
			if err := memtableMain(os.Args[2:]); err != nil {
				fmt.Fprintln(os.Stderr, "memtable:", err)
				os.Exit(1)
			}
			return
		}
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags() (*options, error) {
	o := &options{}
	var modes, scen, only, variants string
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measured `time` per throughput scenario")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "warm-up `time` before each measured window (not counted)")
	flag.IntVar(&o.sessions, "sessions", 32, "`N` concurrent MCP sessions, each calling whoami in a loop")
	flag.StringVar(&modes, "modes", "json,sse", "server response `modes`: json, sse")
	flag.StringVar(&scen, "scenarios", defaultScenarios, "throughput `rows`: direct3, mcp_proxy3, mcp_proxy3_sealed, mcp_proxy3_failover, replicas3, haproxy3, rr3, direct1, stock1, mcp_proxy1, haproxy1")
	flag.StringVar(&only, "only", strings.Join(defaultParts, ","), "`parts` to run: "+strings.Join(allParts, ", "))
	flag.IntVar(&o.rounds, "rounds", 1, "run the throughput scenarios `R` times, interleaved, and report each row's median by calls/s")
	flag.StringVar(&o.out, "o", "", "also write the report (Markdown) to `file`")
	flag.StringVar(&o.pprofDir, "pprof", "", "save CPU and allocation profiles of every Caddy throughput run, and a heap profile of each sizing configuration when full, into `dir`")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (binaries, configs, logs)")
	flag.StringVar(&o.goBin, "go", "go", "the go `command` used to build Caddy and the servers")
	flag.StringVar(&o.haproxy, "haproxy", "/usr/sbin/haproxy", "HAProxy `binary`")
	flag.IntVar(&o.streams, "streams", 10000, "`N` GET SSE streams held open at once (streams part)")
	flag.DurationVar(&o.streamHold, "stream-hold", 10*time.Second, "how long the streams are held open")
	flag.DurationVar(&o.streamPing, "stream-ping", 2*time.Second, "interval of the upstream's events on each held stream")
	flag.StringVar(&o.streamProto, "stream-upstream", "auto", "proxy-to-upstream protocol of the streams part: h1, h2c, or auto (h1 if the open-file limit allows 2 fds per stream, else h2c)")
	flag.IntVar(&o.events, "events", 1000, "`N` GET streams whose first event is timed (firstevent part)")
	flag.IntVar(&o.eventConc, "event-concurrency", 4, "streams timed at once (firstevent part)")
	flag.DurationVar(&o.eventDelay, "event-delay", time.Millisecond, "the upstream writes the first event this long after the stream's headers")
	flag.IntVar(&o.flood, "flood", 50_000, "`N` initializes sent from one client in the flood part")
	flag.IntVar(&o.memSessions, "memory-sessions", 1_000_000, "`N` sessions in the table (memory part)")
	flag.IntVar(&o.sizingSessions, "sizing-sessions", 200_000, "`N` sessions opened per configuration (sizing part)")
	flag.IntVar(&o.sizingConc, "sizing-concurrency", 64, "sessions opened at once, each worker on its own connection (sizing part)")
	flag.BoolVar(&o.sizingConfirm, "sizing-confirm", true, "sizing part: send notifications/initialized after each initialize, as a client does; false: initialize only (half the requests, sessions left unconfirmed)")
	sizingConfigs := flag.String("sizing-configs", "all", "`configurations` of the sizing part: all, or store/failover/sealed joined by commas (memory/off/off,redis/reinitialize/on)")
	flag.BoolVar(&o.merge, "merge", false, "with -o: replace in the file only the sections this run writes (adding those it lacks), keeping the rest")
	flag.StringVar(&o.decisionCPU, "decision-cpu", "1,2,4", "-cpu list of the decision benchmarks")
	flag.StringVar(&o.benchtime, "decision-benchtime", "2000000x", "-benchtime of the decision benchmarks")
	flag.StringVar(&variants, "variants", "", "extra mcp_proxy (3) rows under other settings: `list` of variants, settings joined by + (transport=http,gogc=400+memlimit=1GiB,keepalive_idle_conns=64,flush_interval=-1,h2c; bench/README.md lists them)")
	flag.IntVar(&o.boundSessions, "proxybound-sessions", 64, "`N` concurrent MCP sessions in the proxybound part (enough to keep the proxy's core busy)")
	flag.StringVar(&o.proxyCPUs, "proxy-cpus", "", "sidecar and proxybound parts: `CPUs` of the proxy process (cpuset list: 1, 2-3); default the last CPU")
	flag.StringVar(&o.restCPUs, "rest-cpus", "", "sidecar and proxybound parts: `CPUs` of the load generator and the upstreams; default all CPUs not given to the proxy")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of this program (the load generator) to `file`")
	flag.Parse()
	if flag.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	split := func(s string) []string {
		var out []string
		for _, f := range strings.Split(s, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, f)
			}
		}
		return out
	}
	o.modes, o.scenarios, o.only = split(modes), split(scen), split(only)
	for _, m := range o.modes {
		if m != "json" && m != "sse" {
			return nil, fmt.Errorf("unknown mode %q", m)
		}
	}
	for _, s := range o.scenarios {
		if !slices.ContainsFunc(scenarios, func(x scenario) bool { return x.key == s }) {
			return nil, fmt.Errorf("unknown scenario %q", s)
		}
	}
	for _, p := range o.only {
		if !slices.Contains(allParts, p) {
			return nil, fmt.Errorf("unknown part %q", p)
		}
	}
	var err error
	if o.variants, err = parseVariants(variants); err != nil {
		return nil, err
	}
	if o.sizingConfigs, err = parseSizingConfigs(*sizingConfigs); err != nil {
		return nil, err
	}
	if o.merge && o.out == "" {
		return nil, fmt.Errorf("-merge needs -o: the report to merge this run's sections into")
	}
	if o.sessions < 1 || o.rounds < 1 || o.boundSessions < 1 || o.sizingSessions < 1 || o.sizingConc < 1 {
		return nil, fmt.Errorf("-sessions, -proxybound-sessions, -rounds, -sizing-sessions and -sizing-concurrency must be at least 1")
	}
	return o, nil
}

func (o *options) runs(part string) bool { return slices.Contains(o.only, part) }

// placement reads -proxy-cpus and -rest-cpus: by default the proxy gets the
// last CPU this process may run on, everything else the others.
func (o *options) placement() (placement, error) {
	allowed, err := allowedCPUs()
	if err != nil {
		return placement{}, err
	}
	return defaultPlacement(o.proxyCPUs, o.restCPUs, allowed)
}

// defaultPlacement fills in an empty proxy list (the last allowed CPU) and
// an empty rest list (the allowed CPUs the proxy does not have).
func defaultPlacement(proxy, rest string, allowed []int) (placement, error) {
	if len(allowed) < 2 {
		return placement{}, fmt.Errorf("the sidecar and proxybound parts need 2 CPUs at least; this process may run on %s", formatCPUList(allowed))
	}
	if proxy == "" {
		proxy = strconv.Itoa(allowed[len(allowed)-1])
	}
	if rest == "" {
		p, err := parseCPUList(proxy)
		if err != nil {
			return placement{}, fmt.Errorf("-proxy-cpus: %w", err)
		}
		var r []int
		for _, c := range allowed {
			if !slices.Contains(p, c) {
				r = append(r, c)
			}
		}
		rest = formatCPUList(r)
	}
	return newPlacement(proxy, rest, allowed)
}

// repoRoot finds the repository root: the nearest directory above the
// working directory holding go.work (the plugin's module and the nested
// bench, tests and examples modules).
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.work not found above the working directory: run the bench from a checkout of the repository")
		}
		dir = parent
	}
}

func run() error {
	o, err := parseFlags()
	if err != nil {
		return err
	}
	repo, err := repoRoot()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "mcp-affinity-bench")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintln(os.Stderr, "work directory:", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	if o.pprofDir != "" {
		if err := os.MkdirAll(o.pprofDir, 0o755); err != nil {
			return err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	e := &env{dir: dir, self: self, haproxy: o.haproxy, log: os.Stderr}
	defer e.stopAll()
	var pl placement
	if o.runs("sidecar") || o.runs("proxybound") {
		if pl, err = o.placement(); err != nil {
			return err
		}
	}
	needsBuild := o.runs("throughput") || o.runs("sidecar") || o.runs("proxybound") || o.runs("firstevent") || o.runs("streams") || o.runs("sizing") || o.runs("flood") || o.runs("uploads")
	if needsBuild {
		if err := e.build(o.goBin, repo); err != nil {
			return err
		}
	}
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	started := time.Now()
	rep := &report{o: o, started: started, machine: machineInfo(e, needsBuild), placement: pl}

	if o.runs("throughput") {
		rep.throughput = e.throughputPart(o)
	}
	for _, part := range []string{"sidecar", "proxybound"} {
		if o.runs(part) {
			pl.part = part
			po := *o
			if part == "proxybound" {
				po.sessions = o.boundSessions
			}
			res, err := e.placedPart(&po, pl)
			rep.placed = append(rep.placed, placedResult{part: part, rows: res, err: err, sessions: po.sessions})
		}
	}
	if o.pprofDir != "" && o.runs("proxybound") {
		rep.profiles = e.profileSummaries(o)
	}
	if o.runs("firstevent") {
		rep.firstEvent, rep.firstEventErr = e.firstEventPart(o)
	}
	if o.runs("streams") {
		rep.streams, rep.streamsErr = e.streamsPart(o)
	}
	if o.runs("memory") {
		rep.memory, rep.memoryErr = e.memoryPart(o)
	}
	if o.runs("sizing") {
		start := time.Now()
		rep.sizing, rep.sizingErr = e.sizingPart(o)
		rep.sizingTime = time.Since(start)
	}
	if o.runs("decision") {
		rep.decision, rep.decisionErr = e.decisionPart(o, repo)
	}
	if o.runs("flood") {
		rep.flood, rep.floodErr = e.floodPart(o)
	}
	if o.runs("uploads") {
		rep.uploads, rep.uploadsErr = e.uploadsPart()
	}
	rep.elapsed = time.Since(started)
	if o.out != "" {
		if rep.charts, err = writeCharts(recordedCharts(rep), o.out); err != nil {
			return err
		}
	}

	var buf bytes.Buffer
	rep.write(&buf)
	os.Stdout.Write(buf.Bytes())
	out := buf.Bytes()
	if o.merge {
		old, err := os.ReadFile(o.out)
		if err != nil {
			return fmt.Errorf("-merge: %w", err)
		}
		out = []byte(mergeReport(string(old), buf.String()))
	}
	if o.out != "" {
		if err := os.WriteFile(o.out, out, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// throughputPart runs every throughput row in every mode, rounds times,
// and keeps each row's median run by calls/s.
func (e *env) throughputPart(o *options) []tpResult {
	return e.measureRows(o, "throughput")
}

// placedPart is throughputPart with the proxy on its own CPUs and this
// program (the load generator) and the upstreams on the others.
func (e *env) placedPart(o *options, pl placement) ([]tpResult, error) {
	restore, err := pinSelf(pl.rest)
	if err != nil {
		return nil, err
	}
	defer restore()
	e.pl = &pl
	defer func() { e.pl = nil }()
	return e.measureRows(o, pl.part), nil
}

// measureRows runs o.rows() in every mode, rounds times, and keeps each
// row's median run by calls/s; part names the part in the progress lines.
// Each round starts one row later than the one before (round 2 runs the
// rows from the second on, then the first), so that no row always runs
// first: a row's place in the round moves its calls/s by several percent.
func (e *env) measureRows(o *options, part string) []tpResult {
	byKey := map[string][]tpResult{}
	var order []string
	for round := 1; round <= o.rounds; round++ {
		rows := o.rows()
		if len(rows) > 0 {
			k := (round - 1) % len(rows)
			rows = slices.Concat(rows[k:], rows[:k])
		}
		for _, mode := range o.modes {
			for _, sc := range rows {
				fmt.Fprintf(e.log, "%s %s %-11s round %d/%d ... ", part, mode, sc.key, round, o.rounds)
				r := e.runScenario(o, mode, sc, round)
				if r.err != nil {
					fmt.Fprintf(e.log, "error: %v\n", r.err)
				} else {
					fmt.Fprintf(e.log, "%.0f calls/s, p50 %s, p99 %s, errors %d, misroutes %d, proxy %.2f cores\n",
						r.load.callsPerSec(), ms(percentile(r.load.lat, 50)), ms(percentile(r.load.lat, 99)),
						r.load.errors+r.load.setupErrs, r.load.misroutes, r.proxyCPU.Seconds()/r.load.window.Seconds())
				}
				k := mode + "/" + sc.key
				if _, ok := byKey[k]; !ok {
					order = append(order, k)
				}
				byKey[k] = append(byKey[k], r)
			}
		}
	}
	var out []tpResult
	for _, k := range order {
		rs := byKey[k]
		byRound := make([]float64, len(rs))
		for i, r := range rs {
			if r.err == nil {
				byRound[i] = r.load.callsPerSec()
			}
		}
		slices.SortFunc(rs, func(a, b tpResult) int {
			switch {
			case a.load.callsPerSec() < b.load.callsPerSec():
				return -1
			case a.load.callsPerSec() > b.load.callsPerSec():
				return 1
			}
			return 0
		})
		med := rs[len(rs)/2]
		med.byRound = byRound
		out = append(out, med)
	}
	return out
}

// machine describes where the benchmark ran.
type machine struct {
	cpu, kernel, goVersion, haproxy, caddy, load string
	cores                                        int
	memGiB                                       float64
	nofile                                       uint64
}

func machineInfo(e *env, built bool) machine {
	m := machine{cores: runtime.NumCPU(), goVersion: runtime.Version()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				m.cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if out, err := exec.Command("uname", "-sr").Output(); err == nil {
		m.kernel = strings.TrimSpace(string(out))
	}
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.load = strings.Join(strings.Fields(string(data))[:3], " ")
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		fmt.Sscanf(strings.TrimPrefix(strings.Split(string(data), "\n")[0], "MemTotal:"), "%f", &kb)
		m.memGiB = kb / (1 << 20)
	}
	_, m.nofile = nofileLimit()
	m.haproxy = haproxyVersion(e.haproxy)
	if built {
		m.caddy = caddyVersion(e.caddy)
	}
	return m
}

// ms formats a duration in milliseconds.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}
