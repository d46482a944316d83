package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redisstore"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
)

// testHashKey is a hash_key for tests.
const testHashKey = "0123456789abcdef0123456789abcdef-test"

// sharedTable returns a table named name connected to Redis at addr through
// a redis store with the given timeout, as one Caddy instance has it.
func sharedTable(t testing.TB, addr, name string, timeout time.Duration) *session.Table {
	t.Helper()
	return sharedTableKey(t, addr, name, testHashKey, timeout)
}

// sharedTableKey is sharedTable with the store's hash_key.
func sharedTableKey(t testing.TB, addr, name, hashKey string, timeout time.Duration) *session.Table {
	t.Helper()
	tbl, err := NewTable(name, 1<<20, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	attachStore(t, tbl, addr, name, hashKey, timeout)
	return tbl
}

// attachStore connects tbl to Redis at addr as table name, through a redis
// store with the given hash_key and timeout.
func attachStore(t testing.TB, tbl *session.Table, addr, name, hashKey string, timeout time.Duration) {
	t.Helper()
	s := &RedisStore{Addresses: []string{addr}, HashKey: hashKey, Timeout: caddy.Duration(timeout)}
	if err := s.Provision(newContext(t)); err != nil {
		t.Fatal(err)
	}
	c := redisstore.New(tbl, s.opts, s.KeyPrefix, name, s.hashKey, s.timeout, s.logger)
	t.Cleanup(func() { _ = c.Destruct() })
	tbl.SetStore(c)
}

func TestRedisStoreProvisionErrors(t *testing.T) {
	t.Setenv("TEST_SHORT_KEY", "short")
	for _, tc := range []struct {
		s    RedisStore
		want string
	}{
		{RedisStore{}, "hash_key is required"},
		{RedisStore{HashKey: "{env.TEST_SHORT_KEY}"}, "(got 5)"},
		{RedisStore{HashKey: "{env.TEST_UNSET_KEY}"}, "is the environment variable set?"},
		{RedisStore{HashKey: testHashKey, Addresses: []string{"{env.TEST_UNSET_ADDR}"}}, `address "{env.TEST_UNSET_ADDR}" is empty`},
		{RedisStore{HashKey: testHashKey, DB: -1}, "db must be 0 or more"},
		{RedisStore{HashKey: testHashKey, DB: 3, Addresses: []string{"a:1", "b:1"}}, "a Redis Cluster has only database 0"},
		{RedisStore{HashKey: testHashKey, DB: 3, Cluster: true}, "a Redis Cluster has only database 0"},
		{RedisStore{HashKey: testHashKey, TLS: &RedisTLS{CAFile: "/nonexistent/ca.pem"}}, "reading tls ca_file"},
	} {
		s := tc.s
		if err := s.Provision(newContext(t)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Provision(%+v) = %v, want an error containing %q", tc.s, err, tc.want)
		}
	}
	t.Setenv("TEST_HASH_KEY", testHashKey)
	t.Setenv("TEST_PREFIX", "deployment-a")
	s := RedisStore{HashKey: "{env.TEST_HASH_KEY}", Password: "{env.TEST_HASH_KEY}", KeyPrefix: "{env.TEST_PREFIX}", MasterName: "{env.TEST_PREFIX}", DB: 2}
	if err := s.Provision(newContext(t)); err != nil {
		t.Fatal(err)
	}
	if string(s.hashKey) != testHashKey || s.opts.Password != testHashKey || s.opts.Addrs[0] != DefaultRedisAddress ||
		s.KeyPrefix != "deployment-a" || s.opts.MasterName != "deployment-a" {
		t.Errorf("placeholders or defaults not applied: key %q, password %q, addresses %v, key_prefix %q, master_name %q",
			s.hashKey, s.opts.Password, s.opts.Addrs, s.KeyPrefix, s.opts.MasterName)
	}
}

// TestRequestBeforeAppStart: Caddy starts a config's apps in no set order
// (it ranges over a map), so a Caddy that has just started can serve a
// request in its http app before the mcp_sessions app has started and
// connected the table to its store. A session another instance learned
// into Redis must still be pinned then, not answered 404, which ends it for
// the client (TestReplicasSurviveRestarts lost sessions so, under load, on
// a replica just restarted).
func TestRequestBeforeAppStart(t *testing.T) {
	srv := redistest.Start(t)
	name := "shared/" + t.Name()
	sharedTable(t, srv.Addr, name, time.Second).Learn(testSessionID, "10.0.0.2:8080") // on another instance

	cfg := fmt.Sprintf(`{"tables":{%q:{"store":{"type":"redis","addresses":[%q],"hash_key":%q,"timeout":"1s"}}}}`, name, srv.Addr, testHashKey)
	base, err := caddy.ProvisionContext(&caddy.Config{AppsRaw: caddy.ModuleMap{AppName: json.RawMessage(cfg)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(base)
	t.Cleanup(cancel)
	h := &Handler{Table: name}
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	app, err := sessionsApp(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = app.uses[name].store.(*RedisStore).Cleanup()
		_ = app.Cleanup()
	})
	f := &affinityFixture{h: h, proxy: &fakeProxy{policy: provisionPolicy(t, &SessionSelection{Table: name}), pool: testPool()}}

	// Caddy has not started the app: the first request comes first.
	rec := f.serve(t, newRequest(http.MethodPost, testSessionID), answer(http.StatusOK))
	if up := f.proxy.last(); rec.Code != http.StatusOK || up == nil || up.Dial != "10.0.0.2:8080" {
		t.Fatalf("a request of a session in Redis, before the app started: %d %q; want it pinned to 10.0.0.2:8080", rec.Code, rec.Body.String())
	}
	if err := app.Start(); err != nil { // Caddy's own call comes later: the work is done
		t.Fatalf("the app's start after a request: %v", err)
	}
}

// storeOf returns the redis connection of table t.
func storeOf(t *session.Table) *redisstore.Conn {
	c, _ := t.Store().(*redisstore.Conn)
	return c
}
