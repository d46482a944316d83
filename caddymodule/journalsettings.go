package caddymodule

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/journal"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"
)

// Values of [Handler.Journal].
const (
	JournalOn  = "on"
	JournalOff = "off"
)

// journalOption returns the parser of the journal setting name.
func (s *TableSettings) journalOption(d *caddyfile.Dispenser, name string) func(string) error {
	switch name {
	case "journal":
		return func(v string) error {
			if v != JournalOn && v != JournalOff {
				return d.Errf("journal: '%s' must be '%s' or '%s'", v, JournalOn, JournalOff)
			}
			s.Journal = v
			return nil
		}
	case "journal_window":
		return func(v string) error {
			dur, err := caddy.ParseDuration(v)
			if err != nil || dur <= 0 {
				return d.Errf("journal_window: '%s' is not a positive duration such as 30s or 5m", v)
			}
			s.JournalWindow = caddy.Duration(dur)
			return nil
		}
	case "journal_session_bytes":
		return func(v string) error { return parseSize(d, name, v, &s.JournalSessionBytes) }
	}
	return func(v string) error { return parseSize(d, name, v, &s.JournalTotalBytes) }
}

// validateJournal checks the journal settings of s.
func (s TableSettings) validateJournal() error {
	switch {
	case s.Journal != "" && s.Journal != JournalOn && s.Journal != JournalOff:
		return fmt.Errorf("journal must be %q or %q, got %q", JournalOn, JournalOff, s.Journal)
	case s.JournalWindow < 0 || s.JournalSessionBytes < 0 || s.JournalTotalBytes < 0:
		return fmt.Errorf("journal_window, journal_session_bytes and journal_total_bytes must be positive, got %s, %d, %d",
			time.Duration(s.JournalWindow), s.JournalSessionBytes, s.JournalTotalBytes)
	}
	l := journal.Limits{SessionBytes: int64(s.JournalSessionBytes), TotalBytes: int64(s.JournalTotalBytes)}.WithDefaults()
	if l.SessionBytes > l.TotalBytes {
		return fmt.Errorf("journal_session_bytes %d is above journal_total_bytes %d: no session can keep more than the total; "+
			"lower journal_session_bytes or raise journal_total_bytes", l.SessionBytes, l.TotalBytes)
	}
	return nil
}

// configureJournal applies the journal settings of cfg to t, once its
// store is set: while the setting is on, a journal in Redis with the
// redis store, shared by the replicas, else in this process's memory;
// either is kept across reloads.
func configureJournal(t *session.Table, cfg TableConfig) {
	if cfg.Journal != JournalOn {
		t.SetJournal(nil, journal.Limits{})
		return
	}
	limits := journal.Limits{
		Window: time.Duration(cfg.JournalWindow), SessionBytes: int64(cfg.JournalSessionBytes), TotalBytes: int64(cfg.JournalTotalBytes),
	}.WithDefaults()
	if shared, ok := t.Store().(interface {
		Journal(journal.Limits) journal.Journal
	}); ok {
		t.SetJournal(shared.Journal(limits), limits)
		return
	}
	j, _ := t.Journal()
	m, _ := j.(*journal.Memory)
	if m == nil {
		m = journal.NewMemory(limits)
	}
	m.SetLimits(limits)
	t.SetJournal(m, limits)
}

// parseSize parses v, a positive size such as 4MiB or 1048576, into dst.
func parseSize(d *caddyfile.Dispenser, name, v string, dst *int) error {
	n, err := humanize.ParseBytes(v)
	if err != nil || n == 0 || n > math.MaxInt32*1024 {
		return d.Errf("%s: '%s' is not a positive size such as 4MiB or 1048576", name, v)
	}
	*dst = int(n)
	return nil
}

// resumeCounts counts a table's GETs with a Last-Event-ID the proxy
// issued, by who answered them.
type resumeCounts struct{ journal, upstream atomic.Uint64 }

// resumes holds the resumeCounts of each table (*session.Table).
var resumes sync.Map

// countResume counts a resuming GET of t, answered from the journal or not.
func countResume(t *session.Table, fromJournal bool) {
	v, _ := resumes.LoadOrStore(t, new(resumeCounts))
	c := v.(*resumeCounts)
	if fromJournal {
		c.journal.Add(1)
	} else {
		c.upstream.Add(1)
	}
}

// resumeCountsOf returns t's resuming GETs answered from the journal and
// sent to the upstream.
func resumeCountsOf(t *session.Table) (fromJournal, toUpstream uint64) {
	if v, ok := resumes.Load(t); ok {
		c := v.(*resumeCounts)
		return c.journal.Load(), c.upstream.Load()
	}
	return 0, 0
}
