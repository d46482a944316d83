package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
)

// adminDo sends one request to the admin endpoint, as Caddy's admin server
// would route it, and returns the response and the handler's error.
func adminDo(t *testing.T, method, target, body string) (*httptest.ResponseRecorder, error) {
	t.Helper()
	routes := AdminAPI{}.Routes()
	if len(routes) != 1 || routes[0].Pattern != "/mcp_sessions/" {
		t.Fatalf("Routes() = %+v, want one route at /mcp_sessions/", routes)
	}
	var r *http.Request
	if body == "" {
		r = httptest.NewRequest(method, target, nil)
	} else {
		r = httptest.NewRequest(method, target, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	err := routes[0].Handler.ServeHTTP(rec, r)
	return rec, err
}

// adminOK sends one request that must succeed and decodes its JSON answer into v.
// It returns the raw body.
func adminOK(t *testing.T, method, target, body string, v any) string {
	t.Helper()
	rec, err := adminDo(t, method, target, body)
	if err != nil {
		t.Fatalf("%s %s %s: %v", method, target, body, err)
	}
	if rec.Code != http.StatusOK {
		t.Errorf("%s %s: status %d, want 200", method, target, rec.Code)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", method, target, ct)
	}
	if v != nil {
		dec := json.NewDecoder(strings.NewReader(rec.Body.String()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			t.Fatalf("%s %s: body %q: %v", method, target, rec.Body, err)
		}
	}
	return rec.Body.String()
}

// wantAPIError checks that err is a caddy.APIError with the status, whose
// message contains every one of msgs, and that nothing was written.
func wantAPIError(t *testing.T, rec *httptest.ResponseRecorder, err error, status int, msgs ...string) caddy.APIError {
	t.Helper()
	var ae caddy.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("error = %v (%T), want a caddy.APIError with status %d", err, err, status)
	}
	if ae.HTTPStatus != status {
		t.Errorf("status = %d, want %d (message %q)", ae.HTTPStatus, status, ae.Message)
	}
	for _, m := range msgs {
		if !strings.Contains(ae.Message, m) {
			t.Errorf("message %q does not contain %q", ae.Message, m)
		}
	}
	if rec.Body.Len() != 0 {
		t.Errorf("the endpoint wrote %q before erroring; Caddy's admin server writes the error", rec.Body)
	}
	return ae
}

// testApp is the mcp_sessions app that the admin API finds running in
// these tests. It has no http app, so it knows no configured upstreams.
var testApp = &App{mu: new(sync.Mutex), uses: map[string]*tableUse{}}

func init() {
	runningApp = func() (*App, error) { return testApp, nil }
}

// addToTestApp puts tbl in the running app until the test ends.
func addToTestApp(t *testing.T, tbl *session.Table) {
	testApp.mu.Lock()
	defer testApp.mu.Unlock()
	if testApp.uses[tbl.Name()] != nil {
		t.Fatalf("table %q already in the app", tbl.Name())
	}
	testApp.uses[tbl.Name()] = &tableUse{table: tbl}
	t.Cleanup(func() {
		testApp.mu.Lock()
		defer testApp.mu.Unlock()
		delete(testApp.uses, tbl.Name())
	})
}

// adminTable acquires a table with a name unique to the test (and suffix),
// puts it in the running app, and releases it when the test ends.
func adminTable(t *testing.T, suffix string, maxSessions int, ttl time.Duration) *session.Table {
	t.Helper()
	name := "admin/" + t.Name() + suffix
	tbl, err := acquireTable(name, maxSessions, ttl)
	if err != nil {
		t.Fatalf("acquireTable: %v", err)
	}
	t.Cleanup(func() { releaseTable(name) })
	addToTestApp(t, tbl)
	return tbl
}

// clockTable puts a table reading time from a fake clock in the running
// app, until the test ends.
func clockTable(t *testing.T, maxSessions int, ttl time.Duration) (*session.Table, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	tbl, err := NewTable("admin-clock/"+t.Name(), maxSessions, ttl, clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	addToTestApp(t, tbl)
	return tbl, clk
}

func postBody(fields map[string]string) string {
	b, err := json.Marshal(fields)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestAdminModule(t *testing.T) {
	info := AdminAPI{}.CaddyModule()
	if info.ID != "admin.api.mcp_sessions" {
		t.Errorf("ID = %q", info.ID)
	}
	if _, ok := info.New().(caddy.AdminRouter); !ok {
		t.Errorf("New() = %T, not a caddy.AdminRouter", info.New())
	}
}

func TestAdminList(t *testing.T) {
	b := adminTable(t, "/b", 50, 90*time.Minute)
	a := adminTable(t, "/a", 7, time.Hour)
	a.Learn("S1", "10.0.0.2:80")
	a.Learn("S2", "10.0.0.1:80")
	a.Learn("S3", "10.0.0.2:80")
	a.Learn("S4", "10.0.0.3:80")
	a.Evict("S4", session.EvictDelete) // 10.0.0.3:80 stays known with 0 sessions
	a.SetDraining("10.0.0.2:80", true)
	a.SetDraining("10.0.0.9:80", true) // draining before it owns any session

	var list []TableStatus
	raw := adminOK(t, http.MethodGet, "/mcp_sessions/", "", &list)
	if !slices.IsSortedFunc(list, func(x, y TableStatus) int { return strings.Compare(x.Table, y.Table) }) {
		t.Errorf("tables are not sorted by name: %s", raw)
	}
	byName := map[string]TableStatus{}
	for _, st := range list {
		byName[st.Table] = st
		if !slices.IsSortedFunc(st.Upstreams, func(x, y UpstreamStatus) int { return strings.Compare(x.Upstream, y.Upstream) }) {
			t.Errorf("upstreams of %q are not sorted by dial: %+v", st.Table, st.Upstreams)
		}
	}
	gotA, okA := byName[a.Name()]
	gotB, okB := byName[b.Name()]
	if !okA || !okB {
		t.Fatalf("list %s lacks %q or %q", raw, a.Name(), b.Name())
	}
	wantA := TableStatus{Table: a.Name(), Sessions: 3, MaxSessions: 7, SessionTTL: "1h0m0s", Upstreams: []UpstreamStatus{
		{Table: a.Name(), Upstream: "10.0.0.1:80", LiveSessions: 1},
		{Table: a.Name(), Upstream: "10.0.0.2:80", LiveSessions: 2, Draining: true},
		{Table: a.Name(), Upstream: "10.0.0.3:80", LiveSessions: 0},
		{Table: a.Name(), Upstream: "10.0.0.9:80", LiveSessions: 0, Draining: true},
	}}
	if !tableStatusEqual(gotA, wantA) {
		t.Errorf("table a = %+v\nwant      %+v", gotA, wantA)
	}
	wantB := TableStatus{Table: b.Name(), Sessions: 0, MaxSessions: 50, SessionTTL: "1h30m0s", Upstreams: []UpstreamStatus{}}
	if !tableStatusEqual(gotB, wantB) {
		t.Errorf("table b = %+v, want %+v", gotB, wantB)
	}
	// An empty table lists its upstreams as [], not null.
	if !strings.Contains(raw, `"table":"`+b.Name()+`","sessions":0,"max_sessions":50,"session_ttl":"1h30m0s","upstreams":[]`) {
		t.Errorf("body %s does not list table b with \"upstreams\":[]", raw)
	}
	for _, id := range []string{"S1", "S2", "S3"} {
		if strings.Contains(raw, `"`+id+`"`) {
			t.Errorf("the list carries session ID %q: %s", id, raw)
		}
	}
}

func tableStatusEqual(a, b TableStatus) bool {
	return a.Table == b.Table && a.Sessions == b.Sessions && a.MaxSessions == b.MaxSessions &&
		a.SessionTTL == b.SessionTTL && slices.Equal(a.Upstreams, b.Upstreams) && a.Upstreams != nil
}

func TestAdminUpstream(t *testing.T) {
	tbl := adminTable(t, "", 10, time.Hour)
	tbl.Learn("S1", "10.0.0.1:80")
	tbl.Learn("S2", "10.0.0.1:80")
	q := func(table, upstream string) string {
		v := url.Values{}
		if table != "" {
			v.Set("table", table)
		}
		if upstream != "" {
			v.Set("upstream", upstream)
		}
		return "/mcp_sessions/upstream?" + v.Encode()
	}

	var st UpstreamStatus
	raw := adminOK(t, http.MethodGet, q(tbl.Name(), "10.0.0.1:80"), "", &st)
	if want := (UpstreamStatus{Table: tbl.Name(), Upstream: "10.0.0.1:80", LiveSessions: 2}); st != want {
		t.Errorf("known upstream = %+v, want %+v", st, want)
	}
	if want := `{"table":"` + tbl.Name() + `","upstream":"10.0.0.1:80","live_sessions":2,"draining":false}` + "\n"; raw != want {
		t.Errorf("body = %q, want %q", raw, want)
	}

	// An upstream the table does not know (a typo, or one the proxy never
	// routed to): 404 listing the known ones, so that a typo never looks
	// like "drain done"; asking does not create a record for it.
	rec, err := adminDo(t, http.MethodGet, q(tbl.Name(), "10.0.0.7:80"), "")
	wantAPIError(t, rec, err, http.StatusNotFound, `knows no upstream "10.0.0.7:80"`, "10.0.0.1:80")
	if tbl.KnownUpstream("10.0.0.7:80") != nil {
		t.Error("a GET created a record for the upstream")
	}

	// Missing upstream: 400 that says what to give.
	rec, err = adminDo(t, http.MethodGet, q(tbl.Name(), ""), "")
	wantAPIError(t, rec, err, http.StatusBadRequest, "missing upstream", "dial address", "127.0.0.1:9001")

	// Unknown table: 404 naming the tables in use.
	rec, err = adminDo(t, http.MethodGet, q("no-such-table/"+t.Name(), "10.0.0.1:80"), "")
	wantAPIError(t, rec, err, http.StatusNotFound, `no session table named "no-such-table/`+t.Name()+`"`, "tables in use: ", tbl.Name())
}

// TestAdminDefaultTable checks that an empty or missing table names "default".
func TestAdminDefaultTable(t *testing.T) {
	tbl, err := NewTable(session.DefaultTableName, session.DefaultMaxSessions, session.DefaultSessionTTL, nil)
	if err != nil {
		t.Fatal(err)
	}
	addToTestApp(t, tbl)
	tbl.UseUpstream("10.9.9.9:1") // an upstream the proxy has routed to
	var st UpstreamStatus
	adminOK(t, http.MethodGet, "/mcp_sessions/upstream?upstream=10.9.9.9:1", "", &st)
	if st.Table != session.DefaultTableName {
		t.Errorf("table = %q, want %q", st.Table, session.DefaultTableName)
	}
	st = UpstreamStatus{}
	adminOK(t, http.MethodPost, "/mcp_sessions/undrain", `{"upstream":"10.9.9.9:1"}`, &st)
	if st.Table != session.DefaultTableName || st.Draining {
		t.Errorf("undrain without table = %+v, want the default table, not draining", st)
	}
}

func TestAdminDrainUndrain(t *testing.T) {
	tbl := adminTable(t, "", 10, time.Hour)
	tbl.Learn("S1", "10.0.0.1:80")
	tbl.Learn("S2", "10.0.0.1:80")
	tbl.Learn("S3", "10.0.0.2:80")
	body := postBody(map[string]string{"table": tbl.Name(), "upstream": "10.0.0.1:80"})

	post := func(op string, wantDraining bool) {
		t.Helper()
		var st UpstreamStatus
		raw := adminOK(t, http.MethodPost, "/mcp_sessions/"+op, body, &st)
		want := UpstreamStatus{Table: tbl.Name(), Upstream: "10.0.0.1:80", LiveSessions: 2, Draining: wantDraining}
		if st != want {
			t.Errorf("%s = %+v, want %+v", op, st, want)
		}
		wantRaw, _ := json.Marshal(want)
		if raw != string(wantRaw)+"\n" {
			t.Errorf("%s body = %q, want %q", op, raw, wantRaw)
		}
		if u := tbl.KnownUpstream("10.0.0.1:80"); u == nil || u.Draining() != wantDraining {
			t.Errorf("after %s the table's record drains: %v, want %v", op, u != nil && u.Draining(), wantDraining)
		}
		if tbl.AnyDraining() != wantDraining {
			t.Errorf("after %s AnyDraining() = %v, want %v", op, tbl.AnyDraining(), wantDraining)
		}
	}
	post("drain", true)
	post("drain", true) // idempotent
	post("undrain", false)
	post("undrain", false) // idempotent: the count of draining upstreams must not go below 0
	post("drain", true)
	post("undrain", false)

	// The other upstream was never touched.
	if u := tbl.KnownUpstream("10.0.0.2:80"); u.Draining() || u.LiveSessions() != 1 {
		t.Errorf("other upstream: draining %v, %d sessions", u.Draining(), u.LiveSessions())
	}

	// Two upstreams draining: AnyDraining holds until both are undrained.
	other := postBody(map[string]string{"table": tbl.Name(), "upstream": "10.0.0.2:80"})
	adminOK(t, http.MethodPost, "/mcp_sessions/drain", body, nil)
	adminOK(t, http.MethodPost, "/mcp_sessions/drain", other, nil)
	adminOK(t, http.MethodPost, "/mcp_sessions/undrain", body, nil)
	if !tbl.AnyDraining() {
		t.Error("AnyDraining() = false while 10.0.0.2:80 still drains")
	}
	adminOK(t, http.MethodPost, "/mcp_sessions/undrain", other, nil)
	if tbl.AnyDraining() {
		t.Error("AnyDraining() = true after every upstream was undrained")
	}

	// Draining an upstream the table does not know is refused: it would
	// report "drain done" for a typo.
	rec, err := adminDo(t, http.MethodPost, "/mcp_sessions/drain", postBody(map[string]string{"table": tbl.Name(), "upstream": "10.0.0.5:80"}))
	wantAPIError(t, rec, err, http.StatusNotFound, `knows no upstream "10.0.0.5:80"`)
	if tbl.KnownUpstream("10.0.0.5:80") != nil {
		t.Error("a refused drain created a record for the upstream")
	}

	// Errors.
	rec, err = adminDo(t, http.MethodPost, "/mcp_sessions/drain", postBody(map[string]string{"table": tbl.Name()}))
	wantAPIError(t, rec, err, http.StatusBadRequest, "missing upstream", "dial address")
	rec, err = adminDo(t, http.MethodPost, "/mcp_sessions/undrain", postBody(map[string]string{"table": "nope/" + t.Name(), "upstream": "10.0.0.1:80"}))
	wantAPIError(t, rec, err, http.StatusNotFound, `no session table named "nope/`+t.Name()+`"`, tbl.Name())
}

func TestAdminLookupEvict(t *testing.T) {
	tbl, clk := clockTable(t, 10, time.Hour)
	tbl.Learn(testSessionID, "10.0.0.1:80")
	tbl.Learn("OTHER-SESSION-ID", "10.0.0.2:80")
	body := postBody(map[string]string{"table": tbl.Name(), "session_id": testSessionID})
	fp := fingerprint(testSessionID)

	lookup := func(want SessionStatus) {
		t.Helper()
		var st SessionStatus
		raw := adminOK(t, http.MethodPost, "/mcp_sessions/lookup", body, &st)
		if !reflect.DeepEqual(st, want) {
			t.Errorf("lookup = %s, want %s", asJSON(st), asJSON(want))
		}
		if strings.Contains(raw, testSessionID) {
			t.Errorf("lookup body carries the session ID: %s", raw)
		}
		if !strings.Contains(raw, `"fingerprint":"`+fp+`"`) {
			t.Errorf("lookup body %s lacks fingerprint %s", raw, fp)
		}
		if strings.Contains(raw, "evicted") {
			t.Errorf("lookup body %s mentions evicted", raw)
		}
	}

	clk.Advance(90 * time.Second)
	lookup(SessionStatus{Table: tbl.Name(), Fingerprint: fp, Upstream: "10.0.0.1:80", AgeSeconds: secs(90), IdleSeconds: secs(90)})
	// An admin lookup is not use of the session.
	lookup(SessionStatus{Table: tbl.Name(), Fingerprint: fp, Upstream: "10.0.0.1:80", AgeSeconds: secs(90), IdleSeconds: secs(90)})

	tbl.Lookup(testSessionID) // proxied request: use
	clk.Advance(5500 * time.Millisecond)
	tbl.StreamOpened(testSessionID) // a GET stream opens: use too
	clk.Advance(2500 * time.Millisecond)
	lookup(SessionStatus{Table: tbl.Name(), Fingerprint: fp, Upstream: "10.0.0.1:80", AgeSeconds: secs(98), IdleSeconds: secs(2), OpenStreams: 1})

	if len(fp) != 12 || fp == testSessionID[:12] {
		t.Errorf("fingerprint %q is not 12 hex digits of a hash", fp)
	}

	// Evict.
	var st SessionStatus
	raw := adminOK(t, http.MethodPost, "/mcp_sessions/evict", body, &st)
	want := SessionStatus{Table: tbl.Name(), Fingerprint: fp, Upstream: "10.0.0.1:80", AgeSeconds: secs(98), IdleSeconds: secs(2), OpenStreams: 1, Evicted: true}
	if !reflect.DeepEqual(st, want) {
		t.Errorf("evict = %s, want %s", asJSON(st), asJSON(want))
	}
	if strings.Contains(raw, testSessionID) || !strings.Contains(raw, `"evicted":true`) {
		t.Errorf("evict body = %s, want evicted true and no session ID", raw)
	}
	if tbl.Len() != 1 || tbl.Lookup(testSessionID) != nil {
		t.Errorf("after evict: Len() = %d, session still mapped: %v", tbl.Len(), tbl.Lookup(testSessionID) != nil)
	}
	if got := liveSessions(tbl); got["10.0.0.1:80"] != 0 || got["10.0.0.2:80"] != 1 {
		t.Errorf("live sessions after evict = %v", got)
	}
	wantEvictions(t, tbl, map[session.EvictReason]uint64{session.EvictAdmin: 1})

	// Evicting or looking up again: 404 naming the fingerprint, never the ID.
	for _, op := range []string{"evict", "lookup"} {
		rec, err := adminDo(t, http.MethodPost, "/mcp_sessions/"+op, body)
		ae := wantAPIError(t, rec, err, http.StatusNotFound, "holds no session with fingerprint "+fp, tbl.Name())
		if strings.Contains(ae.Message, testSessionID) || strings.Contains(ae.Err.Error(), testSessionID) {
			t.Errorf("%s error carries the session ID: %q", op, ae.Message)
		}
	}
	wantEvictions(t, tbl, map[session.EvictReason]uint64{session.EvictAdmin: 1})

	// Missing session_id.
	rec, err := adminDo(t, http.MethodPost, "/mcp_sessions/lookup", postBody(map[string]string{"table": tbl.Name()}))
	wantAPIError(t, rec, err, http.StatusBadRequest, "missing session_id")
}

// TestAdminLookupExpired checks that a session past its TTL that the janitor
// has not swept yet is reported as absent, as the proxy would treat it.
func TestAdminLookupExpired(t *testing.T) {
	tbl, clk := clockTable(t, 10, time.Minute)
	tbl.Learn(testSessionID, "10.0.0.1:80")
	clk.Advance(time.Minute + time.Second)
	rec, err := adminDo(t, http.MethodPost, "/mcp_sessions/evict", postBody(map[string]string{"table": tbl.Name(), "session_id": testSessionID}))
	wantAPIError(t, rec, err, http.StatusNotFound, "holds no session")
	if tbl.Evictions(session.EvictAdmin) != 0 {
		t.Error("an expired session was counted as evicted by the admin")
	}
}

func TestAdminErrors(t *testing.T) {
	tbl := adminTable(t, "", 10, time.Hour)
	tbl.Learn(testSessionID, "10.0.0.1:80")
	for _, tc := range []struct {
		name, method, target, body string
		status                     int
		msgs                       []string
	}{
		{name: "POST list", method: http.MethodPost, target: "/mcp_sessions/", body: `{}`, status: 405, msgs: []string{"use GET"}},
		{name: "DELETE list", method: http.MethodDelete, target: "/mcp_sessions/", status: 405, msgs: []string{"use GET"}},
		{name: "POST upstream", method: http.MethodPost, target: "/mcp_sessions/upstream?upstream=a:1", body: `{}`, status: 405, msgs: []string{"use GET"}},
		{name: "GET drain", method: http.MethodGet, target: "/mcp_sessions/drain?upstream=a:1", status: 405, msgs: []string{"use POST with a JSON body"}},
		{name: "PUT undrain", method: http.MethodPut, target: "/mcp_sessions/undrain", body: `{"upstream":"a:1"}`, status: 405, msgs: []string{"use POST"}},
		{name: "GET lookup", method: http.MethodGet, target: "/mcp_sessions/lookup", status: 405, msgs: []string{"use POST"}},
		{name: "DELETE evict", method: http.MethodDelete, target: "/mcp_sessions/evict", status: 405, msgs: []string{"use POST"}},
		{name: "unknown endpoint", method: http.MethodGet, target: "/mcp_sessions/sessions", status: 404, msgs: []string{"unknown endpoint /mcp_sessions/sessions"}},
		{name: "trailing slash", method: http.MethodPost, target: "/mcp_sessions/drain/", body: `{}`, status: 404, msgs: []string{"unknown endpoint", "docs/operating.md#admin-api"}},
		{name: "empty body", method: http.MethodPost, target: "/mcp_sessions/drain", status: 400, msgs: []string{"decoding the JSON body", "the body is empty", `{"table":"default","upstream":"127.0.0.1:9001"`}},
		{name: "truncated JSON", method: http.MethodPost, target: "/mcp_sessions/lookup", body: `{"table":"` + tbl.Name() + `","session_id":"` + testSessionID, status: 400, msgs: []string{"decoding the JSON body"}},
		{name: "not an object", method: http.MethodPost, target: "/mcp_sessions/evict", body: `["` + testSessionID + `"]`, status: 400, msgs: []string{"decoding the JSON body", "not an object"}},
		{name: "wrong type", method: http.MethodPost, target: "/mcp_sessions/evict", body: `{"session_id":["` + testSessionID + `"]}`, status: 400, msgs: []string{"decoding the JSON body", `field "session_id" is a JSON array: give it as a JSON string`}},
		{name: "number as table", method: http.MethodPost, target: "/mcp_sessions/drain", body: `{"table":5,"upstream":"a:1"}`, status: 400, msgs: []string{"decoding the JSON body", `field "table" is a JSON number`}},
		{name: "garbage after a session ID", method: http.MethodPost, target: "/mcp_sessions/lookup", body: `{"session_id":"` + testSessionID + `"x}`, status: 400, msgs: []string{"decoding the JSON body"}},
		{name: "body over 64 KiB", method: http.MethodPost, target: "/mcp_sessions/lookup", body: `{"table":"` + strings.Repeat("x", 1<<16) + `"}`, status: 400, msgs: []string{"decoding the JSON body", "larger than 65536 bytes"}},
		{name: "unknown table", method: http.MethodPost, target: "/mcp_sessions/lookup", body: `{"table":"nope","session_id":"` + testSessionID + `"}`, status: 404, msgs: []string{`no session table named "nope"; tables in use: `, tbl.Name()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := adminDo(t, tc.method, tc.target, tc.body)
			ae := wantAPIError(t, rec, err, tc.status, tc.msgs...)
			if strings.Contains(ae.Message, testSessionID) {
				t.Errorf("error message carries the session ID: %q", ae.Message)
			}
		})
	}
	// No error changed the table.
	if tbl.Len() != 1 || tbl.AnyDraining() || tbl.Evictions(session.EvictAdmin) != 0 {
		t.Errorf("errors changed the table: Len %d, draining %v, admin evictions %d", tbl.Len(), tbl.AnyDraining(), tbl.Evictions(session.EvictAdmin))
	}
}

// TestAdminUnknownTableListsSorted checks that the 404 of an unknown table
// lists every table in use, sorted.
func TestAdminUnknownTableListsSorted(t *testing.T) {
	z := adminTable(t, "/z", 10, time.Hour)
	a := adminTable(t, "/a", 10, time.Hour)
	rec, err := adminDo(t, http.MethodPost, "/mcp_sessions/lookup", `{"table":"nope","session_id":"x"}`)
	ae := wantAPIError(t, rec, err, http.StatusNotFound)
	_, list, ok := strings.Cut(ae.Message, "tables in use: ")
	if !ok {
		t.Fatalf("message %q does not list the tables in use", ae.Message)
	}
	names := strings.Split(list, ", ")
	if !slices.IsSorted(names) {
		t.Errorf("tables in use are not sorted: %q", names)
	}
	if !slices.Contains(names, a.Name()) || !slices.Contains(names, z.Name()) {
		t.Errorf("tables in use %q lack %q or %q", names, a.Name(), z.Name())
	}
	// Every table of the app is named.
	all := slices.Sorted(maps.Keys(testApp.tables()))
	if !slices.Equal(names, all) {
		t.Errorf("tables in use = %q, want %q", names, all)
	}
}

// TestAdminEvictUpstream checks evicting every session of one upstream, as
// a deploy script does after replacing an upstream that did not drain.
func TestAdminEvictUpstream(t *testing.T) {
	tbl := adminTable(t, "", 10, time.Hour)
	for i, dial := range []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.1:80"} {
		tbl.Learn(fmt.Sprintf("S%d", i), dial)
	}
	var got UpstreamEviction
	adminOK(t, http.MethodPost, "/mcp_sessions/evict", postBody(map[string]string{"table": tbl.Name(), "upstream": "10.0.0.1:80"}), &got)
	if want := (UpstreamEviction{Table: tbl.Name(), Upstream: "10.0.0.1:80", EvictedSessions: 2}); got != want {
		t.Errorf("evict upstream = %+v, want %+v", got, want)
	}
	if tbl.Len() != 1 || tbl.Evictions(session.EvictAdmin) != 2 {
		t.Errorf("after the eviction: %d sessions, %d admin evictions; want 1, 2", tbl.Len(), tbl.Evictions(session.EvictAdmin))
	}
	rec, err := adminDo(t, http.MethodPost, "/mcp_sessions/evict", postBody(map[string]string{"table": tbl.Name(), "upstream": "10.0.0.9:80"}))
	wantAPIError(t, rec, err, http.StatusNotFound, `knows no upstream "10.0.0.9:80"`)
}

// secs returns a pointer to n seconds, as SessionStatus holds them.
func secs(n float64) *float64 { return &n }

// asJSON renders v for a failure message.
func asJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestAdminRefusesFieldsTheEndpointIgnores: a call never acts on part of
// what it was given.
func TestAdminRefusesFieldsTheEndpointIgnores(t *testing.T) {
	tbl, _ := clockTable(t, 10, time.Hour)
	tbl.Learn(testSessionID, "10.0.0.1:80")
	for _, tc := range []struct {
		op   string
		body map[string]string
		want string
	}{
		{"evict", map[string]string{"session_id": testSessionID, "upstream": "10.0.0.1:80"}, "not both"},
		{"drain", map[string]string{"session_id": testSessionID, "upstream": "10.0.0.1:80"}, "act on an upstream"},
		{"undrain", map[string]string{"upstream": "10.0.0.1:80", "deadline": "1m"}, "only drain takes one"},
		{"lookup", map[string]string{"session_id": testSessionID, "upstream": "10.0.0.2:80"}, "lookup finds a session by session_id"},
	} {
		tc.body["table"] = tbl.Name()
		rec, err := adminDo(t, http.MethodPost, "/mcp_sessions/"+tc.op, postBody(tc.body))
		wantAPIError(t, rec, err, http.StatusBadRequest, tc.want)
	}
	if tbl.Lookup(testSessionID) == nil || tbl.KnownUpstream("10.0.0.1:80").Draining() {
		t.Error("a refused call changed the table")
	}
}

// TestAdminRefusesAmbiguousInput: input a lenient reader takes in two ways
// (a key twice, a second value, a parameter twice) gets 400, saying what
// to send instead, and changes nothing. The end-to-end test against a real
// Caddy is tests.TestAdminRefusesAmbiguousInput.
func TestAdminRefusesAmbiguousInput(t *testing.T) {
	tbl, _ := clockTable(t, 10, time.Hour)
	tbl.Learn(testSessionID, "10.0.0.1:80")
	tbl.UseUpstream("10.0.0.2:80")
	name := tbl.Name()
	drain := func(rest string) string { return `{"table":"` + name + `","upstream":"10.0.0.1:80"` + rest + `}` }
	for _, tc := range []struct {
		name, method, target, body string
		msgs                       []string
	}{
		{"key twice", "POST", "/mcp_sessions/drain", drain(`,"upstream":"10.0.0.2:80"`), []string{`key "upstream" is given twice: give each field once`}},
		{"key twice, escaped", "POST", "/mcp_sessions/drain", drain(`,"upstre\u0061m":"10.0.0.2:80"`), []string{`key "upstream" is given twice`}},
		{"table twice", "POST", "/mcp_sessions/drain", `{"table":"nope","table":"` + name + `","upstream":"10.0.0.1:80"}`, []string{`key "table" is given twice`}},
		{"key in another case", "POST", "/mcp_sessions/drain", drain(`,"Upstream":"10.0.0.2:80"`), []string{`keys "upstream" and "Upstream" are the same field`}},
		{"key with the long s", "POST", "/mcp_sessions/evict", `{"table":"` + name + `","ſession_id":"` + testSessionID + `"}`, []string{`unknown field "ſession_id"`}},
		{"key with the long s, twice", "POST", "/mcp_sessions/evict", `{"table":"` + name + `","session_id":"x","\u017fession_id":"` + testSessionID + `"}`, []string{`keys "session_id" and "ſession_id" are the same field`}},
		{"unknown key in another case", "POST", "/mcp_sessions/drain", `{"Table":"` + name + `","upstream":"10.0.0.1:80"}`, []string{`unknown field "Table"`, "fields: table, upstream, session_id, deadline"}},
		{"second object", "POST", "/mcp_sessions/drain", drain(``) + `{"table":"` + name + `","upstream":"10.0.0.2:80"}`, []string{"more follows the object at byte", "send one JSON object"}},
		{"second object after a newline", "POST", "/mcp_sessions/evict", `{"table":"` + name + `","upstream":"10.0.0.2:80"}` + "\n" + `{"table":"` + name + `","session_id":"` + testSessionID + `"}`, []string{"more follows the object"}},
		{"text after the object", "POST", "/mcp_sessions/drain", drain(``) + ` x`, []string{"more follows the object"}},
		{"null field", "POST", "/mcp_sessions/drain", `{"table":null,"upstream":"10.0.0.1:80"}`, []string{`field "table": null is not a value here`}},
		{"nested key twice", "POST", "/mcp_sessions/drain", drain(`,"deadline":{"a":1,"a":2}`), []string{`field "deadline": key "a" is given twice`}},
		{"deep nesting", "POST", "/mcp_sessions/drain", drain(`,"deadline":` + strings.Repeat("[", 40) + strings.Repeat("]", 40)), []string{"nest deeper than"}},
		{"query parameter twice", "GET", "/mcp_sessions/upstream?table=" + name + "&upstream=10.0.0.1:80&upstream=10.0.0.2:80", "", []string{"query parameter upstream is given 2 times: give it once"}},
		{"unknown query parameter", "GET", "/mcp_sessions/upstream?table=" + name + "&upstream=10.0.0.1:80&Upstream=10.0.0.2:80", "", []string{`takes the query parameters table and upstream, not "Upstream"`}},
		{"session ID in the query", "GET", "/mcp_sessions/upstream?upstream=10.0.0.1:80&session_id=x", "", []string{"never in a URL"}},
		{"query that does not parse", "GET", "/mcp_sessions/upstream?upstream=10.0.0.1:80&table=%zz", "", []string{"the query does not parse"}},
		{"query on the list", "GET", "/mcp_sessions/?table=" + name, "", []string{"GET /mcp_sessions/ takes no query parameters"}},
		{"query on a POST", "POST", "/mcp_sessions/drain?upstream=10.0.0.2:80", drain(``), []string{"takes no query parameters", "give the fields in the JSON body"}},
		{"body on a GET", "GET", "/mcp_sessions/upstream?table=" + name + "&upstream=10.0.0.1:80", `{"upstream":"10.0.0.2:80"}`, []string{"takes no body"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec, err := adminDo(t, tc.method, tc.target, tc.body)
			ae := wantAPIError(t, rec, err, http.StatusBadRequest, tc.msgs...)
			if strings.Contains(ae.Message, testSessionID) {
				t.Errorf("error message carries the session ID: %q", ae.Message)
			}
		})
	}
	if tbl.Lookup(testSessionID) == nil || tbl.AnyDraining() || tbl.Evictions(session.EvictAdmin) != 0 {
		t.Error("a refused call changed the table")
	}
	// The control: the same calls, well formed, act.
	adminOK(t, "POST", "/mcp_sessions/drain", drain(``), nil)
	if !tbl.KnownUpstream("10.0.0.1:80").Draining() {
		t.Error("a well-formed drain did not drain")
	}
	adminOK(t, "GET", "/mcp_sessions/upstream?table="+name+"&upstream=10.0.0.1:80", "", nil)
	adminOK(t, "POST", "/mcp_sessions/evict", "\r\n\t "+`{"table":"`+name+`","session_id":"`+testSessionID+`"}`+" \n", nil)
	if tbl.Lookup(testSessionID) != nil {
		t.Error("a well-formed evict, with whitespace around its object, did not evict")
	}
}

// TestFoldKey checks that keys encoding/json matches to the same field
// fold to the same key, and others do not.
func TestFoldKey(t *testing.T) {
	type probe struct {
		Params string `json:"params"`
	}
	for _, key := range []string{"params", "PARAMS", "Params", "paramſ", "pArAmS"} {
		var p probe
		if err := json.Unmarshal([]byte(`{"`+key+`":"x"}`), &p); err != nil || p.Params != "x" {
			t.Fatalf("encoding/json does not read %q as params: %v", key, err)
		}
		if foldKey(key) != foldKey("params") {
			t.Errorf("foldKey(%q) = %q, foldKey(params) = %q", key, foldKey(key), foldKey("params"))
		}
	}
	if foldKey("\u212a") != foldKey("k") || foldKey("k") != foldKey("K") {
		t.Error("the Kelvin sign, k and K fold apart")
	}
	if foldKey("params") == foldKey("param") || foldKey("table") == foldKey("tables") {
		t.Error("different keys fold together")
	}
}
