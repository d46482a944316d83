package main

import "syscall"

// setParentDeathSignal makes the kernel send SIGTERM to a backend if the
// demo dies without stopping it (for example on SIGKILL).
func setParentDeathSignal(attr *syscall.SysProcAttr) {
	attr.Pdeathsig = syscall.SIGTERM
}
