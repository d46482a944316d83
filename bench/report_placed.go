package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// placedResult is the rows of the sidecar or the proxybound part.
type placedResult struct {
	part     string
	rows     []tpResult
	err      error
	sessions int // concurrent MCP sessions of the part
}

// find returns the row of mode and scenario key.
func (p *placedResult) find(mode, key string) *tpResult {
	for i := range p.rows {
		if t := &p.rows[i]; t.mode == mode && t.sc.key == key && t.err == nil {
			return t
		}
	}
	return nil
}

// placementLine describes who runs where, for the report's header.
func (pl placement) line() string {
	n, r := len(pl.proxy), len(pl.rest)
	return fmt.Sprintf("proxy process on CPU %s (Caddy GOMAXPROCS=%d, HAProxy nbthread %d, Redis of the replicas row too); "+
		"load generator (GOMAXPROCS=%d) and upstreams (each GOMAXPROCS=%d) on CPU %s",
		formatCPUList(pl.proxy), n, n, r, r, formatCPUList(pl.rest))
}

// usDelta formats b-a in microseconds, signed.
func usDelta(a, b time.Duration) string {
	return fmt.Sprintf("%+.0f µs", float64(b-a)/float64(time.Microsecond))
}

var placedTitles = map[string]string{
	"sidecar":    "Sidecar: the proxy on its own CPU",
	"proxybound": "Proxy-bound: calls/s per proxy core",
}

