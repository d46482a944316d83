package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// memCaddyResult is the memory of a real Caddy process whose table holds n sessions.
type memCaddyResult struct {
	n, tableSessions   int
	fillTime           time.Duration
	rssBefore, rssFull int64 // VmRSS before filling and after, following a forced GC
	heapBefore, heap   int64 // Go heap in use (HeapAlloc) at the same points
	hwm                int64
}

// memCaddyPart fills the session table of a real Caddy `mcp_proxy` with
// o.memSessions sessions, each learned from a real initialize-shaped POST
// answered by one of 3 upstream doubles, and reads the process's memory.
func (e *env) memCaddyPart(o *options) (*memCaddyResult, error) {
	defer e.stopAll()
	n := o.memSessions
	res := &memCaddyResult{n: n}
	fmt.Fprintf(e.log, "memcaddy: starting 3 upstream doubles and Caddy mcp_proxy (max_sessions %d)\n", n+1000)
	_, addrs, err := e.startDoubles(3, time.Millisecond, time.Hour, false)
	if err != nil {
		return nil, err
	}
	px, err := e.startCaddy("memcaddy", mcpProxyRoute(addrs, n+1000, ""))
	if err != nil {
		return nil, err
	}
	// Warm up: connections, pools and code paths, with sessions of their own.
	if err := createSessions(px.Addr(), 1000, 32, nil); err != nil {
		return nil, err
	}
	if res.rssBefore, res.heapBefore, err = caddyMemory(px); err != nil {
		return nil, err
	}
	fmt.Fprintf(e.log, "memcaddy: creating %d sessions through the proxy\n", n)
	start := time.Now()
	var done atomic.Int64
	stopProgress := make(chan struct{})
	go func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case <-t.C:
				fmt.Fprintf(e.log, "memcaddy: %d sessions after %v\n", done.Load(), time.Since(start).Round(time.Second))
			}
		}
	}()
	err = createSessions(px.Addr(), n, 32, func(int, string) { done.Add(1) })
	close(stopProgress)
	if err != nil {
		return nil, err
	}
	res.fillTime = time.Since(start)
	if res.rssFull, res.heap, err = caddyMemory(px); err != nil {
		return nil, err
	}
	res.hwm = procStatus(px.Pid(), "VmHWM")
	var tables []struct{ Sessions int }
	if err := getJSON("http://"+px.admin+"/mcp_sessions/", &tables); err == nil {
		for _, t := range tables {
			res.tableSessions += t.Sessions
		}
	}
	fmt.Fprintf(e.log, "memcaddy: %d sessions in the table, RSS %s\n", res.tableSessions, mib(res.rssFull))
	return res, nil
}

// caddyMemory forces a GC in Caddy (through its pprof endpoint), waits for
// it to return freed memory, and returns its RSS and Go heap in use.
func caddyMemory(px *proxyProc) (rss, heap int64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+px.admin+"/debug/pprof/heap?gc=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	time.Sleep(2 * time.Second)
	var vars struct {
		Memstats struct{ HeapAlloc int64 }
	}
	if err := getJSON("http://"+px.admin+"/debug/vars", &vars); err != nil {
		return 0, 0, err
	}
	return procStatus(px.Pid(), "VmRSS"), vars.Memstats.HeapAlloc, nil
}
