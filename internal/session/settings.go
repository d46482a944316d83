package session

import (
	"crypto/sha256"
	"encoding/hex"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/journal"
	"golang.org/x/sync/singleflight"
)

// The parts of a table that hold its settings, each with the methods that
// read and set them. A [Table] embeds them.

// templates holds a table's placeholder templates, which the Caddy glue
// evaluates per request.
type templates struct {
	bind atomic.Pointer[string] // the bind_principal template

	// clientKey is the client_key template, read when clientCapped.
	clientKey    atomic.Pointer[string]
	clientCapped atomic.Bool
}

// storeLink holds a table's connection to a shared store, and the key its
// principals are hashed under.
type storeLink struct {
	// store is the table's connection to a shared store; nil keeps the
	// sessions in this process only.
	store atomic.Pointer[sharedRef]
	keys  atomic.Pointer[principalKeys]
}

// lifetimes holds what decides how long a table's sessions live, and
// their tombstones (tombstone.go): the idle TTL, the failover settings, and
// which keys are sealed IDs.
type lifetimes struct {
	ttl atomic.Int64 // nanoseconds
	failoverConfig
	keyInfo
}

// failoverConfig holds a table's failover settings.
type failoverConfig struct {
	// failover holds the failover settings; flights lets one request per
	// session fail it over while the others wait (tablefailover.go).
	failover atomic.Pointer[FailoverSettings]
	flights  singleflight.Group
}

// keyInfo holds what a table knows of its keys, and where it logs.
type keyInfo struct {
	// keyKinds tells sealed keys from plain ones, and names keys in logs;
	// nil until set (see [keyInfo.SetKeyKinds]).
	keyKinds atomic.Pointer[KeyKinds]

	// logger receives a debug line per eviction; nil until a handler sets it.
	logger atomic.Pointer[zap.Logger]
}

// SetBindPrincipal sets the placeholder template that evaluates to a
// request's principal (the bind_principal option); "off" turns binding
// off, for the sessions bound before too.
func (p *templates) SetBindPrincipal(template string) { p.bind.Store(&template) }

// BindPrincipal returns the template set by [Table.SetBindPrincipal], or
// [DefaultBindPrincipal].
func (p *templates) BindPrincipal() string {
	if p := p.bind.Load(); p != nil {
		return *p
	}
	return DefaultBindPrincipal
}

// Flight runs fn for session id unless a call for id is running, and
// then waits for that call and returns its result: one request per
// session fails it over while the others wait (golang.org/x/sync's
// singleflight).
func (f *failoverConfig) Flight(id string, fn func() (any, error)) (any, error) {
	v, err, _ := f.flights.Do(id, fn)
	return v, err
}

// SetLogger sets the logger that gets a debug line per eviction.
func (ki *keyInfo) SetLogger(l *zap.Logger) { ki.logger.Store(l) }

// SetKeyKinds sets what the table's keys are; the zero KeyKinds treats
// every key as a plain ID.
func (ki *keyInfo) SetKeyKinds(k KeyKinds) { ki.keyKinds.Store(&k) }

// sealedKey reports whether table key key is a sealed session ID's.
func (ki *keyInfo) sealedKey(key string) bool {
	k := ki.keyKinds.Load()
	return k != nil && k.Sealed != nil && k.Sealed(key)
}

// fingerprint names table key key in logs.
func (ki *keyInfo) fingerprint(key string) string {
	if k := ki.keyKinds.Load(); k != nil && k.Fingerprint != nil {
		return k.Fingerprint(key)
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:6])
}

// ClientKey returns the template set by [Table.SetClientCap], or "" when
// there is no cap, so that the handler evaluates nothing.
func (p *templates) ClientKey() string {
	if !p.clientCapped.Load() {
		return ""
	}
	return *p.clientKey.Load()
}

// sharedRef holds a table's Shared, so that an atomic pointer can swap it.
type sharedRef struct{ s Shared }

