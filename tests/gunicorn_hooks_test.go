package tests

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// startHookedGunicorn starts one gunicorn with examples/gunicorn's
// gunicorn.conf.py (which imports mcp_affinity_hooks.py) and workers
// workers, its shared listener on a free loopback port and its workers'
// sockets in dir, and waits until every worker serves.
func startHookedGunicorn(t *testing.T, peer gunicornPeer, name string, workers int, dir string, args ...string) *testproc.Proc {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(peer.bin, append([]string{"--chdir", peer.dir, "-c", filepath.Join(peer.dir, "gunicorn.conf.py"),
		"app:app", "--workers", strconv.Itoa(workers), "--bind", addr}, args...)...)
	g := launch(t, name, addr, withEnv(cmd, "MCP_SERVER_NAME="+name, "PYTHONDONTWRITEBYTECODE=1",
		"MCP_SOCKET_DIR="+dir, "PYTHONPATH="+peer.dir)) // gunicorn.conf.py imports mcp_affinity_hooks
	ready(t, gunicornStartTimeout, []*testproc.Proc{g}, testproc.LogCount(gunicornReady, workers), testproc.Listening())
	waitSlots(t, g, dir, workers)
	return g
}

var slotLine = regexp.MustCompile(`Worker (\d+) serves slot (\d+) at`)

// slotHistory returns, from the gunicorn log, the worker pids that served
// each slot, in the order they took it.
func slotHistory(g *testproc.Proc) map[int][]int {
	h := map[int][]int{}
	for _, m := range slotLine.FindAllStringSubmatch(g.Log().String(), -1) {
		pid, _ := strconv.Atoi(m[1])
		slot, _ := strconv.Atoi(m[2])
		h[slot] = append(h[slot], pid)
	}
	return h
}

// currentSlots returns the pid that took each slot last.
func currentSlots(g *testproc.Proc) map[int]int {
	cur := map[int]int{}
	for slot, pids := range slotHistory(g) {
		cur[slot] = pids[len(pids)-1]
	}
	return cur
}

// socketFiles returns the names of the files in dir.
func socketFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// slotSockets returns worker-0.sock ... worker-<n-1>.sock.
func slotSockets(n int) []string {
	var names []string
	for i := range n {
		names = append(names, fmt.Sprintf("worker-%d.sock", i))
	}
	return names
}

