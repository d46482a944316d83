package session

import (
	"slices"
	"strings"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Admission: which session leaves when a new one arrives. Every method
// here runs with the index's lock held.

// peek returns session id's entry and the list that holds it, without
// counting it as use.
func (ix *index) peek(id string) (entry, *simplelru.LRU[string, entry], bool) {
	if e, ok := ix.confirmed.Peek(id); ok {
		return e, ix.confirmed, true
	}
	e, ok := ix.unconfirmed.Peek(id)
	return e, ix.unconfirmed, ok
}

// len returns the number of sessions in both lists.
func (ix *index) len() int { return ix.unconfirmed.Len() + ix.confirmed.Len() }

// lists returns both lists, unconfirmed first.
func (ix *index) lists() [2]*simplelru.LRU[string, entry] {
	return [2]*simplelru.LRU[string, entry]{ix.unconfirmed, ix.confirmed}
}

// use stores e, just used, back as session id's entry at the front of the
// confirmed list; list is the list that held it. When this use confirmed
// the session, it returns the key the table now holds it by.
func (ix *index) use(id string, e entry, list *simplelru.LRU[string, entry]) (confirmed string) {
	if list == ix.unconfirmed {
		return ix.confirm(id, e)
	}
	list.Add(id, e)
	return ""
}

// confirm moves session id, at its first use since it was learned, to the
// front of the confirmed list. The number of sessions does not change.
//
// The list keeps the key it is given, and id is the request's: a string
// that may share a larger buffer (an opened sealed ID's key shares the
// buffer of the whole ID and its plaintext, 576 bytes for a sealed ID that
// carries its initialize). So the table keeps a copy of id, and keys the
// session's kept initialize with the same copy, so that it holds one key;
// it returns the copy, which the shared store's index of sessions may take
// too (see [Shared.Rekey]).
func (ix *index) confirm(id string, e entry) string {
	id = strings.Clone(id)
	ix.moving = true
	ix.unconfirmed.Remove(id)
	ix.moving = false
	ix.confirmed.Add(id, e)
	if init, ok := ix.inits[id]; ok {
		delete(ix.inits, id)
		ix.inits[id] = init
	}
	return id
}

// makeRoom evicts sessions until n more fit in the table, and reports
// whether they do. client, when not empty, is the client of the session to
// come: at its cap, its own oldest unconfirmed session goes first.
// Unconfirmed sessions go before confirmed ones, and a session with an
// open GET stream never goes.
func (ix *index) makeRoom(n int, client string) bool {
	if victim := ix.perClient.oldestOver(client); victim != "" {
		ix.reason = EvictClientCap
		ix.unconfirmed.Remove(victim)
	}
	for ix.len()+n > ix.max {
		if ix.unconfirmed.Len() > 0 {
			ix.reason = EvictUnconfirmed
			ix.unconfirmed.RemoveOldest()
			continue
		}
		if !ix.evictConfirmedLRU() {
			return false
		}
	}
	return true
}

// evictConfirmedLRU evicts the least recently used confirmed session that
// has no open GET stream, and reports whether there was one. Sessions with
// an open stream that it passes are in use: they move to the front.
func (ix *index) evictConfirmedLRU() bool {
	now := ix.now()
	for range ix.confirmed.Len() {
		id, e, _ := ix.confirmed.GetOldest()
		if e.streams == 0 {
			ix.reason = EvictLRU
			ix.confirmed.RemoveOldest()
			return true
		}
		e.lastUsed = now
		ix.confirmed.Add(id, e)
	}
	return false
}

// refuse counts session id, learned for up, as evicted at once: every
// session of the full table has an open GET stream.
func (t *Table) refuse(id string, up *Upstream) {
	t.Stats.evictions[EvictLRU].Add(1)
	if l := t.logger.Load(); l != nil {
		if c := l.Check(zapcore.WarnLevel, "session table full of sessions with open GET streams; new session not pinned"); c != nil {
			c.Write(zap.String("table", t.name), zap.Int("max_sessions", t.max),
				zap.String("session", t.fingerprint(id)), zap.String("upstream", up.dial))
		}
	}
}

// SetClientCap sets the most unconfirmed sessions one client may hold
// (max_unconfirmed_per_client; 0: no cap) and the placeholder template that
// names a request's client (client_key). Lowering the cap applies to the
// sessions learned from then on.
func (t *Table) SetClientCap(limit int, key string) {
	if key == "" || limit <= 0 {
		key = DefaultClientKey
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.perClient.setLimit(limit)
	t.clientKey.Store(&key)
	t.clientCapped.Store(limit > 0)
}

// DefaultClientKey names the client of a request for the cap on
// unconfirmed sessions per client: its IP address, as Caddy's http server
// determines it for every request (the `client_ip` request variable, which
// the access log's client_ip and the client_ip matcher read): taken from
// the headers of the proxies the server's `trusted_proxies` trusts,
// otherwise the connection's remote address. The connection's address
// alone ({http.request.remote.host}) would make every client behind a
// trusted load balancer one client.
const DefaultClientKey = "{http.vars.client_ip}"

// clientCap tracks, when a cap is set, the unconfirmed sessions of each
// client, oldest first. It holds at most one entry per unconfirmed session.
type clientCap struct {
	limit    int
	sessions map[string][]string // client -> its unconfirmed sessions, oldest first
	clientOf map[string]string   // unconfirmed session -> its client
}

func (c *clientCap) setLimit(limit int) {
	c.limit = limit
	if limit > 0 && c.sessions == nil {
		c.sessions, c.clientOf = map[string][]string{}, map[string]string{}
	}
}

// oldestOver returns client's oldest unconfirmed session if the client is
// at its cap, or "".
func (c *clientCap) oldestOver(client string) string {
	if c.limit <= 0 || client == "" || len(c.sessions[client]) < c.limit {
		return ""
	}
	return c.sessions[client][0]
}

// add records unconfirmed session id of client.
func (c *clientCap) add(id, client string) {
	if c.limit <= 0 || client == "" {
		return
	}
	c.sessions[client] = append(c.sessions[client], id)
	c.clientOf[id] = client
}

// remove forgets session id, which is no longer unconfirmed.
func (c *clientCap) remove(id string) {
	client, ok := c.clientOf[id]
	if !ok {
		return
	}
	delete(c.clientOf, id)
	ids := slices.DeleteFunc(c.sessions[client], func(s string) bool { return s == id })
	if len(ids) == 0 {
		delete(c.sessions, client)
		return
	}
	c.sessions[client] = ids
}
