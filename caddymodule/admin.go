package caddymodule

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

func init() {
	caddy.RegisterModule(AdminAPI{})
}

// AdminAPI is Caddy's admin endpoint for session tables, mounted at
// /mcp_sessions/. Session IDs are bearer-like: they are accepted only in
// request bodies (the admin endpoint logs URIs and headers) and are never
// returned in full.
//
//	GET  /mcp_sessions/                          every table: sessions, bounds, and per upstream: live sessions, draining
//	GET  /mcp_sessions/upstream?table=&upstream= one upstream: live sessions, draining
//	GET  /mcp_sessions/status                    the status page (HTML), with drain and undrain buttons
//	POST /mcp_sessions/drain    {"table", "upstream"[, "deadline"]}   stop sending new sessions to the upstream;
//	                                                    past the deadline, its sessions fail over (failover reinitialize)
//	POST /mcp_sessions/undrain  {"table", "upstream"}   send new sessions to it again
//	POST /mcp_sessions/lookup   {"table", "session_id"} the session's upstream, age, idle time
//	POST /mcp_sessions/evict    {"table", "session_id"} forget the session
//	POST /mcp_sessions/evict    {"table", "upstream"}   forget every session of the upstream
//
// `table` defaults to `default`; `upstream` is a dial address as written in
// the config, such as `127.0.0.1:9001`.
type AdminAPI struct{}

// CaddyModule returns the Caddy module information.
func (AdminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.mcp_sessions",
		New: func() caddy.Module { return new(AdminAPI) },
	}
}

// Routes returns the admin routes of the session tables.
func (a AdminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/mcp_sessions/", Handler: caddy.AdminHandlerFunc(a.serve)}}
}

// TableStatus is a table in the admin API's answers.
type TableStatus struct {
	// Table is the table's name.
	Table string `json:"table"`
	// Sessions is the number of sessions in the table.
	Sessions int `json:"sessions"`
	// MaxSessions is the table's bound (max_sessions).
	MaxSessions int `json:"max_sessions"`
	// SessionTTL is the idle TTL, as a Go duration such as "24h0m0s".
	SessionTTL string `json:"session_ttl"`
	// Upstreams are the upstreams the table knows, by dial address.
	Upstreams []UpstreamStatus `json:"upstreams"`
	// Store is the table's shared store, "redis"; absent for the memory store.
	Store string `json:"store,omitempty"`
	// StoreReachable is whether the shared store answered its last call;
	// absent for the memory store.
	StoreReachable *bool `json:"store_reachable,omitempty"`
}

// UpstreamStatus is one upstream of a table in the admin API's answers.
// A drain is done when Draining is true and LiveSessions is 0.
type UpstreamStatus struct {
	// Table is the table's name.
	Table string `json:"table"`
	// Upstream is the upstream's dial address, as in the config.
	Upstream string `json:"upstream"`
	// LiveSessions is the number of sessions pinned to the upstream.
	LiveSessions int64 `json:"live_sessions"`
	// Draining is true while the upstream gets no new sessions.
	Draining bool `json:"draining"`
	// ClusterLiveSessions is the number of sessions pinned to the upstream
	// on every instance sharing the table's store, as last read from it
	// (within a second); absent for the memory store. With a shared store, a
	// drain is done when it is 0.
	ClusterLiveSessions *int64 `json:"cluster_live_sessions,omitempty"`
	// DrainDeadline is when the drain's deadline passes (RFC 3339), set by
	// a drain call with a deadline: from then on, with `failover
	// reinitialize`, each remaining session fails over to another upstream
	// on its next request. Absent without a deadline.
	DrainDeadline string `json:"drain_deadline,omitempty"`
	// RefusingUntil is when the upstream gets new sessions again (RFC 3339)
	// after it refused one (429, or a 5xx without a session: a server at its
	// session cap, or whose dependency is down); absent when it is not
	// refusing. Its pinned sessions keep working meanwhile.
	RefusingUntil string `json:"refusing_until,omitempty"`
	// Refusals is how many new sessions the upstream refused (see
	// RefusingUntil); absent while 0.
	Refusals uint64 `json:"refusals,omitempty"`
}

