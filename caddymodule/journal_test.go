package caddymodule

import (
	"context"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/journal"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestJournalOptions(t *testing.T) {
	h := new(Handler)
	in := "mcp_session {\n journal on\n journal_window 30s\n journal_session_bytes 1MiB\n journal_total_bytes 64MiB\n}"
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in)); err != nil {
		t.Fatal(err)
	}
	if h.Journal != JournalOn || time.Duration(h.JournalWindow) != 30*time.Second || h.JournalSessionBytes != 1<<20 || h.JournalTotalBytes != 64<<20 {
		t.Errorf("parsed %q %s %d %d", h.Journal, time.Duration(h.JournalWindow), h.JournalSessionBytes, h.JournalTotalBytes)
	}
	for in, want := range map[string]string{
		"journal maybe":               "must be 'on' or 'off'",
		"journal_window -1s":          "not a positive duration",
		"journal_session_bytes lots":  "not a positive size",
		"journal_total_bytes 0":       "not a positive size",
		"journal on\n journal off":    "duplicate option",
		"journal_window 1m\n journal": "wrong argument count",
	} {
		err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser("mcp_session {\n " + in + "\n}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want an error containing %q", in, err, want)
		}
	}
}

// TestJournalWriterRewritesIDs: events get the proxy's IDs, carrying the
// upstream's; comments pass; blocks split across writes are whole.
func TestJournalWriterRewritesIDs(t *testing.T) {
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "text/event-stream")
	j := journal.NewMemory(journal.Limits{})
	jw := &journalWriter{ResponseWriter: rec, j: j, session: "s"}
	jw.WriteHeader(200)
	for _, w := range []string{": keep-alive\n\n", "id: up-1\nevent: message\ndata: {\"a\"", ":1}\n\n", "data: two\r\n\r\n", "retry: 10\n\n"} {
		_, _ = jw.Write([]byte(w))
	}
	jw.finish()
	s := jw.stream
	want := ": keep-alive\n\n" +
		"id: j1." + s + ".1.up-1\nevent: message\ndata: {\"a\":1}\n\n" +
		"id: j1." + s + ".2\ndata: two\r\n\r\n" +
		"retry: 10\n\n"
	if got := rec.Body.String(); got != want {
		t.Errorf("client got\n%q\nwant\n%q", got, want)
	}
	var seqs []uint64
	err := j.Follow(context.Background(), "s", s, 1, func(ev journal.Event) error { seqs = append(seqs, ev.Seq); return nil })
	if err != nil || len(seqs) != 1 || seqs[0] != 2 {
		t.Errorf("Follow after 1: %v %v; want [2] and the end", seqs, err)
	}
}

// TestJournalWriterPassesOthers: a JSON answer and a compressed stream are
// not recorded.
func TestJournalWriterPassesOthers(t *testing.T) {
	for _, hdr := range []map[string]string{
		{"Content-Type": "application/json"},
		{"Content-Type": "text/event-stream", "Content-Encoding": "gzip"},
	} {
		rec := httptest.NewRecorder()
		for k, v := range hdr {
			rec.Header().Set(k, v)
		}
		jw := &journalWriter{ResponseWriter: rec, j: journal.NewMemory(journal.Limits{}), session: "s"}
		_, _ = jw.Write([]byte("id: 1\ndata: x\n\n"))
		jw.finish()
		if rec.Body.String() != "id: 1\ndata: x\n\n" || jw.stream != "" {
			t.Errorf("%v: client got %q, stream %q; want it unchanged and unrecorded", hdr, rec.Body.String(), jw.stream)
		}
	}
}

// BenchmarkJournalWriter: what the journal adds to one SSE event on its
// way to the client (an event of go-sdk's size, in one write, flushed),
// against the writer alone; the proxy's whole cost of a call is about
// 370 µs of CPU (docs/performance.md).
func BenchmarkJournalWriter(b *testing.B) {
	ev := []byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"message\":\"step 1 of 10\",\"progress\":1,\"progressToken\":\"p1\",\"total\":10}}\n\n")
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "on"}[on], func(b *testing.B) {
			j := journal.NewMemory(journal.Limits{})
			rec := httptest.NewRecorder()
			rec.Header().Set("Content-Type", "text/event-stream")
			b.ReportAllocs()
			for i := range b.N {
				rec.Body.Reset()
				if !on {
					_, _ = rec.Write(ev)
					continue
				}
				if i%11 == 0 { // a call's stream: 10 progress events and a result
					jw := &journalWriter{ResponseWriter: rec, j: j, session: "s" + strconv.Itoa(i%64)}
					jw.WriteHeader(200)
					benchWriter = jw
				}
				_, _ = benchWriter.Write(ev)
			}
		})
	}
}

var benchWriter *journalWriter
