package redistest

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Relay is a TCP relay from a free port of 127.0.0.1 to a target address.
// Its traffic can be blackholed (bytes are held, connections stay open, as
// when packets are dropped) or slowed.
type Relay struct {
	// Addr is where clients connect.
	Addr   string
	target string
	ln     net.Listener
	hole   atomic.Bool
	delay  atomic.Int64 // nanoseconds added before each chunk is passed on
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

// NewRelay starts a relay to target, and closes it when the test ends.
func NewRelay(t testing.TB, target string) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]bool{}}
	go r.accept()
	t.Cleanup(r.close)
	return r
}

// Blackhole holds every byte from now on (on), or passes them again (off).
// Bytes held while on are dropped.
func (r *Relay) Blackhole(on bool) { r.hole.Store(on) }

// Slow delays every chunk of bytes by d in each direction (0: no delay).
func (r *Relay) Slow(d time.Duration) { r.delay.Store(int64(d)) }

// Cut closes every connection the relay carries now, both sides, as a
// network that drops a connection does; later connections pass again.
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.conns {
		c.Close()
		delete(r.conns, c)
	}
}

// String describes the relay's state.
func (r *Relay) String() string {
	return fmt.Sprintf("relay %s -> %s (blackhole %v, delay %s)", r.Addr, r.target, r.hole.Load(), time.Duration(r.delay.Load()))
}

func (r *Relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		go r.serve(c)
	}
}

func (r *Relay) serve(c net.Conn) {
	up, err := net.Dial("tcp", r.target)
	if err != nil {
		c.Close()
		return
	}
	r.track(c, up)
	go r.pipe(up, c)
	r.pipe(c, up)
}

func (r *Relay) track(conns ...net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range conns {
		r.conns[c] = true
	}
}

// pipe copies from src to dst, holding or delaying as the relay says.
func (r *Relay) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if d := r.delay.Load(); d > 0 {
				time.Sleep(time.Duration(d))
			}
			if !r.hole.Load() {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *Relay) close() {
	r.ln.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	for c := range r.conns {
		c.Close()
	}
}
