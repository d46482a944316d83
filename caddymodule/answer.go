package caddymodule

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/mcpwire"
	"github.com/klauspost/compress/zstd"
)

// identityEncoding is the Accept-Encoding of the proxy's own requests: it
// reads their answers itself, so it asks for them uncompressed (RFC 9110
// §12.5.3), whatever the client it acts for accepts.
const identityEncoding = "identity"

// decodedBody returns the body of an answer to one of the proxy's own
// requests without its Content-Encoding (RFC 9110 §8.4): gzip, deflate or
// zstd, which a server's compression middleware may choose although the
// proxy asked for identity. At most maxReplayAnswer decoded bytes are
// returned. An encoding it cannot decode, or a body that does not decode,
// is an error naming it.
func decodedBody(header http.Header, body []byte) ([]byte, error) {
	enc := strings.ToLower(strings.TrimSpace(header.Get("Content-Encoding")))
	var r io.Reader
	switch enc {
	case "", identityEncoding:
		return body, nil
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, fmt.Errorf("the answer's gzip encoding does not decode: %w", err)
		}
		r = zr
	case "deflate":
		r = flate.NewReader(bytes.NewReader(body))
	case "zstd":
		zr, err := zstd.NewReader(bytes.NewReader(body), zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(maxReplayAnswer))
		if err != nil {
			return nil, fmt.Errorf("the answer's zstd encoding does not decode: %w", err)
		}
		defer zr.Close()
		r = zr
	default:
		return nil, fmt.Errorf("the answer is encoded with %q, which the proxy does not decode; configure the server to honour Accept-Encoding: identity", enc)
	}
	out, err := io.ReadAll(io.LimitReader(r, maxReplayAnswer))
	if err != nil && len(out) == 0 {
		return nil, fmt.Errorf("the answer's %s encoding does not decode: %w", enc, err)
	}
	return out, nil
}

// maxReplayAnswer is the most bytes of an answer to a replayed initialize
// the proxy reads to find its result.
const maxReplayAnswer = 1 << 16

// upstreamAnswer records the answer to one of the proxy's own requests: status,
// headers, and the first maxReplayAnswer bytes of the body.
type upstreamAnswer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func newUpstreamAnswer() *upstreamAnswer { return &upstreamAnswer{header: http.Header{}} }

// Header returns the answer's header map.
func (a *upstreamAnswer) Header() http.Header { return a.header }

// WriteHeader records the final status.
func (a *upstreamAnswer) WriteHeader(status int) {
	if a.status == 0 && status >= 200 {
		a.status = status
	}
}

// Write keeps the body up to maxReplayAnswer bytes.
func (a *upstreamAnswer) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	if room := maxReplayAnswer - a.body.Len(); room > 0 {
		a.body.Write(b[:min(len(b), room)])
	}
	return len(b), nil
}

// Flush does nothing: the answer is read once complete.
func (a *upstreamAnswer) Flush() {}

// ok reports whether the status is 2xx.
func (a *upstreamAnswer) ok() bool { return a.status >= 200 && a.status < 300 }

// initializeResult returns the protocol version of the initialize result
// the answer carries, as JSON or as an SSE event, compressed or not, or an
// error saying why it carries none.
func (a *upstreamAnswer) initializeResult() (string, error) {
	body, err := decodedBody(a.header, a.body.Bytes())
	if err != nil {
		return "", err
	}
	if strings.HasPrefix(a.header.Get("Content-Type"), "text/event-stream") {
		body = mcpwire.FirstData(body)
	}
	var msg struct {
		Result *struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"result"`
	}
	if err := json.Unmarshal(body, &msg); err != nil || msg.Result == nil {
		return "", errors.New("the answer carried no initialize result")
	}
	return msg.Result.ProtocolVersion, nil
}

// Interface guards
var (
	_ http.ResponseWriter = (*upstreamAnswer)(nil)
	_ http.Flusher        = (*upstreamAnswer)(nil)
)
