// Package caddymodule is a Caddy v2 plugin that gives MCP Streamable HTTP
// sessions affinity to the upstream that created them.
//
// MCP servers on the Streamable HTTP transport (protocol 2025-03-26 to
// 2025-11-25) keep each session in the memory of the process that answered
// `initialize`, which names it in the `Mcp-Session-Id` response header. The
// plugin learns session -> upstream from that response and sends every later
// request carrying the session to the same upstream.
//
// # Modules
//
// The package registers 11 Caddy modules:
//   - mcp_sessions ([App]): the session tables, by name, and their settings;
//   - mcp_sessions.stores.memory ([MemoryStore]): the default store, a
//     table in this Caddy's memory only;
//   - mcp_sessions.stores.redis ([RedisStore]): a table shared by every
//     Caddy instance that uses the same Redis;
//   - http.handlers.mcp_session ([Handler]): learns sessions from responses,
//     rejects malformed and unknown session IDs, evicts ended sessions, sets
//     the {mcp.*} placeholders;
//   - http.matchers.mcp ([MatchMCP]): matches requests by JSON-RPC method,
//     tool/prompt/resource name, protocol era and version (MCP 2026-07-28
//     request headers, optionally checked against the body);
//   - http.reverse_proxy.selection_policies.mcp_session ([SessionSelection]):
//     pins requests of known sessions, balances the rest with a fallback policy;
//   - http.reverse_proxy.selection_policies.least_sessions
//     ([LeastSessionsSelection]): the default fallback, the upstream with the
//     fewest live sessions;
//   - http.reverse_proxy.transport.mcp ([Transport]): Caddy's http
//     transport, sending a small request body with its headers in one write;
//   - http.reverse_proxy.upstreams.unix_sockets ([UnixSocketUpstreams]):
//     every unix socket matching a pattern is an upstream;
//   - admin.api.mcp_sessions ([AdminAPI]): session counts, lookup, eviction,
//     drain and undrain under Caddy's admin endpoint, and the status page;
//   - http.handlers.mcp_status ([StatusPage]): the status page on a site
//     route, read-only.
//
// Caddyfile directives: `mcp_proxy` (the handler and the policy in one
// directive), `mcp_session` (the handler), `lb_policy mcp_session` and
// `lb_policy least_sessions` inside `reverse_proxy`, `transport mcp`,
// `dynamic unix_sockets`, the `mcp` matcher, `mcp_status` (the status
// page), and the global option
// `mcp_sessions`, which configures the app and its store. docs/caddyfile.md
// is the reference of every option; the field docs of the module structs
// are the JSON reference.
//
// # Where things live
//
// This package holds the Caddy modules and everything that touches
// caddy.Context, caddyhttp or reverseproxy; the domain core lives below it
// in internal packages that import no Caddy package:
//   - internal/session: the session table (table.go: lookups, learning,
//     evictions), index.go (the sessions of this process: the LRU lists
//     and the lock), admission.go (which session leaves when the table is
//     full), janitor.go (the sweeps), stripedlock.go, principal.go (the
//     bind_principal digest), tablefailover.go (kept initialize requests,
//     moves, drain deadlines), tableshare.go (the [session.Shared] store
//     interface and the table's side of it), tombstone.go, upstreams.go
//     (the upstream records, [session.Registry]), cooloff.go (stuck and
//     refusing upstreams), settings.go (the settings, and the lifetimes
//     of sessions and tombstones), methodstats.go, forget.go (the hook
//     told of forgotten sessions their upstream may still hold, and the
//     reclaim counters).
//   - internal/redisstore: the redis store's connection (conn.go: a Conn
//     is the table's layout in Redis, the health Redis's answers show, and
//     the queue of writes not yet taken), sync.go (flushes and the
//     once-a-second sync), keys.go, keycheck.go (hash_key clashes),
//     record.go (the sealed failover records), lost.go (keys Redis lost
//     while running), full.go (a full or read-only Redis), journal.go,
//     reclaim.go (which instance reclaims a session that ends in Redis).
//   - internal/mcpwire: the wire facts: the JSON-RPC head scanner and
//     initialize check, the one JSON-RPC error body and writer, the SSE
//     event parser, the Mcp-Session-Id checks, protocol versions, method
//     labels, the handle in a tool result (handle.go).
//   - internal/seal: the one AEAD envelope of sealed session IDs and of the
//     redis store's failover records.
//
// Here, in four layers; a file uses names of its own layer and of the
// layers before it, never of a later one:
//   - The request's facts: exchange.go (what one request is and what was
//     decided for it, and its era: the request's one variable in Caddy's
//     map, shared by its attempts), decision.go (the
//     {mcp.decision} values), placeholders.go, body.go and bodymemory.go
//     (the body's reads and their memory budget), jsonrpc.go and answer.go
//     (the proxy's own answers, the upstreams' answers to the proxy's own
//     requests), deadline.go
//     (write limits lifted while an upstream answers), host.go,
//     sessionkey.go (table keys and the IDs clients hold), legacyquery.go
//     (a legacy session named in a query), templates.go (placeholder
//     templates, the request's principal), transport.go, methods.go,
//     store.go.
//   - Tables, policies and operations: app.go (the table registry,
//     NewTable), tablesettings.go and journalsettings.go (the settings a
//     handler and the app share), handles.go (the handle rules of
//     2026-07-28 tools and their settings), matcher.go (the mcp matcher),
//     sealer.go (the keys of sealed session IDs), reclaim.go (the DELETEs
//     of sessions the table forgot, sent through the handler's next
//     handler), selection.go, leastsessions.go,
//     health.go, redis.go, admin.go and adminbody.go, metrics.go and
//     journalmetrics.go, the status page in statuspage.go (its HTML and
//     CSS beside it), statushandler.go and activity.go (its recent
//     figures). They see the request path only through the exchange and
//     the tableWriter interface.
//   - The request path, the one cycle by design (the handler and the
//     branches it takes): handler.go (Provision, ServeHTTP, serving each
//     route), route.go (the one decision of where a request goes, from the
//     request and the table), observe.go (the exchange kept around serving),
//     gateway.go (the JSON-RPC answers to reverse_proxy's 502, 503 and 504,
//     and to an app that did not start), frozen.go and open.go
//     (bounded waits for upstream answers), refusal.go (a refused
//     initialize sent elsewhere), reinit.go (a stale initialize),
//     failover.go, sealed.go (sealing responses, over internal/seal),
//     legacysse.go (legacy
//     HTTP+SSE streams), writer.go (the response the session is learned
//     from), handleserve.go and
//     handleresult.go (the requests carrying handles, the results they are
//     learned from), journal.go (resumable streams, over internal/journal).
//   - Configuration on top: caddyfile.go (the matcher's and the upstream
//     source's parsers next to their modules, in matcher.go and
//     unixsockets.go),
//     command.go (the `caddy mcp-proxy` subcommand, which runs the
//     Caddyfile its flags stand for).
package caddymodule
