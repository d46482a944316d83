package journal

import "testing"

func TestIDRoundTrip(t *testing.T) {
	stream := NewStreamID()
	for _, id := range []ID{
		{Stream: stream, Seq: 1},
		{Stream: stream, Seq: 42, Upstream: "abc_123"},
		{Stream: stream, Seq: 7, Upstream: "has.dots.in.it"},
	} {
		got, ok := ParseID(id.String())
		if !ok || got != id {
			t.Errorf("ParseID(%q) = %+v, %v; want %+v", id.String(), got, ok, id)
		}
	}
}

func TestParseIDRefusesOthers(t *testing.T) {
	for _, s := range []string{
		"", "1", "j1.", "j1.0123456789abcdef", "j1.0123456789abcdef.", "j1.0123456789abcdef.0",
		"j1.0123456789ABCDEF.1", "j1.0123456789abcde.1", "j1.0123456789abcdef.+1", "j1.0123456789abcdef.x",
		"j2.0123456789abcdef.1", "_GET_stream_1", "stream-1_5",
	} {
		if id, ok := ParseID(s); ok {
			t.Errorf("ParseID(%q) = %+v; want not ok", s, id)
		}
	}
}
