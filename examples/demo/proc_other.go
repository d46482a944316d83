//go:build unix && !linux

package main

import "syscall"

// setParentDeathSignal does nothing on Unix systems other than Linux.
func setParentDeathSignal(*syscall.SysProcAttr) {}
