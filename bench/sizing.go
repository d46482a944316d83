package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The sizing part: what a session costs in a real Caddy, per session store,
// failover setting and sealing, so that the docs' sizing table is measured.
// Each configuration gets a fresh Caddy (and a fresh Redis for the redis
// store) in front of the same 3 upstream doubles; the part opens
// -sizing-sessions sessions through it, as a client does (initialize, then
// notifications/initialized), and reads the memory of Caddy (and Redis)
// against a baseline of the same process before the first session.

// sizingConfig is one configuration of the sizing part.
type sizingConfig struct {
	redis    bool // store redis; else the memory store
	failover bool // failover reinitialize
	sealed   bool // seal_session_ids
}

// String is the configuration as -sizing-configs names it:
// store/failover/sealed, such as redis/reinitialize/on.
func (c sizingConfig) String() string {
	return map[bool]string{false: "memory", true: "redis"}[c.redis] + "/" +
		map[bool]string{false: "off", true: "reinitialize"}[c.failover] + "/" +
		map[bool]string{false: "off", true: "on"}[c.sealed]
}

// allSizingConfigs are the 8 configurations, in the report's order.
func allSizingConfigs() []sizingConfig {
	var out []sizingConfig
	for _, redis := range []bool{false, true} {
		for _, failover := range []bool{false, true} {
			for _, sealed := range []bool{false, true} {
				out = append(out, sizingConfig{redis, failover, sealed})
			}
		}
	}
	return out
}

// parseSizingConfigs reads -sizing-configs: "all", or configurations as
// String writes them, separated by commas.
func parseSizingConfigs(s string) ([]sizingConfig, error) {
	all := allSizingConfigs()
	if s == "all" {
		return all, nil
	}
	var out []sizingConfig
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		found := false
		for _, c := range all {
			if c.String() == name {
				out, found = append(out, c), true
			}
		}
		if !found {
			return nil, fmt.Errorf("-sizing-configs: unknown configuration %q: give store/failover/sealed, such as memory/off/off or redis/reinitialize/on, or all", name)
		}
	}
	return out, nil
}

// route is the configuration's mcp_proxy over upstreams with room for n
// sessions, and the global options it needs with Redis at redisAddr.
func (c sizingConfig) route(upstreams []string, n int, redisAddr string) (global, route string) {
	var extra strings.Builder
	if c.failover {
		extra.WriteString("\t\tfailover reinitialize\n")
	}
	if c.sealed {
		extra.WriteString("\t\tseal_session_ids {env." + sealKeyEnv + "}\n")
	}
	if c.redis {
		global = redisStoreOption(redisAddr)
	}
	return global, mcpProxyRoute(upstreams, n+n/10, extra.String())
}

// memSnapshot is what one configuration's processes use at one point.
type memSnapshot struct {
	heap  int64 // Caddy's Go heap in use (HeapAlloc) after a forced GC
	rss   int64 // Caddy's VmRSS after that GC
	hwm   int64 // Caddy's peak RSS so far (VmHWM)
	redis int64 // Redis's used_memory; 0 without Redis
}

// sizingResult is one configuration's measurement.
type sizingResult struct {
	cfg        sizingConfig
	n          int   // sessions opened
	held       int   // sessions in the table afterwards (admin API)
	redisKeys  int64 // keys in Redis afterwards (DBSIZE)
	idLen      int   // length of the session ID the client got, bytes
	fill       time.Duration
	caddyCPU   time.Duration // Caddy's CPU time while the sessions were opened
	genCPU     time.Duration // this program's
	base, full memSnapshot
	err        error
}

// perSession returns (full-base)/n of the field pick selects, in bytes.
func (r *sizingResult) perSession(pick func(memSnapshot) int64) float64 {
	return float64(pick(r.full)-pick(r.base)) / float64(r.n)
}

