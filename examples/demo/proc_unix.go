//go:build unix

package main

import (
	"os"
	"syscall"
)

// childProcAttr puts a backend in its own process group, so that Ctrl-C
// reaches only the demo, which then stops Caddy before the backends.
func childProcAttr() *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setpgid: true}
	setParentDeathSignal(attr)
	return attr
}

// terminate asks p to exit.
func terminate(p *os.Process) error {
	return p.Signal(syscall.SIGTERM)
}
