package journal

import (
	"context"
	"errors"
	"time"
)

// Event is one SSE event of a stream as the journal keeps it.
type Event struct {
	// Seq is the event's place in its stream, from 1.
	Seq uint64
	// Upstream is the upstream's own ID of the event; "" if it sent none.
	Upstream string
	// Block is the event's SSE block without its id fields, ending with
	// the blank line that ends the block.
	Block []byte
}

// ID returns the event's ID in stream.
func (ev Event) ID(stream string) ID { return ID{Stream: stream, Seq: ev.Seq, Upstream: ev.Upstream} }

// size is what an event counts against the byte bounds: its block, its
// upstream ID and a fixed overhead for the rest.
func (ev Event) size() int64 { return int64(len(ev.Block)+len(ev.Upstream)) + eventOverhead }

// eventOverhead is the bytes an event costs besides its block and
// upstream ID, in the byte bounds.
const eventOverhead = 64

// ErrNotHeld is returned by [Journal.Follow] for a stream the journal does
// not hold, or whose events after the one asked for it no longer holds in
// full: the window passed, or a byte bound pushed them out.
var ErrNotHeld = errors.New("journal: the stream's events after this ID are not held")

// Journal keeps the recent events of each session's SSE streams. Its
// methods are safe for concurrent use. One writer appends to a stream;
// any number follow it.
type Journal interface {
	// Append records ev as the next event of stream of session (events
	// come in order of Seq). It may push out older events to keep within
	// the journal's limits. It may keep ev.Block: the caller must not
	// change its bytes afterwards.
	Append(ctx context.Context, session, stream string, ev Event) error
	// End records that stream of session has ended: a Follow of it
	// returns once it has given its last event.
	End(ctx context.Context, session, stream string) error
	// Follow calls fn with each event of stream of session after the
	// event numbered after, in order, then with each event appended
	// later, until the stream ends (nil), ctx is done (ctx's error), or
	// fn returns an error (that error). It returns [ErrNotHeld] without
	// calling fn if the journal lacks any of the events asked for.
	Follow(ctx context.Context, session, stream string, after uint64, fn func(Event) error) error
	// Drop forgets the events of session.
	Drop(ctx context.Context, session string) error
	// Stats returns what the journal holds and has done.
	Stats() Stats
}

// Limits bound a journal. A zero field takes its default.
type Limits struct {
	// Window is how long an event is kept. Default: [DefaultWindow].
	Window time.Duration
	// SessionBytes is the most bytes of events kept per session; the
	// oldest go first. Default: [DefaultSessionBytes].
	SessionBytes int64
	// TotalBytes is the most bytes of events kept in all; the oldest
	// events of the session written least recently go first. Default:
	// [DefaultTotalBytes].
	TotalBytes int64
}

// Defaults of [Limits].
const (
	DefaultWindow       = 5 * time.Minute
	DefaultSessionBytes = 4 << 20
	DefaultTotalBytes   = 128 << 20
)

// WithDefaults returns l with each zero field set to its default.
func (l Limits) WithDefaults() Limits {
	if l.Window <= 0 {
		l.Window = DefaultWindow
	}
	if l.SessionBytes <= 0 {
		l.SessionBytes = DefaultSessionBytes
	}
	if l.TotalBytes <= 0 {
		l.TotalBytes = DefaultTotalBytes
	}
	return l
}

// Reasons an event was pushed out of a journal, as in [Stats.Trimmed].
const (
	TrimWindow       = "window"
	TrimSessionBytes = "session_bytes"
	TrimTotalBytes   = "total_bytes"
)

// Stats is what a journal holds and has done since it started.
type Stats struct {
	// Bytes and Sessions are what the journal holds now (for a shared
	// journal, what this process wrote and holds in memory: 0).
	Bytes, Sessions int64
	// Appended counts events recorded.
	Appended uint64
	// Trimmed counts events pushed out, by reason (TrimWindow, ...).
	Trimmed map[string]uint64
}
