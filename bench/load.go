package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The load generator: N goroutines, each one MCP session on its own
// keep-alive HTTP/1.1 connection, as N separate clients would have. Requests
// are written as bytes prepared once per session (only the JSON-RPC id
// changes), responses are parsed with net/http's own reader. This path costs
// far less CPU than net/http's client or the go-sdk client, so the proxy and
// the servers get as much of the shared CPU as possible; the report shows
// what the generator used.

// protocolVersion is the MCP protocol version the sessions negotiate: the
// last one with sessions.
const protocolVersion = "2025-11-25"

const initializeBody = `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"` + protocolVersion +
	`","capabilities":{},"clientInfo":{"name":"mcp-affinity-bench","version":"v0"}}}`

const initializedBody = `{"jsonrpc":"2.0","method":"notifications/initialized"}`

// loadConfig is one load run against one target.
type loadConfig struct {
	// addrs are the host:port the sessions connect to, session i to
	// addrs[i%len(addrs)]: the proxy, or for direct the servers themselves.
	addrs []string
	// callAddrs, if set, are where the sessions send their calls once set
	// up, session i to callAddrs[i%len(callAddrs)]: another Caddy replica
	// than the one that saw the initialize.
	callAddrs []string
	sessions  int
	warmup    time.Duration
	duration  time.Duration
	// onWindow, if set, is called when the measured window opens and closes.
	onWindow func(open bool)
	// sealed: the proxy seals session IDs, so servers see IDs of their own.
	sealed bool
}

// loadResult is what a load run measured inside its window.
type loadResult struct {
	window    time.Duration
	calls     int // successful calls, answered by the session's own server
	errors    int // failed calls that were not misroutes
	misroutes int // calls answered by another server, or "session not found"
	setupErrs int // sessions that could not be set up
	lat       []time.Duration
	genCPU    time.Duration // the generator's CPU time inside the window
	firstErr  string
}

func (r loadResult) callsPerSec() float64 { return float64(r.calls) / r.window.Seconds() }

// percentile returns the p-th percentile (0-100) of the sorted latencies.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

// session is one MCP session of the load generator.
type session struct {
	addr   string
	conn   net.Conn
	br     *bufio.Reader
	id     string // Mcp-Session-Id
	server string // the server that answered initialize
	seen   string // the session ID that server reported on the first call
	sealed bool   // seen must differ from id (sealed session IDs), else equal it
	req    []byte // reused request buffer
	body   []byte // reused response body buffer
	nextID int64

	// results, owned by the session goroutine until the run ends
	lat                     []time.Duration
	calls, errors, misroute int
	firstErr                string
}

var errClosed = errors.New("connection closed by peer")

func (s *session) dial() error {
	if s.conn != nil {
		s.conn.Close()
	}
	c, err := net.DialTimeout("tcp", s.addr, 5*time.Second)
	if err != nil {
		s.conn = nil
		return err
	}
	s.conn = c
	if s.br == nil {
		s.br = bufio.NewReaderSize(c, 16<<10)
	} else {
		s.br.Reset(c)
	}
	return nil
}