// SessionStatus is one session in the admin API's answers. Fingerprint is a
// short hash of the ID, the one debug logs use; the ID itself is not returned.
type SessionStatus struct {
	// Table is the table's name.
	Table string `json:"table"`
	// Fingerprint is the first 12 hex digits of the session ID's SHA-256.
	Fingerprint string `json:"fingerprint"`
	// Upstream is the dial address of the upstream that owns the session.
	Upstream string `json:"upstream"`
	// AgeSeconds is the time since the session was learned, in seconds;
	// absent when only the shared store knows the session (FromStore).
	AgeSeconds *float64 `json:"age_seconds,omitempty"`
	// IdleSeconds is the time since the session was last used, in seconds
	// (1 s resolution); absent when only the shared store knows the session.
	IdleSeconds *float64 `json:"idle_seconds,omitempty"`
	// OpenStreams is the number of GET streams of the session open through
	// this instance.
	OpenStreams int `json:"open_streams"`
	// FromStore is true when this instance has not served the session and
	// the answer comes from the shared store (`store redis`), which holds
	// its upstream and binding only.
	FromStore bool `json:"from_store,omitempty"`
	// PrincipalBound is true when the session is bound to a principal
	// (`bind_principal`); only requests with the same principal may use it.
	PrincipalBound bool `json:"principal_bound"`
	// Evicted is true in the answer to an evict call that removed the session.
	Evicted bool `json:"evicted,omitempty"`
}

// adminRequest is the body of the POST endpoints.
type adminRequest struct {
	Table     string `json:"table"`
	Upstream  string `json:"upstream"`
	SessionID string `json:"session_id"`
	// Deadline of a drain, a duration such as "10m", from now.
	Deadline string `json:"deadline"`
}

func (a AdminAPI) serve(w http.ResponseWriter, r *http.Request) error {
	op := strings.TrimPrefix(r.URL.Path, "/mcp_sessions/")
	switch op {
	case "":
		return a.serveGet(w, r, nil, func(map[string]string) (any, error) { return listTables() })
	case "upstream":
		return a.serveGet(w, r, []string{"table", "upstream"}, func(q map[string]string) (any, error) {
			return upstreamStatus(q["table"], q["upstream"], nil)
		})
	case "drain", "undrain":
		return a.servePost(w, r, op, func(req adminRequest) (any, error) {
			return drainStatus(req, op == "drain")
		})
	case "status":
		return a.serveStatus(w, r)
	case "lookup", "evict":
		return a.servePost(w, r, op, func(req adminRequest) (any, error) {
			if op == "evict" && req.SessionID == "" && req.Upstream != "" {
				return evictUpstream(req.Table, req.Upstream)
			}
			return sessionStatus(req.Table, req.SessionID, op == "evict")
		})
	}
	return apiError(http.StatusNotFound, "unknown endpoint /mcp_sessions/%s; the endpoints are /mcp_sessions/ and "+
		"/mcp_sessions/upstream (GET), drain, undrain, lookup and evict (POST), and the status page /mcp_sessions/status; "+
		"see docs/operating.md#admin-api", op)
}

// serveGet serves a GET endpoint that takes the query parameters params,
// each at most once.
func (AdminAPI) serveGet(w http.ResponseWriter, r *http.Request, params []string, get func(map[string]string) (any, error)) error {
	if r.Method != http.MethodGet {
		return apiError(http.StatusMethodNotAllowed, "use GET")
	}
	if err := noBody(r); err != nil {
		return err
	}
	q, err := strictQuery(r, params...)
	if err != nil {
		return err
	}
	v, err := get(q)
	if err != nil {
		return err
	}
	return writeJSON(w, v)
}

// adminExamples are well-formed bodies of the POST endpoints, for errors.
var adminExamples = map[string]string{
	"drain":   `{"table":"default","upstream":"127.0.0.1:9001","deadline":"10m"}`,
	"undrain": `{"table":"default","upstream":"127.0.0.1:9001"}`,
	"lookup":  `{"table":"default","session_id":"<the session ID>"}`,
	"evict":   `{"table":"default","session_id":"<the session ID>"} or {"table":"default","upstream":"127.0.0.1:9001"}`,
}

// servePost serves the POST endpoint op, whose input is one JSON object in
// the body, read by decodeStrict.
func (AdminAPI) servePost(w http.ResponseWriter, r *http.Request, op string, do func(adminRequest) (any, error)) error {
	if r.Method != http.MethodPost {
		return apiError(http.StatusMethodNotAllowed, "use POST with a JSON body")
	}
	if _, err := strictQuery(r); err != nil {
		return err
	}
	data, err := readAdminBody(w, r)
	if err != nil {
		return err
	}
	var req adminRequest
	if err := decodeStrict(data, &req, adminExamples[op]); err != nil {
		return err
	}
	if err := req.check(op); err != nil {
		return err
	}
	v, err := do(req)
	if err != nil {
		return err
	}
	return writeJSON(w, v)
}

