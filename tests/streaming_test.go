package tests

import (
	"bufio"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Streaming through the proxy (docs/behaviour.md, "Streaming"): SSE
// events are not buffered, long silent GET streams are not cut, a client's
// disconnect reaches the upstream, resumption headers and empty responses
// pass unchanged.

// sseEventBudget is the most an SSE event, or a streamed response's
// headers, may lag behind the upstream's write: well below the gaps
// between the doubles' writes (600 ms and more), so that an event held back
// until the next write still fails, and well above what a busy 2-core
// machine adds.
const sseEventBudget = 400 * time.Millisecond

// TestSSEEventsUnbuffered: a pinned POST answered with a streamed SSE
// response reaches the client event by event, each within 100 ms of the
// upstream writing it, with X-Accel-Buffering: no kept; over HTTP/1.1, over
// h2c, and with `encode gzip` in the site and a client accepting gzip (the
// upstream then leaves out `no-transform`, so the stream is compressed:
// headers must not wait for the first event, events must be flushed one by
// one through the compressor).
func TestSSEEventsUnbuffered(t *testing.T) {
	for _, tc := range []struct {
		name   string
		h2c    bool
		encode bool
	}{
		{name: "http1"},
		{name: "h2c", h2c: true},
		{name: "gzip-http1", encode: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDoubles(t, 1)[0]
			body := "mcp_proxy " + d.addr
			if tc.encode {
				body = "encode gzip\n\t" + body
			}
			p := startProxy(t, body)
			hc := newHTTPClient()
			wantProto := "HTTP/1.1"
			if tc.h2c {
				hc, wantProto = newH2CClient(), "HTTP/2.0"
			}
			defer hc.CloseIdleConnections()
			id := initialize(t, hc, p.url())

			// The double flushes the headers alone, then event 1 150 ms later,
			// event 2 300 ms after that, and the result 300 ms after that.
			writes := make(stamps, 4)
			events := []string{
				"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\n",
				"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":2}}\n\n",
				"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"content\":[]}}\n\n",
			}
			d.handle(func(w http.ResponseWriter, r *http.Request) {
				if tc.encode {
					compressibleSSEHeaders(w)
				} else {
					sseHeaders(w)
				}
				w.WriteHeader(http.StatusOK)
				at := time.Now()
				http.NewResponseController(w).Flush()
				writes <- at
				for i, ev := range events {
					time.Sleep([]time.Duration{600, 900, 900}[i] * time.Millisecond)
					writes <- writeSSE(w, ev)
				}
			})

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.url(),
				strings.NewReader(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"slow","_meta":{"progressToken":1}}}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Mcp-Session-Id", id)
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
			if tc.encode {
				// Set by hand, so the transport neither adds nor hides it.
				req.Header.Set("Accept-Encoding", "gzip")
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatalf("POST: %v", err)
			}
			gotHeaders := time.Now()
			defer resp.Body.Close()
			headerLag := gotHeaders.Sub(writes.next(t, "headers"))
			t.Logf("%s: headers %v after the double flushed them (Content-Encoding %q)",
				resp.Proto, headerLag, resp.Header.Get("Content-Encoding"))
			if resp.StatusCode != http.StatusOK || resp.Proto != wantProto {
				t.Fatalf("got %s %s; want 200 over %s", resp.Proto, resp.Status, wantProto)
			}
			if headerLag > sseEventBudget {
				t.Errorf("headers reached the client %v after the double flushed them; want < %v", headerLag, sseEventBudget)
			}
			if got := resp.Header.Values("X-Accel-Buffering"); len(got) != 1 || got[0] != "no" {
				t.Errorf("X-Accel-Buffering at the client = %q; want [no]", got)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type at the client = %q; want text/event-stream", ct)
			}
			if ce := resp.Header.Get("Content-Encoding"); tc.encode != (ce == "gzip") {
				t.Fatalf("Content-Encoding at the client = %q with encode %v; the test does not exercise what it should", ce, tc.encode)
			}

			var src io.Reader = resp.Body
			if resp.Header.Get("Content-Encoding") == "gzip" {
				zr, err := gzip.NewReader(resp.Body)
				if err != nil {
					t.Fatalf("gzip: %v", err)
				}
				src = zr
			}
			br := bufio.NewReader(src)
			for i, want := range events {
				block, err := readSSEBlock(br)
				got := time.Now()
				if err != nil {
					t.Fatalf("event %d: %v (read %q)", i+1, err, block)
				}
				lag := got.Sub(writes.next(t, fmt.Sprintf("event %d", i+1)))
				t.Logf("event %d: %v after the double wrote it", i+1, lag)
				if block+"\n" != want {
					t.Errorf("event %d = %q; want %q", i+1, block, want)
				}
				if lag > sseEventBudget {
					t.Errorf("event %d reached the client %v after the double wrote it; want < %v", i+1, lag, sseEventBudget)
				}
			}
			if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
				t.Errorf("after the result: %q, %v; want a clean end of stream", rest, err)
			}
			if n := d.sawSession(id); n != 1 {
				t.Errorf("the owner saw the session %d times; want 1 (the POST)", n)
			}
		})
	}
}

