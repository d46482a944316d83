package testproc

import (
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
