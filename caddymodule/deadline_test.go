package caddymodule

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// deadlineRecorder is a ResponseWriter that records the write deadlines
// set on it, as the connection's writer takes them.
type deadlineRecorder struct {
	*httptest.ResponseRecorder
	deadlines []time.Time
}

func (w *deadlineRecorder) SetWriteDeadline(d time.Time) error {
	w.deadlines = append(w.deadlines, d)
	return nil
}

// withServer returns r as a Caddy server with write timeout timeout
// serves it, and, if idle is set, with that write_idle writer.
func withServer(r *http.Request, timeout time.Duration, idle *caddyhttp.IdleTimeoutWriter) *http.Request {
	ctx := context.WithValue(r.Context(), caddyhttp.ServerCtxKey, &caddyhttp.Server{WriteTimeout: caddy.Duration(timeout)})
	if idle != nil {
		ctx = caddyhttp.ContextWithIdleTimeouts(ctx, nil, idle)
	}
	return r.WithContext(ctx)
}

// answerWith returns a next handler that answers with contentType and
// records the write deadlines w holds while the upstream answers.
func answerWith(contentType string, during *[]time.Time, w *deadlineRecorder) caddyhttp.HandlerFunc {
	return func(rw http.ResponseWriter, _ *http.Request) error {
		*during = append([]time.Time(nil), w.deadlines...)
		rw.Header().Set("Content-Type", contentType)
		rw.WriteHeader(http.StatusOK)
		_, err := io.WriteString(rw, "{}")
		return err
	}
}

// near reports whether d is within a second after want.
func near(d, want time.Time) bool { return !d.Before(want) && d.Sub(want) < time.Second }

// TestWriteTimeoutLifted: with a server write timeout, a GET or POST
// forwarded through the handler has no write deadline while the upstream
// answers; a JSON answer gets the timeout again from its headers, an SSE
// stream only once the handler is done. A DELETE keeps Caddy's deadline,
// and without a write timeout nothing is set.
func TestWriteTimeoutLifted(t *testing.T) {
	const timeout = 2 * time.Second
	for _, tc := range []struct {
		name, method, contentType string
		timeout                   time.Duration
		during                    int  // deadlines set before the upstream answered
		after                     int  // deadlines set in all
		lifted                    bool // the first deadline is none, the last the timeout from now
	}{
		{name: "POST answered with JSON", method: http.MethodPost, contentType: "application/json", timeout: timeout, during: 1, after: 2, lifted: true},
		{name: "POST answered with SSE", method: http.MethodPost, contentType: "text/event-stream", timeout: timeout, during: 1, after: 2, lifted: true},
		{name: "GET stream", method: http.MethodGet, contentType: "text/event-stream; charset=utf-8", timeout: timeout, during: 1, after: 2, lifted: true},
		{name: "DELETE", method: http.MethodDelete, contentType: "application/json", timeout: timeout},
		{name: "no write timeout", method: http.MethodPost, contentType: "text/event-stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := provisionHandler(t, &Handler{UnknownSession: UnknownSessionForward})
			w := &deadlineRecorder{ResponseRecorder: httptest.NewRecorder()}
			var during []time.Time
			start := time.Now()
			r := withServer(newRequest(tc.method, "s-1"), tc.timeout, nil)
			if err := h.ServeHTTP(w, r, answerWith(tc.contentType, &during, w)); err != nil {
				t.Fatal(err)
			}
			if len(during) != tc.during || len(w.deadlines) != tc.after {
				t.Fatalf("deadlines while the upstream answered %v, in all %v; want %d and %d", during, w.deadlines, tc.during, tc.after)
			}
			if tc.lifted && (!during[0].IsZero() || !near(w.deadlines[len(w.deadlines)-1], start.Add(timeout))) {
				t.Errorf("deadlines %v: want none while the upstream answered, then %v from now", w.deadlines, timeout)
			}
		})
	}
}