// check refuses fields the endpoint op does not use, so that a call never
// acts on part of what it was given.
func (req adminRequest) check(op string) error {
	var extra string
	switch {
	case (op == "drain" || op == "undrain") && req.SessionID != "":
		extra = "session_id: drain and undrain act on an upstream"
	case op != "drain" && req.Deadline != "":
		extra = "deadline: only drain takes one"
	case op == "lookup" && req.Upstream != "":
		extra = "upstream: lookup finds a session by session_id"
	case op == "evict" && req.SessionID != "" && req.Upstream != "":
		extra = "upstream with session_id: evict one session (session_id) or every session of an upstream (upstream), not both"
	}
	if extra != "" {
		return apiError(http.StatusBadRequest, "/mcp_sessions/%s does not take %s", op, extra)
	}
	return nil
}

// listTables returns the status of every table of the running config, by name.
func listTables() ([]TableStatus, error) {
	app, err := runningApp()
	if err != nil {
		return nil, err
	}
	list := []TableStatus{}
	for _, t := range app.tables() {
		for dial := range app.configuredUpstreams(t.Name()) {
			t.UseUpstream(dial) // list configured upstreams before any traffic too
		}
		st := TableStatus{Table: t.Name(), Sessions: t.Len(), MaxSessions: t.MaxSessions(), SessionTTL: t.TTL().String(), Upstreams: []UpstreamStatus{}}
		for _, u := range t.Upstreams() {
			st.Upstreams = append(st.Upstreams, statusOf(t, u))
		}
		slices.SortFunc(st.Upstreams, func(a, b UpstreamStatus) int { return strings.Compare(a.Upstream, b.Upstream) })
		if t.Shared() {
			reachable := t.StoreReachable()
			st.Store, st.StoreReachable = "redis", &reachable
		}
		list = append(list, st)
	}
	slices.SortFunc(list, func(a, b TableStatus) int { return strings.Compare(a.Table, b.Table) })
	return list, nil
}

// upstreamStatus returns an upstream's status, first setting its draining
// state if drain is not nil.
func upstreamStatus(table, dial string, drain *bool) (UpstreamStatus, error) {
	app, t, err := findTable(table)
	if err != nil {
		return UpstreamStatus{}, err
	}
	if dial == "" {
		return UpstreamStatus{}, apiError(http.StatusBadRequest, "missing upstream: give its dial address as in the config, such as 127.0.0.1:9001")
	}
	configured := app.configuredUpstreams(t.Name())
	if t.KnownUpstream(dial) == nil && configured[dial] {
		t.UseUpstream(dial) // configured, but the proxy has not routed to it yet
	}
	if t.KnownUpstream(dial) == nil {
		known := []string{}
		for _, u := range t.Upstreams() {
			known = append(known, u.Dial())
		}
		for d := range configured {
			known = append(known, d)
		}
		slices.Sort(known)
		known = slices.Compact(known)
		return UpstreamStatus{}, apiError(http.StatusNotFound, "table %q knows no upstream %q; give the dial address exactly as in the config. "+
			"Known upstreams (configured, or routed to since the table was created): %s", t.Name(), dial, strings.Join(known, ", "))
	}
	u := t.KnownUpstream(dial)
	if drain != nil {
		u = t.SetDraining(dial, *drain)
	}
	return statusOf(t, u), nil
}

// drainStatus drains (on) or undrains the upstream of req, with the drain's
// deadline if req gives one, and returns its status.
func drainStatus(req adminRequest, on bool) (UpstreamStatus, error) {
	var deadline time.Time
	if req.Deadline != "" {
		d, err := caddy.ParseDuration(req.Deadline)
		if err != nil || d < 0 || !on {
			return UpstreamStatus{}, apiError(http.StatusBadRequest, "deadline %q: give a drain call a duration from now, such as \"10m\"", req.Deadline)
		}
		deadline = time.Now().Add(d)
	}
	st, err := upstreamStatus(req.Table, req.Upstream, &on)
	if err != nil {
		return st, err
	}
	_, t, _ := findTable(req.Table)
	u := t.KnownUpstream(st.Upstream)
	t.SetDrainDeadline(u, deadline)
	return statusOf(t, u), nil
}

func statusOf(t *session.Table, u *session.Upstream) UpstreamStatus {
	st := UpstreamStatus{Table: t.Name(), Upstream: u.Dial(), LiveSessions: u.LiveSessions(), Draining: u.Draining(), Refusals: u.Refusals()}
	if at, ok := t.RefusingUntil(u); ok {
		st.RefusingUntil = at.UTC().Format(time.RFC3339Nano)
	}
	if at, ok := t.DrainDeadline(u); ok && u.Draining() {
		st.DrainDeadline = at.UTC().Format(time.RFC3339Nano)
	}
	if t.Shared() {
		n := t.ClusterSessions(u)
		st.ClusterLiveSessions = &n
	}
	return st
}

