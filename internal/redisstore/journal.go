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
// connection does. Its keys share the table's hash tag, and name sessions
// by the same keyed hash as the table's keys do, never by their IDs.
func (c *Conn) Journal(l journal.Limits) journal.Journal {
	c.journal.once.Do(func() {
		c.journal.j = journal.NewRedis(c.client, c.ks.tag+":j:", func(id string) string { return c.ks.hash(id).String() }, l, c.timeout)
	})
	c.journal.j.SetLimits(l)
	return c.journal.j
}
