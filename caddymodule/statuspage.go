package caddymodule

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// The status page: every table and upstream at a glance, server-rendered
// HTML with no script and no external asset, so that it works offline and
// under a strict Content-Security-Policy (which it sends itself). The
// mcp_status handler serves it on a site route (read-only unless its
// `controls` option adds the drain and undrain buttons), and the admin
// endpoint at /mcp_sessions/status, with the buttons. Caddy's admin
// endpoint refuses browser requests that carry no allowed Origin, which
// includes every typed URL, so browsers reach the page through a site
// route. It shows counts only: no session ID, not even a fingerprint.

//go:embed statuspage.html
var statusTemplateText string

// statusStyle is the page's stylesheet; the CSP allows exactly it, by hash.
//
//go:embed statuspage.css
var statusStyle string

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"style": func() template.CSS { return template.CSS(statusStyle) },
}).Parse(statusTemplateText))

// statusCSP is the page's Content-Security-Policy: nothing but its own
// stylesheet, forms posting back to itself, no framing.
var statusCSP = func() string {
	sum := sha256.Sum256([]byte(statusStyle))
	return "default-src 'none'; style-src 'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'; " +
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
}()

// DefaultStatusRefresh is how often the status page reloads itself.
const DefaultStatusRefresh = 5 * time.Second

// The health of an upstream, as the page shows it; the first that applies.
const (
	healthUnavailable = "unavailable" // Caddy's health checks take it out of service
	healthStuck       = "stuck"       // it accepted an initialize and sent no headers in time (frozen.go)
	healthFull        = "full"        // it refused a new session (429, or 5xx without a session; refusal.go)
	healthHealthy     = "healthy"
)

// statusView is what the page template renders.
type statusView struct {
	Host    string
	Now     string
	Refresh int    // seconds between reloads; 0 for none
	Action  string // where the drain and undrain buttons post; "" for none
	Tables  []tableView
	Error   string
}

// tableView is one table on the page.
type tableView struct {
	Name, Store                          string
	Sessions, MaxSessions, Unconfirmed   int
	TTL                                  string
	StoreDown                            bool
	Upstreams                            []upstreamView
	Recent                               Recent
	Live, Cluster, Draining, Unavailable int64
	RecentEvictions                      uint64
	Eras                                 []eraShare
}

// eraShare is one era's part of a table's recent requests.
type eraShare struct {
	Label   string
	Count   uint64
	Percent int
}

// upstreamView is one upstream on the page.
type upstreamView struct {
	UpstreamStatus
	Health string
	Recent UpstreamRecent
}

// statusOptions are how one page is rendered.
type statusOptions struct {
	refresh time.Duration // 0 for none
	action  string        // the path the buttons post to; "" for no buttons
}

// buildStatus reads every table of the running config.
func buildStatus(now time.Time) statusView {
	host, _ := os.Hostname()
	v := statusView{Host: host, Now: now.UTC().Format(time.RFC3339)}
	app, err := runningApp()
	if err != nil {
		v.Error = err.Error()
		return v
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for name := range app.tables() {
			if !yield(name) {
				return
			}
		}
	})
	tables := app.tables()
	for _, name := range names {
		v.Tables = append(v.Tables, tableViewOf(app, tables[name], now))
	}
	return v
}

// tableViewOf reads one table and its upstreams.
func tableViewOf(app *App, t *session.Table, now time.Time) tableView {
	hosts := app.configuredHosts(t.Name())
	for dial := range hosts {
		t.UseUpstream(dial) // list configured upstreams before any traffic
	}
	tv := tableView{Name: t.Name(), Sessions: t.Len(), MaxSessions: t.MaxSessions(), Unconfirmed: t.Unconfirmed(),
		TTL: t.TTL().String(), Store: "memory", Recent: recentActivity.recent(t, now)}
	if t.Shared() {
		tv.Store, tv.StoreDown = "redis", !t.StoreReachable()
	}
	for _, u := range t.Upstreams() {
		uv := upstreamView{UpstreamStatus: statusOf(t, u), Health: healthOf(t, u, hosts[u.Dial()])}
		uv.DrainDeadline, uv.RefusingUntil = toSeconds(uv.DrainDeadline), toSeconds(uv.RefusingUntil)
		uv.Recent = tv.Recent.Upstreams[u.Dial()]
		tv.Upstreams = append(tv.Upstreams, uv)
		tv.Live += uv.LiveSessions
		if uv.ClusterLiveSessions != nil {
			tv.Cluster += *uv.ClusterLiveSessions
		}
		if uv.Draining {
			tv.Draining++
		}
		if uv.Health != healthHealthy {
			tv.Unavailable++
		}
	}
	slices.SortFunc(tv.Upstreams, func(a, b upstreamView) int { return strings.Compare(a.Upstream, b.Upstream) })
	for _, n := range tv.Recent.Evictions {
		tv.RecentEvictions += n
	}
	var all uint64
	for _, n := range tv.Recent.Requests {
		all += n
	}
	for _, e := range session.Eras {
		n := tv.Recent.Requests[e.String()]
		share := eraShare{Label: e.String(), Count: n}
		if all > 0 {
			share.Percent = int((n*100 + all/2) / all)
		}
		tv.Eras = append(tv.Eras, share)
	}
	return tv
}

