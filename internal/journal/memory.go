package journal

import (
	"container/list"
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Memory is a [Journal] in this process's memory.
type Memory struct {
	mu       sync.Mutex
	limits   Limits
	sessions map[string]*memSession
	byWrite  list.List // of *memSession, the least recently written first
	total    int64
	now      func() time.Time

	appended                           atomic.Uint64
	trimWindow, trimSession, trimTotal atomic.Uint64
}

// memSession is one session's streams.
type memSession struct {
	key     string
	streams map[string]*memStream
	order   []*memStream // by first event, the oldest first
	bytes   int64
	elem    *list.Element
}

// memStream is one stream's events, the oldest first.
type memStream struct {
	id     string
	events []memEvent
	lost   uint64 // the highest Seq pushed out; 0 if none
	ended  bool
	wake   chan struct{} // closed and replaced at every Append and End
}

type memEvent struct {
	Event
	at time.Time
}

// NewMemory returns an empty journal bounded by l (zero fields take their
// defaults).
func NewMemory(l Limits) *Memory {
	return &Memory{limits: l.WithDefaults(), sessions: map[string]*memSession{}, now: time.Now}
}

// SetLimits changes the journal's bounds; they apply from the next Append.
func (m *Memory) SetLimits(l Limits) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.limits = l.WithDefaults()
}

// Limits returns the journal's bounds.
func (m *Memory) Limits() Limits {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.limits
}

// Append records ev; it never fails.
func (m *Memory) Append(_ context.Context, session, stream string, ev Event) error {
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.session(session)
	st := s.stream(stream)
	if len(st.events) == 0 && st.lost < ev.Seq-1 {
		st.lost = ev.Seq - 1 // events before it were pushed out with an earlier session record
	}
	st.events = append(st.events, memEvent{Event: ev, at: now})
	n := ev.size()
	s.bytes += n
	m.total += n
	m.byWrite.MoveToBack(s.elem)
	m.appended.Add(1)
	st.notify()
	m.trim(s, now)
	return nil
}

// End records the end of stream; it never fails.
func (m *Memory) End(_ context.Context, session, stream string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.sessions[session]; s != nil {
		if st := s.streams[stream]; st != nil {
			st.ended = true
			st.notify()
		}
	}
	return nil
}

// Drop forgets session; it never fails.
func (m *Memory) Drop(_ context.Context, session string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.sessions[session]; s != nil {
		m.remove(s)
	}
	return nil
}

// Follow gives the events after after, then those appended later.
func (m *Memory) Follow(ctx context.Context, session, stream string, after uint64, fn func(Event) error) error {
	for first := true; ; first = false {
		batch, ended, wake, err := m.since(session, stream, after)
		if err != nil {
			if !first {
				return ErrNotHeld // pushed out while the client was reading: it cannot have them all
			}
			return err
		}
		for _, ev := range batch {
			if err := fn(ev); err != nil {
				return err
			}
			after = ev.Seq
		}
		if len(batch) > 0 {
			continue
		}
		if ended {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// since returns the events of stream after after, whether the stream has
// ended, and a channel closed at its next change.
func (m *Memory) since(session, stream string, after uint64) ([]Event, bool, <-chan struct{}, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sessions[session]
	if s == nil || s.streams[stream] == nil {
		return nil, false, nil, ErrNotHeld
	}
	st := s.streams[stream]
	if after < st.lost {
		return nil, false, nil, ErrNotHeld
	}
	var batch []Event
	for _, e := range st.events {
		if e.Seq > after {
			batch = append(batch, e.Event)
		}
	}
	return batch, st.ended, st.wake, nil
}

// Stats returns what the journal holds and has done.
func (m *Memory) Stats() Stats {
	m.mu.Lock()
	bytes, sessions := m.total, int64(len(m.sessions))
	m.mu.Unlock()
	return Stats{Bytes: bytes, Sessions: sessions, Appended: m.appended.Load(), Trimmed: map[string]uint64{
		TrimWindow: m.trimWindow.Load(), TrimSessionBytes: m.trimSession.Load(), TrimTotalBytes: m.trimTotal.Load(),
	}}
}

// session returns session's record, made if missing. Called with m.mu held.
func (m *Memory) session(key string) *memSession {
	s := m.sessions[key]
	if s == nil {
		s = &memSession{key: key, streams: map[string]*memStream{}}
		s.elem = m.byWrite.PushBack(s)
		m.sessions[key] = s
	}
	return s
}

// stream returns the session's stream id, made if missing.
func (s *memSession) stream(id string) *memStream {
	st := s.streams[id]
	if st == nil {
		st = &memStream{id: id, wake: make(chan struct{})}
		s.streams[id] = st
		s.order = append(s.order, st)
	}
	return st
}

// notify wakes the stream's followers.
func (st *memStream) notify() {
	close(st.wake)
	st.wake = make(chan struct{})
}

// trim pushes out what the limits no longer allow, after an Append to s.
// Called with m.mu held.
func (m *Memory) trim(s *memSession, now time.Time) {
	horizon := now.Add(-m.limits.Window)
	for s.bytes > m.limits.SessionBytes && m.dropOldest(s) {
		m.trimSession.Add(1)
	}
	// The least recently written sessions first: each Append looks at as
	// many as have aged out, so that idle sessions go without a sweep.
	for e := m.byWrite.Front(); e != nil; {
		o := e.Value.(*memSession)
		e = e.Next()
		for o.oldestBefore(horizon) && m.dropOldest(o) {
			m.trimWindow.Add(1)
		}
		if o.bytes > 0 || o == s {
			break
		}
	}
	for m.total > m.limits.TotalBytes && m.byWrite.Len() > 0 {
		o := m.byWrite.Front().Value.(*memSession)
		if !m.dropOldest(o) {
			break
		}
		m.trimTotal.Add(1)
	}
}

// oldestBefore reports whether the session's oldest event is older than t.
func (s *memSession) oldestBefore(t time.Time) bool {
	for _, st := range s.order {
		if len(st.events) > 0 {
			return st.events[0].at.Before(t)
		}
	}
	return false
}

// dropOldest pushes out the oldest event of s (of its oldest stream that
// holds any), forgets the streams left empty that have ended, and the
// session once it has no stream; it reports whether there was an event.
// Called with m.mu held.
func (m *Memory) dropOldest(s *memSession) bool {
	dropped := false
	for i := 0; i < len(s.order) && !dropped; {
		st := s.order[i]
		if len(st.events) > 0 {
			ev := st.events[0]
			st.events[0] = memEvent{}
			st.events = st.events[1:]
			st.lost = ev.Seq
			n := ev.size()
			s.bytes -= n
			m.total -= n
			dropped = true
		}
		if len(st.events) == 0 && st.ended {
			if i == 0 {
				s.order[0] = nil
				s.order = s.order[1:] // the usual case, without a copy
			} else {
				s.order = append(s.order[:i], s.order[i+1:]...)
			}
			delete(s.streams, st.id)
			continue
		}
		i++
	}
	if len(s.streams) == 0 {
		m.remove(s)
	}
	return dropped
}

// remove forgets s. Called with m.mu held.
func (m *Memory) remove(s *memSession) {
	for _, st := range s.streams {
		st.lost, st.events = ^uint64(0), nil
		st.notify()
	}
	m.total -= s.bytes
	m.byWrite.Remove(s.elem)
	delete(m.sessions, s.key)
}

// Interface guards
var _ Journal = (*Memory)(nil)
