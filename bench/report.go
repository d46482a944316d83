package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// report is everything one run measured, written as Markdown.
type report struct {
	o       *options
	started time.Time
	elapsed time.Duration
	machine machine

	throughput    []tpResult
	firstEvent    []feResult
	firstEventErr error
	streams       []*streamsResult
	streamsErr    error
	memory        *memResult
	memoryErr     error
	sizing        []*sizingResult
	sizingErr     error
	sizingTime    time.Duration
	decision      *decisionResult
	decisionErr   error
	flood         *floodResult
	floodErr      error
	uploads       []uploadRow
	uploadsErr    error
	charts        []string // chart files written beside the report

	placement placement        // CPUs of the sidecar and proxybound parts
	placed    []placedResult   // sidecar and proxybound parts, in the order run
	profiles  []profileSummary // Caddy's CPU profile in the proxy-bound part
}

// mark renders a target check.
func mark(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

// ratio formats a/b, or "–" when b is zero.
func ratio(a, b float64) string {
	if b == 0 || a == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// cores formats a CPU time as cores used over the window.
func cores(cpu, window time.Duration) string {
	return fmt.Sprintf("%.2f", cpu.Seconds()/window.Seconds())
}

func (r *report) write(w io.Writer) {
	m := r.machine
	fmt.Fprintf(w, "# MCP session affinity benchmark\n\n")
	fmt.Fprintf(w, "- Command: `go run ./bench %s`\n", strings.Join(os.Args[1:], " "))
	fmt.Fprintf(w, "- Date: %s; total run time %s\n", r.started.UTC().Format("2006-01-02 15:04 MST"), r.elapsed.Round(time.Second))
	fmt.Fprintf(w, "- Machine: %s, %d cores, %.0f GiB RAM, %s, open-file limit %d; load average at start %s\n",
		m.cpu, m.cores, m.memGiB, m.kernel, m.nofile, m.load)
	fmt.Fprintf(w, "- Software: %s; Caddy %s (./cmd/caddy, with the plugin); %s\n", m.goVersion, firstField(m.caddy), m.haproxy)
	if len(r.placed) > 0 {
		fmt.Fprintf(w, "- Cores given to each process: sidecar and proxy-bound parts: %s. Other parts: every process on all %d cores.\n", r.placement.line(), m.cores)
	}
	fmt.Fprintf(w, "- Everything (load generator, proxy, servers) runs on these cores on loopback: compare ratios within one run, not absolute numbers across runs.\n\n")
	if r.throughput != nil {
		r.writeThroughput(w)
		r.writeChartLinks(w, "calls", "p99", "cpu")
	}
	r.writeTargets(w)
	for _, p := range r.placed {
		r.writePlaced(w, p)
	}
	r.writeProfiles(w)
	if r.firstEvent != nil || r.firstEventErr != nil {
		r.writeFirstEvent(w)
		r.writeChartLinks(w, "firstevent")
	}
	if r.streams != nil || r.streamsErr != nil {
		r.writeStreams(w)
	}
	if r.memory != nil || r.memoryErr != nil {
		r.writeMemory(w)
	}
	if r.sizing != nil || r.sizingErr != nil {
		r.writeSizing(w)
	}
	if r.decision != nil || r.decisionErr != nil {
		r.writeDecision(w)
	}
	if r.flood != nil || r.floodErr != nil {
		r.writeFlood(w)
	}
	if r.uploads != nil || r.uploadsErr != nil {
		r.writeUploads(w)
	}
}

// writeChartLinks links the charts with these suffixes that were written,
// by file name: they sit beside the report.
func (r *report) writeChartLinks(w io.Writer, suffixes ...string) {
	for _, ch := range charts {
		for _, file := range r.charts {
			if slices.Contains(suffixes, ch.suffix) && strings.HasSuffix(file, "-"+ch.suffix+".svg") {
				fmt.Fprintf(w, "![%s](%s)\n\n", ch.alt, filepath.Base(file))
			}
		}
	}
}

func firstField(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return "unknown"
	}
	return f[0]
}

// find returns the throughput row of mode and scenario key.
func (r *report) find(mode, key string) *tpResult {
	for i := range r.throughput {
		if t := &r.throughput[i]; t.mode == mode && t.sc.key == key && t.err == nil {
			return t
		}
	}
	return nil
}

func (r *report) writeThroughput(w io.Writer) {
	o := r.o
	fmt.Fprintf(w, "## Throughput\n\n")
	fmt.Fprintf(w, "%d concurrent MCP sessions (one keep-alive HTTP/1.1 connection each), each calling the `whoami` tool in a loop; "+
		"%s measured after %s of warm-up; whoami servers answering POSTs with JSON or with SSE. "+
		"Ratios are to the same mode's direct and HAProxy rows with the same number of servers "+
		"(for latency and RSS, below 1 is better). A misroute is a call answered by another server than the one that created the session, or a 404 \"session not found\".", o.sessions, o.duration, o.warmup)
	if o.rounds > 1 {
		fmt.Fprintf(w, " Each row is the median of %d interleaved rounds by calls/s.", o.rounds)
	}
	fmt.Fprintf(w, "\n\n")
	fmt.Fprintf(w, "| mode | target | calls/s | ×direct | ×HAProxy | p50 | ×direct | ×HAProxy | p99 | ×direct | ×HAProxy | errors | misroutes | proxy peak RSS | ×HAProxy |\n")
	fmt.Fprintf(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, t := range r.throughput {
		if t.err != nil {
			fmt.Fprintf(w, "| %s | %s | error: %s |||||||||||||\n", t.mode, t.sc.label, oneLine(t.err.Error()))
			continue
		}
		d := r.find(t.mode, "direct"+t.sc.group)
		h := r.find(t.mode, "haproxy"+t.sc.group)
		cps := t.load.callsPerSec()
		p50, p99 := percentile(t.load.lat, 50), percentile(t.load.lat, 99)
		var dc, dp50, dp99, hc, hp50, hp99, hrss float64
		if d != nil {
			dc, dp50, dp99 = d.load.callsPerSec(), float64(percentile(d.load.lat, 50)), float64(percentile(d.load.lat, 99))
		}
		if h != nil {
			hc, hp50, hp99, hrss = h.load.callsPerSec(), float64(percentile(h.load.lat, 50)), float64(percentile(h.load.lat, 99)), float64(h.proxyRSS)
		}
		rss := "–"
		if t.proxyRSS > 0 {
			rss = mib(t.proxyRSS)
		}
		fmt.Fprintf(w, "| %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %d | %d | %s | %s |\n",
			t.mode, t.sc.label, cps, ratio(cps, dc), ratio(cps, hc),
			ms(p50), ratio(float64(p50), dp50), ratio(float64(p50), hp50),
			ms(p99), ratio(float64(p99), dp99), ratio(float64(p99), hp99),
			t.load.errors+t.load.setupErrs, t.load.misroutes, rss, ratio(float64(t.proxyRSS), hrss))
	}
	fmt.Fprintf(w, "\nCPU used during each measured window, in cores (of %d). The load generator is this program; "+
		"\"other\" is everything else on the machine (other users' work makes a run noisy).\n\n", r.machine.cores)
	fmt.Fprintf(w, "| mode | target | proxy | proxy µs/call | servers | servers µs/call | load generator | generator µs/call | other |\n|---|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, t := range r.throughput {
		if t.err != nil {
			continue
		}
		win := t.load.window
		proxy, proxyPer := "–", "–"
		if t.sc.kind != "direct" {
			proxy, proxyPer = cores(t.proxyCPU, win), fmt.Sprintf("%.1f", perCall(t.proxyCPU, t.load.calls))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %.1f | %s | %.1f | %s |\n", t.mode, t.sc.label, proxy, proxyPer,
			cores(t.serversCPU, win), perCall(t.serversCPU, t.load.calls),
			cores(t.load.genCPU, win), perCall(t.load.genCPU, t.load.calls), cores(t.otherCPU, win))
	}
	fmt.Fprintf(w, "\nCPU per successful call is steadier than calls/s when the machine is shared: "+
		"*proxy µs/call* of `mcp_proxy (1)` over `stock reverse_proxy (1)` is the plugin's CPU cost.\n")
	var errs []string
	for _, t := range r.throughput {
		if t.err == nil && t.load.firstErr != "" {
			errs = append(errs, fmt.Sprintf("- %s %s: %s", t.mode, t.sc.label, oneLine(t.load.firstErr)))
		}
	}
	if len(errs) > 0 {
		fmt.Fprintf(w, "\nFirst failure of each row that had one:\n\n%s\n", strings.Join(errs, "\n"))
	}
	fmt.Fprintln(w)
}

// perCall returns cpu in microseconds per call.
func perCall(cpu time.Duration, calls int) float64 {
	if calls == 0 {
		return 0
	}
	return float64(cpu.Microseconds()) / float64(calls)
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", "\\|")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

func (r *report) writeTargets(w io.Writer) {
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	for _, mode := range r.o.modes {
		if m, s := r.find(mode, "mcp_proxy1"), r.find(mode, "stock1"); m != nil && s != nil {
			x := m.load.callsPerSec() / s.load.callsPerSec()
			mc, sc := perCall(m.proxyCPU, m.load.calls), perCall(s.proxyCPU, s.load.calls)
			add("%s, 1 server: mcp_proxy calls/s ≥ 0.97× stock reverse_proxy: %.3f× — %s (proxy CPU per call: %.1f vs %.1f µs, %s×)",
				mode, x, mark(x >= 0.97), mc, sc, ratio(mc, sc))
		}
		m, h, d := r.find(mode, "mcp_proxy3"), r.find(mode, "haproxy3"), r.find(mode, "direct3")
		if m != nil && h != nil {
			x := m.load.callsPerSec() / h.load.callsPerSec()
			add("%s, 3 servers: mcp_proxy calls/s ≥ HAProxy: %.3f× — %s", mode, x, mark(x >= 1))
		}
		if m != nil && d != nil {
			x := m.load.callsPerSec() / d.load.callsPerSec()
			add("%s, 3 servers: mcp_proxy calls/s ≥ 0.95× direct: %.3f× — %s", mode, x, mark(x >= 0.95))
		}
		if sl := r.find(mode, "mcp_proxy3_sealed"); m != nil && sl != nil {
			x := sl.load.callsPerSec() / m.load.callsPerSec()
			sc, mc := perCall(sl.proxyCPU, sl.load.calls), perCall(m.proxyCPU, m.load.calls)
			add("%s, 3 servers: mcp_proxy with sealed session IDs calls/s ≥ 0.98× plain IDs: %.3f× — %s (proxy CPU per call: %.1f vs %.1f µs, %s×)",
				mode, x, mark(x >= 0.98), sc, mc, ratio(sc, mc))
		}
		if fo := r.find(mode, "mcp_proxy3_failover"); m != nil && fo != nil {
			x := fo.load.callsPerSec() / m.load.callsPerSec()
			fc, mc := perCall(fo.proxyCPU, fo.load.calls), perCall(m.proxyCPU, m.load.calls)
			add("%s, 3 servers: mcp_proxy with failover reinitialize calls/s ≥ 0.98× without: %.3f× — %s (proxy CPU per call: %.1f vs %.1f µs, %s×)",
				mode, x, mark(x >= 0.98), fc, mc, ratio(fc, mc))
		}
	}
	if fe := r.firstEvent; fe != nil {
		m, h := findFE(fe, "mcp_proxy"), findFE(fe, "haproxy")
		if m != nil && h != nil && len(m.reqToEvent) > 0 && len(h.reqToEvent) > 0 {
			mp, hp := percentile(m.reqToEvent, 99), percentile(h.reqToEvent, 99)
			add("first SSE event p99: mcp_proxy %s ≤ HAProxy %s — %s", ms(mp), ms(hp), mark(mp <= hp))
		}
	}
	if d := r.decision; d != nil {
		for _, cpu := range []int{1, 2} {
			if v := d.find("BenchmarkPinnedLookupParallel/lookup+select-vs-map-serial", cpu); v != nil && v.xMap > 0 {
				add("pinned-request decision of sessions in use at 1M sessions ≤ 2× a bare map lookup of the same IDs, one lookup at a time (each waits for the one before, as a request's one lookup does), in alternating chunks, %d goroutine(s): %.2f× — %s",
					cpu, v.xMap, mark(v.xMap <= 2))
			}
			if v := d.find("BenchmarkPinnedLookupParallel/lookup+select-vs-map", cpu); v != nil && v.xMap > 0 {
				add("the same, independent lookups in a tight loop (the bare map overlaps one lookup's cache misses with the next one's; the table's read lock, locked instructions, does not let it), %d goroutine(s): %.2f× — %s",
					cpu, v.xMap, mark(v.xMap <= 2))
			}
		}
		b, m := d.find("BenchmarkPinnedLookup/lookup+select", 1), d.find("BenchmarkPinnedLookup/map-baseline", 1)
		if b != nil && m != nil {
			add("pinned-request decision at 1M sessions 0 allocs/op: %.0f allocs/op (%.0f ns/op, %.2f× map-baseline's %.0f ns/op in a separate run, which the machine's load weighs on differently; the ratio target is the alternating one above) — %s",
				b.allocs, b.nsOp, b.nsOp/m.nsOp, m.nsOp, mark(b.allocs == 0))
		}
	}
	if mem := r.memory; mem != nil {
		add("≤ 150 bytes per session beyond the ID: %.0f B (heap, measured after GC) — %s", mem.TableHeap, mark(mem.TableHeap <= 150))
	}
	for _, s := range r.streams {
		if strings.Contains(s.label, "mcp_proxy") {
			add("%d open GET SSE streams held through mcp_proxy for %s: %d held — %s", s.n, s.hold, s.held, mark(s.held == s.n))
		}
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(w, "## Targets\n\nA miss is reported here, not a failure.\n\n")
	for _, l := range lines {
		fmt.Fprintf(w, "- %s\n", l)
	}
	fmt.Fprintln(w)
}

func findFE(fe []feResult, key string) *feResult {
	for i := range fe {
		if fe[i].key == key {
			return &fe[i]
		}
	}
	return nil
}

func (r *report) writeFirstEvent(w io.Writer) {
	fmt.Fprintf(w, "## First SSE event latency\n\n")
	if r.firstEventErr != nil {
		fmt.Fprintf(w, "Error: %s\n\n", oneLine(r.firstEventErr.Error()))
		return
	}
	o := r.o
	fmt.Fprintf(w, "%d GET streams of pinned sessions (%d at a time, each on a new connection) to 3 upstream doubles; "+
		"each double sends the stream's headers at once and its first event %s later, stamped with the time it wrote it. "+
		"*Request → event*: from writing the GET to reading the first event (includes the %s). "+
		"*Event transit*: from the upstream's write of the event to the client's read.\n\n", o.events, o.eventConc, o.eventDelay, o.eventDelay)
	fmt.Fprintf(w, "| target | request → event p50 | p99 | p99 ×direct | p99 ×HAProxy | event transit p50 | p99 | errors |\n|---|--:|--:|--:|--:|--:|--:|--:|\n")
	d, h := findFE(r.firstEvent, "direct"), findFE(r.firstEvent, "haproxy")
	for _, f := range r.firstEvent {
		if f.err != nil {
			fmt.Fprintf(w, "| %s | error: %s |||||||\n", f.label, oneLine(f.err.Error()))
			continue
		}
		p99 := float64(percentile(f.reqToEvent, 99))
		var dp, hp float64
		if d != nil && d.err == nil {
			dp = float64(percentile(d.reqToEvent, 99))
		}
		if h != nil && h.err == nil {
			hp = float64(percentile(h.reqToEvent, 99))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %d |\n", f.label,
			ms(percentile(f.reqToEvent, 50)), ms(percentile(f.reqToEvent, 99)), ratio(p99, dp), ratio(p99, hp),
			ms(percentile(f.transit, 50)), ms(percentile(f.transit, 99)), f.errors)
	}
	fmt.Fprintln(w)
}

func (r *report) writeStreams(w io.Writer) {
	fmt.Fprintf(w, "## Concurrent GET SSE streams\n\n")
	if r.streamsErr != nil {
		fmt.Fprintf(w, "Error: %s\n\n", oneLine(r.streamsErr.Error()))
	}
	if len(r.streams) == 0 {
		return
	}
	s0 := r.streams[0]
	fmt.Fprintf(w, "%d sessions created through the proxy (3 upstream doubles), then one GET SSE stream each, all open at once, "+
		"each on its own client connection (HTTP/1.1), held for %s while the upstreams write an event on every stream every %s. "+
		"Proxy to upstream: %s. A fresh Caddy and fresh upstreams for each column.\n\n", s0.n, s0.hold, s0.ping, s0.proto)
	row := func(name string, f func(s *streamsResult) string) {
		fmt.Fprintf(w, "| %s |", name)
		for _, s := range r.streams {
			fmt.Fprintf(w, " %s |", f(s))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "| figure |")
	for _, s := range r.streams {
		fmt.Fprintf(w, " %s |", s.label)
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("--:|", len(r.streams)))
	row("streams opened (headers and first event through the proxy)", func(s *streamsResult) string { return fmt.Sprint(s.opened) })
	row(fmt.Sprintf("streams held: open at the end, an event received in the last %s", 2*s0.ping), func(s *streamsResult) string { return fmt.Sprint(s.held) })
	row("streams the upstreams had open at the end", func(s *streamsResult) string { return fmt.Sprint(s.upstreamOpen) })
	row("time to open all", func(s *streamsResult) string { return s.openTime.Round(time.Millisecond).String() })
	row("proxy RSS before the streams (sessions created)", func(s *streamsResult) string { return mib(s.rssBefore) })
	row("proxy RSS with all streams open", func(s *streamsResult) string { return mib(s.rssHeld) })
	row("proxy RSS per open stream", func(s *streamsResult) string {
		return fmt.Sprintf("%.1f KiB", float64(s.rssHeld-s.rssBefore)/float64(max(s.held, 1))/1024)
	})
	row("proxy peak RSS", func(s *streamsResult) string { return mib(s.rssPeak) })
	row("proxy open file descriptors", func(s *streamsResult) string { return fmt.Sprint(s.fds) })
	row("sessions in the plugin's table (admin API)", func(s *streamsResult) string {
		if s.tableSessions < 0 {
			return "–"
		}
		return fmt.Sprint(s.tableSessions)
	})
	row("first failure", func(s *streamsResult) string {
		if s.firstErr == "" {
			return "none"
		}
		return oneLine(s.firstErr)
	})
	fmt.Fprintln(w)
}

func (r *report) writeMemory(w io.Writer) {
	fmt.Fprintf(w, "## Memory per session\n\n")
	if r.memoryErr != nil {
		fmt.Fprintf(w, "Error: %s\n\n", oneLine(r.memoryErr.Error()))
		return
	}
	m := r.memory
	fmt.Fprintf(w, "A process holding only the plugin's session table (`caddymodule.NewTable`, as Caddy creates it) learns %d sessions "+
		"with go-sdk-shaped IDs (26 bytes), spread over 3 upstreams; heap measured after GC, RSS from /proc/self/status (GOGC=100).\n\n", m.N)
	fmt.Fprintf(w, "| figure | value |\n|---|--:|\n")
	fmt.Fprintf(w, "| heap per session: the ID string (26 bytes in a 32-byte allocation) | %.1f B |\n", m.IDHeap)
	fmt.Fprintf(w, "| heap per session beyond the ID (map slot, LRU element, entry) | %.1f B |\n", m.TableHeap)
	fmt.Fprintf(w, "| heap of the table with %d sessions, IDs included | %s |\n", m.N, mib(int64((m.IDHeap+m.TableHeap)*float64(m.N))))
	fmt.Fprintf(w, "| process RSS with the table | %s |\n", mib(m.RSSFull))
	fmt.Fprintf(w, "| RSS growth per session, IDs included | %.1f B |\n", m.RSSPerSession)
	fmt.Fprintf(w, "| process peak RSS while filling (VmHWM) | %s |\n", mib(m.HWM))
	fmt.Fprintln(w)
}

func (r *report) writeDecision(w io.Writer) {
	fmt.Fprintf(w, "## Table benchmarks (caddymodule)\n\n")
	if r.decisionErr != nil {
		fmt.Fprintf(w, "Error: %s\n\n", oneLine(r.decisionErr.Error()))
		if r.decision == nil {
			return
		}
	}
	d := r.decision
	fmt.Fprintf(w, "`%s` — 1,000,000 live sessions; *lookup+select* is the whole pinned-request decision; the Parallel benchmarks run one goroutine per `-cpu` and show contention on the table's lock; *lookup+select-vs-map* alternates the decision with a bare map lookup of the same IDs in chunks of 1,000 and reports their ratio (*x-map*), which holds up on a busy machine where separate runs do not; *-serial* does the same with each lookup's ID depending on the previous lookup's result, so that each lookup costs its latency, as a request's one lookup does, instead of overlapping its cache misses with the next lookup's.\n\n", d.command)
	fmt.Fprintf(w, "```\n%s```\n\n", d.output)
}