// do sends one request with the given method and body and returns the
// response status, headers and body (valid until the next call).
func (s *session) do(method string, body []byte, withSession bool) (int, http.Header, []byte, error) {
	if s.conn == nil {
		if err := s.dial(); err != nil {
			return 0, nil, nil, err
		}
	}
	r := s.req[:0]
	r = append(r, method...)
	r = append(r, " /mcp HTTP/1.1\r\nHost: "...)
	r = append(r, s.addr...)
	r = append(r, "\r\nUser-Agent: mcp-affinity-bench\r\n"...)
	if method == http.MethodPost {
		r = append(r, "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"...)
	}
	if withSession {
		r = append(r, "Mcp-Session-Id: "...)
		r = append(r, s.id...)
		r = append(r, "\r\nMcp-Protocol-Version: "+protocolVersion+"\r\n"...)
	}
	r = append(r, "Content-Length: "...)
	r = strconv.AppendInt(r, int64(len(body)), 10)
	r = append(r, "\r\n\r\n"...)
	r = append(r, body...)
	s.req = r
	_ = s.conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := s.conn.Write(r); err != nil {
		s.conn.Close()
		s.conn = nil
		return 0, nil, nil, err
	}
	resp, err := http.ReadResponse(s.br, nil)
	if err != nil {
		s.conn.Close()
		s.conn = nil
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = errClosed
		}
		return 0, nil, nil, err
	}
	s.body = s.body[:0]
	for {
		if len(s.body) == cap(s.body) {
			s.body = slices.Grow(s.body, 4096)
		}
		n, err := resp.Body.Read(s.body[len(s.body):cap(s.body)])
		s.body = s.body[:len(s.body)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			s.conn.Close()
			s.conn = nil
			return 0, nil, nil, err
		}
	}
	resp.Body.Close()
	if resp.Close {
		s.conn.Close()
		s.conn = nil
	}
	return resp.StatusCode, resp.Header, s.body, nil
}

// jsonPayload returns the JSON-RPC message of a response body: the body
// itself for application/json, the data of the first event for
// text/event-stream.
func jsonPayload(h http.Header, body []byte) []byte {
	if ct := h.Get("Content-Type"); len(ct) < 17 || ct[:17] != "text/event-stream" {
		return body
	}
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			return bytes.TrimSpace(d)
		}
	}
	return nil
}

// setup opens the session: initialize, then notifications/initialized.
func (s *session) setup() error {
	status, h, body, err := s.do(http.MethodPost, []byte(initializeBody), false)
	if err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	if status != http.StatusOK {
		return fmt.Errorf("initialize: status %d: %.200s", status, body)
	}
	s.id = h.Get("Mcp-Session-Id")
	if s.id == "" {
		return errors.New("initialize: no Mcp-Session-Id")
	}
	msg := jsonPayload(h, body)
	const key = `"serverInfo":{"name":"`
	i := bytes.Index(msg, []byte(key))
	if i < 0 {
		return fmt.Errorf("initialize: no serverInfo in %.200s", msg)
	}
	rest := msg[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return fmt.Errorf("initialize: bad serverInfo in %.200s", msg)
	}
	s.server = string(rest[:j])
	status, _, body, err = s.do(http.MethodPost, []byte(initializedBody), true)
	if err != nil {
		return fmt.Errorf("notifications/initialized: %w", err)
	}
	if status != http.StatusAccepted {
		return fmt.Errorf("notifications/initialized: status %d: %.200s", status, body)
	}
	return nil
}

// call calls the whoami tool once and classifies the answer.
func (s *session) call(buf []byte) (ok, misroute bool, why string) {
	s.nextID++
	body := append(buf[:0], `{"jsonrpc":"2.0","id":`...)
	body = strconv.AppendInt(body, s.nextID, 10)
	body = append(body, `,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`...)
	status, h, resp, err := s.do(http.MethodPost, body, true)
	if err != nil {
		return false, false, err.Error()
	}
	if status == http.StatusNotFound {
		return false, true, fmt.Sprintf("status 404: %.200s", resp)
	}
	if status != http.StatusOK {
		return false, false, fmt.Sprintf("status %d: %.200s", status, resp)
	}
	msg := jsonPayload(h, resp)
	// A correct answer carries our id and names our server and session.
	want := make([]byte, 0, 128)
	want = append(want, `"id":`...)
	want = strconv.AppendInt(want, s.nextID, 10)
	want = append(want, ',')
	if !bytes.Contains(msg, want) {
		return false, false, fmt.Sprintf("answer without id %d: %.200s", s.nextID, msg)
	}
	if s.seen == "" {
		if s.seen = sessionSeen(msg); s.seen == "" || s.sealed == (s.seen == s.id) {
			return false, false, fmt.Sprintf("server saw session %q for client session %q (sealed IDs: %v)", s.seen, s.id, s.sealed)
		}
	}
	want = append(want[:0], `"structuredContent":{"server":"`...)
	want = append(want, s.server...)
	want = append(want, `","session":"`...)
	want = append(want, s.seen...)
	want = append(want, `"}`...)
	if !bytes.Contains(msg, want) {
		if bytes.Contains(msg, []byte(`"structuredContent"`)) {
			return false, true, fmt.Sprintf("misrouted: session of %s got %.200s", s.server, msg)
		}
		return false, false, fmt.Sprintf("unexpected answer: %.200s", msg)
	}
	return true, false, ""
}

