package main

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
)

// memResult is the memory a table of n sessions costs.
type memResult struct {
	N             int     `json:"n"`
	IDHeap        float64 `json:"id_heap"`    // heap bytes per session of the ID strings
	TableHeap     float64 `json:"table_heap"` // heap bytes per session beyond the ID
	RSSFull       int64   `json:"rss_full"`   // process RSS with the table
	RSSPerSession float64 `json:"rss_per_session"`
	HWM           int64   `json:"hwm"`
}

// memtableMain is the child process of the memory part: it fills a session
// table and prints what it cost, as JSON. Running it alone keeps the load
// generator's own memory out of the figures.
func memtableMain(args []string) error {
	fs := flag.NewFlagSet("memtable", flag.ContinueOnError)
	n := fs.Int("n", 1_000_000, "sessions")
	if err := fs.Parse(args); err != nil {
		return err
	}
	settle := func() (runtime.MemStats, int64) {
		runtime.GC()
		debug.FreeOSMemory() // return freed pages, so RSS shows what is live
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m, procStatus(os.Getpid(), "VmRSS")
	}
	// The slice of string headers is the benchmark's, not the table's: the
	// table keeps its own copies of the headers (counted below).
	ids := make([]string, *n)
	m0, rss0 := settle()
	for i := range ids {
		ids[i] = rand.Text() // go-sdk's session IDs: 26 characters of base32
	}
	m1, _ := settle()
	tbl, err := caddymodule.NewTable("memory", *n, caddymodule.DefaultSessionTTL, nil)
	if err != nil {
		return err
	}
	dials := []string{"127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"}
	for i, id := range ids {
		tbl.Learn(id, dials[i%len(dials)])
	}
	m2, rss2 := settle()
	if tbl.Len() != *n {
		return fmt.Errorf("table holds %d sessions, want %d", tbl.Len(), *n)
	}
	res := memResult{
		N:             *n,
		IDHeap:        float64(m1.HeapAlloc-m0.HeapAlloc) / float64(*n),
		TableHeap:     float64(m2.HeapAlloc-m1.HeapAlloc) / float64(*n),
		RSSFull:       rss2,
		RSSPerSession: float64(rss2-rss0) / float64(*n),
		HWM:           procStatus(os.Getpid(), "VmHWM"),
	}
	runtime.KeepAlive(ids)
	runtime.KeepAlive(tbl)
	return json.NewEncoder(os.Stdout).Encode(res)
}

// memoryPart runs memtable in a child process.
func (e *env) memoryPart(o *options) (*memResult, error) {
	fmt.Fprintf(e.log, "memory: filling a table with %d sessions\n", o.memSessions)
	cmd := exec.Command(e.self, "memtable", "-n", strconv.Itoa(o.memSessions))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("memtable: %w", err)
	}
	var r memResult
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("memtable output %q: %w", out, err)
	}
	fmt.Fprintf(e.log, "memory: %.1f B/session beyond the ID, RSS %s\n", r.TableHeap, mib(r.RSSFull))
	return &r, nil
}

// decisionResult is the output of the caddymodule benchmarks.
type decisionResult struct {
	command string
	output  string
	lines   []benchLine
}

// benchLine is one line of `go test -bench` output.
type benchLine struct {
	name   string // without the -GOMAXPROCS suffix
	cpu    int
	nsOp   float64
	allocs float64
	xMap   float64 // the decision ÷ a bare map lookup of the same IDs, in alternating chunks (lookup+select-vs-map)
}

func (d *decisionResult) find(name string, cpu int) *benchLine {
	for i := range d.lines {
		if d.lines[i].name == name && d.lines[i].cpu == cpu {
			return &d.lines[i]
		}
	}
	return nil
}

// decisionBenchmarks selects the caddymodule benchmarks of the decision
// part; the package's other benchmarks (sealing, Redis, failover) take
// their own -benchtime and would run for many minutes at this one.
const decisionBenchmarks = "^Benchmark(PinnedLookup|PinnedLookupParallel|SessionMemory)$"

// decisionPart runs the caddymodule benchmarks: the pinned-request decision
// at 1M sessions, single and parallel, and the memory per session.
func (e *env) decisionPart(o *options, repo string) (*decisionResult, error) {
	args := []string{"test", "-run", "^$", "-bench", decisionBenchmarks, "-benchtime", o.benchtime, "-cpu", o.decisionCPU, "./caddymodule/"}
	d := &decisionResult{command: "go " + strings.Join(args, " ")}
	fmt.Fprintf(e.log, "decision: %s\n", d.command)
	start := time.Now()
	cmd := exec.Command(o.goBin, args...)
	cmd.Dir = repo
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	fmt.Fprintf(e.log, "decision: done in %v\n", time.Since(start).Round(time.Second))
	var keep []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "Benchmark") || strings.HasPrefix(line, "cpu:") || strings.HasPrefix(line, "goos:") {
			keep = append(keep, line)
		}
		if b, ok := parseBenchLine(line); ok {
			d.lines = append(d.lines, b)
		}
	}
	d.output = strings.Join(keep, "\n") + "\n"
	if err != nil {
		return d, fmt.Errorf("%v: %s%s", err, out, stderr.String())
	}
	return d, nil
}

// parseBenchLine parses "BenchmarkX/y-2  2000000  312 ns/op  0 B/op  0 allocs/op".
func parseBenchLine(line string) (benchLine, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
		return benchLine{}, false
	}
	b := benchLine{name: f[0], cpu: 1}
	if i := strings.LastIndexByte(f[0], '-'); i > 0 {
		if n, err := strconv.Atoi(f[0][i+1:]); err == nil {
			b.name, b.cpu = f[0][:i], n
		}
	}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			continue
		}
		switch f[i+1] {
		case "ns/op":
			b.nsOp = v
		case "allocs/op":
			b.allocs = v
		case "x-map":
			b.xMap = v
		}
	}
	return b, true
}
