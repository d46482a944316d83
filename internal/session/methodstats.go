package session

import (
	"sync/atomic"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
)

// firstCode and lastCode bound the HTTP statuses counted.
const firstCode, lastCode = 100, 599

// methodCounts counts requests by method label (mcpwire's label indexes)
// and response status.
type methodCounts [mcpwire.Labels][lastCode - firstCode + 1]atomic.Uint64

// MethodStats are a table's per-method counters and its open
// subscriptions/listen streams. The counts are allocated on first use
// (about 100 KiB), so a table that serves no traffic costs nothing.
type MethodStats struct {
	counts  atomic.Pointer[methodCounts]
	listens atomic.Int64
}

// Count counts one request of method answered with status; a status
// outside 100–599 is not counted.
func (s *MethodStats) Count(method string, status int) {
	if status < firstCode || status > lastCode {
		return
	}
	c := s.counts.Load()
	if c == nil {
		s.counts.CompareAndSwap(nil, new(methodCounts))
		c = s.counts.Load()
	}
	c[mcpwire.MethodIndex(method)][status-firstCode].Add(1)
}

// AddListens counts delta subscriptions/listen streams opened (above 0)
// or closed (below 0).
func (s *MethodStats) AddListens(delta int64) { s.listens.Add(delta) }

// Listens returns the number of subscriptions/listen streams open.
func (s *MethodStats) Listens() int64 { return s.listens.Load() }

// Each calls fn for every method label and status counted at least once.
func (s *MethodStats) Each(fn func(method string, status int, n uint64)) {
	c := s.counts.Load()
	if c == nil {
		return
	}
	for i := range c {
		for j := range c[i] {
			if n := c[i][j].Load(); n > 0 {
				fn(mcpwire.MethodLabel(i), j+firstCode, n)
			}
		}
	}
}
