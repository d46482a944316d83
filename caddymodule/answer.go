package caddymodule

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"strings"

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
