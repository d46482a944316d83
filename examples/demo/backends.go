package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Timeouts for the backend processes.
const (
	backendStartTimeout = 15 * time.Second
	backendStopTimeout  = 5 * time.Second
)

// backend is one whoami server running as a child process.
type backend struct {
	name    string
	addr    string // host:port, once known
	cmd     *exec.Cmd
	exited  chan struct{} // closed when the process has exited
	waitErr error         // valid once exited is closed
	dir     string        // temporary directory holding the address file
}

// startBackends starts n whoami backends named s1..sN and waits until each
// has written its address. On error, the backends started so far are
// returned too, so that the caller can stop them.
func startBackends(ctx context.Context, n int, jsonMode bool) ([]*backend, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var backends []*backend
	for i := 1; i <= n; i++ {
		b, err := startBackend(exe, fmt.Sprintf("s%d", i), jsonMode)
		if err != nil {
			return backends, err
		}
		backends = append(backends, b)
	}
	for _, b := range backends {
		if err := b.waitAddr(ctx); err != nil {
			return backends, err
		}
	}
	return backends, nil
}

// startBackend starts one backend process running the demo binary with the
// hidden backend command.
func startBackend(exe, name string, jsonMode bool) (*backend, error) {
	dir, err := os.MkdirTemp("", "mcp-demo-"+name+"-")
	if err != nil {
		return nil, err
	}
	args := []string{backendCommand, "-name", name, "-listen", "127.0.0.1:0",
		"-addr-file", filepath.Join(dir, "addr")}
	if jsonMode {
		args = append(args, "-json")
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr // stdout (the "listening" line) is discarded
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting backend %s: %w", name, err)
	}
	b := &backend{name: name, cmd: cmd, exited: make(chan struct{}), dir: dir}
	go func() {
		b.waitErr = cmd.Wait()
		close(b.exited)
	}()
	return b, nil
}

// waitAddr waits until the backend has written its address file.
func (b *backend) waitAddr(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, backendStartTimeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if data, err := os.ReadFile(filepath.Join(b.dir, "addr")); err == nil {
			b.addr = strings.TrimSpace(string(data))
			return nil
		}
		select {
		case <-b.exited:
			return fmt.Errorf("backend %s exited before listening: %v", b.name, b.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("backend %s: waiting for its address: %w", b.name, ctx.Err())
		case <-tick.C:
		}
	}
}

// stopBackends stops all backends concurrently and waits for them.
func stopBackends(backends []*backend) {
	done := make(chan struct{})
	for _, b := range backends {
		go func() {
			b.stop()
			done <- struct{}{}
		}()
	}
	for range backends {
		<-done
	}
}

// stop asks the backend to terminate, kills it if it does not exit within
// backendStopTimeout, and removes its temporary directory.
func (b *backend) stop() {
	defer os.RemoveAll(b.dir)
	if err := terminate(b.cmd.Process); err != nil && !errors.Is(err, os.ErrProcessDone) {
		b.cmd.Process.Kill()
	}
	select {
	case <-b.exited:
	case <-time.After(backendStopTimeout):
		fmt.Fprintf(os.Stderr, "demo: backend %s did not stop in %v, killing it\n", b.name, backendStopTimeout)
		b.cmd.Process.Kill()
		<-b.exited
	}
}

// backendAddrs returns the backends' host:port addresses.
func backendAddrs(backends []*backend) []string {
	addrs := make([]string, len(backends))
	for i, b := range backends {
		addrs[i] = b.addr
	}
	return addrs
}

// backendNames returns the backends' names.
func backendNames(backends []*backend) []string {
	names := make([]string, len(backends))
	for i, b := range backends {
		names[i] = b.name
	}
	return names
}