// TestWriteIdleCeilingLifted: with Caddy's write_idle writer, whose
// ceiling (the server's write timeout) would put the timeout back at its
// next write, the ceiling is lifted too, and the minimum rate is dropped
// for a stream and counted from the headers for a JSON answer.
func TestWriteIdleCeilingLifted(t *testing.T) {
	const timeout = 2 * time.Second
	for _, tc := range []struct {
		contentType string
		minRate     int64 // the rate after the headers
		ceiling     bool  // the ceiling after the headers is the timeout from then
	}{
		{contentType: "application/json", minRate: 1000, ceiling: true},
		{contentType: "text/event-stream", minRate: 0},
	} {
		t.Run(tc.contentType, func(t *testing.T) {
			h, _ := provisionHandler(t, &Handler{UnknownSession: UnknownSessionForward})
			rec := &deadlineRecorder{ResponseRecorder: httptest.NewRecorder()}
			start := time.Now().Add(-time.Minute) // the request came a minute ago
			idle := &caddyhttp.IdleTimeoutWriter{
				ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: rec},
				Ctrl:                  http.NewResponseController(rec),
				Deadline:              caddyhttp.IdleDeadline{Start: start, Timeout: time.Minute, MinRate: 1000, HardDeadline: start.Add(timeout)},
				Logger:                zap.NewNop(),
			}
			var ceilingDuring time.Time
			var rateAfter int64
			var ceilingAfter time.Time
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
				ceilingDuring = idle.Deadline.HardDeadline
				w.Header().Set("Content-Type", tc.contentType)
				w.WriteHeader(http.StatusOK)
				rateAfter, ceilingAfter = idle.Deadline.MinRate, idle.Deadline.HardDeadline
				_, err := io.WriteString(w, "{}")
				return err
			})
			headers := time.Now()
			if err := h.ServeHTTP(idle, withServer(newRequest(http.MethodPost, "s-1"), timeout, idle), next); err != nil {
				t.Fatal(err)
			}
			if !ceilingDuring.IsZero() {
				t.Errorf("write_idle's ceiling while the upstream answered: %v; want none", ceilingDuring)
			}
			if rateAfter != tc.minRate || tc.ceiling != near(ceilingAfter, headers.Add(timeout)) || !tc.ceiling && !ceilingAfter.IsZero() {
				t.Errorf("after the headers: min_rate %d, ceiling %v; want %d, and the timeout from the headers: %v", rateAfter, ceilingAfter, tc.minRate, tc.ceiling)
			}
			if tc.ceiling && idle.Deadline.Start.Before(headers) {
				t.Errorf("the minimum rate counts from %v, before the headers (%v)", idle.Deadline.Start, headers)
			}
		})
	}
}

// TestWriteTimeoutHiddenWarns: a writer that cannot set deadlines (one
// without Unwrap between the server and the handler) leaves the timeout
// as it is and logs a warning, once per handler, naming the setting.
func TestWriteTimeoutHiddenWarns(t *testing.T) {
	h, logs := provisionHandler(t, &Handler{UnknownSession: UnknownSessionForward})
	for range 3 {
		r := withServer(newRequest(http.MethodPost, "s-1"), 2*time.Second, nil)
		if err := h.ServeHTTP(httptest.NewRecorder(), r, &countingNext{}); err != nil {
			t.Fatal(err)
		}
	}
	warned := logs.FilterMessageSnippet("servers > timeouts > write").All()
	if len(warned) != 1 {
		t.Fatalf("%d warnings about the write timeout; want 1", len(warned))
	}
	if w := warned[0].ContextMap()["write_timeout"]; w != 2*time.Second {
		t.Errorf("the warning names write_timeout %v; want 2s", w)
	}
}

// BenchmarkLiftWriteTimeout measures what lifting and putting back the
// write timeout adds to a POST answered with JSON, against the same
// request on a server without a write timeout.
func BenchmarkLiftWriteTimeout(b *testing.B) {
	h, _ := provisionHandler(b, &Handler{UnknownSession: UnknownSessionForward})
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		return nil
	})
	for _, timeout := range []time.Duration{0, 2 * time.Second} {
		b.Run("write_"+timeout.String(), func(b *testing.B) {
			w := &deadlineRecorder{ResponseRecorder: httptest.NewRecorder()}
			eachRequest(b, func() *http.Request {
				return withServer(caddyRequest(`{}`, map[string]string{HeaderSessionID: "s-1"}), timeout, nil)
			},
				func(r *http.Request) {
					w.deadlines = w.deadlines[:0]
					if err := h.ServeHTTP(w, r, next); err != nil {
						b.Fatal(err)
					}
				})
		})
	}
}
