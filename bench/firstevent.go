package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// feResult is the first-event latency through one target.
type feResult struct {
	key, label string
	reqToEvent []time.Duration // sorted
	transit    []time.Duration // sorted
	errors     int
	firstErr   string
	err        error
}

// firstEventPart times the first event of GET SSE streams direct, through
// mcp_proxy and through HAProxy (with and, for reference, without
// `option http-no-delay`), all in front of the same 3 upstream doubles.
func (e *env) firstEventPart(o *options) ([]feResult, error) {
	defer e.stopAll()
	fmt.Fprintf(e.log, "firstevent: starting 3 upstream doubles\n")
	_, addrs, err := e.startDoubles(3, o.eventDelay, time.Hour, false)
	if err != nil {
		return nil, err
	}
	targets := []struct {
		key, label string
		start      func() (*proxyProc, error)
	}{
		{"direct", "direct (3 doubles)", nil},
		{"mcp_proxy", "Caddy mcp_proxy (3)", func() (*proxyProc, error) {
			return e.startCaddy("firstevent-mcp_proxy", mcpProxyRoute(addrs, 0, ""))
		}},
		{"haproxy", "HAProxy stick table, http-no-delay (3)", func() (*proxyProc, error) {
			return e.startHAProxy("firstevent-haproxy", addrs, true)
		}},
		{"haproxy-default", "HAProxy stick table, without http-no-delay (3), for reference", func() (*proxyProc, error) {
			return e.startHAProxy("firstevent-haproxy-default", addrs, false)
		}},
	}
	var out []feResult
	for _, t := range targets {
		fmt.Fprintf(e.log, "firstevent %-15s ... ", t.key)
		res := feResult{key: t.key, label: t.label}
		dest := addrs
		var px *proxyProc
		if t.start != nil {
			px, err = t.start()
			if err != nil {
				res.err = err
				out = append(out, res)
				fmt.Fprintf(e.log, "error: %v\n", err)
				continue
			}
			dest = []string{px.Addr()}
		}
		res.reqToEvent, res.transit, res.errors, res.firstErr, res.err = timeFirstEvents(dest, o.events, o.eventConc)
		if px != nil {
			px.Stop(stopGrace)
		}
		if res.err != nil {
			fmt.Fprintf(e.log, "error: %v\n", res.err)
		} else {
			fmt.Fprintf(e.log, "p50 %s p99 %s\n", ms(percentile(res.reqToEvent, 50)), ms(percentile(res.reqToEvent, 99)))
		}
		out = append(out, res)
	}
	return out, nil
}

// mintSession creates a session at addr with an initialize-shaped POST and
// returns its ID.
func mintSession(addr string) (string, error) {
	s := &session{addr: addr, req: make([]byte, 0, 512)}
	defer func() {
		if s.conn != nil {
			s.conn.Close()
		}
	}()
	status, h, body, err := s.do(http.MethodPost, []byte(initializeBody), false)
	if err != nil {
		return "", err
	}
	if status != http.StatusOK || h.Get("Mcp-Session-Id") == "" {
		return "", fmt.Errorf("initialize: status %d, session %q: %.200s", status, h.Get("Mcp-Session-Id"), body)
	}
	return h.Get("Mcp-Session-Id"), nil
}

// getRequest is a GET stream request of session id to addr.
func getRequest(addr, id string) []byte {
	return []byte("GET /mcp HTTP/1.1\r\nHost: " + addr + "\r\nAccept: text/event-stream\r\nMcp-Session-Id: " + id +
		"\r\nMcp-Protocol-Version: " + protocolVersion + "\r\nUser-Agent: mcp-affinity-bench\r\n\r\n")
}

// readEvent reads SSE lines until the first data line and returns its value
// as the Unix nanoseconds the upstream stamped it with.
func readEvent(br *bufio.Reader) (int64, error) {
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return 0, err
		}
		if v, ok := strings.CutPrefix(line, "data: "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
}

// timeFirstEvents opens n GET streams, conc at a time, each on a new
// connection to one of dest, and times their first event.
func timeFirstEvents(dest []string, n, conc int) (reqToEvent, transit []time.Duration, errs int, firstErr string, err error) {
	const perWorker = 4 // sessions per worker
	const warm = 5      // untimed streams per worker first
	type sess struct{ addr, id string }
	sessions := make([]sess, conc*perWorker)
	for i := range sessions {
		addr := dest[i%len(dest)]
		id, err := mintSession(addr)
		if err != nil {
			return nil, nil, 0, "", fmt.Errorf("creating sessions: %w", err)
		}
		sessions[i] = sess{addr, id}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range conc {
		count := n / conc
		if w < n%conc {
			count++
		}
		wg.Go(func() {
			var lat, tr []time.Duration
			var nErr int
			var first string
			for i := range count + warm {
				s := sessions[w*perWorker+i%perWorker]
				d, t, err := firstEvent(s.addr, s.id)
				if i < warm {
					continue
				}
				if err != nil {
					nErr++
					if first == "" {
						first = err.Error()
					}
					continue
				}
				lat, tr = append(lat, d), append(tr, t)
			}
			mu.Lock()
			reqToEvent, transit = append(reqToEvent, lat...), append(transit, tr...)
			errs += nErr
			if firstErr == "" {
				firstErr = first
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(reqToEvent)
	slices.Sort(transit)
	if len(reqToEvent) == 0 {
		return nil, nil, errs, firstErr, errors.New("no stream delivered an event: " + firstErr)
	}
	return reqToEvent, transit, errs, firstErr, nil
}

// firstEvent opens one GET stream and returns the time from writing the
// request to reading the first event, and the event's transit time.
func firstEvent(addr, id string) (time.Duration, time.Duration, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req := getRequest(addr, id)
	br := bufio.NewReaderSize(c, 4096)
	t0 := time.Now()
	if _, err := c.Write(req); err != nil {
		return 0, 0, err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("GET stream: status %d", resp.StatusCode)
	}
	stamp, err := readEvent(bufio.NewReaderSize(resp.Body, 512))
	t1 := time.Now()
	if err != nil {
		return 0, 0, fmt.Errorf("reading first event: %w", err)
	}
	return t1.Sub(t0), t1.Sub(time.Unix(0, stamp)), nil
}
