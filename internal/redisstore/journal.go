package redisstore

import (
	"sync"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/journal"
)

// journalOnce holds a connection's journal, made at its first use.
type journalOnce struct {
	once sync.Once
	j    *journal.Redis
}

// Journal returns the connection's event journal in Redis, bounded by l:
// one per connection, so that it outlives config reloads as the
// connection does. Each session's keys share the session's hash tag, its
// keyed hash, as its table keys do (journalOf), never its ID; the
// journal's byte counters share the table's tag.
func (c *Conn) Journal(l journal.Limits) journal.Journal {
	c.journal.once.Do(func() {
		c.journal.j = journal.NewRedis(c.client, c.ks.tag+":j:", c.ks.journalOf, l, c.timeout)
	})
	c.journal.j.SetLimits(l)
	return c.journal.j
}
