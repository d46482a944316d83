package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// streamsResult is the held-streams figure.
type streamsResult struct {
	label                                             string
	n, opened, held, upstreamOpen, fds, tableSessions int
	proto                                             string
	hold, ping, openTime                              time.Duration
	rssBefore, rssHeld, rssPeak                       int64
	firstErr                                          string
}

// heldStream is one open GET stream of the client side.
type heldStream struct {
	conn      net.Conn
	lastEvent atomic.Int64 // Unix nanoseconds of the last event read
	closed    atomic.Bool
}

// streamsPart opens o.streams GET SSE streams through Caddy mcp_proxy, all
// at once, holds them for o.streamHold and checks that every one stays open
// and keeps delivering the upstreams' events. It does the same through stock
// Caddy reverse_proxy (round_robin; the doubles accept any session on any
// upstream), so that the plugin's own share of the proxy's memory shows.
func (e *env) streamsPart(o *options) ([]*streamsResult, error) {
	var out []*streamsResult
	for _, target := range []struct{ key, label string }{
		{"mcp_proxy", "Caddy mcp_proxy"},
		{"stock", "stock Caddy reverse_proxy (round_robin)"},
	} {
		r, err := e.holdStreams(o, target.key)
		if r != nil {
			r.label = target.label
			out = append(out, r)
		}
		if err != nil {
			return out, fmt.Errorf("%s: %w", target.label, err)
		}
	}
	return out, nil
}

// holdStreams is one target of streamsPart.
func (e *env) holdStreams(o *options, key string) (*streamsResult, error) {
	defer e.stopAll()
	n := o.streams
	res := &streamsResult{n: n, hold: o.streamHold, ping: o.streamPing}
	// Each stream holds a client connection and, over HTTP/1.1, an upstream
	// connection in the proxy: 2 file descriptors.
	soft, _ := nofileLimit()
	var h2c bool
	switch o.streamProto {
	case "h1", "h2c":
		h2c = o.streamProto == "h2c"
	case "auto":
		h2c = uint64(2*n+1000) > soft
	default:
		return nil, fmt.Errorf("-stream-upstream must be h1, h2c or auto")
	}
	res.proto = "HTTP/1.1, one upstream connection per stream"
	if h2c {
		res.proto = "h2c"
		if o.streamProto == "auto" {
			res.proto = fmt.Sprintf("h2c, because the open-file limit (%d) is too low for 2 fds per stream over HTTP/1.1", soft)
		}
	}

	fmt.Fprintf(e.log, "streams %s: starting 3 upstream doubles and Caddy\n", key)
	_, addrs, err := e.startDoubles(3, time.Millisecond, o.streamPing, h2c)
	if err != nil {
		return nil, err
	}
	extra := ""
	if h2c {
		extra = "\t\ttransport mcp {\n\t\t\tversions h2c\n\t\t}\n"
	}
	route := mcpProxyRoute(addrs, max(n+1000, 100_000), extra)
	if key == "stock" {
		route = fmt.Sprintf("reverse_proxy %s {\n\t\tlb_policy round_robin\n\t\theader_up Host {upstream_hostport}\n%s\t}",
			strings.Join(addrs, " "), extra)
	}
	px, err := e.startCaddy("streams-"+key, route)
	if err != nil {
		return nil, err
	}

	fmt.Fprintf(e.log, "streams %s: creating %d sessions through the proxy\n", key, n)
	ids := make([]string, n)
	if err := createSessions(px.Addr(), len(ids), 32, func(i int, id string) { ids[i] = id }); err != nil {
		return nil, err
	}
	time.Sleep(500 * time.Millisecond)
	res.rssBefore = procStatus(px.Pid(), "VmRSS")

	fmt.Fprintf(e.log, "streams %s: opening %d GET streams\n", key, n)
	streams := make([]*heldStream, n)
	var firstErr atomic.Value
	var wg sync.WaitGroup
	sem := make(chan struct{}, 128)
	start := time.Now()
	for i := range streams {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s, err := openStream(px.Addr(), ids[i])
			if err != nil {
				firstErr.CompareAndSwap(nil, err.Error())
				return
			}
			streams[i] = s
		})
	}
	wg.Wait()
	res.openTime = time.Since(start)
	for _, s := range streams {
		if s != nil {
			res.opened++
		}
	}
	fmt.Fprintf(e.log, "streams %s: %d opened in %v; holding for %v\n", key, res.opened, res.openTime.Round(time.Millisecond), o.streamHold)
	time.Sleep(o.streamHold)
	end := time.Now()
	res.rssHeld = procStatus(px.Pid(), "VmRSS")
	res.rssPeak = procStatus(px.Pid(), "VmHWM")
	res.fds = fdCount(px.Pid())
	for _, s := range streams {
		if s != nil && !s.closed.Load() && end.Sub(time.Unix(0, s.lastEvent.Load())) <= 2*o.streamPing {
			res.held++
		}
	}
	for _, d := range addrs {
		var st struct{ Open int }
		if err := getJSON("http://"+d+"/stats", &st); err == nil {
			res.upstreamOpen += st.Open
		}
	}
	res.tableSessions = -1
	if key == "mcp_proxy" {
		var tables []struct{ Sessions int }
		if err := getJSON("http://"+px.admin+"/mcp_sessions/", &tables); err == nil {
			res.tableSessions = 0
			for _, t := range tables {
				res.tableSessions += t.Sessions
			}
		}
	}
	if e, _ := firstErr.Load().(string); e != "" {
		res.firstErr = e
	}
	for _, s := range streams {
		if s != nil {
			s.conn.Close()
		}
	}
	if px.Exited() {
		return res, fmt.Errorf("caddy exited: %s", px.Log().Tail(2000))
	}
	fmt.Fprintf(e.log, "streams %s: %d held, proxy RSS %s\n", key, res.held, mib(res.rssHeld))
	return res, nil
}

