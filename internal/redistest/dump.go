package redistest

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Dump returns every key of the Redis at addr with its value (strings),
// members (sorted sets), or fields (hashes), one per line, as one text: for
// a test to check what reached Redis, or did not.
func Dump(t testing.TB, addr string) string {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	ctx := context.Background()
	keys, err := rc.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + "\n")
		switch rc.Type(ctx, k).Val() {
		case "string":
			b.WriteString(rc.Get(ctx, k).Val() + "\n")
		case "zset":
			b.WriteString(strings.Join(rc.ZRange(ctx, k, 0, -1).Val(), "\n") + "\n")
		case "hash":
			for f := range rc.HGetAll(ctx, k).Val() {
				b.WriteString(f + "\n")
			}
		}
	}
	return b.String()
}
