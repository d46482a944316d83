package tests

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"
)

var slotLine = regexp.MustCompile(`Worker (\d+) serves slot (\d+) at`)

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
