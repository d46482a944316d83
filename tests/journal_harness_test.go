package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
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
// on or off, in table table.
func journalSite(upstream, table string, on bool) string {
	journal := "off"
	if on {
		journal = "on"
	}
	return fmt.Sprintf("mcp_proxy %s {\n\t\ttable %s\n\t\tjournal %s\n\t}", upstream, table, journal)
}
