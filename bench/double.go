package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// The upstream double: a tiny MCP-shaped Streamable HTTP upstream for the
// streaming figures, run as a child process (`bench double`). The go-sdk
// allows one standalone GET stream per session and spends CPU on every
// session; the double mints a session for every POST without one (as
// `initialize` does), holds any number of GET streams, and stamps its
// events with the time it writes them. It keeps no state per session.
// It also answers any other JSON-RPC request as the whoami tool would
// (`structuredContent` naming the server and the session ID it received),
// in JSON or, with -sse, as one SSE event: an upstream that costs almost
// nothing per call, for the proxy-bound part. A POST to /upload is read
// whole and answered with its length, for the uploads part.

// doubleMain runs the double until SIGTERM.
func doubleMain(args []string) error {
	fs := flag.NewFlagSet("double", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "TCP address")
	name := fs.String("name", "double", "server name")
	delay := fs.Duration("first-delay", time.Millisecond, "delay between a stream's headers and its first event")
	ping := fs.Duration("ping", 2*time.Second, "interval of events on an open stream")
	h2c := fs.Bool("h2c", false, "also serve HTTP/2 without TLS")
	sse := fs.Bool("sse", false, "answer POSTs with an SSE stream of one event instead of JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	d := &double{name: *name, delay: *delay, ping: *ping, sse: *sse}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: d, ReadHeaderTimeout: 10 * time.Second}
	if *h2c {
		srv.Protocols = new(http.Protocols)
		srv.Protocols.SetHTTP1(true)
		srv.Protocols.SetUnencryptedHTTP2(true)
		srv.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 1000}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	fmt.Printf("double %s listening on %s\n", *name, ln.Addr())
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

type double struct {
	name  string
	delay time.Duration
	ping  time.Duration
	sse   bool // POST answers as text/event-stream
	open  atomic.Int64
}

func (d *double) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/stats":
		fmt.Fprintf(w, `{"open":%d}`, d.open.Load())
		return
	case "/upload": // the uploads part: read the whole body, answer its length
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, `{"bytes":%d}`, n)
		return
	}
	sid := r.Header.Get("Mcp-Session-Id")
	switch {
	case r.Method == http.MethodPost && sid == "":
		w.Header().Set("Mcp-Session-Id", rand.Text())
		d.answer(w, fmt.Appendf(nil, `{"jsonrpc":"2.0","id":0,"result":{"protocolVersion":"%s","capabilities":{},"serverInfo":{"name":"%s","version":"v0"}}}`,
			protocolVersion, d.name))
	case r.Method == http.MethodPost:
		d.call(w, r, sid)
	case r.Method == http.MethodDelete:
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodGet && sid != "":
		d.stream(w, r)
	default:
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

// Content types of the answers, as header values ready to assign.
var (
	jsonType = []string{"application/json"}
	sseType  = []string{"text/event-stream"}
)

// bufPool holds request and answer buffers of the double's POSTs.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// call answers a POST of a session: 202 to a notification, the whoami
// tool's result to a request (any method), with the request's id.
func (d *double) call(w http.ResponseWriter, r *http.Request, sid string) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	body, err := readAll(r.Body, (*bp)[:0])
	*bp = body
	id := rpcID(body)
	if err != nil || id == nil {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	out := append(body[len(body):], `{"jsonrpc":"2.0","id":`...)
	out = append(out, id...)
	out = append(out, `,"result":{"content":[{"type":"text","text":"`...)
	out = append(out, d.name...)
	out = append(out, `"}],"structuredContent":{"server":"`...)
	out = append(out, d.name...)
	out = append(out, `","session":"`...)
	out = append(out, sid...)
	out = append(out, `"}}}`...)
	*bp = out
	d.answer(w, out)
}

// answer writes msg as JSON, or as one SSE message event with -sse.
func (d *double) answer(w http.ResponseWriter, msg []byte) {
	if !d.sse {
		w.Header()["Content-Type"] = jsonType
		w.Write(msg)
		return
	}
	w.Header()["Content-Type"] = sseType
	w.Write([]byte("event: message\ndata: "))
	w.Write(msg)
	w.Write([]byte("\n\n"))
}

// readAll appends r's contents to buf.
func readAll(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, 512)
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// rpcID returns the raw JSON value of a JSON-RPC message's top-level "id"
// (a number or a string without escapes, as clients send), or nil for a
// notification. It looks only for the first `"id":`, which is enough for
// the benchmark's own messages.
func rpcID(msg []byte) []byte {
	_, rest, ok := bytes.Cut(msg, []byte(`"id":`))
	if !ok {
		return nil
	}
	rest = bytes.TrimLeft(rest, " ")
	end := bytes.IndexAny(rest, ",}")
	if end <= 0 {
		return nil
	}
	return bytes.TrimRight(rest[:end], " ")
}

// stream serves a GET stream: headers at once, the first event after
// d.delay, then an event every d.ping until the client goes away. Every
// event's data is the Unix time in nanoseconds at which it was written.
func (d *double) stream(w http.ResponseWriter, r *http.Request) {
	d.open.Add(1)
	defer d.open.Add(-1)
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	ctx := r.Context()
	t := time.NewTimer(d.delay)
	defer t.Stop()
	buf := make([]byte, 0, 64)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		buf = append(buf[:0], "data: "...)
		buf = strconv.AppendInt(buf, time.Now().UnixNano(), 10)
		buf = append(buf, "\n\n"...)
		if _, err := w.Write(buf); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		t.Reset(d.ping)
	}
}

// startDoubles starts n upstream doubles named d1..dn.
func (e *env) startDoubles(n int, delay, ping time.Duration, h2c bool) ([]*testproc.Proc, []string, error) {
	return e.startDoublesSSE(n, delay, ping, h2c, false)
}

// startDoublesSSE is startDoubles whose POST answers are SSE (sse) or JSON.
func (e *env) startDoublesSSE(n int, delay, ping time.Duration, h2c, sse bool) ([]*testproc.Proc, []string, error) {
	return e.startFleet(n, "double-", "d", e.self, func(name, addr string) []string {
		args := []string{"double", "-name", name, "-listen", addr, "-first-delay", delay.String(), "-ping", ping.String()}
		if h2c {
			args = append(args, "-h2c")
		}
		if sse {
			args = append(args, "-sse")
		}
		return args
	})
}
