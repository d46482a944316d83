package mcpwire

import (
	"bytes"
	"testing"
)

func TestSSEBlocks(t *testing.T) {
	for _, tc := range []struct {
		name, in  string
		end       int // BlockEnd
		typ, data string
		lines     int
	}{
		{name: "LF", in: "event: endpoint\ndata: /m?sessionid=A\n\nevent: message\n", end: 38, typ: "endpoint", data: "/m?sessionid=A", lines: 1},
		{name: "CRLF", in: "event: endpoint\r\ndata: /m?x=1\r\n\r\n", end: 33, typ: "endpoint", data: "/m?x=1", lines: 1},
		{name: "CR", in: "event:endpoint\rdata:/m\r\r", end: 24, typ: "endpoint", data: "/m", lines: 1},
		{name: "comment only", in: ": ping\n\n", end: 8, lines: 0},
		{name: "no data", in: "event: endpoint\n\n", end: 17, typ: "endpoint", lines: 0},
		{name: "incomplete", in: "event: endpoint\ndata: /m?sessionId=A\n", end: -1},
		{name: "split CRLF", in: "event: endpoint\r\ndata: /m\r\n\r", end: 28, typ: "endpoint", data: "/m", lines: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			end := BlockEnd([]byte(tc.in))
			if end != tc.end {
				t.Fatalf("BlockEnd(%q) = %d, want %d", tc.in, end, tc.end)
			}
			if end < 0 {
				return
			}
			block := []byte(tc.in[:end])
			ev := ParseEvent(block)
			if ev.Type != tc.typ || string(ev.Data) != tc.data || ev.DataLines != tc.lines {
				t.Errorf("ParseEvent(%q) = type %q data %q (%d lines), want %q %q (%d)", block, ev.Type, ev.Data, ev.DataLines, tc.typ, tc.data, tc.lines)
			}
			if tc.lines == 1 && string(block[ev.DataStart:ev.DataEnd]) != tc.data {
				t.Errorf("data span %q, want %q", block[ev.DataStart:ev.DataEnd], tc.data)
			}
		})
	}
}

// FuzzSSEEvent: for any bytes an upstream's GET stream starts with, finding
// the first block and reading its event never panics, the block ends at a
// blank line within the input, and the data span is the event's data.
func FuzzSSEEvent(f *testing.F) {
	for _, s := range []string{
		"event: endpoint\ndata: /m?sessionid=A\n\nevent: message\n", "event: endpoint\r\ndata: /m?x=1\r\n\r\n",
		"event:endpoint\rdata:/m\r\r", ": ping\n\n", "event: endpoint\n\n", "data: a\ndata: b\n\n", "\n", "\r\n\r\n",
		"event: endpoint\ndata: /m?sessionId=A\n", "data:\x00\xff\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		end := BlockEnd(in)
		if end < 0 {
			return
		}
		if end == 0 || end > len(in) || (in[end-1] != '\n' && in[end-1] != '\r') {
			t.Fatalf("BlockEnd(%q) = %d: not the end of a line within the input", in, end)
		}
		block := in[:end]
		ev := ParseEvent(block)
		if ev.DataLines < 0 || ev.DataStart < 0 || ev.DataStart > ev.DataEnd || ev.DataEnd > len(block) {
			t.Fatalf("ParseEvent(%q): data span %d..%d, %d data lines", block, ev.DataStart, ev.DataEnd, ev.DataLines)
		}
		if ev.DataLines == 1 && !bytes.Equal(block[ev.DataStart:ev.DataEnd], ev.Data) {
			t.Fatalf("ParseEvent(%q): data %q, span %q", block, ev.Data, block[ev.DataStart:ev.DataEnd])
		}
		if bytes.ContainsAny(ev.Data, "\r\n") {
			t.Fatalf("ParseEvent(%q): data %q spans lines", block, ev.Data)
		}
	})
}

// TestFirstData: the data of the first dispatched event, whatever the line
// endings (CRLF, LF, CR: §9.2.6), its data lines joined by LF; comments
// and events without data are skipped, and an event the stream cuts short
// is not dispatched. The CR-only stream is one that the bufio.Scanner
// reader failover used before read as one line, finding no data.
func TestFirstData(t *testing.T) {
	const result = `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25"}}`
	for _, tc := range []struct {
		name, stream string
		want         string
		none         bool
	}{
		{name: "LF", stream: "event: message\ndata: " + result + "\n\n", want: result},
		{name: "CRLF", stream: "event: message\r\ndata: " + result + "\r\n\r\n", want: result},
		{name: "CR", stream: "event: message\rdata: " + result + "\r\r", want: result},
		{name: "no space", stream: "data:" + result + "\n\n", want: result},
		{name: "after a keep-alive and an id-only block", stream: ": ping\n\nid: 1\n\ndata: " + result + "\n\n", want: result},
		{name: "two data lines", stream: "data: {\"a\":\ndata: 1}\n\n", want: "{\"a\":\n1}"},
		{name: "second event not read", stream: "data: first\n\ndata: second\n\n", want: "first"},
		{name: "cut short", stream: "event: message\ndata: " + result, none: true},
		{name: "empty", stream: "", none: true},
	} {
		got := FirstData([]byte(tc.stream))
		if tc.none != (got == nil) || string(got) != tc.want {
			t.Errorf("%s: FirstData(%q) = %q, want %q (none %v)", tc.name, tc.stream, got, tc.want, tc.none)
		}
	}
}