// UpstreamEviction is the answer to evicting every session of an upstream.
type UpstreamEviction struct {
	// Table is the table's name.
	Table string `json:"table"`
	// Upstream is the upstream's dial address.
	Upstream string `json:"upstream"`
	// EvictedSessions is the number of sessions removed (reason admin).
	EvictedSessions int `json:"evicted_sessions"`
}

// evictUpstream forgets every session of an upstream the table knows.
func evictUpstream(table, dial string) (UpstreamEviction, error) {
	st, err := upstreamStatus(table, dial, nil)
	if err != nil {
		return UpstreamEviction{}, err
	}
	_, t, _ := findTable(st.Table)
	return UpstreamEviction{Table: st.Table, Upstream: dial, EvictedSessions: t.EvictUpstream(dial, session.EvictAdmin)}, nil
}

// sessionStatus returns a session's status, first evicting it if evict is true.
func sessionStatus(table, id string, evict bool) (SessionStatus, error) {
	_, t, err := findTable(table)
	if err != nil {
		return SessionStatus{}, err
	}
	if id == "" {
		return SessionStatus{}, apiError(http.StatusBadRequest, "missing session_id")
	}
	id = adminKey(t, id)
	info, ok := t.Info(id)
	if !ok {
		return SessionStatus{}, apiError(http.StatusNotFound, "table %q holds no session with fingerprint %s", t.Name(), fingerprint(id))
	}
	st := SessionStatus{
		Table: t.Name(), Fingerprint: fingerprint(id), Upstream: info.Upstream,
		OpenStreams: info.OpenStreams, PrincipalBound: info.Bound, FromStore: info.FromStore,
	}
	if !info.FromStore {
		age, idle := info.Age.Seconds(), info.Idle.Seconds()
		st.AgeSeconds, st.IdleSeconds = &age, &idle
	}
	if evict {
		st.Evicted = t.Evict(id, session.EvictAdmin)
	}
	return st, nil
}

// configuredUpstreams returns the static upstreams of every reverse_proxy
// of the app's config whose selection policy is mcp_session with the given
// table, by dial address. Dynamic upstreams are known only once the proxy
// has routed to them.
func (a *App) configuredUpstreams(table string) map[string]bool {
	dials := map[string]bool{}
	for dial := range a.configuredHosts(table) {
		dials[dial] = true
	}
	return dials
}

// configuredHosts is configuredUpstreams with the provisioned upstream of
// each dial address (one of them, when several handlers list it), whose
// Healthy reports Caddy's health checks of its host.
func (a *App) configuredHosts(table string) map[string]*reverseproxy.Upstream {
	hosts := map[string]*reverseproxy.Upstream{}
	httpApp := a.httpApp()
	if httpApp == nil {
		return hosts
	}
	for _, srv := range httpApp.Servers {
		collectUpstreams(srv.Routes, table, hosts)
		if srv.Errors != nil {
			collectUpstreams(srv.Errors.Routes, table, hosts)
		}
	}
	return hosts
}

func collectUpstreams(routes caddyhttp.RouteList, table string, hosts map[string]*reverseproxy.Upstream) {
	for _, route := range routes {
		for _, h := range route.Handlers {
			switch h := h.(type) {
			case *caddyhttp.Subroute:
				collectUpstreams(h.Routes, table, hosts)
			case *reverseproxy.Handler:
				if h.LoadBalancing == nil {
					continue
				}
				if s, ok := h.LoadBalancing.SelectionPolicy.(*SessionSelection); ok && s.Table == table {
					for _, u := range h.Upstreams {
						hosts[u.Dial] = u
					}
				}
			}
		}
	}
}

// runningApp returns the mcp_sessions app of the running config. Tests
// replace it.
var runningApp = func() (*App, error) {
	v, err := caddy.ActiveContext().AppIfConfigured(AppName) // never loads an app that is not running
	if err != nil {
		return nil, apiError(http.StatusNotFound, "no session tables: the running config uses no mcp_session handler or policy")
	}
	return v.(*App), nil
}

// findTable returns the running app and its table called name ("default"
// when empty).
func findTable(name string) (*App, *session.Table, error) {
	if name == "" {
		name = session.DefaultTableName
	}
	app, err := runningApp()
	if err != nil {
		return nil, nil, err
	}
	all := app.tables()
	if t, ok := all[name]; ok {
		return app, t, nil
	}
	names := slices.Sorted(maps.Keys(all))
	return nil, nil, apiError(http.StatusNotFound, "no session table named %q; tables in use: %s", name, strings.Join(names, ", "))
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

func apiError(status int, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return caddy.APIError{HTTPStatus: status, Err: err, Message: err.Error()}
}

// Interface guards
var _ caddy.AdminRouter = (*AdminAPI)(nil)
