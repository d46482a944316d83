// Package session is the session table of the MCP affinity plugin: which
// upstream owns each MCP session (Mcp-Session-Id, MCP 2025-03-26 to
// 2025-11-25 transports, §Session Management), and everything the table
// decides about it without Caddy.
//
// A [Table] learns sessions from initialize responses, pins later requests
// to their session's [Upstream], binds sessions to principals (a keyed
// hash, principal.go), bounds itself (two LRU lists, admission.go; a TTL
// and a janitor, table.go), remembers sessions that ended for good
// (tombstone.go), keeps each session's initialize for failover
// (tablefailover.go), and counts what it does ([Stats]; the method
// counters in methodstats.go). Its [Registry] of upstream records
// (upstreams.go) carries draining flags, drain deadlines and cool-offs
// (cooloff.go); its settings live in small embedded types (settings.go).
// It tells a [ForgetHook] of the sessions it forgets that their upstream
// may still hold, so that the proxy can end them there (forget.go).
//
// A table can share its sessions with other instances through a [Shared]
// store (tableshare.go): the table calls the store outside its locks, and
// the store calls back only through the table's exported methods
// ([Table.EvictHere], [Table.EvictUpstreamHere], [Table.DrainHere],
// [Table.Follow], [Table.StoreUpstream], [Table.Snapshot], …).
//
// The package imports no Caddy package; the Caddy modules in caddymodule
// sit on top of it (internal/layers_test.go checks it).
package session
