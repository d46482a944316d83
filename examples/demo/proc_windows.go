package main

import (
	"os"
	"syscall"
)

// childProcAttr returns no special attributes on Windows.
func childProcAttr() *syscall.SysProcAttr { return nil }

// terminate kills p: Windows has no SIGTERM.
func terminate(p *os.Process) error {
	return p.Kill()
}
