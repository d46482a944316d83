package journal

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
)

// newRedis returns two journals on one real redis-server, as two
// replicas see it.
func newRedis(t *testing.T, l Limits) (*Redis, *Redis) {
	srv := redistest.Start(t)
	mk := func() *Redis {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { c.Close() })
		return NewRedis(c, "{t}:j:", func(s string) string { return "{t}:j:h" + s }, l, 2*time.Second)
	}
	return mk(), mk()
}

func TestRedisReplaysThenFollowsAcrossReplicas(t *testing.T) {
	a, b := newRedis(t, Limits{})
	ctx := context.Background()
	for i := 1; i <= 3; i++ {
		if err := a.Append(ctx, "s", "x", Event{Seq: uint64(i), Upstream: fmt.Sprint("u", i), Block: block(i)}); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan []uint64)
	go func() {
		got, err := follow(t, b, "s", "x", 1) // the other replica
		if err != nil {
			t.Error(err)
		}
		done <- got
	}()
	time.Sleep(100 * time.Millisecond)
	_ = a.Append(ctx, "s", "x", Event{Seq: 4, Block: block(4)})
	_ = a.End(ctx, "s", "x")
	if got := <-done; fmt.Sprint(got) != "[2 3 4]" {
		t.Errorf("followed %v through the other replica; want [2 3 4]", got)
	}
	if _, err := follow(t, b, "s", "other", 1); !errors.Is(err, ErrNotHeld) {
		t.Errorf("unknown stream: %v; want ErrNotHeld", err)
	}
	_ = a.Drop(ctx, "s")
	if _, err := follow(t, b, "s", "x", 1); !errors.Is(err, ErrNotHeld) {
		t.Errorf("after Drop: %v; want ErrNotHeld", err)
	}
}

func TestRedisByteBound(t *testing.T) {
	size := int64(len(block(1))) + eventOverhead
	a, _ := newRedis(t, Limits{SessionBytes: 2 * size})
	ctx := context.Background()
	var errs []error
	for i := 1; i <= 3; i++ {
		errs = append(errs, a.Append(ctx, "s", "x", Event{Seq: uint64(i), Block: block(i)}))
	}
	if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], ErrFull) {
		t.Errorf("appends: %v; want the third to reach the session bound", errs)
	}
	if st := a.Stats(); st.Appended != 3 || st.Trimmed[TrimSessionBytes] != 1 {
		t.Errorf("stats %+v", st)
	}
}
