package testproc

import (
	"net"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	if !Until(0, func() bool { return true }) {
		t.Error("a condition that holds at once: want true")
	}
	n := 0
	if !Until(time.Second, func() bool { n++; return n == 3 }) || n != 3 {
		t.Errorf("a condition that holds on the third check: want true after 3 checks, got %d", n)
	}
	start := time.Now()
	if Until(50*time.Millisecond, func() bool { return false }) {
		t.Error("a condition that never holds: want false")
	}
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Errorf("gave up after %v, before the 50ms timeout", took)
	}
}

func TestOpenConnsTo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	if n, err := OpenConnsTo(addr); err != nil || n != 0 {
		t.Fatalf("before any connection: %d, %v; want 0", n, err)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if n, err := OpenConnsTo(addr); err != nil || n != 1 {
		t.Errorf("a connection open: %d, %v; want 1", n, err)
	}
	server.Close()
	time.Sleep(20 * time.Millisecond) // the FIN reaches the client
	if n, err := OpenConnsTo(addr); err != nil || n != 1 {
		t.Errorf("the server closed, the client has not: %d, %v; want 1 (CLOSE_WAIT)", n, err)
	}
	c.Close()
	if !Until(time.Second, func() bool { n, err := OpenConnsTo(addr); return err == nil && n == 0 }) {
		t.Error("both ends closed: want 0 within a second")
	}
}
