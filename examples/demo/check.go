package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/examples/whoami"
)

// Self-check parameters.
const (
	sessionTimeout  = 30 * time.Second // whole life of one checked session
	progressSteps   = 3                // progress notifications of the slow call
	progressMillis  = 150              // duration of the slow call
	progressTimeout = 2 * time.Second  // wait for progress after the result
	maxShownErrors  = 5
)

// sessionReport is the outcome of one checked session.
type sessionReport struct {
	backend string // server that answered the session's first call
	calls   int    // whoami calls that answered from backend
	err     error  // first failure, nil if the session was fine
}

// selfCheck runs cfg.sessions concurrent MCP sessions through the proxy at
// url, prints a summary and returns an error if any session broke.
func selfCheck(ctx context.Context, cfg config, url string, backends []string) error {
	fmt.Printf("self-check: %d concurrent sessions, %d whoami calls and one streamed slow call each\n",
		cfg.sessions, cfg.calls)
	reports := runSessions(ctx, cfg.sessions, func(ctx context.Context) sessionReport {
		return checkSession(ctx, url, cfg.calls)
	})
	failed := summarize(reports, cfg.calls, backends)
	if failed == 0 {
		return nil
	}
	if cfg.stock {
		fmt.Println("(expected with -stock: round_robin sends each request of a session to the next backend, which does not know the session)")
	}
	return fmt.Errorf("self-check failed: %d of %d sessions broken", failed, len(reports))
}

// runSessions runs n copies of check concurrently and collects their reports.
func runSessions(ctx context.Context, n int, check func(context.Context) sessionReport) []sessionReport {
	reports := make([]sessionReport, n)
	var wg sync.WaitGroup
	for i := range reports {
		wg.Go(func() { reports[i] = check(ctx) })
	}
	wg.Wait()
	return reports
}

// checkSession opens one session, calls whoami calls times, then the slow
// tool with a progress token, and closes the session (DELETE).
func checkSession(ctx context.Context, url string, calls int) (r sessionReport) {
	ctx, cancel := context.WithTimeout(ctx, sessionTimeout)
	defer cancel()
	var progress atomic.Int32
	client := mcp.NewClient(&mcp.Implementation{Name: "demo-self-check", Version: whoami.Version},
		&mcp.ClientOptions{ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
			progress.Add(1)
		}})
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		r.err = fmt.Errorf("connect: %w", err)
		return r
	}
	defer func() {
		if err := cs.Close(); err != nil && r.err == nil {
			r.err = fmt.Errorf("close (DELETE): %w", err)
		}
	}()
	if cs.ID() == "" {
		r.err = errors.New("no session ID: the server did not create a session")
		return r
	}
	if r = checkWhoami(ctx, cs, calls); r.err != nil {
		return r
	}
	r.err = checkSlow(ctx, cs, &progress)
	return r
}

// checkWhoami calls whoami calls times and checks that every call names the
// same server and the client's session ID.
func checkWhoami(ctx context.Context, cs *mcp.ClientSession, calls int) (r sessionReport) {
	for i := range calls {
		id, err := callWhoami(ctx, cs)
		if err != nil {
			r.err = fmt.Errorf("whoami call %d: %w", i+1, err)
			return r
		}
		if id.Session != cs.ID() {
			r.err = fmt.Errorf("whoami call %d: server %s sees session %q, client has %q", i+1, id.Server, id.Session, cs.ID())
			return r
		}
		if i == 0 {
			r.backend = id.Server
		} else if id.Server != r.backend {
			r.err = fmt.Errorf("whoami call %d: answered by %s, the session started on %s", i+1, id.Server, r.backend)
			return r
		}
		r.calls++
	}
	return r
}

// callWhoami calls the whoami tool and decodes its structured output.
func callWhoami(ctx context.Context, cs *mcp.ClientSession) (whoami.Identity, error) {
	var id whoami.Identity
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami"})
	if err != nil {
		return id, err
	}
	if res.IsError {
		return id, fmt.Errorf("tool error: %s", resultText(res))
	}
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return id, err
	}
	if err := json.Unmarshal(raw, &id); err != nil {
		return id, fmt.Errorf("decoding %s: %w", raw, err)
	}
	return id, nil
}

// checkSlow calls the slow tool with a progress token and checks that the
// result and every progress notification arrive.
func checkSlow(ctx context.Context, cs *mcp.ClientSession, progress *atomic.Int32) error {
	params := &mcp.CallToolParams{Name: "slow",
		Arguments: whoami.SlowInput{Milliseconds: progressMillis, Steps: progressSteps}}
	params.SetProgressToken("demo-progress")
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		return fmt.Errorf("slow call: %w", err)
	}
	if text := resultText(res); res.IsError || text != "done" {
		return fmt.Errorf("slow call: got %q", text)
	}
	// In JSON-response mode progress travels on the GET stream and may
	// arrive after the result.
	deadline := time.Now().Add(progressTimeout)
	for progress.Load() < progressSteps && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := progress.Load(); n != progressSteps {
		return fmt.Errorf("slow call: %d of %d progress notifications arrived", n, progressSteps)
	}
	return nil
}

// resultText returns the text contents of a tool result.
func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	return strings.Join(parts, " ")
}

// summarize prints the self-check summary and a few failures, and returns
// the number of failed sessions.
func summarize(reports []sessionReport, calls int, backends []string) int {
	perBackend := map[string]int{}
	okSessions, pinned, failed := 0, 0, 0
	for _, r := range reports {
		pinned += r.calls
		if r.backend != "" {
			perBackend[r.backend]++
		}
		if r.err == nil {
			okSessions++
		} else {
			failed++
		}
	}
	var dist []string
	for _, name := range backends {
		dist = append(dist, fmt.Sprintf("%s=%d", name, perBackend[name]))
	}
	fmt.Printf("self-check: %d/%d sessions ok, %d/%d calls pinned; sessions per backend: %s\n",
		okSessions, len(reports), pinned, len(reports)*calls, strings.Join(dist, " "))
	printFailures(reports)
	return failed
}

// printFailures prints the first few session errors.
func printFailures(reports []sessionReport) {
	shown := 0
	for i, r := range reports {
		if r.err == nil {
			continue
		}
		if shown == maxShownErrors {
			fmt.Println("  ...")
			return
		}
		fmt.Printf("  session %d: %v\n", i+1, r.err)
		shown++
	}
}
