package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Shape of the flood part (the Security and abuse issue's measurement).
const (
	floodMaxSessions = 1000
	floodCalling     = 20              // sessions calling every floodCallEvery
	floodStreaming   = 10              // sessions holding a GET stream
	floodCallEvery   = 2 * time.Second // how often a calling session is used
)

// floodResult is what a flood of initialize requests from one client did
// to the sessions in use behind a Caddy mcp_proxy with a small table.
type floodResult struct {
	flood                  int           // initializes sent
	floodTime              time.Duration // how long the flood took
	callingOK, streamingOK int           // sessions in use still pinned after it
	callFailures           int           // calls of the calling sessions that got no 202 during it
	idleEvicted            bool          // control: a session never used since its initialize was pushed out
	tableSessions          int
	hwm                    int64 // Caddy's peak RSS
}

// floodPart starts Caddy mcp_proxy with max_sessions floodMaxSessions over
// 3 upstream doubles, opens floodCalling sessions that are used every
// floodCallEvery and floodStreaming sessions with an open GET stream, then
// sends o.flood initializes from one client and counts the sessions in use
// that are still pinned.
func (e *env) floodPart(o *options) (*floodResult, error) {
	defer e.stopAll()
	_, addrs, err := e.startDoubles(3, time.Millisecond, time.Second, false)
	if err != nil {
		return nil, err
	}
	px, err := e.startCaddy("flood", mcpProxyRoute(addrs, floodMaxSessions, ""))
	if err != nil {
		return nil, err
	}
	ids := make([]string, floodCalling+floodStreaming+1)
	if err := createSessions(px.Addr(), len(ids), 4, func(i int, id string) { ids[i] = id }); err != nil {
		return nil, err
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	calling, streaming, idle := ids[:floodCalling], ids[floodCalling:floodCalling+floodStreaming], ids[len(ids)-1]
	for _, id := range calling { // first use: the session is confirmed
		if st := usePost(hc, px.Addr(), id); st != http.StatusAccepted {
			return nil, fmt.Errorf("first call of a session: status %d", st)
		}
	}
	streams := make([]*heldStream, 0, floodStreaming)
	defer func() {
		for _, s := range streams {
			s.conn.Close()
		}
	}()
	for _, id := range streaming {
		s, err := openStream(px.Addr(), id)
		if err != nil {
			return nil, err
		}
		streams = append(streams, s)
	}
	res := &floodResult{flood: o.flood}
	fmt.Fprintf(e.log, "flood: %d initializes from one client, max_sessions %d, %d sessions calling every %v, %d with a GET stream\n",
		o.flood, floodMaxSessions, floodCalling, floodCallEvery, floodStreaming)
	stop := make(chan struct{})
	var failures atomic.Int64
	var wg sync.WaitGroup
	for _, id := range calling {
		wg.Go(func() { keepCalling(hc, px.Addr(), id, stop, &failures) })
	}
	start := time.Now()
	err = createSessions(px.Addr(), o.flood, 32, nil)
	res.floodTime = time.Since(start)
	close(stop)
	wg.Wait()
	if err != nil {
		return nil, err
	}
	res.callFailures = int(failures.Load())
	for _, id := range calling {
		if usePost(hc, px.Addr(), id) == http.StatusAccepted {
			res.callingOK++
		}
	}
	for i, id := range streaming {
		if !streams[i].closed.Load() && usePost(hc, px.Addr(), id) == http.StatusAccepted {
			res.streamingOK++
		}
	}
	res.idleEvicted = usePost(hc, px.Addr(), idle) == http.StatusNotFound
	res.hwm = procStatus(px.Pid(), "VmHWM")
	var tables []struct{ Sessions int }
	if err := getJSON("http://"+px.admin+"/mcp_sessions/", &tables); err == nil {
		for _, t := range tables {
			res.tableSessions += t.Sessions
		}
	}
	fmt.Fprintf(e.log, "flood: %d/%d calling and %d/%d streaming sessions still pinned after %v\n",
		res.callingOK, floodCalling, res.streamingOK, floodStreaming, res.floodTime.Round(time.Millisecond))
	return res, nil
}

// keepCalling uses session id every floodCallEvery until stop, counting
// uses that do not get the upstream's 202.
func keepCalling(hc *http.Client, addr, id string, stop <-chan struct{}, failures *atomic.Int64) {
	t := time.NewTicker(floodCallEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if usePost(hc, addr, id) != http.StatusAccepted {
				failures.Add(1)
			}
		}
	}
}

// usePost sends a notification of session id through the proxy and returns
// the status: the upstream double's 202, or the proxy's 404 once the
// session is no longer pinned (0 on a transport error).
func usePost(hc *http.Client, addr, id string) int {
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/", strings.NewReader(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", id)
	resp, err := hc.Do(req)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func (r *report) writeFlood(w io.Writer) {
	fmt.Fprintf(w, "## Initialize flood\n\n")
	if r.floodErr != nil {
		fmt.Fprintf(w, "Error: %s\n\n", oneLine(r.floodErr.Error()))
		return
	}
	f := r.flood
	fmt.Fprintf(w, "Caddy `mcp_proxy` with `max_sessions %d` over 3 upstream doubles; %d sessions used every %v and %d holding a GET stream "+
		"while one client sends %d initializes (each a new session).\n\n", floodMaxSessions, floodCalling, floodCallEvery, floodStreaming, f.flood)
	fmt.Fprintf(w, "| figure | value |\n|---|--:|\n")
	fmt.Fprintf(w, "| flood | %d initializes in %s (%.0f/s) |\n", f.flood, f.floodTime.Round(time.Millisecond), float64(f.flood)/f.floodTime.Seconds())
	fmt.Fprintf(w, "| calling sessions still pinned | %d/%d (%s) |\n", f.callingOK, floodCalling, mark(f.callingOK == floodCalling))
	fmt.Fprintf(w, "| GET-stream sessions still pinned | %d/%d (%s) |\n", f.streamingOK, floodStreaming, mark(f.streamingOK == floodStreaming))
	fmt.Fprintf(w, "| calls during the flood not answered by the upstream | %d |\n", f.callFailures)
	fmt.Fprintf(w, "| control: a session never used since its initialize was pushed out | %v |\n", f.idleEvicted)
	fmt.Fprintf(w, "| sessions in the table after | %d |\n", f.tableSessions)
	fmt.Fprintf(w, "| Caddy peak RSS (VmHWM) | %s |\n", mib(f.hwm))
	fmt.Fprintln(w)
}
