package caddymodule

import "bytes"

// maxEndpointEvent is the most bytes of a GET's SSE response held back
// while the proxy waits for the end of its first event. The `endpoint`
// event of the legacy HTTP+SSE transport is a short URL; a stream whose
// first event is longer passes on unread and teaches no session.
const maxEndpointEvent = 16 << 10

// sseEvent is what the proxy reads of one block of an SSE stream: the lines
// up to a blank line (WHATWG HTML, §9.2.6 "Interpreting an event stream").
type sseEvent struct {
	typ  string // the event field; "" if none
	data []byte // the value of the data line
	// dataLines counts data fields; the block dispatches an event only with one or more.
	dataLines int
	// dataStart and dataEnd delimit the data line's value in the block.
	dataStart, dataEnd int
}

// dispatched reports whether the block is an event a client sees: one
// with at least one data field. Blocks of comments (keep-alives) are not.
func (e sseEvent) dispatched() bool { return e.dataLines > 0 }

// eventType returns the event's type: its event field, or "message".
func (e sseEvent) eventType() string {
	if e.typ == "" {
		return "message"
	}
	return e.typ
}

// lineEnd finds the line that starts at from in b: it returns the index of
// its terminator (CRLF, LF or CR) and the index after it, or ok false when
// b holds no terminator yet. A CR at the end of b ends its line; an LF that
// follows it in a later write is read as a blank line, which is harmless
// before the first event and never parsed after it.
func lineEnd(b []byte, from int) (end, next int, ok bool) {
	i := bytes.IndexAny(b[from:], "\r\n")
	if i < 0 {
		return 0, 0, false
	}
	end = from + i
	if b[end] == '\r' && end+1 < len(b) && b[end+1] == '\n' {
		return end, end + 2, true
	}
	return end, end + 1, true
}

// blockEnd returns the index just after the blank line that ends the
// first block of b, or -1 if b holds no complete block yet.
func blockEnd(b []byte) int {
	for from := 0; ; {
		end, next, ok := lineEnd(b, from)
		if !ok {
			return -1
		}
		if end == from {
			return next
		}
		from = next
	}
}

// parseEvent reads the event and data fields of a complete block.
func parseEvent(block []byte) sseEvent {
	var ev sseEvent
	for from := 0; from < len(block); {
		end, next, ok := lineEnd(block, from)
		if !ok {
			end, next = len(block), len(block)
		}
		ev.field(block, from, end)
		from = next
	}
	return ev
}

// field reads the field on the line block[from:end].
func (ev *sseEvent) field(block []byte, from, end int) {
	line := block[from:end]
	name, value, found := bytes.Cut(line, []byte(":"))
	start := from + len(name)
	if found {
		start++
		if bytes.HasPrefix(value, []byte(" ")) {
			value, start = value[1:], start+1
		}
	}
	switch string(name) {
	case "event":
		ev.typ = string(value)
	case "data":
		ev.dataLines++
		ev.data, ev.dataStart, ev.dataEnd = value, start, end
	}
}
