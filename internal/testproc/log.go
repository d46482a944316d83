package testproc

import (
	"bytes"
	"io"
	"strings"
	"sync"
)

// Log is a child process's captured output. The child writes it while the
// parent reads it, so every method takes its lock.
type Log struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	sink io.Writer // a copy of the output, e.g. a log file; may be nil
}

// Write appends b, and copies it to the sink. The sink's error is returned.
func (l *Log) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(b)
	if l.sink != nil {
		return l.sink.Write(b)
	}
	return len(b), nil
}

// String returns all output so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Tail returns the last n bytes of output, for error messages.
func (l *Log) Tail(n int) string {
	s := l.String()
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Count returns how many times s occurs in the output so far.
func (l *Log) Count(s string) int { return strings.Count(l.String(), s) }
