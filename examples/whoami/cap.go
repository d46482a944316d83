package whoami

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"strconv"
	"sync"
)

// capped wraps an MCP handler with the session limits of Options (GET
// /capz, served by NewHandler, tells its counts): with
// MaxSessions positive, an initialize past that many live sessions gets 503
// with Retry-After, as the Python MCP SDK 2.2 answers at its session cap
// (no reaper: only a DELETE frees a slot); with InitializeStatus set, every
// initialize gets that status, as a server whose dependency is down.
// Requests of sessions pass unchanged.
func capped(next http.Handler, opts Options) http.Handler {
	if opts.MaxSessions <= 0 && opts.InitializeStatus == 0 {
		return next
	}
	c := &sessionCap{next: next, max: opts.MaxSessions, status: opts.InitializeStatus, live: map[string]bool{}, deletes: map[string]int{}}
	return c
}

// sessionCap counts the sessions a handler opened and ends.
type sessionCap struct {
	next    http.Handler
	max     int
	status  int
	refused int
	mu      sync.Mutex
	live    map[string]bool
	// deletes counts the DELETEs of each session ID, known or not: a
	// test's count of what a proxy sent.
	deletes map[string]int
}

// CapStats is what GET /capz answers for a capped server.
type CapStats struct {
	// Live is the number of sessions opened and not DELETEd.
	Live int `json:"live"`
	// Max is the cap.
	Max int `json:"max"`
	// Refused counts initializes answered 503 at the cap.
	Refused int `json:"refused"`
	// Deletes counts the DELETEs of each session ID.
	Deletes map[string]int `json:"deletes"`
}

// stats answers GET /capz with the server's CapStats.
func (c *sessionCap) stats(w http.ResponseWriter, _ *http.Request) {
	c.mu.Lock()
	st := CapStats{Live: len(c.live), Max: c.max, Refused: c.refused, Deletes: maps.Clone(c.deletes)}
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(st)
}

// ServeHTTP refuses an initialize past the cap and counts the sessions
// opened and DELETEd.
func (c *sessionCap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("Mcp-Session-Id")
	switch {
	case r.Method == http.MethodPost && id == "" && isInitialize(r):
		if c.status != 0 {
			refuse(w, c.status, "the server cannot open sessions now")
			return
		}
		c.mu.Lock()
		full := len(c.live) >= c.max
		if full {
			c.refused++
		}
		c.mu.Unlock()
		if full {
			refuse(w, http.StatusServiceUnavailable, "the server holds its most sessions ("+strconv.Itoa(c.max)+"); end one with DELETE")
			return
		}
		rec := &statusRecorder{ResponseWriter: w}
		c.next.ServeHTTP(rec, r)
		if sid := w.Header().Get("Mcp-Session-Id"); sid != "" && rec.status < 300 {
			c.mu.Lock()
			c.live[sid] = true
			c.mu.Unlock()
		}
	case r.Method == http.MethodDelete && id != "":
		c.mu.Lock()
		c.deletes[id]++
		c.mu.Unlock()
		rec := &statusRecorder{ResponseWriter: w}
		c.next.ServeHTTP(rec, r)
		if rec.status < 300 || rec.status == http.StatusNotFound {
			c.mu.Lock()
			delete(c.live, id)
			c.mu.Unlock()
		}
	default:
		c.next.ServeHTTP(w, r)
	}
}

// refuse answers status with a JSON-RPC error and Retry-After: 1.
func refuse(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", "1")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": -32000, "message": msg}})
}

// isInitialize reports whether r's body is an initialize request; the body
// is put back.
func isInitialize(r *http.Request) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), r.Body))
	var msg struct {
		Method string `json:"method"`
	}
	return err == nil && json.Unmarshal(body, &msg) == nil && msg.Method == "initialize"
}

// statusRecorder records the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

// WriteHeader records status and passes it on.
func (s *statusRecorder) WriteHeader(status int) {
	if s.status == 0 {
		s.status = status
	}
	s.ResponseWriter.WriteHeader(status)
}

// Write records a 200 when no status was written.
func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Flush flushes the response, for SSE answers.
func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
