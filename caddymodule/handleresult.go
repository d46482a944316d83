package caddymodule

import (
	"io"
	"mime"
	"net/http"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// handleWriter reads the result of a tools/call of a minting tool as it
// passes to the client, and learns the handle it holds before the client
// can read it: so that the client's next call, carrying the handle, finds
// it in the table. A JSON response is held until it is complete (up to
// maxHandleResult); an SSE response passes event by event, each complete
// event held only until it is read, until the call's response event. Once
// the response is read, or the result is too large, or the status is not
// 2xx, bytes pass unread.
type handleWriter struct {
	caddyhttp.ResponseWriterWrapper
	h    *Handler
	r    *http.Request
	rule *HandleRule

	mode    int    // handleWatch* below
	held    []byte // bytes not yet written: the JSON body, or an SSE event not yet complete
	wrote   bool   // WriteHeader was called with a final status
	flushed bool   // a flush was asked for while the body was held
}

// Modes of a handleWriter.
const (
	handleWatchNone = iota // pass bytes unread
	handleWatchJSON        // hold the whole body, then read it
	handleWatchSSE         // read event by event until the response
)

func newHandleWriter(w http.ResponseWriter, h *Handler, r *http.Request, rule *HandleRule) *handleWriter {
	return &handleWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, h: h, r: r, rule: rule}
}

// WriteHeader picks what to read by the final status and Content-Type.
func (hw *handleWriter) WriteHeader(status int) {
	if !hw.wrote && status >= 200 {
		hw.wrote = true
		if status < 300 {
			ct, _, _ := mime.ParseMediaType(hw.Header().Get("Content-Type"))
			switch ct {
			case "application/json":
				hw.mode = handleWatchJSON
			case "text/event-stream":
				hw.mode = handleWatchSSE
			}
		}
	}
	hw.ResponseWriter.WriteHeader(status)
}

// Write holds or reads b as the mode says, then writes what may pass.
func (hw *handleWriter) Write(b []byte) (int, error) {
	if !hw.wrote {
		hw.WriteHeader(http.StatusOK)
	}
	switch hw.mode {
	case handleWatchJSON:
		hw.held = append(hw.held, b...)
		if len(hw.held) > maxHandleResult {
			hw.giveUp()
			return len(b), hw.release()
		}
		return len(b), nil
	case handleWatchSSE:
		hw.held = append(hw.held, b...)
		return len(b), hw.readEvents()
	}
	return hw.ResponseWriter.Write(b)
}

// readEvents reads the complete events held, learning from the call's
// response, and writes them; an incomplete event stays held.
func (hw *handleWriter) readEvents() error {
	for hw.mode == handleWatchSSE {
		end := mcpwire.BlockEnd(hw.held)
		if end < 0 {
			if len(hw.held) > maxHandleResult {
				hw.giveUp()
			}
			break
		}
		if data := mcpwire.FirstData(hw.held[:end]); data != nil {
			if handle, response := mcpwire.ResultHandle(data, hw.rule.From); response {
				hw.mode = handleWatchNone
				hw.learn(handle)
			}
		}
		if _, err := hw.ResponseWriter.Write(hw.held[:end]); err != nil {
			return err
		}
		hw.held = hw.held[end:]
	}
	if hw.mode == handleWatchNone {
		return hw.release()
	}
	return nil
}

// giveUp stops reading a result larger than maxHandleResult.
func (hw *handleWriter) giveUp() {
	hw.mode = handleWatchNone
	hw.h.logger.Warn("a minting tool's result is larger than 1 MiB; its handle is not learned",
		zap.String("tool", hw.rule.Tool), zap.String("header", hw.rule.Header))
}

// release writes what is held, and the flush asked for meanwhile.
func (hw *handleWriter) release() error {
	if len(hw.held) > 0 {
		b := hw.held
		hw.held = nil
		if _, err := hw.ResponseWriter.Write(b); err != nil {
			return err
		}
	}
	if hw.flushed {
		hw.flushed = false
		return http.NewResponseController(hw.ResponseWriter).Flush()
	}
	return nil
}

// finish reads a JSON result once the upstream's response has ended, and
// writes what is still held.
func (hw *handleWriter) finish() error {
	if hw.mode == handleWatchJSON {
		hw.mode = handleWatchNone
		// A compressed answer (a server's compression middleware) is read
		// decoded; the client gets it as it came.
		if body, err := decodedBody(hw.Header(), hw.held); err == nil {
			if handle, response := mcpwire.ResultHandle(body, hw.rule.From); response {
				hw.learn(handle)
			}
		}
	}
	hw.mode = handleWatchNone
	return hw.release()
}

// learn records handle -> the upstream that answered the call, bound to
// the call's principal.
func (hw *handleWriter) learn(handle string) {
	h, t := hw.h, hw.h.handles.table
	if handle == "" || len(handle) > h.MaxSessionIDLength || !printable(handle) {
		if handle != "" {
			h.debug("handle_unusable", handle, "", zap.String("tool", hw.rule.Tool), zap.Int("length", len(handle)))
		}
		return
	}
	sel := selectedUpstream(hw.r)
	if sel == nil {
		return
	}
	origin := session.Origin{Principal: principalOf(hw.r, t.BindPrincipal()), Client: placeholderValue(hw.r, t.ClientKey())}
	if t.LearnFrom(handle, sel.Dial, origin) {
		decide(hw.r, decisionLearned, sel.Dial)
		h.debug("handle_learned", handle, sel.Dial, headerField(hw.rule.Header))
	}
}

// printable reports whether s has no control bytes: a handle is text.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return false
		}
	}
	return true
}

// ReadFrom copies r through Write while the result is read, and straight
// to the wrapped writer after.
func (hw *handleWriter) ReadFrom(r io.Reader) (int64, error) {
	if !hw.wrote {
		hw.WriteHeader(http.StatusOK)
	}
	if hw.mode != handleWatchNone {
		return io.Copy(struct{ io.Writer }{hw}, r)
	}
	return hw.ResponseWriterWrapper.ReadFrom(r)
}

// FlushError flushes what may pass; while the body is held, the flush
// waits for it.
func (hw *handleWriter) FlushError() error {
	if !hw.wrote {
		hw.WriteHeader(http.StatusOK)
	}
	if hw.mode == handleWatchJSON || len(hw.held) > 0 && hw.mode == handleWatchNone {
		hw.flushed = true
		return nil
	}
	return http.NewResponseController(hw.ResponseWriter).Flush()
}

// Flush implements http.Flusher on top of FlushError.
func (hw *handleWriter) Flush() { _ = hw.FlushError() }

// Interface guards
var (
	_ http.ResponseWriter = (*handleWriter)(nil)
	_ http.Flusher        = (*handleWriter)(nil)
	_ io.ReaderFrom       = (*handleWriter)(nil)
)
