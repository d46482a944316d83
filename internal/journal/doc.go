// Package journal keeps the recent events of a session's SSE streams, so
// that a client that lost a stream can resume it with Last-Event-ID
// (MCP 2025-11-25 transports, "Resumability and Redelivery"): event IDs
// are per stream, and a GET carrying one resumes the stream it belongs to.
//
// The proxy gives every event it passes an ID of its own ([ID]), which
// names the stream, the event's place in it, and the upstream's own ID if
// the upstream sent one, so that the proxy's IDs never collide with the
// upstream's and an ID the journal no longer holds can still be sent on to
// the upstream as the ID the upstream gave.
//
// A [Journal] is bounded ([Limits]): by time, by bytes per session, and by
// bytes in all. [Memory] keeps the events in this process.
package journal
