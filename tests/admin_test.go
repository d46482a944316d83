package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/caddymodule"
)

// The admin API's answers decode into the plugin's own response types
// (caddymodule.TableStatus, UpstreamStatus, SessionStatus), so the tests
// and the API cannot drift apart; the rolling deploy script's test checks
// the same answers as JSON text, the way an operator's tooling reads them.

// adminClient talks to the in-process Caddy's admin endpoint.
var adminClient = &http.Client{Timeout: 5 * time.Second}

// adminDo sends body (JSON, when not nil) to the admin endpoint and decodes
// a 200 answer into out (when not nil). It returns the status, or an error
// when the request or the decoding failed. It does not fail the test, so a
// goroutine may call it.
func adminDo(method, path string, body, out any) (int, error) {
	return adminDoAt(adminAddr, method, path, body, out)
}

// adminDoAt is adminDo to the Caddy whose admin endpoint is admin.
func adminDoAt(admin, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, "http://"+admin+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := adminClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || out == nil || resp.StatusCode != http.StatusOK {
		return resp.StatusCode, err
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return resp.StatusCode, fmt.Errorf("%s %s: decoding %q: %w", method, path, raw, err)
	}
	return resp.StatusCode, nil
}

// adminCall is adminDo, failing the test when the request fails.
func adminCall(t testing.TB, method, path string, body, out any) int {
	t.Helper()
	status, err := adminDo(method, path, body, out)
	if err != nil {
		t.Fatalf("admin API: %v", err)
	}
	return status
}

// adminOK is adminCall, failing the test unless the answer is 200.
func adminOK(t testing.TB, method, path string, body, out any) {
	t.Helper()
	if status := adminCall(t, method, path, body, out); status != http.StatusOK {
		t.Fatalf("admin API %s %s: %d", method, path, status)
	}
}

// upstreamOf returns GET /mcp_sessions/upstream's answer for upstream in table.
func upstreamOf(table, upstream string) (caddymodule.UpstreamStatus, error) {
	var st caddymodule.UpstreamStatus
	q := url.Values{"table": {table}, "upstream": {upstream}}
	status, err := adminDo(http.MethodGet, "/mcp_sessions/upstream?"+q.Encode(), nil, &st)
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("GET /mcp_sessions/upstream %s: %d", upstream, status)
	}
	return st, err
}

// mustUpstream is upstreamOf, failing the test on error.
func mustUpstream(t testing.TB, table, upstream string) caddymodule.UpstreamStatus {
	t.Helper()
	st, err := upstreamOf(table, upstream)
	if err != nil {
		t.Fatalf("admin API: %v", err)
	}
	return st
}

// setDraining drains (on) or undrains upstream in table through the admin
// API and returns the answer, which must say so.
func setDraining(t testing.TB, table, upstream string, on bool) caddymodule.UpstreamStatus {
	t.Helper()
	op := map[bool]string{true: "drain", false: "undrain"}[on]
	var st caddymodule.UpstreamStatus
	adminOK(t, http.MethodPost, "/mcp_sessions/"+op, map[string]string{"table": table, "upstream": upstream}, &st)
	if st.Draining != on {
		t.Fatalf("admin API %s %s: answer says draining=%v", op, upstream, st.Draining)
	}
	return st
}

// tableOf returns the admin API's view of the running config's table name,
// failing the test when there is none.
func tableOf(t testing.TB, name string) caddymodule.TableStatus {
	t.Helper()
	var list []caddymodule.TableStatus
	adminOK(t, http.MethodGet, "/mcp_sessions/", nil, &list)
	i := slices.IndexFunc(list, func(s caddymodule.TableStatus) bool { return s.Table == name })
	if i < 0 {
		t.Fatalf("the running config has no table %q: %+v", name, list)
	}
	return list[i]
}

// caddyFails returns the failed requests Caddy's passive health checks
// count against the upstream dialed at dial (the `fails` of Caddy's
// /reverse_proxy/upstreams admin endpoint), -1 when Caddy lists no such
// upstream.
func caddyFails(t testing.TB, dial string) int {
	t.Helper()
	var hosts []struct {
		Address string `json:"address"`
		Fails   int    `json:"fails"`
	}
	adminOK(t, http.MethodGet, "/reverse_proxy/upstreams", nil, &hosts)
	for _, h := range hosts {
		if h.Address == dial {
			return h.Fails
		}
	}
	return -1
}

// upstreamSessions sums the live sessions over the upstreams of the one
// table the admin API at url lists.
func upstreamSessions(t *testing.T, url string) int64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tables []caddymodule.TableStatus
	if err := json.NewDecoder(resp.Body).Decode(&tables); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d, %v", url, resp.StatusCode, err)
	}
	if len(tables) != 1 || len(tables[0].Upstreams) != 3 {
		t.Fatalf("GET %s: want one table with 3 upstreams, got %+v", url, tables)
	}
	var n int64
	for _, u := range tables[0].Upstreams {
		n += u.LiveSessions
	}
	return n
}
