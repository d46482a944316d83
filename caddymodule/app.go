package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(App{})
}

// AppName is the module ID of the session tables app.
const AppName = "mcp_sessions"

// App holds the session tables of a config. The `mcp_session` handler and
// the `mcp_session` and `least_sessions` selection policies fetch their
// table from it by name, as does the admin API; a config that uses them
// gets the app even when it does not configure it.
//
// A table's settings come from this app's `tables` and from the options of
// the `mcp_session` handlers (or `mcp_proxy` directives) that name the
// table; two places that set one option differently are a load error. They
// apply when the app starts, once the whole config has loaded: a config
// that fails to load changes no table, and a reload that lowers
// `max_sessions` applies at the reload. Tables outlive the app: a reload
// keeps every table that the new config still names, with its sessions and
// draining upstreams.
type App struct {
	// The session tables, by name. A table that a handler or a policy names
	// but that is not listed here gets the defaults, or the options given in
	// the handler.
	Tables map[string]*TableConfig `json:"tables,omitempty"`

	ctx    caddy.Context
	logger *zap.Logger
	mu     *sync.Mutex
	uses   map[string]*tableUse // by table name; guarded by mu

	// start runs the start once, whether Caddy or a request comes first
	// (see Start); startErr is its error.
	start    *sync.Once
	startErr error
}

// TableConfig is the configuration of one session table.
type TableConfig struct {
	// The table's settings, which mcp_session handlers of the table may
	// set too; places in one config that set one must agree.
	TableSettings

	// How long the table keeps the record of an upstream that no config
	// lists, that owns no session (on any instance, with a shared store) and
	// that no request was sent to: its draining flag and metric series then
	// go too. Dynamic upstreams, such as pods, come and go. Default: `10m`.
	UpstreamTTL caddy.Duration `json:"upstream_ttl,omitempty"`

	// Where the table keeps its sessions besides this process's memory: a
	// module of the `mcp_sessions.stores` namespace, `memory` or `redis`.
	// Default: `memory`.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=mcp_sessions.stores inline_key=type"`
}

// tableUse is one table of the config: its merged settings, where each
// setting came from, and the table itself.
type tableUse struct {
	cfg     TableConfig
	sources map[string]string // option -> where it was set
	table   *session.Table
	store   Store // nil: memory
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  AppName,
		New: func() caddy.Module { return new(App) },
	}
}

// Provision checks the configured tables and registers the plugin's metrics
// in the config's registry. Tables are acquired when a module asks for one.
// It returns an error naming the table and setting when a configured table
// is invalid, and the registry's error when the metrics cannot be
// registered.
func (a *App) Provision(ctx caddy.Context) error {
	a.ctx, a.mu, a.uses, a.start = ctx, new(sync.Mutex), map[string]*tableUse{}, new(sync.Once)
	a.logger = ctx.Logger()
	for _, name := range a.configuredNames() {
		if err := a.provisionTable(ctx, name); err != nil {
			return err
		}
	}
	return registerMetrics(ctx.GetMetricsRegistry())
}

// provisionTable acquires a configured table and loads its store.
func (a *App) provisionTable(ctx caddy.Context, name string) error {
	cfg := a.Tables[name]
	if _, err := a.use(name, *cfg, "the "+AppName+" app"); err != nil {
		return err
	}
	if cfg.UpstreamTTL < 0 {
		return fmt.Errorf("session table %q: upstream_ttl must be positive, got %s", name, time.Duration(cfg.UpstreamTTL))
	}
	if cfg.StoreRaw == nil {
		return nil
	}
	mod, err := ctx.LoadModule(cfg, "StoreRaw")
	if err != nil {
		return fmt.Errorf("session table %q: loading store: %v", name, err)
	}
	a.uses[name].store = mod.(Store)
	return nil
}

