package testproc

import (
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

// A Check reports whether a started process is ready. An error ends the
// wait at once.
type Check func(p *Proc) (bool, error)

// pollEvery is how often Wait runs a check that does not hold yet.
const pollEvery = 10 * time.Millisecond

// Wait waits until every check holds, in order, for at most timeout. It
// returns an error naming the check's process when the process exits first,
// a check fails, or timeout passes; the error holds the end of the output.
func (p *Proc) Wait(timeout time.Duration, checks ...Check) error {
	deadline := time.Now().Add(timeout)
	for _, check := range checks {
		for {
			if p.Exited() {
				return p.exitError()
			}
			ok, err := check(p)
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s not ready after %v: %s", p.name, timeout, p.log.Tail(2000))
			}
			time.Sleep(pollEvery)
		}
	}
	return nil
}

// AddrFile holds once the process has written its address to path; the
// address becomes the process's Addr. The writer should write a temporary
// file and rename it, so that the file is never seen half written.
func AddrFile(path string) Check {
	return func(p *Proc) (bool, error) {
		data, err := os.ReadFile(path)
		if err != nil {
			return false, nil
		}
		p.addr = strings.TrimSpace(string(data))
		return p.addr != "", nil
	}
}

// Listening holds once the process's Addr accepts a connection.
func Listening() Check {
	return func(p *Proc) (bool, error) { return Accepts(p.addr), nil }
}

// LogCount holds once s occurs n times in the process's output (e.g. a
// server's "started" line, once per worker).
func LogCount(s string, n int) Check {
	return func(p *Proc) (bool, error) { return p.log.Count(s) >= n, nil }
}

// Accepts reports whether addr ("host:port", or "unix/<path>") accepts a
// connection within a second.
func Accepts(addr string) bool {
	network := "tcp"
	if path, ok := strings.CutPrefix(addr, "unix/"); ok {
		network, addr = "unix", path
	}
	c, err := net.DialTimeout(network, addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Until polls cond every 10 ms until it holds or timeout passes, and
// reports whether it held: a wait for a condition that no process check
// covers (a file, a counter, an admin API answer).
func Until(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollEvery)
	}
	return true
}
