// Package testproc starts and stops the child processes of the end-to-end
// tests and the benchmark: MCP servers, upstream doubles, gunicorn, Caddy,
// HAProxy. A child's output is captured in a Log that is safe to read while
// the child writes, and a child is ready when every one of its Checks holds.
package testproc

import (
	"fmt"
	"io"
	"os/exec"
	"syscall"
	"time"
)

// Proc is a running child process with a name (for messages), the address
// it serves on once known ("host:port", or "unix/<path>" as Caddy writes a
// unix socket upstream), and its captured output.
type Proc struct {
	name string
	addr string
	cmd  *exec.Cmd
	log  *Log
	done chan struct{} // closed when the process has exited
	err  error         // cmd.Wait's error; read after done
}

// Start starts cmd as the child process called name, serving on addr
// ("" when a readiness check learns it, see AddrFile). Its stdout and stderr
// go to the process's Log, and to sink too when sink is not nil. The child
// runs in its own process group, so Kill and Stop reach its own children
// (gunicorn's workers), and the kernel kills it if this process dies first.
// Start returns exec.Cmd.Start's error, naming the process.
func Start(name, addr string, cmd *exec.Cmd, sink io.Writer) (*Proc, error) {
	p := &Proc{name: name, addr: addr, cmd: cmd, log: &Log{sink: sink}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.log, p.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Name returns the name the process was started with.
func (p *Proc) Name() string { return p.name }

// Addr returns the address the process serves on: the one it was started
// with, or the one AddrFile learned ("" before that).
func (p *Proc) Addr() string { return p.addr }

// URL returns the process's MCP endpoint, http://<addr>/mcp.
func (p *Proc) URL() string { return "http://" + p.addr + "/mcp" }

// Pid returns the process ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Log returns the process's captured output.
func (p *Proc) Log() *Log { return p.log }

// Done returns a channel that is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill ends the process and its process group at once, as a crash would,
// and waits until it has exited. Killing an exited process does nothing.
func (p *Proc) Kill() {
	if p == nil || p.Exited() {
		return
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	<-p.done
}

// Stop asks the process to end (SIGTERM to its process group) and kills it
// if it has not ended after grace.
func (p *Proc) Stop(grace time.Duration) {
	if p == nil || p.Exited() {
		return
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}

// exitError describes the process's end, with the tail of its output.
func (p *Proc) exitError() error {
	return fmt.Errorf("%s exited (%v): %s", p.name, p.err, p.log.Tail(2000))
}