// sizingPart runs every configuration of -sizing-configs in turn.
func (e *env) sizingPart(o *options) ([]*sizingResult, error) {
	defer e.stopAll()
	_, addrs, err := e.startDoubles(3, time.Millisecond, time.Hour, false)
	if err != nil {
		return nil, err
	}
	var out []*sizingResult
	for _, cfg := range o.sizingConfigs {
		fmt.Fprintf(e.log, "sizing %s: %d sessions, %d at once\n", cfg, o.sizingSessions, o.sizingConc)
		res := e.sizeOne(o, cfg, addrs)
		if res.err != nil {
			fmt.Fprintf(e.log, "sizing %s: %v\n", cfg, res.err)
		} else {
			fmt.Fprintf(e.log, "sizing %s: %d held, peak RSS %s (+%.0f B/session), heap +%.0f B/session, Redis +%.0f B/session, filled in %v\n",
				cfg, res.held, mib(res.full.hwm), res.perSession(func(m memSnapshot) int64 { return m.hwm }),
				res.perSession(func(m memSnapshot) int64 { return m.heap }), res.perSession(func(m memSnapshot) int64 { return m.redis }),
				res.fill.Round(time.Second))
		}
		out = append(out, res)
	}
	return out, nil
}

// sizeOne measures one configuration with fresh Caddy and Redis processes,
// which it stops when done.
func (e *env) sizeOne(o *options, cfg sizingConfig, upstreams []string) *sizingResult {
	res := &sizingResult{cfg: cfg, n: o.sizingSessions}
	name := "sizing-" + strings.ReplaceAll(cfg.String(), "/", "-")
	redisAddr := ""
	if cfg.redis {
		redis, err := e.startRedis(name + "-redis")
		if err != nil {
			res.err = err
			return res
		}
		defer redis.Stop(stopGrace)
		redisAddr = redis.Addr()
	}
	global, route := cfg.route(upstreams, res.n, redisAddr)
	px, err := e.startCaddyWith(name, global, route)
	if err != nil {
		res.err = err
		return res
	}
	defer px.Stop(stopGrace)
	// Warm up connections and code paths without opening a session: a
	// sessionless GET is balanced to an upstream, which answers 405.
	if err := sessionlessRequests(px.Addr(), 20*o.sizingConc, o.sizingConc); err != nil {
		res.err = fmt.Errorf("warm-up: %w", err)
		return res
	}
	if res.base, err = snapshot(px, redisAddr); err != nil {
		res.err = err
		return res
	}
	start, cpu0, gen0 := time.Now(), procCPU(px.Pid()), selfCPU()
	var idLen atomic.Int64
	if err := openSessions(px.Addr(), res.n, o.sizingConc, o.sizingConfirm, func(id string) { idLen.Store(int64(len(id))) }); err != nil {
		res.err = err
		return res
	}
	res.fill, res.idLen = time.Since(start), int(idLen.Load())
	res.caddyCPU, res.genCPU = procCPU(px.Pid())-cpu0, selfCPU()-gen0
	if res.full, err = snapshot(px, redisAddr); err != nil {
		res.err = err
		return res
	}
	if o.pprofDir != "" {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		path := filepath.Join(o.pprofDir, name+".heap.pprof")
		if err := fetch(ctx, "http://"+px.admin+"/debug/pprof/heap", path); err != nil {
			fmt.Fprintf(e.log, "  pprof heap: %v\n", err)
		}
		cancel()
	}
	var tables []struct{ Sessions int }
	if err := getJSON("http://"+px.admin+"/mcp_sessions/", &tables); err != nil {
		res.err = err
		return res
	}
	for _, t := range tables {
		res.held += t.Sessions
	}
	if redisAddr != "" {
		if res.redisKeys, err = redisInt(redisAddr, "DBSIZE", ""); err != nil {
			res.err = err
			return res
		}
	}
	switch {
	case px.Exited():
		res.err = fmt.Errorf("caddy exited: %s", px.Log().Tail(2000))
	case res.held != res.n:
		res.err = fmt.Errorf("the table holds %d sessions, not the %d opened", res.held, res.n)
	case redisAddr != "" && res.redisKeys < int64(res.n):
		res.err = fmt.Errorf("redis holds %d keys, fewer than the %d sessions opened: the store missed writes", res.redisKeys, res.n)
	}
	return res
}

