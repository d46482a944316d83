package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The profile summary: where Caddy's CPU goes in the proxy-bound
// mcp_proxy (3) row, from the CPU profile -pprof saved of it, read with
// `go tool pprof -top`.

// pprofEntry is one function of a `go tool pprof -top` listing.
type pprofEntry struct {
	name      string
	flat, cum float64 // share of all samples, percent
}

// profileGroup is a named share of the samples: a function family whose
// cost can be raised as one item.
type profileGroup struct {
	name  string
	share float64 // percent of all samples
}

// profileSummary is the summary of one profile.
type profileSummary struct {
	mode, file string
	total      string // "Total samples = 9.61s (96.10%)"
	groups     []profileGroup
	flat, cum  []pprofEntry // top entries
	err        error
}

// parsePprofTop reads `go tool pprof -top` output: the header line with
// the total, then rows "flat flat% sum% cum cum% name".
func parsePprofTop(out string) (total string, entries []pprofEntry) {
	for _, l := range strings.Split(out, "\n") {
		if i := strings.Index(l, "Total samples = "); i >= 0 {
			total = strings.TrimSpace(l[i:])
			continue
		}
		f := strings.Fields(l)
		if len(f) < 6 || !strings.HasSuffix(f[1], "%") || !strings.HasSuffix(f[4], "%") {
			continue
		}
		flat, err1 := strconv.ParseFloat(strings.TrimSuffix(f[1], "%"), 64)
		cum, err2 := strconv.ParseFloat(strings.TrimSuffix(f[4], "%"), 64)
		if err1 != nil || err2 != nil {
			continue
		}
		name := strings.TrimSuffix(strings.Join(f[5:], " "), " (inline)")
		entries = append(entries, pprofEntry{name: name, flat: flat, cum: cum})
	}
	return total, entries
}

// syscallLeaves are runtime functions that are themselves system calls.
var syscallLeaves = []string{"runtime.futex", "runtime.epollwait", "runtime.usleep", "runtime.write1", "runtime.read", "runtime.madvise", "runtime.mmap", "runtime.sysMmap"}

// groupProfile sums the entries into the families the investigation
// follows. System calls and the plugin are flat sums (disjoint); the
// others are the cumulative share of their entry points, which may overlap
// with each other (an allocation inside a header copy counts in both).
func groupProfile(es []pprofEntry) []profileGroup {
	sum := func(pick func(pprofEntry) bool, cum bool) float64 {
		var s float64
		for _, e := range es {
			switch {
			case pick(e) && cum:
				s += e.cum
			case pick(e):
				s += e.flat
			}
		}
		return s
	}
	named := func(names ...string) func(pprofEntry) bool {
		return func(e pprofEntry) bool { return slices.Contains(names, e.name) }
	}
	return []profileGroup{
		{"system calls (read, write, epoll, futex; flat)", sum(func(e pprofEntry) bool {
			return strings.HasPrefix(e.name, "syscall.") || strings.HasPrefix(e.name, "internal/runtime/syscall") || slices.Contains(syscallLeaves, e.name)
		}, false)},
		{"allocation: runtime.mallocgc (cum, includes GC assists)", sum(named("runtime.mallocgc"), true)},
		{"background GC: runtime.gcBgMarkWorker (cum)", sum(named("runtime.gcBgMarkWorker"), true)},
		{"reverse_proxy's per-request logger: zap.(*Logger).With (cum)", sum(named("go.uber.org/zap.(*Logger).With"), true)},
		{"header copies: http.Header.Clone, reverseproxy.copyHeader (cum)", sum(func(e pprofEntry) bool {
			return strings.HasSuffix(e.name, "http.Header.Clone") || strings.HasSuffix(e.name, "reverseproxy.copyHeader")
		}, true)},
		{"the plugin: caddymodule functions (flat)", sum(func(e pprofEntry) bool { return strings.Contains(e.name, "caddy-mcp-affinity/") }, false)},
	}
}

// topEntries returns the n largest entries by flat or cum share.
func topEntries(es []pprofEntry, n int, byCum bool) []pprofEntry {
	out := slices.Clone(es)
	key := func(e pprofEntry) float64 {
		if byCum {
			return e.cum
		}
		return e.flat
	}
	slices.SortStableFunc(out, func(a, b pprofEntry) int {
		switch {
		case key(a) > key(b):
			return -1
		case key(a) < key(b):
			return 1
		}
		return 0
	})
	return out[:min(n, len(out))]
}

// partsBelow is the cum share under which an entry is a part of the work
// rather than the serving chain every request passes (conn.serve, Caddy's
// middleware wrappers, the plugin's handler, reverse_proxy's loop).
const partsBelow = 25.0

// topParts returns the n largest entries by cum share below partsBelow,
// one per call chain: an entry with the same cum share as the one before
// it (its caller or callee on one path) is left out.
func topParts(es []pprofEntry, n int) []pprofEntry {
	var out []pprofEntry
	for _, e := range topEntries(es, len(es), true) {
		if e.cum >= partsBelow || (len(out) > 0 && out[len(out)-1].cum == e.cum) {
			continue
		}
		if out = append(out, e); len(out) == n {
			break
		}
	}
	return out
}

// shortName trims the module paths off a function name.
func shortName(s string) string {
	for _, p := range []string{"github.com/caddyserver/caddy/v2/modules/", "github.com/caddyserver/caddy/v2.", "github.com/caddy-mcp-affinity/caddy-mcp-affinity/", "go.uber.org/"} {
		s = strings.ReplaceAll(s, p, "")
	}
	return s
}

// profileSummaries summarizes the CPU profile of the proxy-bound default
// mcp_proxy (3) row of every mode (the first round's).
func (e *env) profileSummaries(o *options) []profileSummary {
	var out []profileSummary
	for _, mode := range o.modes {
		file := filepath.Join(o.pprofDir, fmt.Sprintf("proxybound-mcp_proxy3-%s-r1.cpu.pprof", mode))
		s := profileSummary{mode: mode, file: file}
		if _, err := os.Stat(file); err != nil {
			s.err = err
			out = append(out, s)
			continue
		}
		cmd := exec.Command(o.goBin, "tool", "pprof", "-top", "-nodecount=100000", e.caddy, file)
		b, err := cmd.Output()
		if err != nil {
			s.err = fmt.Errorf("go tool pprof: %w", err)
		}
		var es []pprofEntry
		s.total, es = parsePprofTop(string(b))
		s.groups, s.flat, s.cum = groupProfile(es), topEntries(es, 10, false), topParts(es, 10)
		out = append(out, s)
	}
	return out
}
