// Package caddymodule is a Caddy v2 plugin that gives MCP Streamable HTTP
// sessions affinity to the upstream that created them.
//
// MCP servers on the Streamable HTTP transport (protocol 2025-03-26 to
// 2025-11-25) keep each session in the memory of the process that answered
// `initialize`, which names it in the `Mcp-Session-Id` response header. The
// plugin learns session -> upstream from that response and sends every later
// request carrying the session to the same upstream.
//
// Modules:
//   - mcp_sessions ([App]): the session tables, by name, and their settings;
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
//   - admin.api.mcp_sessions ([AdminAPI]): session counts, lookup, eviction,
//     drain and undrain under Caddy's admin endpoint.
//
// Caddyfile directives: `mcp_proxy` (both modules in one directive),
// `mcp_session` (the handler), and `lb_policy mcp_session` inside
// `reverse_proxy`; the global option `mcp_sessions` configures the app.
package caddymodule