// TestGETStreamSurvivesSilence: a pinned GET stream whose upstream sends
// headers, then nothing for 3 s, then an event: the client has the headers
// within 200 ms and the event about 3 s later, within 100 ms of its write;
// the default config cuts nothing (docs/behaviour.md, "Streaming": GET streams have no proxy timeout).
func TestGETStreamSurvivesSilence(t *testing.T) {
	const silence = 3 * time.Second
	d := startDoubles(t, 1)[0]
	p := startProxy(t, "mcp_proxy "+d.addr)
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	id := initialize(t, hc, p.url())

	writes := make(stamps, 2)
	d.handle(func(w http.ResponseWriter, r *http.Request) {
		sseHeaders(w)
		w.WriteHeader(http.StatusOK)
		at := time.Now()
		http.NewResponseController(w).Flush()
		writes <- at
		select {
		case <-time.After(silence):
		case <-r.Context().Done():
			return
		}
		writes <- writeSSE(w, "id: 0_1\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\n")
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.url(), nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", id)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET: %v", err)
	}
	gotHeaders := time.Now()
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET: %s", resp.Status)
	}
	headerLag := gotHeaders.Sub(writes.next(t, "headers"))
	t.Logf("headers %v after the double flushed them", headerLag)
	if headerLag > 200*time.Millisecond {
		t.Errorf("headers reached the client %v after the double flushed them; want < 200ms", headerLag)
	}

	block, err := readSSEBlock(bufio.NewReader(resp.Body))
	got := time.Now()
	if err != nil {
		t.Fatalf("the stream ended after %v of silence without the event: %v (read %q)", got.Sub(gotHeaders), err, block)
	}
	lag := got.Sub(writes.next(t, "the event"))
	t.Logf("event after %v of silence, %v after the double wrote it", got.Sub(gotHeaders), lag)
	if !strings.Contains(block, "notifications/message") {
		t.Errorf("event = %q", block)
	}
	if got.Sub(gotHeaders) < silence-100*time.Millisecond {
		t.Errorf("the event came %v after the headers; the double waited %v", got.Sub(gotHeaders), silence)
	}
	if lag > sseEventBudget {
		t.Errorf("the event reached the client %v after the double wrote it; want < %v", lag, sseEventBudget)
	}
}

// TestClientCancelReachesUpstream: when a client drops its GET stream, the
// proxy cancels the upstream request within 500 ms, over HTTP/1.1 (the
// client closes the connection) and h2c (the client resets the stream).
func TestClientCancelReachesUpstream(t *testing.T) {
	for _, h2c := range []bool{false, true} {
		name := "http1"
		if h2c {
			name = "h2c"
		}
		t.Run(name, func(t *testing.T) {
			d := startDoubles(t, 1)[0]
			p := startProxy(t, "mcp_proxy "+d.addr)
			hc := newHTTPClient()
			if h2c {
				hc = newH2CClient()
			}
			defer hc.CloseIdleConnections()
			id := initialize(t, hc, p.url())

			ended := make(stamps, 1)
			d.handle(func(w http.ResponseWriter, r *http.Request) {
				sseHeaders(w)
				w.WriteHeader(http.StatusOK)
				http.NewResponseController(w).Flush()
				select {
				case <-r.Context().Done():
					ended <- time.Now()
				case <-time.After(10 * time.Second):
				}
			})

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.url(), nil)
			req.Header.Set("Accept", "text/event-stream")
			req.Header.Set("Mcp-Session-Id", id)
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatalf("GET: %v", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET: %s", resp.Status)
			}
			time.Sleep(50 * time.Millisecond) // the stream is established
			cancelled := time.Now()
			cancel()
			select {
			case at := <-ended:
				lag := at.Sub(cancelled)
				t.Logf("%s: the upstream request was cancelled %v after the client cancelled", resp.Proto, lag)
				if lag > 500*time.Millisecond {
					t.Errorf("the upstream request was cancelled %v after the client; want < 500ms", lag)
				}
			case <-time.After(2 * time.Second):
				t.Fatalf("the upstream request was still open 2s after the client cancelled")
			}
		})
	}
}

