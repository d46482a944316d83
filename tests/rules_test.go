package tests

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestLearnRules covers what creates, changes or ignores a mapping (docs/behaviour.md,
// "What happens when", the first rows): only a 2xx response carrying Mcp-Session-Id, in any
// spelling, to a request that carried none teaches; it is learned when the
// headers pass, before the body ends.
func TestLearnRules(t *testing.T) {
	ds := startDoubles(t, 3)
	p := startProxy(t, "mcp_proxy "+upstreams(ds))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	t.Run("learned session is pinned, any spelling", func(t *testing.T) {
		id := initialize(t, hc, p.url())
		owner := ownerOf(t, ds, id)
		for i, spelling := range []string{"Mcp-Session-Id", "mcp-session-id", "MCP-Session-Id", "MCP-SESSION-ID"} {
			for range 5 {
				ex := send(t, hc, http.MethodPost, p.url(), map[string][]string{spelling: {id}}, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
				if ex.status != http.StatusOK || !strings.Contains(ex.body, owner.name) {
					t.Fatalf("spelling %d %q: %d %s, want the owner %s", i, spelling, ex.status, ex.body, owner.name)
				}
			}
		}
		if got := owner.sawSession(id); got != 20 {
			t.Fatalf("owner saw %d requests of the session, want 20", got)
		}
	})

	t.Run("upstream writes the header in lowercase, client gets exactly one, byte-identical", func(t *testing.T) {
		for _, d := range ds {
			d.handle(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Mcp-Session-Id") == "" {
					w.Header()["mcp-session-id"] = []string{d.mint()}
				}
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"jsonrpc":"2.0","id":1,"result":{"server":%q}}`, d.name)
			})
			defer d.handle(nil)
		}
		ex := send(t, hc, http.MethodPost, p.url(), nil, `{"jsonrpc":"2.0","id":1,"method":"initialize"}`)
		ids := ex.header.Values("Mcp-Session-Id")
		if len(ids) != 1 {
			t.Fatalf("client got %d session headers: %v", len(ids), ids)
		}
		owner := ownerOf(t, ds, ids[0])
		if !strings.Contains(ex.body, owner.name) {
			t.Fatalf("initialize answered by the wrong double: %s", ex.body)
		}
		ex = send(t, hc, http.MethodPost, p.url(), sid(ids[0]), `{}`)
		if ex.status != http.StatusOK || !strings.Contains(ex.body, owner.name) {
			t.Fatalf("follow-up: %d %s, want %s", ex.status, ex.body, owner.name)
		}
	})

	t.Run("IDs are opaque and byte-exact", func(t *testing.T) {
		// Shapes seen in the wild: commas, quotes, percent signs, JWT-like
		// dots and base64 padding. The proxy must not split, trim, decode or
		// fold any of them.
		shapes := []string{`a,b`, `x"y"z`, `%2Fenc%20`, `eyJh.eyJi.c2ln==`, `k:v;w=~+/`, `UPPER-lower`}
		for _, shape := range shapes {
			for _, d := range ds {
				d.handle(func(w http.ResponseWriter, r *http.Request) {
					got := r.Header.Values("Mcp-Session-Id")
					switch {
					case len(got) == 0:
						w.Header().Set("Mcp-Session-Id", d.name+"|"+shape)
					case len(got) != 1 || got[0] != d.name+"|"+shape:
						http.Error(w, fmt.Sprintf("%s got %q", d.name, got), http.StatusTeapot)
						return
					}
					fmt.Fprintf(w, `{"server":%q}`, d.name)
				})
			}
			ex := send(t, hc, http.MethodPost, p.url(), nil, `{"method":"initialize"}`)
			id := ex.header.Get("Mcp-Session-Id")
			owner := strings.SplitN(id, "|", 2)[0]
			// (Whitespace around a field value is not part of it, RFC 9110 §5.5.)
			for _, variant := range []string{strings.ToLower(id), strings.ToUpper(id), id[:len(id)-1]} {
				if variant == id {
					continue
				}
				if ex := send(t, hc, http.MethodPost, p.url(), sid(variant), `{}`); ex.status != http.StatusNotFound && ex.status != http.StatusBadRequest {
					t.Errorf("ID %q: a variant %q was accepted: %d %s", id, variant, ex.status, ex.body)
				}
			}
			if ex := send(t, hc, http.MethodPost, p.url(), sid(id), `{}`); ex.status != http.StatusOK || !strings.Contains(ex.body, owner) {
				t.Errorf("ID %q: %d %s, want 200 from %s", id, ex.status, ex.body, owner)
			}
		}
		for _, d := range ds {
			d.handle(nil)
		}
	})

	t.Run("non-2xx responses never teach", func(t *testing.T) {
		for _, status := range []int{http.StatusMisdirectedRequest, http.StatusUnauthorized, http.StatusInternalServerError, http.StatusBadRequest} {
			minted := fmt.Sprintf("Z-%d", status)
			for _, d := range ds {
				d.handle(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Mcp-Session-Id", minted)
					w.Header().Set("X-Upstream", d.name)
					http.Error(w, "refused by upstream", status)
				})
			}
			ex := send(t, hc, http.MethodPost, p.url(), nil, `{"jsonrpc":"2.0","id":1,"method":"initialize"}`)
			if ex.status != status || !strings.Contains(ex.body, "refused by upstream") || ex.header.Get("Mcp-Session-Id") != minted {
				t.Fatalf("status %d: the upstream's response did not pass unchanged: %d %v %s", status, ex.status, ex.header, ex.body)
			}
			for _, d := range ds {
				d.handle(nil)
			}
			checkProxy404(t, send(t, hc, http.MethodPost, p.url(), sid(minted), `{}`))
			for _, d := range ds {
				if n := d.sawSession(minted); n != 0 {
					t.Fatalf("status %d: %s received the unlearned session %d times", status, d.name, n)
				}
			}
		}
	})

	t.Run("a response to a pinned request never changes or adds a mapping", func(t *testing.T) {
		id := initialize(t, hc, p.url())
		owner := ownerOf(t, ds, id)
		owner.handle(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Mcp-Session-Id", "W-stray")
			fmt.Fprintf(w, `{"server":%q}`, owner.name)
		})
		ex := send(t, hc, http.MethodPost, p.url(), sid(id), `{}`)
		owner.handle(nil)
		if ex.status != http.StatusOK {
			t.Fatalf("pinned request: %d %s", ex.status, ex.body)
		}
		checkProxy404(t, send(t, hc, http.MethodPost, p.url(), sid("W-stray"), `{}`))
		ex = send(t, hc, http.MethodPost, p.url(), sid(id), `{}`)
		if ex.status != http.StatusOK || !strings.Contains(ex.body, owner.name) {
			t.Fatalf("mapping changed: %d %s", ex.status, ex.body)
		}
	})

	t.Run("stateless upstream: nothing learned, requests balanced", func(t *testing.T) {
		for _, d := range ds {
			d.handle(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, `{"server":%q}`, d.name)
			})
			defer d.handle(nil)
		}
		before := map[string]int{}
		for _, d := range ds {
			before[d.name] = d.total()
		}
		for range 30 {
			if ex := send(t, hc, http.MethodPost, p.url(), nil, `{}`); ex.status != http.StatusOK || ex.header.Get("Mcp-Session-Id") != "" {
				t.Fatalf("stateless request: %d %v", ex.status, ex.header)
			}
		}
		for _, d := range ds { // least_sessions: no sessions anywhere, ties broken at random
			if d.total() == before[d.name] {
				t.Errorf("%s got none of 30 sessionless requests", d.name)
			}
		}
	})

	t.Run("learned at header time, while the initialize body still streams", func(t *testing.T) {
		release := make(chan struct{})
		for _, d := range ds {
			d.handle(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Mcp-Session-Id") != "" {
					d.serveMCP(w, r)
					return
				}
				w.Header().Set("Mcp-Session-Id", d.mint())
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				select {
				case <-release:
				case <-time.After(5 * time.Second):
				}
				fmt.Fprint(w, "event: message\ndata: {}\n\n")
			})
			defer d.handle(nil)
		}
		req, _ := http.NewRequest(http.MethodPost, p.url(), strings.NewReader(`{"method":"initialize"}`))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		id := resp.Header.Get("Mcp-Session-Id")
		ex := send(t, hc, http.MethodPost, p.url(), sid(id), `{"method":"notifications/initialized"}`)
		close(release)
		owner := ownerOf(t, ds, id)
		if ex.status != http.StatusOK || !strings.Contains(ex.body, owner.name) {
			t.Fatalf("request sent while initialize streamed: %d %s, want the owner %s", ex.status, ex.body, owner.name)
		}
	})
}

// TestUnknownSession (docs/behaviour.md, "What happens when": unknown session): the proxy itself
// answers 404 with a JSON-RPC error for a session it does not hold, without
// contacting an upstream, unless unknown_session is forward.
func TestUnknownSession(t *testing.T) {
	ds := startDoubles(t, 2)
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	p := startProxy(t, "mcp_proxy "+upstreams(ds))
	for _, method := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
		checkProxy404(t, send(t, hc, method, p.url(), sid("made-up-session"), ""))
	}
	for _, d := range ds {
		if d.total() != 0 {
			t.Fatalf("%s was contacted for an unknown session", d.name)
		}
	}

	p = startProxy(t, "mcp_proxy "+upstreams(ds)+" {\n\t\tunknown_session forward\n\t}")
	ex := send(t, hc, http.MethodPost, p.url(), sid("made-up-session"), `{}`)
	if ex.status != http.StatusNotFound || strings.Contains(ex.body, "jsonrpc") {
		t.Fatalf("forwarded unknown session: want the upstream's own 404, got %d %s", ex.status, ex.body)
	}
	if ds[0].sawSession("made-up-session")+ds[1].sawSession("made-up-session") != 1 {
		t.Fatalf("unknown_session forward did not reach an upstream")
	}
}

// TestBadSessionHeader (docs/behaviour.md, "What happens when": `Mcp-Session-Id` sent
// twice, empty, ...): a malformed Mcp-Session-Id
// gets 400 with a reason, is never stored or forwarded, and costs no other
// client its session.
func TestBadSessionHeader(t *testing.T) {
	ds := startDoubles(t, 2)
	p := startProxy(t, "mcp_proxy "+upstreams(ds)+" {\n\t\tmax_session_id_length 64\n\t}")
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	good := initialize(t, hc, p.url())
	before := ds[0].total() + ds[1].total()

	cases := []struct {
		name   string
		hdr    map[string][]string
		reason string
	}{
		{"sent twice", map[string][]string{"Mcp-Session-Id": {good, good}}, "sent 2 times"},
		{"sent twice in two spellings", map[string][]string{"Mcp-Session-Id": {good}, "mcp-session-id": {"other"}}, "sent 2 times"},
		{"space inside", sid("abc def"), "0x20"},
		{"byte above 0x7E", sid("abc\x80def"), "0x80"},
		{"too long", sid(strings.Repeat("A", 65)), "65 bytes"},
		{"empty", sid(""), "empty"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			checkBadRequest(t, send(t, hc, http.MethodPost, p.url(), c.hdr, `{}`), c.reason)
		})
	}
	if after := ds[0].total() + ds[1].total(); after != before {
		t.Fatalf("malformed requests reached upstreams: %d", after-before)
	}
	if ex := send(t, hc, http.MethodPost, p.url(), sid(strings.Repeat("A", 64)), `{}`); ex.status != http.StatusNotFound {
		t.Fatalf("a 64-byte ID is within the limit and unknown: want 404, got %d %s", ex.status, ex.body)
	}
	if ex := send(t, hc, http.MethodPost, p.url(), sid(good), `{}`); ex.status != http.StatusOK {
		t.Fatalf("the good session was lost: %d %s", ex.status, ex.body)
	}
}

// TestUnderscoredSessionHeaderDropped (docs/behaviour.md, "What happens when":
// Mcp-Session-Id with underscores): CGI, WSGI and FastCGI servers read
// Mcp_Session_Id as Mcp-Session-Id, which would carry a session past the
// proxy's checks (bind_principal) to any upstream. Caddy drops header names
// with underscores before any handler (GHSA-f59h-q822-g45g): the request is
// one without a session, and no upstream sees the header or the ID. This
// guards the plugin's reliance on that default.
func TestUnderscoredSessionHeaderDropped(t *testing.T) {
	ds := startDoubles(t, 2)
	p := startProxy(t, "mcp_proxy "+upstreams(ds))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	good := initialize(t, hc, p.url())
	before := ds[0].sawSession(good) + ds[1].sawSession(good)
	for _, name := range []string{"mcp_session_id", "MCP-SESSION_ID", "Mcp_Session-Id"} {
		ex := send(t, hc, http.MethodPost, p.url(), map[string][]string{name: {good}}, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
		if ex.status != http.StatusOK {
			t.Errorf("%s: %d %s, want the answer to a request without a session", name, ex.status, ex.body)
		}
	}
	for _, d := range ds {
		for _, r := range d.requests() {
			for k, v := range r.header {
				if strings.Contains(k, "_") || slices.Contains(v, good) && k != "Mcp-Session-Id" {
					t.Errorf("upstream %s got header %s: %v", d.name, k, v)
				}
			}
		}
	}
	if after := ds[0].sawSession(good) + ds[1].sawSession(good); after != before {
		t.Errorf("%d requests reached an upstream with the session", after-before)
	}
}

// TestEviction (docs/behaviour.md, "What happens when": the upstream's 404, DELETE and
// 400 rows): DELETE answered 2xx or 404 drops the mapping, 405 keeps it; a
// 404 to a POST drops it, a 404 to a GET keeps it (a server without a GET
// route), and both pass through
// unchanged; 400 keeps it.
func TestEviction(t *testing.T) {
	ds := startDoubles(t, 3)
	p := startProxy(t, "mcp_proxy "+upstreams(ds))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	cases := []struct {
		method  string
		status  int
		evicted bool
	}{
		{http.MethodDelete, http.StatusNoContent, true},
		{http.MethodDelete, http.StatusOK, true},
		{http.MethodDelete, http.StatusNotFound, true},
		{http.MethodDelete, http.StatusMethodNotAllowed, false},
		{http.MethodPost, http.StatusNotFound, true},
		{http.MethodGet, http.StatusNotFound, false}, // no GET route: the session is kept
		{http.MethodPost, http.StatusBadRequest, false},
		{http.MethodPost, http.StatusMethodNotAllowed, false},
		{http.MethodPost, http.StatusInternalServerError, false},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s answered %d", c.method, c.status), func(t *testing.T) {
			id := initialize(t, hc, p.url())
			owner := ownerOf(t, ds, id)
			owner.handle(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("X-From", owner.name)
				w.WriteHeader(c.status)
				if c.status != http.StatusNoContent {
					fmt.Fprint(w, `{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"from upstream"}}`)
				}
			})
			ex := send(t, hc, c.method, p.url(), sid(id), "")
			owner.handle(nil)
			if ex.status != c.status || ex.header.Get("X-From") != owner.name {
				t.Fatalf("the upstream's answer did not pass unchanged: %d %v %s", ex.status, ex.header, ex.body)
			}
			if c.status != http.StatusNoContent && !strings.Contains(ex.body, "from upstream") {
				t.Fatalf("the upstream's body did not pass unchanged: %s", ex.body)
			}
			seen := owner.sawSession(id)
			ex = send(t, hc, http.MethodPost, p.url(), sid(id), `{}`)
			if c.evicted {
				checkProxy404(t, ex)
				if owner.sawSession(id) != seen {
					t.Fatalf("an evicted session still reached its upstream")
				}
			} else if owner.sawSession(id) != seen+1 {
				t.Fatalf("a kept session did not reach its owner: %d %s", ex.status, ex.body)
			}
		})
	}
}

// TestTableBounds (docs/caddyfile.md, `max_sessions` and `session_ttl`) through the
// proxy: a full table
// evicts its least recently used session, and a session with an open GET
// stream outlives the idle TTL while an idle one does not.
func TestTableBounds(t *testing.T) {
	ds := startDoubles(t, 2)
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	t.Run("lru", func(t *testing.T) {
		p := startProxy(t, "mcp_proxy "+upstreams(ds)+" {\n\t\ttable lru\n\t\tmax_sessions 2\n\t}")
		a, b := initialize(t, hc, p.url()), initialize(t, hc, p.url())
		send(t, hc, http.MethodPost, p.url(), sid(a), `{}`) // a is now more recently used than b
		c := initialize(t, hc, p.url())
		checkProxy404(t, send(t, hc, http.MethodPost, p.url(), sid(b), `{}`))
		for _, id := range []string{a, c} {
			if ex := send(t, hc, http.MethodPost, p.url(), sid(id), `{}`); ex.status != http.StatusOK {
				t.Fatalf("session %s lost: %d %s", id, ex.status, ex.body)
			}
		}
	})

	t.Run("ttl with an open stream", func(t *testing.T) {
		p := startProxy(t, "mcp_proxy "+upstreams(ds)+" {\n\t\ttable ttl\n\t\tsession_ttl 1s\n\t}")
		streaming, idle := initialize(t, hc, p.url()), initialize(t, hc, p.url())
		owner := ownerOf(t, ds, streaming)
		opened := make(chan struct{})
		owner.handle(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet {
				owner.serveMCP(w, r)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			close(opened)
			<-r.Context().Done()
		})
		defer owner.handle(nil)
		req, _ := http.NewRequest(http.MethodGet, p.url(), nil)
		req.Header.Set("Mcp-Session-Id", streaming)
		req.Header.Set("Accept", "text/event-stream")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		<-opened
		time.Sleep(2500 * time.Millisecond) // longer than the TTL and a janitor sweep
		if ex := send(t, hc, http.MethodPost, p.url(), sid(streaming), `{}`); ex.status != http.StatusOK {
			t.Fatalf("a session with an open GET stream expired: %d %s", ex.status, ex.body)
		}
		checkProxy404(t, send(t, hc, http.MethodPost, p.url(), sid(idle), `{}`))
		resp.Body.Close()
	})
}

// TestUpstreamGone (docs/behaviour.md, "What happens when": session's upstream removed,
// refusing connections, or unhealthy for unhealthy_grace): when the pinned
// upstream is removed from the config, has been marked unhealthy for longer
// than unhealthy_grace, or refuses connections, its sessions get 404 within
// 1 s and are dropped, never re-routed; the other upstreams' sessions are
// untouched and new sessions go to live upstreams.
func TestUpstreamGone(t *testing.T) {
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()

	// setup returns a proxy over three doubles and one session owned by each.
	setup := func(t *testing.T, cfg func(ds []*double) string) ([]*double, proxy, map[*double]string) {
		ds := startDoubles(t, 3)
		p := startProxy(t, cfg(ds))
		owned := map[*double]string{}
		for len(owned) < 3 {
			id := initialize(t, hc, p.url())
			owned[ownerOf(t, ds, id)] = id
		}
		return ds, p, owned
	}
	// check asserts the outcome once ds[0] is gone.
	check := func(t *testing.T, ds []*double, p proxy, owned map[*double]string) {
		gone := ds[0]
		seen := gone.mcpRequests()
		start := time.Now()
		checkProxy404(t, send(t, hc, http.MethodPost, p.url(), sid(owned[gone]), `{}`))
		if took := time.Since(start); took > time.Second {
			t.Fatalf("the 404 took %v; want under 1s", took)
		}
		checkProxy404(t, send(t, hc, http.MethodPost, p.url(), sid(owned[gone]), `{}`))
		for _, d := range ds[1:] {
			if ex := send(t, hc, http.MethodPost, p.url(), sid(owned[d]), `{}`); ex.status != http.StatusOK || !strings.Contains(ex.body, d.name) {
				t.Fatalf("session of live %s broken: %d %s", d.name, ex.status, ex.body)
			}
			if d.sawSession(owned[gone]) != 0 {
				t.Fatalf("the lost session was re-routed to %s", d.name)
			}
		}
		for range 6 {
			if id := initialize(t, hc, p.url()); ownerOf(t, ds, id) == gone {
				t.Fatalf("a new session went to the gone upstream")
			}
		}
		if n := gone.mcpRequests() - seen; n > 1 {
			t.Fatalf("the gone upstream got %d MCP requests after it left", n)
		}
	}

	t.Run("removed by reload", func(t *testing.T) {
		ds, p, owned := setup(t, func(ds []*double) string { return "mcp_proxy " + upstreams(ds) })
		reloadViaAdmin(t, siteConfig(p.port(), "mcp_proxy "+upstreams(ds[1:])))
		hc.CloseIdleConnections() // the old server closes them; see reloadViaAdmin
		check(t, ds, p, owned)
	})

	t.Run("unhealthy per active health checks for longer than the grace", func(t *testing.T) {
		ds, p, owned := setup(t, func(ds []*double) string {
			return "mcp_proxy " + upstreams(ds) + " {\n\t\thealth_uri /health\n\t\thealth_interval 100ms\n\t\tunhealthy_grace 100ms\n\t}"
		})
		for _, d := range ds {
			d.handle(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/health" && d == ds[0] {
					http.Error(w, "down", http.StatusServiceUnavailable)
					return
				}
				d.serveMCP(w, r)
			})
			defer d.handle(nil)
		}
		time.Sleep(400 * time.Millisecond) // a few health checks
		check(t, ds, p, owned)
	})

	t.Run("refusing connections", func(t *testing.T) {
		ds, p, owned := setup(t, func(ds []*double) string { return "mcp_proxy " + upstreams(ds) })
		ds[0].srv.Close()
		waitClosesRead(t, ds[0].addr) // the proxy's idle connections to it see the close
		check(t, ds, p, owned)
	})
}

// TestFailedRequestKeepsOtherSessions: mcp_proxy's passive health checks
// count one failed request against an upstream, but a pinned session has
// nowhere else to go, so that failure must not end the other sessions of
// an upstream that is still alive (nor the failing client's own).
func TestFailedRequestKeepsOtherSessions(t *testing.T) {
	ds := startDoubles(t, 2)
	p := startProxy(t, "mcp_proxy "+upstreams(ds))
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	var mine []string // sessions owned by ds[0]
	for len(mine) < 3 {
		if id := initialize(t, hc, p.url()); ownerOf(t, ds, id) == ds[0] {
			mine = append(mine, id)
		}
	}
	ds[0].handle(func(w http.ResponseWriter, r *http.Request) {
		if body, _ := io.ReadAll(r.Body); strings.Contains(string(body), "crash") {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close() // the upstream fails this one request
			return
		}
		ds[0].serveMCP(w, r)
	})
	defer ds[0].handle(nil)
	if ex := send(t, hc, http.MethodPost, p.url(), sid(mine[0]), `{"crash":1}`); ex.status != http.StatusBadGateway {
		t.Fatalf("the failed request: %d %s, want 502", ex.status, ex.body)
	}
	for _, id := range mine {
		if ex := send(t, hc, http.MethodPost, p.url(), sid(id), `{}`); ex.status != http.StatusOK || !strings.Contains(ex.body, ds[0].name) {
			t.Errorf("session %s after another request failed on its upstream: %d %s", id, ex.status, ex.body)
		}
	}
}
