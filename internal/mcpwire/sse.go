package mcpwire

import "bytes"

// Event is what the proxy reads of one block of an SSE stream: the lines
// up to a blank line (HTML Living Standard, §9.2.6 "Interpreting an event
// stream"). Lines end at CRLF, LF or CR.
type Event struct {
	Type string // the event field; "" if none
	// Data is the value of the last data field. A block with one data
	// field (DataLines 1) has the event's data; [FirstData] joins several.
	Data []byte
	// DataLines counts data fields; the block dispatches an event only
	// with one or more.
	DataLines int
	// DataStart and DataEnd delimit the last data field's value in the block.
	DataStart, DataEnd int
}

// Dispatched reports whether the block is an event a client sees: one
// with at least one data field. Blocks of comments (keep-alives) are not.
func (e Event) Dispatched() bool { return e.DataLines > 0 }

// EventType returns the event's type: its event field, or "message".
func (e Event) EventType() string {
	if e.Type == "" {
		return "message"
	}
	return e.Type
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

// BlockEnd returns the index just after the blank line that ends the
// first block of b, or -1 if b holds no complete block yet.
func BlockEnd(b []byte) int {
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

// ParseEvent reads the event and data fields of a complete block. It does
// not allocate but for the event type.
func ParseEvent(block []byte) Event {
	var ev Event
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

// cutLine splits the line block[from:end] into its field name and value,
// and returns where the value starts in block: after the first colon and
// one space following it; a line without a colon is a name with an empty
// value (§9.2.6).
func cutLine(block []byte, from, end int) (name, value []byte, start int) {
	line := block[from:end]
	name, value, found := bytes.Cut(line, []byte(":"))
	start = from + len(name)
	if found {
		start++
		if bytes.HasPrefix(value, []byte(" ")) {
			value, start = value[1:], start+1
		}
	}
	return name, value, start
}

// field reads the field on the line block[from:end].
func (ev *Event) field(block []byte, from, end int) {
	name, value, start := cutLine(block, from, end)
	switch string(name) {
	case "event":
		ev.Type = string(value)
	case "data":
		ev.DataLines++
		ev.Data, ev.DataStart, ev.DataEnd = value, start, end
	}
}

// FirstData returns the data of the first event of stream that is
// dispatched, a complete block with a data field: its data fields' values
// joined by LF (§9.2.6); nil if stream holds none. An event cut short by
// the end of stream is not dispatched, as the standard says.
func FirstData(stream []byte) []byte {
	for {
		end := BlockEnd(stream)
		if end < 0 {
			return nil
		}
		if data, ok := blockData(stream[:end]); ok {
			return data
		}
		stream = stream[end:]
	}
}

// blockData returns the data of a complete block, and whether it has any
// data field.
func blockData(block []byte) (data []byte, ok bool) {
	for from := 0; from < len(block); {
		end, next, _ := lineEnd(block, from)
		if name, value, _ := cutLine(block, from, end); string(name) == "data" {
			if ok {
				data = append(data, '\n')
			}
			data, ok = append(data, value...), true
		}
		from = next
	}
	return data, ok
}
