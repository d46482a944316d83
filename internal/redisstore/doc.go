// Package redisstore shares session tables through Redis (or Valkey): it
// implements [session.Shared] for the mcp_sessions.stores.redis module.
//
// Per table, Redis holds each session's value under a keyed hash of its ID
// (HMAC-SHA256 under hash_key, never the ID; keys.go), with the table's
// idle TTL, under a Redis Cluster hash tag of its own so that a cluster's
// masters share the table (legacy.go reads the older one-slot layout); per
// upstream, the sessions it owns and its draining flag; the
// tombstones of sessions that ended for good; and, with failover, each
// session's sealed failover record (AES-256-GCM, record.go). A [Conn]
// answers the table's misses, writes what the table learns and ends,
// publishes it to the other instances and applies what they publish
// (sync.go), and keeps the cluster's view current. While Redis cannot be
// reached it fails fast, queues the writes, and writes them back when
// Redis answers again (failovers with their compare-and-set, record.go).
// lost.go notices keys Redis lost while it ran (restart, failover, flush,
// eviction) and writes the table back; full.go keeps a Redis that refuses
// writes (OOM, READONLY) readable, and bounds what sessions never used
// after their initialize hold in Redis; keycheck.go notices instances on
// another hash_key. reclaim.go makes exactly one instance reclaim each
// session that ends in Redis: the one whose write (or expiry sweep)
// removed it; upend.go ends the sessions of an evicted upstream that Redis
// holds when the eviction is written, and no session learned after it.
//
// The package imports no Caddy package: caddymodule/redis.go configures it.
package redisstore
