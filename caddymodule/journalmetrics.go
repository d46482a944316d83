package caddymodule

import (
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/journal"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/prometheus/client_golang/prometheus"
)

// The journal's metrics (journal.go), exported while a table's journal is on.
var (
	descJournalBytes = prometheus.NewDesc("caddy_mcp_journal_bytes",
		"Bytes of SSE events the table's journal holds in this process, against journal_total_bytes.", []string{"table"}, nil)
	descJournalLimit = prometheus.NewDesc("caddy_mcp_journal_limit",
		"The journal's bounds: window_seconds, session_bytes, total_bytes.", []string{"table", "bound"}, nil)
	descJournalSessions = prometheus.NewDesc("caddy_mcp_journal_sessions",
		"Sessions with events in the table's journal.", []string{"table"}, nil)
	descJournalEvents = prometheus.NewDesc("caddy_mcp_journal_events_total",
		"SSE events recorded in the table's journal.", []string{"table"}, nil)
	descJournalTrimmed = prometheus.NewDesc("caddy_mcp_journal_trimmed_total",
		"Events pushed out of the journal, by the bound that pushed them (window, session_bytes, total_bytes); a client resuming after one of them gets its stream from the upstream.", []string{"table", "reason"}, nil)
	descJournalResumes = prometheus.NewDesc("caddy_mcp_journal_resumes_total",
		"GETs carrying a Last-Event-ID the proxy issued, by who answered them: journal, or upstream when the journal no longer held the events after it.", []string{"table", "answered_by"}, nil)
)

// journalDescs are the journal's metric descriptors.
var journalDescs = []*prometheus.Desc{descJournalBytes, descJournalLimit, descJournalSessions, descJournalEvents, descJournalTrimmed, descJournalResumes}

// collectJournal sends the journal metrics of t, if its journal is on.
func collectJournal(ch chan<- prometheus.Metric, t *session.Table) {
	j, limits := t.Journal()
	if j == nil {
		return
	}
	st := j.Stats()
	name := t.Name()
	ch <- prometheus.MustNewConstMetric(descJournalBytes, prometheus.GaugeValue, float64(st.Bytes), name)
	ch <- prometheus.MustNewConstMetric(descJournalSessions, prometheus.GaugeValue, float64(st.Sessions), name)
	ch <- prometheus.MustNewConstMetric(descJournalLimit, prometheus.GaugeValue, limits.Window.Seconds(), name, "window_seconds")
	ch <- prometheus.MustNewConstMetric(descJournalLimit, prometheus.GaugeValue, float64(limits.SessionBytes), name, "session_bytes")
	ch <- prometheus.MustNewConstMetric(descJournalLimit, prometheus.GaugeValue, float64(limits.TotalBytes), name, "total_bytes")
	ch <- prometheus.MustNewConstMetric(descJournalEvents, prometheus.CounterValue, float64(st.Appended), name)
	for _, reason := range []string{journal.TrimWindow, journal.TrimSessionBytes, journal.TrimTotalBytes} {
		ch <- prometheus.MustNewConstMetric(descJournalTrimmed, prometheus.CounterValue, float64(st.Trimmed[reason]), name, reason)
	}
	fromJournal, toUpstream := resumeCountsOf(t)
	ch <- prometheus.MustNewConstMetric(descJournalResumes, prometheus.CounterValue, float64(fromJournal), name, "journal")
	ch <- prometheus.MustNewConstMetric(descJournalResumes, prometheus.CounterValue, float64(toUpstream), name, "upstream")
}