func (r *report) writePlaced(w io.Writer, p placedResult) {
	fmt.Fprintf(w, "## %s\n\n", placedTitles[p.part])
	if p.err != nil {
		fmt.Fprintf(w, "Error: %s\n\n", oneLine(p.err.Error()))
		return
	}
	pl := r.placement
	fmt.Fprintf(w, "%s. %d sessions, %s measured after %s of warm-up. Placement: %s. "+
		"The direct rows run the upstreams and the generator on CPU %s as in the proxied rows, so every ratio compares like with like. "+
		"*+p50*, *+p99*: the row's latency minus the direct row's (same mode and number of upstreams). "+
		"*Calls/s per proxy core* is calls/s divided by the proxy's CPU use; the proxy is saturated when *proxy cores* is near %d. "+
		"*Others on proxy / rest CPUs*: cores' worth of CPU that other processes of the machine used on those CPUs during the window (noise: on a quiet machine both are near 0).\n\n",
		placedIntro[p.part], p.sessions, r.o.duration, r.o.warmup, pl.line(), formatCPUList(pl.rest), len(pl.proxy))
	fmt.Fprintf(w, "| mode | row | calls/s | ×direct | ×HAProxy | p50 | +p50 | p99 | +p99 | proxy cores (of %d) | proxy µs/call | ×HAProxy | calls/s per proxy core | generator + upstreams cores (of %d) | upstreams µs/call | others on proxy / rest CPUs | errors | misroutes |\n",
		len(pl.proxy), len(pl.rest))
	fmt.Fprintf(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, t := range p.rows {
		fmt.Fprintln(w, placedRow(p, t))
	}
	fmt.Fprintln(w)
	if worst := noisiest(p.rows); worst > noisyCores {
		fmt.Fprintf(w, "**Noisy run**: other processes used up to %.2f cores' worth of the proxy's CPUs during a window; "+
			"calls/s and latency then measure the machine's load more than the proxy (CPU µs per call is steadier). Run again on a quiet machine.\n\n", worst)
	}
	r.writePlacedTargets(w, p)
	r.writeVariants(w, p)
}

var placedIntro = map[string]string{
	"sidecar": "The throughput rows (whoami servers) with the proxy pinned to its own core(s), as a sidecar container with a CPU " +
		"limit or a dedicated core would have it: the proxy no longer takes CPU from the servers",
	"proxybound": "The proxy alone on its core(s) in front of upstream doubles (`bench double`: a whoami-shaped answer to every " +
		"call, JSON or one SSE event, written from pooled buffers; its CPU per call is the *upstreams µs/call* column), " +
		"so that the proxy is the bottleneck: its capacity per core",
}

// noisyCores is how much CPU other processes may use on the proxy's CPUs
// in a window, in cores, before the report calls the run noisy.
const noisyCores = 0.1

// noisiest returns the most CPU, in cores, that other processes used on
// the proxy's CPUs in any row's window.
func noisiest(rows []tpResult) float64 {
	var worst float64
	for _, t := range rows {
		if t.err == nil && t.load.window > 0 {
			worst = max(worst, t.otherOnProxy.Seconds()/t.load.window.Seconds())
		}
	}
	return worst
}

// placedRow formats one row of a placed part's table.
func placedRow(p placedResult, t tpResult) string {
	if t.err != nil {
		return fmt.Sprintf("| %s | %s | error: %s ||||||||||||||||", t.mode, t.sc.label, oneLine(t.err.Error()))
	}
	d, h := p.find(t.mode, "direct"+t.sc.group), p.find(t.mode, "haproxy"+t.sc.group)
	cps, win := t.load.callsPerSec(), t.load.window
	p50, p99 := percentile(t.load.lat, 50), percentile(t.load.lat, 99)
	var dc, hc, hus float64
	dp50, dp99 := "–", "–"
	if d != nil {
		dc = d.load.callsPerSec()
		dp50, dp99 = usDelta(percentile(d.load.lat, 50), p50), usDelta(percentile(d.load.lat, 99), p99)
	}
	if h != nil {
		hc, hus = h.load.callsPerSec(), perCall(h.proxyCPU, h.load.calls)
	}
	proxy, us, perCore, xh := "–", "–", "–", "–"
	if t.sc.kind != "direct" {
		u := perCall(t.proxyCPU, t.load.calls)
		proxy, us, xh = cores(t.proxyCPU, win), fmt.Sprintf("%.1f", u), ratio(u, hus)
		if u > 0 {
			perCore = fmt.Sprintf("%.0f", 1e6/u)
		}
	}
	return fmt.Sprintf("| %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f | %s / %s | %d | %d |",
		t.mode, t.sc.label, cps, ratio(cps, dc), ratio(cps, hc), ms(p50), dp50, ms(p99), dp99,
		proxy, us, xh, perCore, cores(t.serversCPU+t.load.genCPU, win), perCall(t.serversCPU, t.load.calls),
		cores(t.otherOnProxy, win), cores(t.otherOnRest, win),
		t.load.errors+t.load.setupErrs, t.load.misroutes)
}

// writePlacedTargets checks the sidecar targets of issue-level goals:
// mcp_proxy calls/s ≥ 0.98× HAProxy, and its p50 added over direct within
// 2× HAProxy's.
func (r *report) writePlacedTargets(w io.Writer, p placedResult) {
	if p.part != "sidecar" {
		return
	}
	var lines []string
	for _, mode := range r.o.modes {
		m, h, d := p.find(mode, "mcp_proxy3"), p.find(mode, "haproxy3"), p.find(mode, "direct3")
		if m == nil || h == nil || d == nil {
			continue
		}
		x := m.load.callsPerSec() / h.load.callsPerSec()
		dp := percentile(d.load.lat, 50)
		ma, ha := percentile(m.load.lat, 50)-dp, percentile(h.load.lat, 50)-dp
		lines = append(lines,
			fmt.Sprintf("- %s, 3 servers: mcp_proxy calls/s ≥ 0.98× HAProxy: %.3f× — %s", mode, x, mark(x >= 0.98)),
			fmt.Sprintf("- %s, 3 servers: mcp_proxy p50 added over direct ≤ 2× HAProxy's: %s vs %s — %s", mode,
				usDelta(0, ma), usDelta(0, ha), mark(ma <= 2*max(ha, 0))))
	}
	if len(lines) > 0 {
		fmt.Fprintf(w, "Targets (a miss is reported, not a failure):\n\n%s\n\n", strings.Join(lines, "\n"))
	}
}

// writeVariants compares each variant row with the default mcp_proxy (3)
// row of the same mode.
func (r *report) writeVariants(w io.Writer, p placedResult) {
	if len(r.o.variants) == 0 {
		return
	}
	fmt.Fprintf(w, "Variants of `mcp_proxy (3)`, against the default row of the same mode in this part:\n\n")
	fmt.Fprintf(w, "| mode | variant | calls/s | ×default | ×default paired by round: median (range) | p50 | ×default | proxy µs/call | ×default |\n|---|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, mode := range r.o.modes {
		base := p.find(mode, "mcp_proxy3")
		for _, v := range r.o.variants {
			t := p.find(mode, "mcp_proxy3+"+v.name)
			if t == nil {
				fmt.Fprintf(w, "| %s | `%s` | failed (see above) |||||||\n", mode, v.name)
				continue
			}
			fmt.Fprintln(w, variantRow(mode, v.name, t, base))
		}
	}
	fmt.Fprintln(w)
}

func variantRow(mode, name string, t, base *tpResult) string {
	cps, p50, us := t.load.callsPerSec(), percentile(t.load.lat, 50), perCall(t.proxyCPU, t.load.calls)
	var bc, bp, bu float64
	if base != nil {
		bc, bp, bu = base.load.callsPerSec(), float64(percentile(base.load.lat, 50)), perCall(base.proxyCPU, base.load.calls)
	}
	paired := "–"
	if base != nil {
		paired = pairedRatio(t.byRound, base.byRound)
	}
	return fmt.Sprintf("| %s | `%s` | %.0f | %s | %s | %s | %s | %.1f | %s |", mode, name, cps, ratio(cps, bc), paired,
		ms(p50), ratio(float64(p50), bp), us, ratio(us, bu))
}

// pairedRatio is the median and range of a row's calls/s over the default
// row's in the same round, over the rounds both ran: it cancels what
// drifts between rounds, which the ratio of two medians does not.
func pairedRatio(row, base []float64) string {
	var rs []float64
	for i := range min(len(row), len(base)) {
		if row[i] > 0 && base[i] > 0 {
			rs = append(rs, row[i]/base[i])
		}
	}
	if len(rs) == 0 {
		return "–"
	}
	slices.Sort(rs)
	med := rs[len(rs)/2]
	if len(rs)%2 == 0 {
		med = (rs[len(rs)/2-1] + rs[len(rs)/2]) / 2
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f, %d rounds)", med, rs[0], rs[len(rs)-1], len(rs))
}

// writeProfiles writes the profile summaries of the proxy-bound part.
func (r *report) writeProfiles(w io.Writer) {
	if len(r.profiles) == 0 {
		return
	}
	fmt.Fprintf(w, "## Where Caddy's CPU goes (proxy-bound, mcp_proxy (3))\n\n")
	fmt.Fprintf(w, "CPU profiles of Caddy over the measured window (`-pprof`, `/debug/pprof/profile`), read with "+
		"`go tool pprof -top`. Shares are of all samples of the Caddy process. Flat: in the function itself; cum: in it and what it calls.\n\n")
	for _, s := range r.profiles {
		fmt.Fprintf(w, "### %s mode\n\n", s.mode)
		if s.err != nil {
			fmt.Fprintf(w, "Error: %s\n\n", oneLine(s.err.Error()))
			if len(s.groups) == 0 {
				continue
			}
		}
		fmt.Fprintf(w, "`%s`: %s\n\n| family | share |\n|---|--:|\n", s.file, s.total)
		for _, g := range s.groups {
			fmt.Fprintf(w, "| %s | %.1f %% |\n", g.name, g.share)
		}
		fmt.Fprintf(w, "\n| top flat | flat | cum | | top cum below %.0f %%, one per call chain | flat | cum |\n|---|--:|--:|---|---|--:|--:|\n", partsBelow)
		for i := range max(len(s.flat), len(s.cum)) {
			fmt.Fprintf(w, "| %s | | %s |\n", entryCells(s.flat, i), entryCells(s.cum, i))
		}
		fmt.Fprintln(w)
	}
}

func entryCells(es []pprofEntry, i int) string {
	if i >= len(es) {
		return " | |"
	}
	e := es[i]
	return fmt.Sprintf("`%s` | %.1f %% | %.1f %%", oneLine(shortName(e.name)), e.flat, e.cum)
}