// toSeconds shortens an RFC 3339 time to whole seconds, for reading.
func toSeconds(rfc3339 string) string {
	at, err := time.Parse(time.RFC3339Nano, rfc3339)
	if err != nil {
		return rfc3339
	}
	return at.Truncate(time.Second).Format(time.RFC3339)
}

// healthOf says how an upstream is doing: Caddy's health checks of the
// configured upstream host (nil for a dynamic one) first, then the
// table's own view.
func healthOf(t *session.Table, u *session.Upstream, host *reverseproxy.Upstream) string {
	switch {
	case host != nil && host.Host != nil && !host.Healthy():
		return healthUnavailable
	case t.Stuck(u):
		return healthStuck
	case t.Refusing(u):
		return healthFull
	}
	return healthHealthy
}

// statusRefresh reads the page's refresh from the query: ?refresh=off, or
// a number of seconds (1–3600); def otherwise.
func statusRefresh(q url.Values, def time.Duration) time.Duration {
	switch s := q.Get("refresh"); s {
	case "":
		return def
	case "off", "0":
		return 0
	default:
		if n, err := strconv.Atoi(s); err == nil && n >= 1 && n <= 3600 {
			return time.Duration(n) * time.Second
		}
	}
	return def
}

// writeStatusPage renders the page.
func writeStatusPage(w http.ResponseWriter, opts statusOptions) error {
	v := buildStatus(time.Now())
	v.Refresh, v.Action = int(opts.refresh/time.Second), opts.action
	var b bytes.Buffer
	if err := statusTemplate.Execute(&b, v); err != nil {
		return fmt.Errorf("rendering the status page: %v", err)
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", statusCSP)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	_, err := w.Write(b.Bytes())
	return err
}

// serveStatus serves the admin endpoint's page: GET renders it; POST, from
// its own drain and undrain buttons, drains or undrains an upstream and
// sends the browser back to the page.
func (a AdminAPI) serveStatus(w http.ResponseWriter, r *http.Request) error {
	recentActivity.run()
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		return writeStatusPage(w, statusOptions{refresh: statusRefresh(r.URL.Query(), DefaultStatusRefresh), action: r.URL.Path})
	case http.MethodPost:
		return statusAction(w, r)
	}
	w.Header().Set("Allow", "GET, HEAD, POST")
	return apiError(http.StatusMethodNotAllowed, "/mcp_sessions/status takes GET, or POST from its own buttons")
}

// statusAction carries out a button of the page and sends the browser back
// to it. A form POST can be sent by any site the operator's browser visits,
// so it is accepted only from the page itself: with a Sec-Fetch-Site or
// Origin that says so.
func statusAction(w http.ResponseWriter, r *http.Request) error {
	if !sameOrigin(r) {
		return apiError(http.StatusForbidden, "the status page's buttons work only from the page itself "+
			"(the request's Origin must be the page's); scripts use the admin API: POST /mcp_sessions/drain")
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	if err := r.ParseForm(); err != nil {
		return apiError(http.StatusBadRequest, "reading the form: %v", err)
	}
	action := r.PostForm.Get("action")
	if action != "drain" && action != "undrain" {
		return apiError(http.StatusBadRequest, "unknown action %q: the page's buttons send drain or undrain", action)
	}
	req := adminRequest{Table: r.PostForm.Get("table"), Upstream: r.PostForm.Get("upstream")}
	if action == "drain" {
		req.Deadline = strings.TrimSpace(r.PostForm.Get("deadline"))
	}
	if _, err := drainStatus(req, action == "drain"); err != nil {
		return err
	}
	http.Redirect(w, r, r.URL.Path, http.StatusSeeOther)
	return nil
}

// sameOrigin reports whether a browser sent r from a page of r's own
// origin: Sec-Fetch-Site says same-origin, or Origin names r's host.
// Requests without either (not from a browser form) are refused too.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		return site == "same-origin"
	}
	origin, err := url.Parse(r.Header.Get("Origin"))
	return err == nil && origin.Host != "" && strings.EqualFold(origin.Host, r.Host)
}
