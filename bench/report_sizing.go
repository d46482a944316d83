package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// writeSizing writes the sizing part's table.
func (r *report) writeSizing(w io.Writer) {
	fmt.Fprintf(w, "## Sizing: memory per session by store, failover and sealing\n\n")
	if r.sizingErr != nil {
		fmt.Fprintf(w, "Error: %s\n\n", oneLine(r.sizingErr.Error()))
		return
	}
	n, conc := r.o.sizingSessions, r.o.sizingConc
	opens := fmt.Sprintf("each as a client does: `initialize` (%d bytes), then `notifications/initialized` with the ID it got", len(initializeBody))
	if !r.o.sizingConfirm {
		opens = fmt.Sprintf("each with an `initialize` (%d bytes) only, so that it stays unconfirmed (`-sizing-confirm=false`)", len(initializeBody))
	}
	fmt.Fprintf(w, "For each configuration, a fresh Caddy `mcp_proxy` over 3 upstream doubles (and, for the redis store, a fresh "+
		"`redis-server`) opens %d sessions, %d at a time, %s (raw HTTP/1.1 on keep-alive connections). The upstreams mint 26-byte IDs, as go-sdk does. "+
		"Every figure is the difference between the process after the sessions and the same process before the first one "+
		"(after %d sessionless requests that warm its connections up), divided by %d: the Go heap in use (`HeapAlloc`) and the RSS, "+
		"each after a GC forced through `/debug/pprof/heap?gc=1`; the peak RSS (`VmHWM`, which the GC's headroom while the "+
		"sessions arrive is part of); Redis's `used_memory`. *Held* is the table's count (admin API), and with Redis its `DBSIZE`; "+
		"a configuration whose table or Redis holds fewer sessions than it opened is an error. `max_sessions` is %d.\n\n",
		n, conc, opens, 20*conc, n, n+n/10)
	fmt.Fprintf(w, "| store | failover | sealed IDs | client's ID | held | Redis keys | sessions/s | Caddy CPU / session | Go heap / session | RSS / session | peak RSS / session | peak RSS | Redis / session |\n")
	fmt.Fprintf(w, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, s := range r.sizing {
		c := s.cfg
		parts := strings.Split(c.String(), "/")
		if s.err != nil {
			fmt.Fprintf(w, "| %s | %s | %s | error: %s ||||||||||\n", parts[0], parts[1], parts[2], oneLine(s.err.Error()))
			continue
		}
		per := func(pick func(memSnapshot) int64) string { return fmt.Sprintf("%.0f B", s.perSession(pick)) }
		redis, keys := "–", "–"
		if c.redis {
			redis, keys = per(func(m memSnapshot) int64 { return m.redis }), fmt.Sprint(s.redisKeys)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %d B | %d | %s | %.0f | %.0f µs | %s | %s | %s | %s | %s |\n",
			parts[0], parts[1], parts[2], s.idLen, s.held, keys, float64(s.n)/s.fill.Seconds(), perCall(s.caddyCPU, s.n),
			per(func(m memSnapshot) int64 { return m.heap }), per(func(m memSnapshot) int64 { return m.rss }),
			per(func(m memSnapshot) int64 { return m.hwm }), mib(s.full.hwm), redis)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Baselines (before the first session): ")
	var base []string
	for _, s := range r.sizing {
		if s.err == nil {
			base = append(base, fmt.Sprintf("%s heap %s, peak RSS %s", s.cfg, mib(s.base.heap), mib(s.base.hwm)))
		}
	}
	var gen time.Duration
	for _, s := range r.sizing {
		gen += s.genCPU
	}
	fmt.Fprintf(w, "%s. The part took %s in all; the load generator used %s of CPU while opening sessions.\n\n",
		strings.Join(base, "; "), r.sizingTime.Round(time.Second), gen.Round(time.Second))
}
