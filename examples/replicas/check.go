package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// roundRobin sends each request to the next replica in turn, as a
// round-robin balancer would; a refused connection (a replica restarting)
// goes to the next one.
type roundRobin struct {
	hosts []string
	next  atomic.Uint64
	tr    http.RoundTripper
}

// RoundTrip sends req to the next replica.
func (rr *roundRobin) RoundTrip(req *http.Request) (*http.Response, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		out := req.Clone(req.Context())
		out.URL.Host = rr.hosts[int(rr.next.Add(1))%len(rr.hosts)]
		out.Host = out.URL.Host
		if req.GetBody != nil {
			out.Body, _ = req.GetBody()
		}
		resp, err := rr.tr.RoundTrip(out)
		var op *net.OpError
		if err == nil || !errors.As(err, &op) || op.Op != "dial" || time.Now().After(deadline) {
			return resp, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// session is one client session of the self-check.
type session struct {
	cs     *mcp.ClientSession
	server string
	calls  int
	err    error
}

// call calls whoami n times and checks that the session's server answers.
func (s *session) call(ctx context.Context, n int) {
	for range n {
		res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami"})
		if err != nil {
			s.err = err
			return
		}
		var who struct{ Server, Session string }
		raw, _ := json.Marshal(res.StructuredContent)
		_ = json.Unmarshal(raw, &who)
		if s.server == "" {
			s.server = who.Server
		}
		if who.Server != s.server || who.Session != s.cs.ID() {
			s.err = fmt.Errorf("call answered by %s for session %q; the session began on %s", who.Server, who.Session, s.server)
			return
		}
		s.calls++
	}
}

// selfCheck opens sessions whose requests go to the replicas in turn,
// calls whoami through them, restarts the first replica, and calls again.
func selfCheck(ctx context.Context, cfg config, f *fleet) error {
	hosts := make([]string, len(f.replicas))
	for i, r := range f.replicas {
		hosts[i] = r.addr
	}
	hc := &http.Client{Transport: &roundRobin{hosts: hosts, tr: &http.Transport{DisableKeepAlives: true}}}
	sessions := make([]*session, cfg.sessions)
	each(sessions, func(i int) {
		s := &session{}
		sessions[i] = s
		client := mcp.NewClient(&mcp.Implementation{Name: "replicas-check", Version: "v1"}, nil)
		if s.cs, s.err = client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: f.urls()[0], HTTPClient: hc}, nil); s.err == nil {
			s.call(ctx, cfg.calls)
		}
	})
	defer each(sessions, func(i int) {
		if sessions[i].cs != nil {
			sessions[i].cs.Close()
		}
	})
	failed := report(fmt.Sprintf("%d sessions, every request to the next of %d replicas", cfg.sessions, len(f.replicas)), sessions, cfg.calls)
	if failed > 0 {
		return fmt.Errorf("%d of %d sessions broken", failed, cfg.sessions)
	}
	fmt.Printf("restarting replica c1 (its table is empty when it is back)\n")
	f.replicas[0].stop()
	if err := f.replicas[0].start(ctx); err != nil {
		return err
	}
	each(sessions, func(i int) { sessions[i].call(ctx, 2) })
	if failed = report("the same sessions after the restart", sessions, cfg.calls+2); failed > 0 {
		return fmt.Errorf("%d of %d sessions broken after a replica restarted", failed, cfg.sessions)
	}
	fmt.Println("OK: every call reached the server that created its session")
	return nil
}

// each runs f(i) for every index of s, concurrently, and waits.
func each[T any](s []T, f func(i int)) {
	var wg sync.WaitGroup
	for i := range s {
		wg.Go(func() { f(i) })
	}
	wg.Wait()
}

// report prints a summary of the sessions and returns how many failed.
func report(title string, sessions []*session, calls int) int {
	failed, perServer := 0, map[string]int{}
	var first error
	for _, s := range sessions {
		if s.err != nil || s.calls != calls {
			failed++
			first = cmpErr(first, s.err)
			continue
		}
		perServer[s.server]++
	}
	fmt.Printf("%s: %d/%d sessions ok, sessions per server %v\n", title, len(sessions)-failed, len(sessions), perServer)
	if first != nil {
		fmt.Printf("  first failure: %v\n", first)
	}
	return failed
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
