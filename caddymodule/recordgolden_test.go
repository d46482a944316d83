package caddymodule

import (
	"bytes"
	"testing"
)

// TestGoldenFailoverRecords: failover records the redis store wrote before
// records were sealed by internal/seal (main a187596; hash_key 0x33 × 32)
// still open, to what was sealed, for their own session only.
func TestGoldenFailoverRecords(t *testing.T) {
	ks := newKeyspace("mcp", "default", bytes.Repeat([]byte{0x33}, 32))
	const body = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`
	for _, c := range []struct {
		id, rec string
		want    sessionInit
	}{
		{"ABCDEFGHIJKLMNOPQRSTUVWXYZ", "AcFgvM4Pz421OpKyqpVHUxcYzaG4pgiu_fE84Ijwq8Hf5rXw5ymGjnwDxWLYWPNsIn7101sOUlFJeV0ntJdiqHGGgDNZKuC8N9GpIDG5KPP2pk7sqjsiiOm4_Tg2hs2hKenyfRdfYHvbfTHrugGchBWfBTmktUcHbqhTJ3auPGrKV_BiQIyh55g-lWzHoA",
			sessionInit{accept: "application/json, text/event-stream", contentType: "application/json"}},
		{"sess-2", "AXBc2s-PzN5rNBqj-BzUl6VrEGYjQDe4UkUO7MTipLaJHBicugyYQEw6DyXj7PM31eRWfUovAuzHi-1E2d__RH4pSmgpbHn0m_R5eWYsMPW3GDhbhDpEnjHPq2O9_5rrh5NupMbpOspdQiZg9fEgn6zh2oz4lCKWztdNyIL055CPXtaxToS7XeqDYyIEvI0Lvo0qw2bFX8O8sHAIQR9p",
			sessionInit{accept: "application/json, text/event-stream", contentType: "application/json", version: "2025-06-18", upstreamID: "moved-9"}},
	} {
		got, ok := ks.openRecord(ks.hash(c.id), c.rec)
		if !ok {
			t.Errorf("the record of %s does not open", c.id)
			continue
		}
		if string(got.body) != body || got.stored != c.rec {
			t.Errorf("the record of %s opens to body %q, stored %q", c.id, got.body, got.stored)
		}
		if got.upstreamID != c.want.upstreamID || got.accept != c.want.accept || got.contentType != c.want.contentType || got.version != c.want.version {
			t.Errorf("the record of %s opens to %+v, want %+v", c.id, *got, c.want)
		}
		if _, ok := ks.openRecord(ks.hash(c.id+"x"), c.rec); ok {
			t.Errorf("the record of %s opens for another session", c.id)
		}
	}
}