// snapshot reads Caddy's memory after a forced GC, and Redis's at redisAddr
// when not empty.
func snapshot(px *proxyProc, redisAddr string) (memSnapshot, error) {
	var m memSnapshot
	var err error
	if m.rss, m.heap, err = caddyMemory(px); err != nil {
		return m, err
	}
	m.hwm = procStatus(px.Pid(), "VmHWM")
	if redisAddr != "" {
		if m.redis, err = redisInt(redisAddr, "INFO", "used_memory"); err != nil {
			return m, err
		}
	}
	return m, nil
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

// redisInt sends Redis at addr one command without arguments (an inline
// command, RESP) and returns its integer answer, or with field, the value
// of field in the answer's "name:value" lines (INFO).
func redisInt(addr, command, field string) (int64, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "%s\r\n", command); err != nil {
		return 0, err
	}
	br := bufio.NewReader(c)
	head, err := br.ReadString('\n')
	if err != nil {
		return 0, err
	}
	head = strings.TrimSpace(head)
	switch {
	case strings.HasPrefix(head, ":") && field == "":
		return strconv.ParseInt(head[1:], 10, 64)
	case strings.HasPrefix(head, "$") && field != "":
		n, err := strconv.Atoi(head[1:])
		if err != nil {
			return 0, fmt.Errorf("redis %s: %q", command, head)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(br, body); err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(body), "\r\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				return strconv.ParseInt(v, 10, 64)
			}
		}
		return 0, fmt.Errorf("redis %s: no %s", command, field)
	}
	return 0, fmt.Errorf("redis %s: %q", command, head)
}

// openSessions opens n sessions at addr with initialize, and with confirm
// then notifications/initialized as a client does, with conc workers each
// on its own keep-alive connection, and calls opened with each session's ID.
func openSessions(addr string, n, conc int, confirm bool, opened func(id string)) error {
	return eachRequest(n, conc, addr, func(s *session) error {
		s.id = ""
		status, h, body, err := s.do(http.MethodPost, []byte(initializeBody), false)
		if err == nil && (status != http.StatusOK || h.Get("Mcp-Session-Id") == "") {
			err = fmt.Errorf("initialize: status %d: %.200s", status, body)
		}
		if err != nil {
			return err
		}
		s.id = h.Get("Mcp-Session-Id")
		if !confirm {
			opened(s.id)
			return nil
		}
		if status, _, body, err = s.do(http.MethodPost, []byte(initializedBody), true); err == nil && status != http.StatusAccepted {
			err = fmt.Errorf("notifications/initialized: status %d: %.200s", status, body)
		}
		if err == nil {
			opened(s.id)
		}
		return err
	})
}

// sessionlessRequests sends n GETs without a session to addr, conc at a
// time; the proxy balances them and the upstream doubles answer 405.
func sessionlessRequests(addr string, n, conc int) error {
	return eachRequest(n, conc, addr, func(s *session) error {
		status, _, body, err := s.do(http.MethodGet, nil, false)
		if err == nil && status != http.StatusMethodNotAllowed {
			err = fmt.Errorf("GET without a session: status %d, want the upstream's 405: %.200s", status, body)
		}
		return err
	})
}

// eachRequest runs do n times over conc workers, each with a session of its
// own on its own keep-alive connection, and returns the first error.
func eachRequest(n, conc int, addr string, do func(*session) error) error {
	var next atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			s := &session{addr: addr, req: make([]byte, 0, 1024), body: make([]byte, 0, 4096)}
			defer func() {
				if s.conn != nil {
					s.conn.Close()
				}
			}()
			for next.Add(1) <= int64(n) && firstErr.Load() == nil {
				if err := do(s); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return err
	}
	return nil
}