// TestStandaloneGETReconnectAfterCancel: go-sdk allows one standalone GET
// stream per session (a second one gets 409 Conflict). After a client
// cancels its GET stream, a new GET of the session through the proxy gets
// 200: the proxy ended the upstream stream instead of leaking it.
func TestStandaloneGETReconnectAfterCancel(t *testing.T) {
	bs := startBackends(t, 1, false)
	p := startProxy(t, "mcp_proxy "+upstreams(bs))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	id := goSDKSession(t, hc, p.url())

	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	first := openStandaloneGET(ctx1, t, hc, p.url(), id)
	defer first.Body.Close()
	if first.StatusCode != http.StatusOK {
		t.Fatalf("first GET: %s", first.Status)
	}
	// go-sdk writes ": ok" once the stream is registered.
	if block, err := readSSEBlock(bufio.NewReader(first.Body)); err != nil || !strings.HasPrefix(block, ":") {
		t.Fatalf("first GET: %q, %v; want the server's opening comment", block, err)
	}

	// Control: while the first stream is open, the server refuses a second.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	second := openStandaloneGET(ctx2, t, hc, p.url(), id)
	second.Body.Close()
	cancel2()
	if second.StatusCode != http.StatusConflict {
		t.Fatalf("a second GET while the first is open: %s; want 409 (else this test cannot see a leaked stream)", second.Status)
	}

	cancel1()
	cancelled := time.Now()
	deadline := cancelled.Add(time.Second)
	for attempt := 1; ; attempt++ {
		ctx3, cancel3 := context.WithTimeout(context.Background(), 5*time.Second)
		third := openStandaloneGET(ctx3, t, hc, p.url(), id)
		status := third.StatusCode
		third.Body.Close()
		cancel3()
		if status == http.StatusOK {
			t.Logf("GET after cancelling the first: 200 on attempt %d, %v after the cancel", attempt, time.Since(cancelled))
			break
		}
		if status != http.StatusConflict || time.Now().After(deadline) {
			t.Fatalf("GET after cancelling the first: %d on attempt %d, %v after the cancel; want 200 (409 means the upstream stream was not ended)",
				status, attempt, time.Since(cancelled))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLastEventIDReachesOwner: a pinned GET's Last-Event-ID reaches the
// session's owner byte-exact, whatever the event ID's shape (resumption, MCP transports §Resumability), and the
// other upstream never sees it.
func TestLastEventIDReachesOwner(t *testing.T) {
	ds := startDoubles(t, 2)
	p := startProxy(t, "mcp_proxy "+upstreams(ds))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	id := initialize(t, hc, p.url())
	owner := ownerOf(t, ds, id)
	other := ds[0]
	if other == owner {
		other = ds[1]
	}
	replay := func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			owner.serveMCP(w, r)
			return
		}
		sseHeaders(w)
		fmt.Fprintf(w, "id: %s\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n\n", r.Header.Get("Last-Event-ID")+"-next")
	}
	owner.handle(replay)
	other.handle(replay)

	for _, eid := range []string{"0_1", "stream-7:42", "1730000000000-3", "a+b/c="} {
		before := len(mcpOnly(owner.requests()))
		ex := send(t, hc, http.MethodGet, p.url(), map[string][]string{
			"Mcp-Session-Id": {id},
			"Accept":         {"text/event-stream"},
			"Last-Event-ID":  {eid},
		}, "")
		if ex.status != http.StatusOK || !strings.Contains(ex.body, "id: "+eid+"-next\n") {
			t.Errorf("GET with Last-Event-ID %q: %d %q; want 200 and the owner's replay", eid, ex.status, ex.body)
		}
		reqs := mcpOnly(owner.requests())
		if len(reqs) != before+1 {
			t.Errorf("Last-Event-ID %q: the owner got %d requests; want 1", eid, len(reqs)-before)
			continue
		}
		if got := reqs[len(reqs)-1].header.Values("Last-Event-ID"); len(got) != 1 || got[0] != eid {
			t.Errorf("the owner got Last-Event-ID %q; want [%q]", got, eid)
		}
	}
	if n := other.mcpRequests(); n != 0 {
		t.Errorf("the other upstream got %d requests; want 0", n)
	}
}

// TestEmptyResponsesPassThrough: a 202 with no body to a notification comes
// back as the owner sent it, with no Content-Type added; a
// DELETE with no body and no Content-Length reaches the owner, whose 204 or
// empty 200 comes back, and the session is then dropped (docs/behaviour.md, "What
// happens when": a DELETE answered 2xx).
func TestEmptyResponsesPassThrough(t *testing.T) {
	ds := startDoubles(t, 2)
	p := startProxy(t, "mcp_proxy "+upstreams(ds))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	t.Run("202", func(t *testing.T) {
		id := initialize(t, hc, p.url())
		owner := ownerOf(t, ds, id)
		owner.handle(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && strings.Contains(readBody(r), "notifications/initialized") {
				w.WriteHeader(http.StatusAccepted)
				return
			}
			owner.serveMCP(w, r)
		})
		defer owner.handle(nil)
		before := owner.sawSession(id)
		ex := send(t, hc, http.MethodPost, p.url(), mcpPOSTHeaders(id), `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		if ex.status != http.StatusAccepted || ex.body != "" {
			t.Errorf("notification: %d %q; want 202 with an empty body", ex.status, ex.body)
		}
		for _, h := range []string{"Content-Type", "Content-Encoding", "Mcp-Session-Id"} {
			if v, ok := ex.header[h]; ok {
				t.Errorf("the 202 gained %s: %q", h, v)
			}
		}
		if n := owner.sawSession(id) - before; n != 1 {
			t.Errorf("the owner saw the notification %d times; want 1", n)
		}
		// The session is still pinned.
		if ex := send(t, hc, http.MethodPost, p.url(), sid(id), `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`); ex.status != http.StatusOK || !strings.Contains(ex.body, owner.name) {
			t.Errorf("after the 202: %d %q; want 200 from %s", ex.status, ex.body, owner.name)
		}
	})

	for _, tc := range []struct {
		name   string
		status int
	}{{"DELETE 204", http.StatusNoContent}, {"DELETE 200 empty", http.StatusOK}} {
		t.Run(tc.name, func(t *testing.T) {
			id := initialize(t, hc, p.url())
			owner := ownerOf(t, ds, id)
			type seen struct {
				contentLength int64
				hasCL         bool
				te            []string
				body          string
			}
			got := make(chan seen, 1)
			owner.handle(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodDelete {
					owner.serveMCP(w, r)
					return
				}
				_, hasCL := r.Header["Content-Length"]
				got <- seen{r.ContentLength, hasCL, r.TransferEncoding, readBody(r)}
				w.WriteHeader(tc.status)
			})
			defer owner.handle(nil)

			resp, body := rawRequest(t, p.addr, http.MethodDelete, fmt.Sprintf(
				"DELETE /mcp HTTP/1.1\r\nHost: %s\r\nMcp-Session-Id: %s\r\nMcp-Protocol-Version: 2025-11-25\r\nConnection: close\r\n\r\n", p.addr, id))
			if resp.StatusCode != tc.status || body != "" {
				t.Errorf("DELETE: %d %q; want %d with an empty body", resp.StatusCode, body, tc.status)
			}
			if v, ok := resp.Header["Content-Type"]; ok {
				t.Errorf("the DELETE response gained Content-Type %q", v)
			}
			select {
			case s := <-got:
				if s.contentLength != 0 || s.hasCL || len(s.te) != 0 || s.body != "" {
					t.Errorf("the owner got a DELETE with Content-Length %d (header sent: %v), Transfer-Encoding %q, body %q; want no body and no framing",
						s.contentLength, s.hasCL, s.te, s.body)
				}
			default:
				t.Fatalf("the DELETE never reached the owner %s", owner.name)
			}

			// The session ended: the proxy answers 404 itself.
			before := owner.mcpRequests()
			ex := send(t, hc, http.MethodPost, p.url(), sid(id), `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
			if n := owner.mcpRequests() - before; ex.status != http.StatusNotFound || n != 0 {
				t.Errorf("after the DELETE: %d %q, owner got %d more requests; want the proxy's 404", ex.status, ex.body, n)
			}
		})
	}
}
