package caddymodule

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redisstore"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

func init() {
	caddy.RegisterModule(RedisStore{})
}

// Defaults of the redis store.
const (
	// DefaultRedisTimeout bounds each wait for a Redis reply, and so how long a
	// request can wait on Redis.
	DefaultRedisTimeout = 500 * time.Millisecond
	// DefaultRedisDialTimeout bounds each connection attempt to Redis.
	DefaultRedisDialTimeout = time.Second
	// DefaultRedisKeyPrefix starts every key the store writes.
	DefaultRedisKeyPrefix = "caddy-mcp"
	// DefaultRedisAddress is the Redis of a store that lists no address.
	DefaultRedisAddress = "127.0.0.1:6379"
	// minHashKeyLength is the shortest hash_key accepted, in bytes.
	minHashKeyLength = 32
)

// RedisStore shares a session table through Redis (or Valkey) with every
// Caddy instance configured with the same store, key prefix and table name,
// so that a session learned on one instance is pinned on all, and survives a
// restart of any. The instance's own table stays in front as a cache: a
// request whose session this instance has seen costs no round trip to Redis.
//
// Redis holds, per session, a keyed hash of the session ID (never the ID)
// mapped to the upstream's dial address, with the table's idle TTL; per
// upstream, the sessions it owns and its draining flag. When Redis cannot be
// reached in time, requests are served from the instance's own table, and
// what the instance learns meanwhile is written back when Redis returns.
//
// The client is go-redis's universal client: one address for a standalone
// server, several for a Redis Cluster, or Sentinels with `master_name`.
type RedisStore struct {
	// The addresses of Redis, as host:port: one standalone server, or
	// several nodes of a Redis Cluster, or the Sentinels when `master_name`
	// is set. Placeholders such as `{env.REDIS_ADDR}` are replaced.
	// Default: `127.0.0.1:6379`.
	Addresses []string `json:"addresses,omitempty"`

	// The name of the master monitored by Redis Sentinel; the addresses are
	// then the Sentinels'.
	MasterName string `json:"master_name,omitempty"`

	// Use Redis Cluster even with one address (a cluster's configuration
	// endpoint). Several addresses imply it. Default: false.
	Cluster bool `json:"cluster,omitempty"`

	// The ACL user name, and its password. Use placeholders such as
	// `{env.REDIS_PASSWORD}` to keep secrets out of the config.
	Username string `json:"username,omitempty"`
	// The password of `username`, or of the default user.
	Password string `json:"password,omitempty"`
	// The password of the Sentinels, when it differs from Redis's.
	SentinelPassword string `json:"sentinel_password,omitempty"`

	// The database index (standalone and Sentinel). Default: 0.
	DB int `json:"db,omitempty"`

	// Connect with TLS. Default: no TLS.
	TLS *RedisTLS `json:"tls,omitempty"`

	// How long a connection attempt to Redis may take. Default: `1s`.
	DialTimeout caddy.Duration `json:"dial_timeout,omitempty"`

	// How long to wait for each reply of Redis. A request waits on Redis at
	// most this long, only when this instance has not seen its session (or
	// when it creates one); after a failure, requests stop waiting on Redis
	// until it answers again. Default: `500ms`.
	Timeout caddy.Duration `json:"timeout,omitempty"`

	// The start of every key and channel name the store uses, so that tables
	// of several deployments can share one Redis. Default: `caddy-mcp`.
	KeyPrefix string `json:"key_prefix,omitempty"`

	// The secret key of the keyed hash (HMAC-SHA256) that turns session IDs
	// into Redis keys: at least 32 bytes, the same on every instance, for
	// example `{env.MCP_SESSIONS_HASH_KEY}` set from `openssl rand -base64 32`.
	// Session IDs are bearer credentials; Redis never sees them. Required.
	HashKey string `json:"hash_key,omitempty"`

	fingerprint string // identifies the settings, to share connections across reloads
	opts        *redis.UniversalOptions
	hashKey     []byte
	timeout     time.Duration
	logger      *zap.Logger
	acquired    []string
}