// configuredNames returns the names of the configured tables, sorted, so
// that errors are stable.
func (a *App) configuredNames() []string {
	names := make([]string, 0, len(a.Tables))
	for name, cfg := range a.Tables {
		if cfg == nil {
			a.Tables[name] = new(TableConfig)
		}
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Table returns the table called name ("default" when empty) for a module
// of this config, acquiring it on first use. cfg holds the settings the
// module gives the table (zero fields set nothing); source names the module
// in errors. It errors when cfg contradicts a setting made elsewhere in the
// config or is invalid.
func (a *App) Table(name string, cfg TableConfig, source string) (*session.Table, error) {
	if name == "" {
		name = session.DefaultTableName
	}
	return a.use(name, cfg, source)
}

func (a *App) use(name string, cfg TableConfig, source string) (*session.Table, error) {
	if err := cfg.validate(name); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	u := a.uses[name]
	if u == nil {
		u = &tableUse{}
	}
	if err := u.merge(name, cfg, source); err != nil {
		return nil, err
	}
	if u.table == nil {
		t, err := acquireTable(name, u.maxSessions(), u.ttl())
		if err != nil {
			return nil, err
		}
		u.table, a.uses[name] = t, u
	}
	return u.table, nil
}

// validate checks the settings of the table called name.
func (c TableConfig) validate(name string) error {
	switch {
	case c.MaxSessions < 0:
		return fmt.Errorf("session table %q: max_sessions must be positive, got %d", name, c.MaxSessions)
	case c.MaxUnconfirmedPerClient < 0:
		return fmt.Errorf("session table %q: max_unconfirmed_per_client must be positive, got %d", name, c.MaxUnconfirmedPerClient)
	case c.SessionTTL != 0 && time.Duration(c.SessionTTL) < session.MinSessionTTL:
		return fmt.Errorf("session table %q: session_ttl %s is below the minimum of %s; sessions would be forgotten between a client's requests",
			name, time.Duration(c.SessionTTL), session.MinSessionTTL)
	case c.FailoverMaxAge != 0 && time.Duration(c.FailoverMaxAge) < session.MinSessionTTL:
		return fmt.Errorf("session table %q: failover_max_age %s is below the minimum of %s; give a duration such as 1h, or leave it out for session_ttl",
			name, time.Duration(c.FailoverMaxAge), session.MinSessionTTL)
	case c.BindPrincipal != "":
		if err := checkBindPrincipal(c.BindPrincipal); err != nil {
			return fmt.Errorf("session table %q: %w", name, err)
		}
	}
	if c.ClientKey != "" {
		if err := checkClientKey(c.ClientKey); err != nil {
			return fmt.Errorf("session table %q: %w", name, err)
		}
	}
	if err := c.validateJournal(); err != nil {
		return fmt.Errorf("session table %q: %w", name, err)
	}
	return nil
}

// checkBindPrincipal refuses a bind_principal template without a
// placeholder: every request would have the same principal.
func checkBindPrincipal(v string) error {
	if v == session.BindPrincipalOff {
		return nil
	}
	return checkHasPlaceholder("bind_principal", v, "every request would have the same principal and binding would refuse no one",
		"{http.auth.user.id} or {http.request.header.Authorization}, or off")
}

// merge adds the settings cfg, made in source, to u's.
func (u *tableUse) merge(name string, cfg TableConfig, source string) error {
	if u.sources == nil {
		u.sources = map[string]string{}
	}
	return errors.Join(
		mergeSetting(name, "max_sessions", &u.cfg.MaxSessions, cfg.MaxSessions, u.sources, source, "%d"),
		mergeSetting(name, "session_ttl", &u.cfg.SessionTTL, cfg.SessionTTL, u.sources, source, "%s"),
		mergeSetting(name, "bind_principal", &u.cfg.BindPrincipal, cfg.BindPrincipal, u.sources, source, "%q"),
		mergeSetting(name, "failover", &u.cfg.Failover, cfg.Failover, u.sources, source, "%q"),
		mergeSetting(name, "max_initialize_size", &u.cfg.MaxInitializeSize, cfg.MaxInitializeSize, u.sources, source, "%d"),
		mergeSetting(name, "failover_max_age", &u.cfg.FailoverMaxAge, cfg.FailoverMaxAge, u.sources, source, "%s"),
		mergeSetting(name, "max_unconfirmed_per_client", &u.cfg.MaxUnconfirmedPerClient, cfg.MaxUnconfirmedPerClient, u.sources, source, "%d"),
		mergeSetting(name, "client_key", &u.cfg.ClientKey, cfg.ClientKey, u.sources, source, "%q"),
		mergeSetting(name, "journal", &u.cfg.Journal, cfg.Journal, u.sources, source, "%q"),
		mergeSetting(name, "journal_window", &u.cfg.JournalWindow, cfg.JournalWindow, u.sources, source, "%s"),
		mergeSetting(name, "journal_session_bytes", &u.cfg.JournalSessionBytes, cfg.JournalSessionBytes, u.sources, source, "%d"),
		mergeSetting(name, "journal_total_bytes", &u.cfg.JournalTotalBytes, cfg.JournalTotalBytes, u.sources, source, "%d"),
	)
}

// mergeSetting sets *dst to v if v is set, unless *dst was set to another
// value elsewhere (sources[option]).
func mergeSetting[T comparable](table, option string, dst *T, v T, sources map[string]string, source, format string) error {
	var zero T
	if v == zero || *dst == v {
		return nil
	}
	if *dst != zero {
		return fmt.Errorf("session table %q: %s "+format+" in %s, but "+format+" in %s; "+
			"give the table one setting, or use different table names", table, option, display(v), source, display(*dst), sources[option])
	}
	*dst, sources[option] = v, source
	return nil
}

// display renders a setting's value for an error message.
func display(v any) any {
	if d, ok := v.(caddy.Duration); ok {
		return time.Duration(d)
	}
	return v
}

func (u *tableUse) maxSessions() int {
	if u.cfg.MaxSessions == 0 {
		return session.DefaultMaxSessions
	}
	return u.cfg.MaxSessions
}

func (u *tableUse) bindPrincipal() string {
	if u.cfg.BindPrincipal == "" {
		return session.DefaultBindPrincipal
	}
	return u.cfg.BindPrincipal
}

func (u *tableUse) ttl() time.Duration {
	if u.cfg.SessionTTL == 0 {
		return session.DefaultSessionTTL
	}
	return time.Duration(u.cfg.SessionTTL)
}

// Start applies every table's settings, now that the whole config has
// loaded, after checking that each `reverse_proxy` with the `mcp_session`
// policy reads the table its `mcp_session` handler writes. Its error names
// both tables of a route where they differ; the config then fails to load
// and the running one is kept.
//
// Caddy starts a config's apps in no set order (it ranges over a map), so
// its http app may serve requests before this app starts: a new table
// would still have no settings and no store, and a request of a session
// that only the shared store knows would get 404, ending the session. The
// mcp_session handler therefore calls Start before serving; the work runs
// once, and later calls return its error.
func (a *App) Start() error {
	a.start.Do(func() { a.startErr = a.startTables() })
	return a.startErr
}

// startTables is Start's work.
func (a *App) startTables() error {
	if err := a.checkPairs(); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for name, u := range a.uses {
		if err := a.startTable(name, u); err != nil {
			return err
		}
	}
	return nil
}

// startTable applies a table's settings and connects it to its store. It
// warns of a client_key or bind_principal template naming placeholders
// Caddy does not set.
func (a *App) startTable(name string, u *tableUse) error {
	warnUnknownPlaceholders(a.logger, name, "client_key", u.cfg.ClientKey)
	if u.cfg.BindPrincipal != session.BindPrincipalOff {
		warnUnknownPlaceholders(a.logger, name, "bind_principal", u.cfg.BindPrincipal)
	}
	u.table.Configure(u.maxSessions(), u.ttl())
	u.table.SetBindPrincipal(u.bindPrincipal())
	u.table.SetFailover(u.cfg.Failover, u.cfg.MaxInitializeSize)
	u.table.SetFailoverMaxAge(time.Duration(u.cfg.FailoverMaxAge))
	u.table.SetClientCap(u.cfg.MaxUnconfirmedPerClient, u.cfg.ClientKey)
	if cfg := a.Tables[name]; cfg != nil {
		u.table.SetUpstreamTTL(time.Duration(cfg.UpstreamTTL))
	}
	var conn session.Shared
	if u.store != nil {
		c, err := u.store.Connect(u.table)
		if err != nil {
			return fmt.Errorf("session table %q: connecting its store: %v", name, err)
		}
		conn = c
	}
	u.table.SetStore(conn)
	configureJournal(u.table, u.cfg) // journal.go: in Redis with the redis store
	u.table.SetConfigured(a.configuredUpstreams(name))
	return nil
}

// Stop does nothing and never returns an error: the tables outlive the
// config; Cleanup releases them.
func (a *App) Stop() error { return nil }

// Cleanup releases the tables the app acquired. It never returns an error.
func (a *App) Cleanup() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name := range a.uses {
		releaseTable(name)
	}
	a.uses = map[string]*tableUse{}
	return nil
}

// tables returns the app's tables by name.
func (a *App) tables() map[string]*session.Table {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := make(map[string]*session.Table, len(a.uses))
	for name, u := range a.uses {
		m[name] = u.table
	}
	return m
}

// sessionsApp returns the config's session tables app, loading it if the
// config does not configure it.
func sessionsApp(ctx caddy.Context) (*App, error) {
	v, err := ctx.App(AppName)
	if err != nil {
		return nil, err
	}
	return v.(*App), nil
}

// httpApp returns the config's http app, or nil if it has none.
func (a *App) httpApp() *caddyhttp.App {
	v, err := a.ctx.AppIfConfigured("http")
	if err != nil {
		return nil
	}
	app, _ := v.(*caddyhttp.App)
	return app
}

// handlerSeen is an mcp_session handler met while walking routes: the
// table it writes, and the matchers of its route (nil when it applies to
// every request that reaches the routes walked).
type handlerSeen struct {
	table    string
	matchers caddyhttp.MatcherSets
}

// checkPairs errors when a reverse_proxy's mcp_session policy names another
// table than the mcp_session handler before it, in any server's routes.
func (a *App) checkPairs() error {
	app := a.httpApp()
	if app == nil {
		return nil
	}
	var errs []error
	for _, srv := range app.Servers {
		errs = append(errs, checkRoutes(srv.Routes, nil))
		if srv.Errors != nil {
			errs = append(errs, checkRoutes(srv.Errors.Routes, nil))
		}
	}
	return errors.Join(errs...)
}

// tableWriter is a handler that learns sessions into a table: the
// mcp_session handler.
type tableWriter interface {
	// sessionTable returns the name of the table the handler writes.
	sessionTable() string
}

// checkRoutes walks routes in order; outer are the handlers met before
// them in enclosing routes.
func checkRoutes(routes caddyhttp.RouteList, outer []handlerSeen) error {
	seen := outer
	for _, route := range routes {
		inRoute := relevant(seen, route.MatcherSets)
		for _, h := range route.Handlers {
			switch h := h.(type) {
			case tableWriter:
				inRoute = append(inRoute, handlerSeen{table: h.sessionTable()})
				seen = append(seen, handlerSeen{table: h.sessionTable(), matchers: route.MatcherSets})
			case *caddyhttp.Subroute:
				if err := checkRoutes(h.Routes, inRoute); err != nil {
					return err
				}
			case *reverseproxy.Handler:
				if err := checkProxy(h, inRoute); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// relevant returns the handlers of seen that run before a route with the
// given matchers: those whose route matches every request, or matches the
// same requests. The result applies to every request of the route.
func relevant(seen []handlerSeen, matchers caddyhttp.MatcherSets) []handlerSeen {
	out := make([]handlerSeen, 0, len(seen))
	for _, s := range seen {
		if len(s.matchers) == 0 || reflect.DeepEqual(s.matchers, matchers) {
			out = append(out, handlerSeen{table: s.table})
		}
	}
	return out
}

// checkProxy errors when the proxy's mcp_session policy, or its
// least_sessions fallback, names another table than the last handler of
// before.
func checkProxy(rp *reverseproxy.Handler, before []handlerSeen) error {
	if rp.LoadBalancing == nil || len(before) == 0 {
		return nil
	}
	policy, ok := rp.LoadBalancing.SelectionPolicy.(*SessionSelection)
	if !ok {
		return nil
	}
	want := before[len(before)-1].table
	got := policy.Table
	if ls, ok := policy.fallback.(*LeastSessionsSelection); ok && got == want {
		got = ls.Table
	}
	if got == want {
		return nil
	}
	return fmt.Errorf("the mcp_session handler before a reverse_proxy writes session table %q, but the reverse_proxy's "+
		"selection policy reads table %q; give both the same table name (mcp_proxy does this for you)", want, got)
}

// Defaults and values of the table settings, as the module docs name
// them; the session table (internal/session) defines them.
const (
	// DefaultMaxSessions is the default bound of a session table (entries).
	DefaultMaxSessions = session.DefaultMaxSessions
	// DefaultSessionTTL is the default idle time after which a session is forgotten.
	DefaultSessionTTL = session.DefaultSessionTTL
	// DefaultTableName names the table used when no table is configured.
	DefaultTableName = session.DefaultTableName
	// DefaultUpstreamTTL is how long a table keeps the record of an
	// upstream that no config lists, that owns no session and that
	// nothing used.
	DefaultUpstreamTTL = session.DefaultUpstreamTTL
	// MinSessionTTL is the shortest session TTL accepted.
	MinSessionTTL = session.MinSessionTTL
	// DefaultBindPrincipal is the default bind_principal template.
	DefaultBindPrincipal = session.DefaultBindPrincipal
	// BindPrincipalOff turns principal binding off.
	BindPrincipalOff = session.BindPrincipalOff
	// DefaultClientKey is the default client_key template.
	DefaultClientKey = session.DefaultClientKey
	// FailoverOff ends a session whose upstream is gone: its requests get 404.
	FailoverOff = session.FailoverOff
	// FailoverReinitialize moves a session whose upstream is gone to
	// another upstream by replaying the session's initialize request there.
	FailoverReinitialize = session.FailoverReinitialize
	// DefaultMaxInitializeSize is the default max_initialize_size, in bytes.
	DefaultMaxInitializeSize = session.DefaultMaxInitializeSize
)

// Table is a session table: the sessions of one table name, shared by
// the handlers and policies that name it, across config reloads.
type Table = session.Table

// NewTable returns a session table bounded to maxSessions entries with
// the given idle TTL, reading time from now (time.Now when nil), which
// knows the plugin's keys: sealed session IDs, and the fingerprints of the
// debug log, the admin API and {mcp.session_fingerprint}. It errors when
// maxSessions is not positive. It starts no goroutine; see
// [Table.StartJanitor].
func NewTable(name string, maxSessions int, ttl time.Duration, now func() time.Time) (*session.Table, error) {
	t, err := session.NewTable(name, maxSessions, ttl, now)
	if err != nil {
		return nil, err
	}
	t.SetKeyKinds(session.KeyKinds{Sealed: isSealedKey, Fingerprint: fingerprint})
	return t, nil
}

// isSealedKey reports whether table key key is a sealed ID's (decoded
// sealed IDs begin with their version byte, which no plain ID can).
func isSealedKey(key string) bool { return len(key) > 0 && isSealVersion(key[0]) }

// tables holds the session tables by name, across config reloads.
var tables = caddy.NewUsagePool()

// acquireTable returns the table called name, creating it with the given
// bounds, and counts a reference to it that [releaseTable] gives back.
func acquireTable(name string, maxSessions int, ttl time.Duration) (*session.Table, error) {
	val, _, err := tables.LoadOrNew(name, func() (caddy.Destructor, error) {
		t, err := NewTable(name, maxSessions, ttl, nil)
		if err != nil {
			return nil, err
		}
		t.StartJanitor(session.JanitorInterval)
		return t, nil
	})
	if err != nil {
		return nil, err
	}
	return val.(*session.Table), nil
}

// releaseTable gives back a reference taken by acquireTable.
func releaseTable(name string) {
	_, _ = tables.Delete(name)
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)

// unmarshalTable parses the argument of a policy's `table` option at the
// cursor into dst, which must not be set yet.
func unmarshalTable(d *caddyfile.Dispenser, dst *string) error {
	if *dst != "" {
		return d.Err("duplicate option 'table'")
	}
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}
