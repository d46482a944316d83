package caddymodule

import "github.com/caddyserver/caddy/v2"

// TableSettings are the settings of a session table. An mcp_session
// handler (and so mcp_proxy) and the `mcp_sessions` app's table of the same
// name both embed them: each setting may be given in any of those places,
// and places in one config that set it must agree. A setting applies when
// the config has loaded, so a failed reload changes nothing. A setting no
// place gives takes its default.
type TableSettings struct {
	// The most sessions the table holds. When the table is full, a new
	// session pushes out the oldest session not used since its initialize,
	// and only when there is none the least recently used one; never one
	// with an open GET stream. Each session costs about
	// 170 bytes plus its ID. Default: 100000 (about 20 MiB when full).
	MaxSessions int `json:"max_sessions,omitempty"`

	// How long a session may go unused before the table forgets it. Every
	// request of the session counts as use, recorded exactly: a session used more often than session_ttl never expires. A
	// session whose GET stream is open through the proxy does not expire
	// while the stream is open. MCP servers keep sessions until DELETE by
	// default, so the proxy should not forget first: the default is long,
	// and `max_sessions` bounds memory. The minimum is `1s`. Default: `24h`.
	SessionTTL caddy.Duration `json:"session_ttl,omitempty"`

	// Binds each session to the principal of the request that opened it: a
	// placeholder template, evaluated for the initialize request, whose
	// value the table keeps as a keyed hash (HMAC-SHA256 under a random
	// per-process key; with the redis store, under a key derived from its
	// hash_key, so that every Caddy instance checks the binding). A later
	// request of the session whose template evaluates to another value gets the same 404 as an unknown session,
	// never reaches the upstream, and neither ends nor refreshes the
	// session (MCP 2025-11-25, Security Best Practices, "Session
	// Hijacking": bind session state to the user). Placeholders without a
	// value evaluate to empty; a session opened with an empty principal is
	// unbound and any request may use it.
	//
	// Any placeholder works: `{http.auth.user.id}` (set by Caddy's
	// authentication handlers), `{http.request.header.Authorization}` (a
	// static API key; an OAuth client that refreshes its token mid-session
	// would lose its session), `{http.request.tls.client.fingerprint}`, or
	// `{http.request.cookie.NAME}`. `off` turns binding off. A template
	// without a placeholder fails to load; one naming placeholders that
	// neither Caddy's http server, its standard modules nor this plugin set
	// (a typo, or a Caddyfile shorthand such as `{header.X}` in JSON) is
	// logged as a warning when the config loads, since a `map` or another
	// plugin may set them. Default:
	// `{http.auth.user.id}`, which binds sessions when Caddy authenticates
	// the request (and survives token refresh), and leaves them unbound
	// when it does not.
	BindPrincipal string `json:"bind_principal,omitempty"`

	// What to do with a session whose upstream is gone (removed from the
	// config, refusing connections, failing active health checks for
	// longer than the policy's `unhealthy_grace`, answering a POST of the
	// session with 404, or draining past its deadline): `off` ends the session, and its requests get 404;
	// `reinitialize` keeps each session's initialize request (its body and
	// its Accept, Content-Type and MCP-Protocol-Version headers, never
	// credentials) and replays it on an upstream the fallback policy picks,
	// with the credentials of the request that found the upstream gone,
	// followed by notifications/initialized. The client keeps its session
	// ID: the proxy sends the new upstream its own ID and gives the client
	// back its own. The new upstream session starts fresh: subscriptions,
	// log level and other session state are not carried over. Only requests
	// that never reached an upstream, or that it answered 404, are sent
	// again. The kept initialize lives in this Caddy's table; with
	// `seal_session_ids` the client's sealed session ID carries it too, so
	// that any replica can fail the session over. With the redis store, the
	// kept initialize and the new upstream's session ID travel in the
	// session's value in Redis (sealed under a key derived from its
	// hash_key), so that any replica fails the session over, and a move
	// applies on every replica. Default: `off`.
	Failover string `json:"failover,omitempty"`

	// The largest initialize request body, in bytes, that the table keeps
	// for failover; a session opened with a larger one cannot fail over. The
	// SDK clients send 150 to 500 bytes. Default: 4096.
	MaxInitializeSize int `json:"max_initialize_size,omitempty"`

	// How old a sealed session ID (`seal_session_ids`) may be, counted from
	// the initialize that opened the session (the ID carries its issue
	// time, authenticated), and still fail over. An older one whose upstream is gone gets 404, and
	// its client re-initializes. A replica that did not see a session end
	// cannot know it ended; without a shared store, this bound is what
	// keeps an ended, expired or leaked sealed ID from being failed over,
	// as a fresh upstream session, on such a replica until the key is
	// rotated. At its default, a session that expired on any replica can
	// fail over on none. Sealed IDs minted before the issue time was
	// sealed (format versions 1 and 2) never fail over. Sessions with plain
	// IDs need no bound: the table, and the shared store, know when they
	// end. The minimum is `1s`. Default: the table's `session_ttl` (`24h`).
	FailoverMaxAge caddy.Duration `json:"failover_max_age,omitempty"`

	// The most sessions one client may hold that have not been used since
	// their initialize. A client's next one pushes out its own oldest, so
	// that one client flooding initialize requests cannot push out the new
	// sessions of others before they are used. (Sessions that have been
	// used are never pushed out by new ones while unused ones are left,
	// whatever this setting.) Clients behind one NAT or gateway share an
	// address: set it well above the sessions such a client opens at once.
	// Default: 0, no cap.
	MaxUnconfirmedPerClient int `json:"max_unconfirmed_per_client,omitempty"`

	// The placeholder template that names a request's client for
	// `max_unconfirmed_per_client`; a request for which it evaluates to
	// empty is not capped. A template without a placeholder fails to load
	// (every request would be one client); one naming placeholders that
	// neither Caddy's http server, its standard modules nor this plugin set
	// is logged as a warning when the config loads (they evaluate to empty,
	// unless a `map` or another plugin sets them). Default:
	// `{http.vars.client_ip}`, the client's IP address as Caddy's server
	// determines it: from the headers of the proxies the server's
	// `trusted_proxies` trusts, otherwise the connection's.
	ClientKey string `json:"client_key,omitempty"`

	// Keeps the recent events of each session's SSE streams (POST
	// responses and GET streams): `on` or `off`. With it on, the proxy
	// gives every event an ID of its own (carrying the upstream's own ID,
	// if any), keeps reading an upstream's response for `journal_window`
	// after its client went away instead of cancelling it, and answers a
	// GET whose Last-Event-ID it issued from the journal: the events after
	// it, then the live rest of that stream (MCP 2025-11-25 transports,
	// "Resumability and Redelivery"). A GET with an ID the journal no
	// longer holds goes to the upstream with the upstream's own ID. See
	// docs/behaviour.md, "Resumable streams". Default: `off`.
	Journal string `json:"journal,omitempty"`

	// How long the journal keeps an event, and keeps reading an upstream's
	// response after its client went away. Default: `5m`.
	JournalWindow caddy.Duration `json:"journal_window,omitempty"`

	// The most bytes of events the journal keeps per session, the oldest
	// pushed out first; each event counts its bytes plus 64. At most
	// journal_total_bytes. Default: 4194304 (4 MiB).
	JournalSessionBytes int `json:"journal_session_bytes,omitempty"`

	// The most bytes of events the journal keeps for the whole table, the
	// oldest of the session written least recently pushed out first.
	// Default: 134217728 (128 MiB).
	JournalTotalBytes int `json:"journal_total_bytes,omitempty"`
}