// createSessions creates n sessions at addr with conc workers, each on its
// own keep-alive connection, and calls created (if not nil) with each new
// session's index and ID, from the workers' goroutines.
func createSessions(addr string, n, conc int, created func(i int, id string)) error {
	var next atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			s := &session{addr: addr, req: make([]byte, 0, 512), body: make([]byte, 0, 4096)}
			defer func() {
				if s.conn != nil {
					s.conn.Close()
				}
			}()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || firstErr.Load() != nil {
					return
				}
				status, h, body, err := s.do(http.MethodPost, []byte(initializeBody), false)
				if err == nil && (status != http.StatusOK || h.Get("Mcp-Session-Id") == "") {
					err = fmt.Errorf("status %d: %.200s", status, body)
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				if created != nil {
					created(i, h.Get("Mcp-Session-Id"))
				}
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return fmt.Errorf("creating sessions: %w", err)
	}
	return nil
}

// openStream opens a GET stream of session id at addr, waits for its first
// event and keeps reading its events in the background.
func openStream(addr, id string) (*heldStream, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := c.Write(getRequest(addr, id)); err != nil {
		c.Close()
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 1024), nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		c.Close()
		return nil, fmt.Errorf("GET stream: status %d", resp.StatusCode)
	}
	br := bufio.NewReaderSize(resp.Body, 256)
	if _, err := readEvent(br); err != nil {
		c.Close()
		return nil, fmt.Errorf("first event: %w", err)
	}
	_ = c.SetDeadline(time.Time{})
	s := &heldStream{conn: c}
	s.lastEvent.Store(time.Now().UnixNano())
	go func() {
		for {
			if _, err := readEvent(br); err != nil {
				s.closed.Store(true)
				return
			}
			s.lastEvent.Store(time.Now().UnixNano())
		}
	}()
	return s, nil
}

// getJSON GETs url and decodes its JSON body into v.
func getJSON(url string, v any) error {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