// waitSlots waits until slots 0..n-1 are served by live workers that
// answer on their sockets, and dir holds exactly their n sockets.
func waitSlots(t *testing.T, g *testproc.Proc, dir string, n int) {
	t.Helper()
	deadline := time.Now().Add(gunicornStartTimeout)
	for !slotsServed(g, dir, n) {
		if time.Now().After(deadline) {
			t.Fatalf("gunicorn %s: slots 0..%d not served after %v; files %v; log:\n%s",
				g.Name(), n-1, gunicornStartTimeout, socketFiles(t, dir), g.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func slotsServed(g *testproc.Proc, dir string, n int) bool {
	cur := currentSlots(g)
	if len(cur) < n {
		return false
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != n {
		return false
	}
	for i, name := range slotSockets(n) {
		if entries[i].Name() != name || cur[i] == 0 || syscall.Kill(cur[i], 0) != nil {
			return false
		}
		c, err := net.DialTimeout("unix", filepath.Join(dir, name), time.Second)
		if err != nil {
			return false
		}
		c.Close()
	}
	return true
}

// workerPid returns the pid in a server name of the example app, "<name>-pid<pid>".
func workerPid(server string) int {
	i := strings.LastIndex(server, "-pid")
	if i < 0 {
		return 0
	}
	pid, _ := strconv.Atoi(server[i+len("-pid"):])
	return pid
}

// liveReport is the outcome of one session that calls whoami until stopped.
type liveReport struct {
	creator   string // serverInfo.name of the initialize response: "<name>-pid<pid>"
	calls     int    // calls answered by the creator with the client's session ID
	misrouted int
	errs      []error // failed calls, in order; the session ends at a 404 or the third failure
}

// is404 reports whether err is the go-sdk client's error for a 404 answer.
func is404(err error) bool {
	return err != nil && strings.Contains(strings.ToLower(err.Error()), "not found")
}

// runLiveSessions connects n go-sdk sessions through url, then has each call
// whoami in a loop until stop is closed or a call fails. ready is closed
// once every session has answered a call.
func runLiveSessions(t *testing.T, url string, n int, ready chan<- struct{}, stop <-chan struct{}) []liveReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	reps := make([]liveReport, n)
	var started, wg sync.WaitGroup
	started.Add(n)
	for i := range reps {
		wg.Go(func() { reps[i] = callUntilStopped(ctx, url, hc, started.Done, stop) })
	}
	started.Wait()
	close(ready)
	wg.Wait()
	return reps
}

func callUntilStopped(ctx context.Context, url string, hc *http.Client, started func(), stop <-chan struct{}) liveReport {
	var rep liveReport
	once := sync.OnceFunc(started)
	defer once()
	cs, err := connect(ctx, url, hc, peerLegacyProtocol)
	if err != nil {
		rep.errs = append(rep.errs, fmt.Errorf("connect: %w", err))
		return rep
	}
	defer cs.Close()
	rep.creator = cs.InitializeResult().ServerInfo.Name
	for {
		id, err := whoami(ctx, cs)
		switch {
		case err != nil:
			rep.errs = append(rep.errs, err)
			if is404(err) || len(rep.errs) == 3 {
				return rep
			}
		case id.Server == rep.creator && id.Session == cs.ID():
			rep.calls++
		default:
			rep.misrouted++
		}
		once()
		select {
		case <-stop:
			return rep
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// liveSummary splits live sessions into those created on the workers in
// dead (pids) and the others.
type liveSummary struct {
	onDead, onDeadEnded404, onDead502First int
	others, othersOK                       int
	calls, misrouted                       int
	errs                                   []string
}

func summarizeLive(reps []liveReport, dead map[int]bool) liveSummary {
	var s liveSummary
	for _, r := range reps {
		s.calls += r.calls
		s.misrouted += r.misrouted
		for _, err := range r.errs {
			if len(s.errs) < 4 {
				s.errs = append(s.errs, err.Error())
			}
		}
		if !dead[workerPid(r.creator)] {
			s.others++
			if len(r.errs) == 0 && r.misrouted == 0 && r.creator != "" {
				s.othersOK++
			}
			continue
		}
		s.onDead++
		if n := len(r.errs); n > 0 && is404(r.errs[n-1]) {
			s.onDeadEnded404++
		}
		if len(r.errs) > 1 && strings.Contains(r.errs[0].Error(), "Bad Gateway") {
			s.onDead502First++
		}
	}
	return s
}

func (s liveSummary) String() string {
	return fmt.Sprintf("sessions on the replaced workers: %d, %d ended with 404 (%d of them had a call answered 502 first); other sessions: %d/%d ok; calls pinned %d, misrouted %d; errors %q",
		s.onDead, s.onDeadEnded404, s.onDead502First, s.othersOK, s.others, s.calls, s.misrouted, s.errs)
}

// TestInteropGunicornHooks runs one gunicorn with `workers = 3` and
// examples/gunicorn/mcp_affinity_hooks.py behind mcp_proxy with the
// unix_sockets upstream source. Every session stays on the worker that
// created it; the same gunicorn's shared port behind the same proxy breaks
// sessions (negative control); a stale socket left before the start is
// removed; the shared port keeps answering.
func TestInteropGunicornHooks(t *testing.T) {
	peer := findGunicorn(t)
	dir := shortTempDir(t)
	stale, err := net.Listen("unix", filepath.Join(dir, "worker-7.sock"))
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close() // the file stays, nobody listens: what a killed master leaves
	g := startHookedGunicorn(t, peer, "gh", 3, dir)
	if files := socketFiles(t, dir); !slices.Equal(files, slotSockets(3)) {
		t.Fatalf("socket directory holds %v, want %v (the stale worker-7.sock removed)", files, slotSockets(3))
	}

	p := startProxy(t, dynamicSocketsSite(dir))
	res := runSessions(t, p.url(), peerSessions, sessionPlan{calls: peerCalls})
	t.Logf("1 gunicorn x 3 workers with the hooks, mcp_proxy dynamic unix_sockets: %s", res)
	if res.ok != peerSessions || res.onCreator != peerTotalCalls || len(res.perServer) != 3 {
		t.Fatalf("want %d/%d sessions ok, %d calls on the creating worker, spread over 3 workers; got %s",
			peerSessions, peerSessions, peerTotalCalls, res)
	}

	fixed := startProxy(t, "mcp_proxy "+slotUpstreams(dir, 3))
	fres := runSessions(t, fixed.url(), peerSessions, sessionPlan{calls: peerCalls})
	t.Logf("the same, mcp_proxy with the fixed list of sockets: %s", fres)
	if fres.ok != peerSessions || fres.onCreator != peerTotalCalls || len(fres.perServer) != 3 {
		t.Fatalf("fixed list: want %d/%d sessions ok, %d calls on the creating worker over 3 workers; got %s",
			peerSessions, peerSessions, peerTotalCalls, fres)
	}

	shared := startProxy(t, "mcp_proxy "+g.Addr())
	sres := runSessions(t, shared.url(), peerSessions, sessionPlan{calls: peerCalls})
	t.Logf("negative control, the same gunicorn's shared port behind mcp_proxy: %s", sres)
	if sres.failed == 0 {
		t.Fatalf("negative control: sessions through the shared port all worked; got %s", sres)
	}
	if status := initializeStatus(t, "http://"+g.Addr()+"/mcp"); status != http.StatusOK {
		t.Fatalf("the shared port answers initialize with %d, want 200 (it must keep serving health checks)", status)
	}
	if err := syscall.Kill(g.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.Done():
	case <-time.After(gunicornStartTimeout):
		t.Fatalf("gunicorn did not stop on SIGTERM: %s", g.Log())
	}
	if files := socketFiles(t, dir); len(files) != 0 {
		t.Fatalf("after gunicorn stopped, the socket directory holds %v, want nothing", files)
	}
	recordInterop(interopRow{
		Server: gunicornRow(peer, "1 gunicorn × `workers = 3` with `mcp_affinity_hooks.py` (a unix socket per worker), `dynamic unix_sockets`"),
		Client: "go-sdk " + goSDKVersion,
		Result: fmt.Sprintf("%d/%d sessions ok; %d/%d calls answered by the session's worker (fixed list of the sockets: %d/%d); through the same gunicorn's shared port sessions break (negative control)",
			res.ok, peerSessions, res.onCreator, peerTotalCalls, fres.onCreator, peerTotalCalls),
	})
}

// slotUpstreams returns the upstreams unix/<dir>/worker-0.sock ... for a Caddyfile.
func slotUpstreams(dir string, n int) string {
	var ups []string
	for _, name := range slotSockets(n) {
		ups = append(ups, "unix/"+filepath.Join(dir, name))
	}
	return strings.Join(ups, " ")
}

// shortTempDir returns a temporary directory with a short path (socket
// paths must stay under 108 bytes), removed when the test ends.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mcpgh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// initializeStatus POSTs an initialize request to url and returns the status.
func initializeStatus(t *testing.T, url string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"probe","version":"0"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("initialize at %s: %v", url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// dynamicSocketsSite is an mcp_proxy whose upstreams are the worker sockets in dir.
func dynamicSocketsSite(dir string) string {
	return "mcp_proxy {\n\t\tdynamic unix_sockets " + filepath.Join(dir, "worker-*.sock") + "\n\t}"
}

// underLoad runs n live sessions through url, calls act once every session
// has answered a call, keeps the sessions calling for hold after act
// returns, and returns their reports.
func underLoad(t *testing.T, url string, n int, hold time.Duration, act func()) []liveReport {
	t.Helper()
	ready, stop, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var reps []liveReport
	go func() {
		defer close(done)
		reps = runLiveSessions(t, url, n, ready, stop)
	}()
	<-ready
	act()
	time.Sleep(hold)
	close(stop)
	<-done
	return reps
}

// TestGunicornHooksWorkerKilled: a worker killed with SIGKILL while 30
// sessions call tools. Its sessions end with 404 (their state died with
// it); every session on the other workers keeps working, each call on its
// worker; gunicorn respawns the worker on the same slot's socket, and new
// sessions reach it.
func TestGunicornHooksWorkerKilled(t *testing.T) {
	peer := findGunicorn(t)
	dir := shortTempDir(t)
	g := startHookedGunicorn(t, peer, "gk", 3, dir)
	p := startProxy(t, dynamicSocketsSite(dir))
	before := currentSlots(g)
	victim := before[1]

	reps := underLoad(t, p.url(), 30, 2*time.Second, func() {
		if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	})
	s := summarizeLive(reps, map[int]bool{victim: true})
	t.Logf("worker of slot 1 (pid %d) killed under load: %s", victim, s)
	if s.onDead == 0 || s.onDeadEnded404 != s.onDead || s.others == 0 || s.othersOK != s.others || s.misrouted != 0 {
		t.Fatalf("want every session of the killed worker ended with 404 and every other session ok; got %s", s)
	}

	waitSlots(t, g, dir, 3)
	after := currentSlots(g)
	if after[1] == victim || after[0] != before[0] || after[2] != before[2] {
		t.Fatalf("slots before the kill %v, after %v: want slot 1 respawned with a new pid, the others unchanged", before, after)
	}
	res := runSessions(t, p.url(), peerSessions, sessionPlan{calls: peerCalls})
	t.Logf("after the respawn: %s", res)
	if res.ok != peerSessions || res.onCreator != peerTotalCalls || res.perServer[fmt.Sprintf("gk-pid%d", after[1])] == 0 {
		t.Fatalf("after the respawn: want %d/%d sessions ok, %d calls on the creating worker, some on the respawned worker %d; got %s",
			peerSessions, peerSessions, peerTotalCalls, after[1], res)
	}
}

// shutDown reports whether every worker in pids has logged that it is
// shutting down: it no longer accepts connections.
func shutDown(g *testproc.Proc, pids map[int]bool) bool {
	log := g.Log().String()
	for pid := range pids {
		if !strings.Contains(log, fmt.Sprintf("[%d] [INFO] Shutting down", pid)) {
			return false
		}
	}
	return true
}

// TestGunicornHooksReload: SIGHUP to gunicorn (a graceful reload) while
// 30 sessions call tools, and a new session starts every 50 ms. The new
// workers take over the slots' sockets (still worker-0..2.sock). Live
// sessions die with their workers: their next call gets 404 from the new
// worker of their slot. Every session started once the old workers stopped
// accepting works, each call on its worker.
func TestGunicornHooksReload(t *testing.T) {
	peer := findGunicorn(t)
	dir := shortTempDir(t)
	g := startHookedGunicorn(t, peer, "gr", 3, dir)
	p := startProxy(t, dynamicSocketsSite(dir))
	before := currentSlots(g)
	old := map[int]bool{}
	for _, pid := range before {
		old[pid] = true
	}

	type fresh struct {
		rep     *session
		started time.Duration // after the HUP
	}
	var (
		hup      time.Time
		stopped  time.Duration // when every old worker had stopped accepting, after the HUP
		sessions []fresh
	)
	reps := underLoad(t, p.url(), 30, time.Second, func() {
		hup = time.Now()
		if err := syscall.Kill(g.Pid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		hc := newHTTPClient()
		defer hc.CloseIdleConnections()
		var mu sync.Mutex
		var wg sync.WaitGroup
		for time.Since(hup) < 4*time.Second {
			if stopped == 0 && shutDown(g, old) {
				stopped = time.Since(hup)
			}
			started := time.Since(hup)
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				rep := runSession(ctx, p.url(), hc, sessionPlan{calls: peerCalls})
				mu.Lock()
				sessions = append(sessions, fresh{rep, started})
				mu.Unlock()
			})
			time.Sleep(50 * time.Millisecond)
		}
		wg.Wait()
	})
	waitSlots(t, g, dir, 3)
	after := currentSlots(g)
	for slot, pid := range after {
		if old[pid] {
			t.Fatalf("slots before the reload %v, after %v: slot %d still has its old worker", before, after, slot)
		}
	}
	if stopped == 0 {
		t.Fatalf("the old workers did not all stop accepting within 4 s of the HUP; log:\n%s", g.Log())
	}
	s := summarizeLive(reps, old)
	t.Logf("SIGHUP under load, slots %v -> %v; old workers stopped accepting %v after the HUP; live sessions: %s",
		before, after, stopped.Round(time.Millisecond), s)
	var early, earlyOK, late, lateOK int
	var lateErr error
	for _, f := range sessions {
		ok := f.rep.err == nil && f.rep.onCreator == peerCalls
		if f.started < stopped {
			early++
			if ok {
				earlyOK++
			}
			continue
		}
		late++
		if ok {
			lateOK++
		} else if lateErr == nil {
			lateErr = fmt.Errorf("session started %v after the HUP: %v (%d calls on its creator)", f.started, f.rep.err, f.rep.onCreator)
		}
	}
	t.Logf("new sessions during the reload: started before the old workers stopped accepting %d/%d ok, after %d/%d ok",
		earlyOK, early, lateOK, late)
	if s.onDead != 30 || s.onDeadEnded404 != 30 || s.misrouted != 0 {
		t.Fatalf("want all 30 live sessions ended with 404 (their workers were replaced), none misrouted; got %s", s)
	}
	if late == 0 || lateOK != late {
		t.Fatalf("want every session started after the old workers stopped accepting to work; %d/%d did, first failure: %v", lateOK, late, lateErr)
	}
}

// TestGunicornHooksMaxRequests: workers recycled by gunicorn's
// max_requests under load take their own slot's socket again; the socket
// directory ends with exactly worker-0..2.sock, and new sessions work.
func TestGunicornHooksMaxRequests(t *testing.T) {
	peer := findGunicorn(t)
	dir := shortTempDir(t)
	g := startHookedGunicorn(t, peer, "gm", 3, dir, "--max-requests", "60")
	p := startProxy(t, dynamicSocketsSite(dir))
	res := runSessions(t, p.url(), peerSessions, sessionPlan{calls: peerCalls})
	notFound, other := 0, []string{}
	for _, err := range res.errs {
		if is404(err) {
			notFound++
		} else {
			other = append(other, err.Error())
		}
	}
	t.Logf("max_requests 60 under %d sessions: %s; failures: %d with 404, others %q", peerSessions, res, notFound, other)
	waitSlots(t, g, dir, 3)
	hist := slotHistory(g)
	t.Logf("workers per slot over the run: %v", hist)
	for slot := range 3 {
		if len(hist[slot]) < 2 {
			t.Fatalf("slot %d was never recycled: %v", slot, hist)
		}
	}
	if len(hist) != 3 {
		t.Fatalf("workers took slots %v, want only 0..2", hist)
	}
	if res.misrouted != 0 {
		t.Fatalf("misrouted calls: %s", res)
	}
	after := runSessions(t, p.url(), 5, sessionPlan{calls: 2})
	if after.ok != 5 {
		t.Fatalf("after the recycling: want 5/5 new sessions ok; got %s", after)
	}
}
