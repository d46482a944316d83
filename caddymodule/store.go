package caddymodule

import (
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
)

func init() {
	caddy.RegisterModule(MemoryStore{})
}

// Store is a module of the `mcp_sessions.stores` namespace: where a session
// table keeps its sessions besides this process's memory.
type Store interface {
	// Connect returns what table t shares its sessions through, or nil to
	// keep them in this process's memory only. It must not wait for the
	// store: an unreachable store never stops Caddy from starting.
	Connect(t *session.Table) (session.Shared, error)
}

// MemoryStore keeps a table's sessions in this Caddy process's memory only:
// they survive config reloads but not a restart, and other Caddy instances
// do not see them. It is the default store and needs nothing to run.
type MemoryStore struct{}

// CaddyModule returns the Caddy module information.
func (MemoryStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "mcp_sessions.stores.memory",
		New: func() caddy.Module { return new(MemoryStore) },
	}
}

// Connect returns nil: the table keeps its sessions in memory only.
func (MemoryStore) Connect(*session.Table) (session.Shared, error) { return nil, nil }

// Interface guards
var _ Store = (*MemoryStore)(nil)