// RedisTLS configures TLS to Redis.
type RedisTLS struct {
	// The server name to verify in Redis's certificate. Default: the host
	// of the address.
	ServerName string `json:"server_name,omitempty"`
	// A PEM file of the certificate authorities to trust. Default: the
	// system's.
	CAFile string `json:"ca_file,omitempty"`
	// Skip verifying Redis's certificate. Only for testing. Default: false.
	InsecureSkipVerify bool `json:"insecure_skip_verify,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (RedisStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "mcp_sessions.stores.redis",
		New: func() caddy.Module { return new(RedisStore) },
	}
}

// Provision fills in defaults, replaces placeholders and checks the settings.
// It does not connect: an unreachable Redis never stops Caddy from starting.
func (s *RedisStore) Provision(ctx caddy.Context) error {
	s.logger = ctx.Logger()
	fp, err := json.Marshal(s)
	if err != nil {
		return err
	}
	s.fingerprint = string(fp)
	repl := caddy.NewReplacer()
	if err := s.replaceAddresses(repl); err != nil {
		return err
	}
	if err := s.replaceHashKey(repl); err != nil {
		return err
	}
	s.KeyPrefix = cmp.Or(repl.ReplaceKnown(s.KeyPrefix, ""), DefaultRedisKeyPrefix)
	s.MasterName = repl.ReplaceKnown(s.MasterName, "")
	s.timeout = durationOr(s.Timeout, DefaultRedisTimeout)
	opts, err := s.options(repl)
	if err != nil {
		return err
	}
	s.opts = opts
	return nil
}

// replaceAddresses replaces the placeholders of the addresses; one that
// ends up empty is an error, never the default address.
func (s *RedisStore) replaceAddresses(repl *caddy.Replacer) error {
	for i, a := range s.Addresses {
		if s.Addresses[i] = repl.ReplaceKnown(a, ""); s.Addresses[i] == "" {
			return fmt.Errorf("redis store: address %q is empty once its placeholders are replaced; "+
				"set the environment variable it names, or give host:port", a)
		}
	}
	if len(s.Addresses) == 0 {
		s.Addresses = []string{DefaultRedisAddress}
	}
	return nil
}

// replaceHashKey replaces the placeholders of hash_key and checks its length.
func (s *RedisStore) replaceHashKey(repl *caddy.Replacer) error {
	s.hashKey = []byte(repl.ReplaceKnown(s.HashKey, ""))
	switch {
	case len(s.hashKey) >= minHashKeyLength:
		return nil
	case s.HashKey == "":
		return fmt.Errorf("redis store: hash_key is required: a secret of at least %d bytes, the same on every Caddy instance; "+
			"set it from an environment variable, hash_key {env.MCP_SESSIONS_HASH_KEY}, filled by `openssl rand -base64 32`", minHashKeyLength)
	case len(s.hashKey) == 0:
		return fmt.Errorf("redis store: hash_key %s is empty once its placeholders are replaced: is the environment variable set?", s.HashKey)
	}
	return fmt.Errorf("redis store: hash_key must be at least %d bytes, the same on every Caddy instance (got %d); "+
		"fill it with `openssl rand -base64 32`", minHashKeyLength, len(s.hashKey))
}

// options returns the go-redis options of the store.
func (s *RedisStore) options(repl *caddy.Replacer) (*redis.UniversalOptions, error) {
	if s.DB < 0 {
		return nil, fmt.Errorf("redis store: db must be 0 or more, got %d", s.DB)
	}
	if s.DB != 0 && s.MasterName == "" && (s.Cluster || len(s.Addresses) > 1) {
		return nil, fmt.Errorf("redis store: db %d: a Redis Cluster has only database 0; "+
			"db applies to a standalone Redis (one address) and to Sentinel (master_name)", s.DB)
	}
	o := &redis.UniversalOptions{
		Addrs:            s.Addresses,
		MasterName:       s.MasterName,
		IsClusterMode:    s.Cluster,
		Username:         repl.ReplaceKnown(s.Username, ""),
		Password:         repl.ReplaceKnown(s.Password, ""),
		SentinelPassword: repl.ReplaceKnown(s.SentinelPassword, ""),
		DB:               s.DB,
		ClientName:       "caddy-mcp-affinity",
		DialTimeout:      durationOr(s.DialTimeout, DefaultRedisDialTimeout),
		DialerRetries:    1,
		ReadTimeout:      s.timeout,
		WriteTimeout:     s.timeout,
		PoolTimeout:      s.timeout,
		MaxRetries:       -1, // a request must not wait for retries; the store retries in the background
		MinIdleConns:     2,  // connected before the first request needs it
		// The request's own deadline bounds a call too.
		ContextTimeoutEnabled: true,
	}
	if s.TLS != nil {
		cfg, err := s.TLS.config(repl)
		if err != nil {
			return nil, err
		}
		o.TLSConfig = cfg
	}
	return o, nil
}

// config returns the TLS client configuration.
func (t *RedisTLS) config(repl *caddy.Replacer) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: repl.ReplaceKnown(t.ServerName, ""), InsecureSkipVerify: t.InsecureSkipVerify, MinVersion: tls.VersionTLS12}
	if t.CAFile == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(repl.ReplaceKnown(t.CAFile, ""))
	if err != nil {
		return nil, fmt.Errorf("redis store: reading tls ca_file: %v", err)
	}
	cfg.RootCAs = x509.NewCertPool()
	if !cfg.RootCAs.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("redis store: tls ca_file %s holds no PEM certificate", t.CAFile)
	}
	return cfg, nil
}

func durationOr(d caddy.Duration, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return time.Duration(d)
}

// clientLog receives go-redis's own log lines (one per failed dial, among
// others) at debug level: the store logs each outage once, at warn level.
type clientLog struct{ logger *zap.Logger }

func (l clientLog) Printf(_ context.Context, format string, v ...any) {
	if c := l.logger.Check(zap.DebugLevel, "go-redis"); c != nil {
		c.Write(zap.String("message", fmt.Sprintf(format, v...)))
	}
}

// quietClient routes go-redis's process-wide logger to zap, once.
var quietClient sync.Once

// connections holds the connections of redis stores, by table and
// settings, so that a reload that keeps a table's store keeps its
// connection, its subscription and what it has queued for Redis.
var connections = caddy.NewUsagePool()

// Connect returns the connection of table t to Redis, opening it unless a
// running config already has it open.
func (s *RedisStore) Connect(t *session.Table) (session.Shared, error) {
	quietClient.Do(func() { redis.SetLogger(clientLog{s.logger}) })
	key := t.Name() + "\x00" + s.fingerprint
	v, _, err := connections.LoadOrNew(key, func() (caddy.Destructor, error) {
		return redisstore.New(t, s.opts, s.KeyPrefix, t.Name(), s.hashKey, s.timeout, s.logger), nil
	})
	if err != nil {
		return nil, err
	}
	s.acquired = append(s.acquired, key)
	return v.(*redisstore.Conn), nil
}

// Cleanup releases the connections the store opened.
func (s *RedisStore) Cleanup() error {
	for _, key := range s.acquired {
		_, _ = connections.Delete(key)
	}
	s.acquired = nil
	return nil
}

// Interface guards
var (
	_ Store              = (*RedisStore)(nil)
	_ caddy.Provisioner  = (*RedisStore)(nil)
	_ caddy.CleanerUpper = (*RedisStore)(nil)
)
