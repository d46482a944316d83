package redisstore

import (
	"bytes"
	"testing"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
)

// TestGoldenFailoverRecords: failover records the redis store wrote before
// records were sealed by internal/seal (main a187596; hash_key 0x33 × 32)
// still open, to what was sealed, for their own session only.
func TestGoldenFailoverRecords(t *testing.T) {
	ks := newKeyspace("mcp", "default", bytes.Repeat([]byte{0x33}, 32))
	const body = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`
	for _, c := range []struct {
		id, rec string
		want    session.Init
	}{
		{"ABCDEFGHIJKLMNOPQRSTUVWXYZ", "AcFgvM4Pz421OpKyqpVHUxcYzaG4pgiu_fE84Ijwq8Hf5rXw5ymGjnwDxWLYWPNsIn7101sOUlFJeV0ntJdiqHGGgDNZKuC8N9GpIDG5KPP2pk7sqjsiiOm4_Tg2hs2hKenyfRdfYHvbfTHrugGchBWfBTmktUcHbqhTJ3auPGrKV_BiQIyh55g-lWzHoA",
			session.Init{Accept: "application/json, text/event-stream", ContentType: "application/json"}},
		{"sess-2", "AXBc2s-PzN5rNBqj-BzUl6VrEGYjQDe4UkUO7MTipLaJHBicugyYQEw6DyXj7PM31eRWfUovAuzHi-1E2d__RH4pSmgpbHn0m_R5eWYsMPW3GDhbhDpEnjHPq2O9_5rrh5NupMbpOspdQiZg9fEgn6zh2oz4lCKWztdNyIL055CPXtaxToS7XeqDYyIEvI0Lvo0qw2bFX8O8sHAIQR9p",
			session.Init{Accept: "application/json, text/event-stream", ContentType: "application/json", Version: "2025-06-18", UpstreamID: "moved-9"}},
	} {
		got, ok := ks.openRecord(ks.hash(c.id), c.rec)
		if !ok {
			t.Errorf("the record of %s does not open", c.id)
			continue
		}
		if string(got.Body) != body || got.StoreRecord != c.rec {
			t.Errorf("the record of %s opens to body %q, stored %q", c.id, got.Body, got.StoreRecord)
		}
		if got.UpstreamID != c.want.UpstreamID || got.Accept != c.want.Accept || got.ContentType != c.want.ContentType || got.Version != c.want.Version {
			t.Errorf("the record of %s opens to %+v, want %+v", c.id, *got, c.want)
		}
		if _, ok := ks.openRecord(ks.hash(c.id+"x"), c.rec); ok {
			t.Errorf("the record of %s opens for another session", c.id)
		}
	}
}
