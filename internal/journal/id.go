package journal

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
)

// idPrefix starts every event ID the proxy issues; it carries the format's
// version.
const idPrefix = "j1."

// streamIDLen is the length of a stream ID: 8 random bytes in hex, so that
// streams of replicas sharing a journal do not collide.
const streamIDLen = 16

// ID is an event ID the proxy issues: the stream, the event's sequence
// number in it (from 1), and the upstream's own ID of the event ("" if it
// sent none). Its text form is `j1.<stream>.<seq>[.<upstream ID>]`.
type ID struct {
	Stream   string
	Seq      uint64
	Upstream string
}

// NewStreamID returns a new random stream ID (16 hex digits).
func NewStreamID() string {
	var b [streamIDLen / 2]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24)
	return hex.EncodeToString(b[:])
}

// String returns the ID's text form, as it goes in an SSE `id` field.
func (id ID) String() string {
	s := idPrefix + id.Stream + "." + strconv.FormatUint(id.Seq, 10)
	if id.Upstream != "" {
		s += "." + id.Upstream
	}
	return s
}

// ParseID reads an ID the proxy issued from s, a Last-Event-ID value; ok
// is false for any other value (an upstream's own ID, say).
func ParseID(s string) (id ID, ok bool) {
	rest, found := strings.CutPrefix(s, idPrefix)
	if !found || len(rest) < streamIDLen+2 || rest[streamIDLen] != '.' {
		return ID{}, false
	}
	id.Stream, rest = rest[:streamIDLen], rest[streamIDLen+1:]
	if !isHex(id.Stream) {
		return ID{}, false
	}
	seq, upstream, _ := strings.Cut(rest, ".")
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil || n == 0 || seq[0] == '+' {
		return ID{}, false
	}
	id.Seq, id.Upstream = n, upstream
	return id, true
}

// isHex reports whether s is lowercase hex digits only.
func isHex(s string) bool {
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