// sessionSeen returns the session ID a whoami answer reports, or "".
func sessionSeen(msg []byte) string {
	const key = `"session":"`
	i := bytes.Index(msg, []byte(key))
	if i < 0 {
		return ""
	}
	rest := msg[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return ""
	}
	return string(rest[:j])
}

// close ends the session with DELETE and closes its connection.
func (s *session) close() {
	if s.id != "" {
		_, _, _, _ = s.do(http.MethodDelete, nil, true)
	}
	if s.conn != nil {
		s.conn.Close()
	}
}

// runLoad runs cfg: sets up every session, warms up, measures for
// cfg.duration, then deletes the sessions.
func runLoad(cfg loadConfig) loadResult {
	sessions := make([]*session, cfg.sessions)
	var setupErrs atomic.Int64
	var setupErr atomic.Value
	var wg sync.WaitGroup
	for i := range sessions {
		s := &session{addr: cfg.addrs[i%len(cfg.addrs)], sealed: cfg.sealed, req: make([]byte, 0, 512), body: make([]byte, 0, 4096)}
		sessions[i] = s
		wg.Go(func() {
			if err := s.setup(); err != nil {
				setupErrs.Add(1)
				setupErr.CompareAndSwap(nil, err.Error())
				s.id = ""
			}
		})
	}
	wg.Wait()
	for i, s := range sessions {
		if len(cfg.callAddrs) > 0 && s.conn != nil {
			s.conn.Close()
			s.conn, s.addr = nil, cfg.callAddrs[i%len(cfg.callAddrs)]
		}
	}

	start := time.Now()
	winStart := start.Add(cfg.warmup)
	winEnd := winStart.Add(cfg.duration)
	var stop atomic.Bool
	for _, s := range sessions {
		if s.id == "" {
			continue
		}
		s.lat = make([]time.Duration, 0, 1<<14)
		wg.Go(func() {
			buf := make([]byte, 0, 256)
			for !stop.Load() {
				t0 := time.Now()
				ok, misroute, why := s.call(buf)
				t1 := time.Now()
				if t0.Before(winStart) || t1.After(winEnd) {
					if !ok && s.conn == nil {
						time.Sleep(10 * time.Millisecond) // do not spin on a dead target
					}
					continue
				}
				switch {
				case ok:
					s.calls++
					s.lat = append(s.lat, t1.Sub(t0))
				case misroute:
					s.misroute++
				default:
					s.errors++
				}
				if !ok && s.firstErr == "" {
					s.firstErr = why
				}
				if !ok && s.conn == nil {
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	time.Sleep(time.Until(winStart))
	if cfg.onWindow != nil {
		cfg.onWindow(true)
	}
	cpu0 := selfCPU()
	time.Sleep(time.Until(winEnd))
	cpu1 := selfCPU()
	if cfg.onWindow != nil {
		cfg.onWindow(false)
	}
	stop.Store(true)
	wg.Wait()

	res := loadResult{window: cfg.duration, genCPU: cpu1 - cpu0, setupErrs: int(setupErrs.Load())}
	if e, _ := setupErr.Load().(string); e != "" {
		res.firstErr = "setup: " + e
	}
	for _, s := range sessions {
		res.calls += s.calls
		res.errors += s.errors
		res.misroutes += s.misroute
		res.lat = append(res.lat, s.lat...)
		if res.firstErr == "" {
			res.firstErr = s.firstErr
		}
	}
	slices.Sort(res.lat)
	for _, s := range sessions {
		wg.Go(s.close)
	}
	wg.Wait()
	return res
}