// shared returns the table's shared store; nil keeps sessions in this
// process only.
func (l *storeLink) shared() Shared {
	if r := l.store.Load(); r != nil {
		return r.s
	}
	return nil
}

// Store returns the table's shared store; nil when its sessions stay in
// this process only.
func (l *storeLink) Store() Shared { return l.shared() }

// setStore connects the table to a shared store; nil keeps its sessions in
// this process only. With a store, principals are hashed under a key
// derived from the store's secret, which every instance shares; sessions
// bound to a principal before a table changed stores are refused
// afterwards (their principal's hash was made under another key).
func (l *storeLink) SetStore(c Shared) {
	if c == l.shared() {
		return
	}
	if c == nil {
		l.store.Store(nil)
		l.keys.Store(newPrincipalKeys(nil))
		return
	}
	l.store.Store(&sharedRef{c})
	l.keys.Store(newPrincipalKeys(c.PrincipalKey()))
}

// Shared reports whether the table shares its sessions through a store.
func (l *storeLink) Shared() bool { return l.shared() != nil }

// StoreReachable reports whether the table's shared store answered its last
// call; true without a shared store.
func (l *storeLink) StoreReachable() bool {
	c := l.shared()
	return c == nil || c.Reachable()
}

// setFailover sets the table's failover mode and max_initialize_size,
// keeping its failover_max_age.
func (f *failoverConfig) SetFailover(mode string, maxInit int) {
	if maxInit <= 0 {
		maxInit = DefaultMaxInitializeSize
	}
	f.failover.Store(&FailoverSettings{On: mode == FailoverReinitialize, MaxInit: maxInit, MaxAge: f.Failover().MaxAge})
}

// setFailoverMaxAge sets the table's failover_max_age; 0 or less makes it
// the table's session_ttl.
func (f *failoverConfig) SetFailoverMaxAge(d time.Duration) {
	fs := f.Failover()
	fs.MaxAge = max(d, 0)
	f.failover.Store(&fs)
}

// failoverSettings returns the table's failover settings; off when unset.
func (f *failoverConfig) Failover() FailoverSettings {
	if s := f.failover.Load(); s != nil {
		return *s
	}
	return FailoverSettings{MaxInit: DefaultMaxInitializeSize}
}

// refused reports whether a request with principal sum may not use a
// session bound to bound.
func (p *templates) refused(bound, sum PrincipalSum) bool {
	return bound != (PrincipalSum{}) && bound != sum && p.BindPrincipal() != BindPrincipalOff
}

// TTL returns the table's idle TTL.
func (lt *lifetimes) TTL() time.Duration { return time.Duration(lt.ttl.Load()) }

// failoverMaxAge returns the age past which a sealed session ID fails over
// no more: failover_max_age, or the table's session_ttl.
func (lt *lifetimes) FailoverMaxAge() time.Duration {
	if d := lt.Failover().MaxAge; d > 0 {
		return d
	}
	return lt.TTL()
}

// journalLink holds a table's event journal (the journal setting); nil
// while the setting is off.
type journalLink struct {
	journal atomic.Pointer[journalRef]
}

// journalRef holds a Journal and its limits, so that an atomic pointer can
// swap them.
type journalRef struct {
	j      journal.Journal
	limits journal.Limits
}

// SetJournal gives the table the journal j, bounded by limits; nil turns
// the journal off.
func (l *journalLink) SetJournal(j journal.Journal, limits journal.Limits) {
	if j == nil {
		l.journal.Store(nil)
		return
	}
	l.journal.Store(&journalRef{j: j, limits: limits.WithDefaults()})
}

// Journal returns the table's journal and its limits; nil while the
// journal setting is off.
func (l *journalLink) Journal() (journal.Journal, journal.Limits) {
	if r := l.journal.Load(); r != nil {
		return r.j, r.limits
	}
	return nil, journal.Limits{}
}
