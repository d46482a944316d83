package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap/zapcore"
)

// TestGatewayAnswer: the errors a request ends with before any response
// that the handler answers itself, with which status and code, and those
// it leaves to Caddy.
func TestGatewayAnswer(t *testing.T) {
	refused := reverseproxy.NewDialError(errors.New("dial tcp 127.0.0.1:9: connect: connection refused"))
	for _, tc := range []struct {
		name       string
		err        error
		clientGone bool
		status     int // 0: left to Caddy
		code       int
	}{
		{name: "every dial refused", err: caddyhttp.Error(http.StatusBadGateway, refused), status: 502, code: CodeUpstreamUnavailable},
		{name: "no upstreams available", err: caddyhttp.Error(http.StatusServiceUnavailable, errors.New("no upstreams available")), status: 503, code: CodeUpstreamUnavailable},
		{name: "timeout", err: caddyhttp.Error(http.StatusGatewayTimeout, errors.New("i/o timeout")), status: 504, code: CodeUpstreamTimeout},
		{name: "client went away, 499", err: caddyhttp.Error(499, context.Canceled)},
		{name: "client went away, 502", err: caddyhttp.Error(http.StatusBadGateway, refused), clientGone: true},
		{name: "no status: 500", err: errors.New("making dial info: bad address")},
		{name: "a later handler's 500", err: caddyhttp.Error(http.StatusInternalServerError, errors.New("template failed"))},
		{name: "a later handler's 401", err: caddyhttp.Error(http.StatusUnauthorized, errors.New("no credentials"))},
		{name: "a fault", err: caddyhttp.Error(http.StatusBadRequest, mismatch("Mcp-Method was sent 2 times"))},
		{name: "a fault carrying 503", err: refuseBodyMemory(newRequest(http.MethodPost))},
		{name: "no error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := gatewayAnswer(tc.err, tc.clientGone)
			switch {
			case tc.status == 0 && f != nil:
				t.Errorf("answered %d %q, want the error left to Caddy", f.status, f.message)
			case tc.status == 0:
			case f == nil:
				t.Errorf("left to Caddy, want %d with code %d", tc.status, tc.code)
			case f.status != tc.status || f.code != tc.code:
				t.Errorf("answered %d with code %d, want %d with code %d", f.status, f.code, tc.status, tc.code)
			case strings.Contains(f.message, "127.0.0.1") || !strings.Contains(f.message, "the proxy's log has the cause"):
				t.Errorf("message %q: want no address, and where the cause is", f.message)
			}
		})
	}
}

// TestGatewayAnswerServed: a request that reverse_proxy ends with a 502
// before any response gets the proxy's JSON-RPC 502 carrying the
// request's id, and the cause is logged once at ERROR; a request whose
// response began, or whose client went away, gets the error returned as
// before (the negative controls).
func TestGatewayAnswerServed(t *testing.T) {
	refused := caddyhttp.Error(http.StatusBadGateway,
		reverseproxy.NewDialError(errors.New("dial tcp 127.0.0.1:9: connect: connection refused")))
	initialize := `{"jsonrpc":"2.0","id":"open-7","method":"initialize","params":{}}`
	for _, tc := range []struct {
		name     string
		body     string
		next     func(w http.ResponseWriter) error
		cancel   bool
		answered bool
		id       string
	}{
		{name: "initialize, every upstream refused", body: initialize, next: func(http.ResponseWriter) error { return refused }, answered: true, id: `"open-7"`},
		{name: "sessionless call, every upstream refused", body: `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`,
			next: func(http.ResponseWriter) error { return refused }, answered: true, id: `3`},
		{name: "a notification", body: `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
			next: func(http.ResponseWriter) error { return refused }, answered: true, id: `null`},
		{name: "the response began", body: initialize, next: func(w http.ResponseWriter) error {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			return refused
		}},
		{name: "the client went away", body: initialize, cancel: true, next: func(http.ResponseWriter) error { return refused }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, logs := provisionHandler(t, &Handler{})
			r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(tc.body))
			r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
			if tc.cancel {
				ctx, cancel := context.WithCancel(r.Context())
				cancel()
				r = r.WithContext(ctx)
			}
			rec := httptest.NewRecorder()
			err := h.ServeHTTP(rec, r, caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error { return tc.next(w) }))
			logged := logs.FilterMessageSnippet("no upstream answered").FilterLevelExact(zapcore.ErrorLevel)
			if !tc.answered {
				if !errors.Is(err, refused.Err) {
					t.Errorf("ServeHTTP = %v, want reverse_proxy's error returned", err)
				}
				if logged.Len() != 0 {
					t.Errorf("logged %v, want nothing: Caddy logs the error it gets", logged.All())
				}
				return
			}
			if err != nil {
				t.Fatalf("ServeHTTP = %v, want nil: the handler answers", err)
			}
			checkGatewayBody(t, rec, http.StatusBadGateway, CodeUpstreamUnavailable, tc.id)
			if logged.Len() != 1 || !strings.Contains(fmt.Sprint(logged.All()[0].ContextMap()["error"]), "connection refused") {
				t.Errorf("logs %v, want one ERROR line with the dial error", logs.All())
			}
		})
	}
}

// TestStartFailureAnswered: a request reaching a handler whose
// mcp_sessions app failed to start gets a JSON-RPC 503, and the cause is
// logged.
func TestStartFailureAnswered(t *testing.T) {
	h, logs := provisionHandler(t, &Handler{})
	h.app = &App{start: new(sync.Once)}
	h.app.start.Do(func() {
		h.app.startErr = errors.New(`session table "default": connecting its store: dial tcp 127.0.0.1:6390: connection refused`)
	})
	next := &countingNext{}
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, newRequest(http.MethodPost), next); err != nil {
		t.Fatalf("ServeHTTP = %v, want nil: the handler answers", err)
	}
	checkGatewayBody(t, rec, http.StatusServiceUnavailable, CodeInternalError, `null`)
	if next.calls != 0 {
		t.Errorf("the next handler ran %d times, want 0", next.calls)
	}
	if n := logs.FilterMessageSnippet("mcp_sessions app did not start").FilterLevelExact(zapcore.ErrorLevel).Len(); n != 1 {
		t.Errorf("%d ERROR lines for the start failure, want 1; logs: %v", n, logs.All())
	}
}

// checkGatewayBody checks that rec is the proxy's JSON-RPC error answer
// of status and code to the request of JSON-RPC id id, naming no address.
func checkGatewayBody(t *testing.T, rec *httptest.ResponseRecorder, status, code int, id string) {
	t.Helper()
	var body rpcBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q is not JSON: %v", rec.Body, err)
	}
	if rec.Code != status || rec.Header().Get("Content-Type") != "application/json" || body.JSONRPC != "2.0" ||
		body.Error.Code != code || string(body.ID) != id {
		t.Errorf("answer %d %v %s; want %d application/json with JSON-RPC code %d, id %s", rec.Code, rec.Header(), rec.Body, status, code, id)
	}
	if strings.Contains(body.Error.Message, "127.0.0.1") || !strings.Contains(body.Error.Message, "the proxy's log has the cause") {
		t.Errorf("message %q: want no address, and where the cause is", body.Error.Message)
	}
}
