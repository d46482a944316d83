package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is the kernel's USER_HZ, the unit of utime and stime in
// /proc/<pid>/stat. It is 100 on every Linux architecture Go supports.
const clockTicks = 100

// proc is a child process the benchmark started: a proxy, an MCP server or
// an upstream double. Its output goes to a log file in the work directory.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startProc starts name as a child process logging to dir/<name>.log.
func startProc(dir, name string, env []string, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// pid returns the process ID.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop ends the process: SIGTERM, then SIGKILL after a grace period.
func (p *proc) stop() {
	if p == nil || p.exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// tail returns the end of the process's log, for error messages.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// freePort returns a loopback TCP port that nothing listens on now. It
// checks /proc/net/tcp as well as binding the port, because Caddy and
// HAProxy listen with SO_REUSEPORT: a second process listening on a port
// another process holds would silently take a share of its connections.
func freePort() (int, error) {
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if inodes, err := listeningInodes(port); err == nil && len(inodes) == 0 {
			return port, nil
		}
	}
	return 0, errors.New("no free port found")
}

// listeningInodes returns the socket inodes listening on TCP port (any
// local address, IPv4 or IPv6).
func listeningInodes(port int) (map[string]bool, error) {
	inodes := map[string]bool{}
	hexPort := fmt.Sprintf(":%04X", port)
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(file)
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, err
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "0A" || !strings.HasSuffix(f[1], hexPort) {
				continue
			}
			inodes[f[9]] = true
		}
	}
	return inodes, nil
}

// ownsAllListeners reports whether every socket listening on port belongs
// to process pid (and at least one does).
func ownsAllListeners(pid, port int) (bool, error) {
	inodes, err := listeningInodes(port)
	if err != nil || len(inodes) == 0 {
		return false, err
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false, err
	}
	owned := 0
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil || !strings.HasPrefix(link, "socket:[") {
			continue
		}
		if inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
			owned++
		}
	}
	return owned == len(inodes), nil
}

// waitListening waits until process p listens on port, alone.
func waitListening(p *proc, port int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("%s exited: %v\n%s", p.name, p.err, p.tail())
		}
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 100*time.Millisecond)
		if err == nil {
			c.Close()
			ok, err := ownsAllListeners(p.pid(), port)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("port %d: another process listens on it too (SO_REUSEPORT); rerun", port)
			}
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s did not listen on port %d within %v\n%s", p.name, port, timeout, p.tail())
}

// procStatus returns a field of /proc/<pid>/status in bytes (VmHWM, VmRSS).
func procStatus(pid int, field string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			fs := strings.Fields(rest)
			if len(fs) >= 1 {
				kb, _ := strconv.ParseInt(fs[0], 10, 64)
				return kb * 1024
			}
		}
	}
	return 0
}

// procCPU returns the CPU time (user + system) process pid has used.
func procCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; fields after its closing
	// parenthesis are space-separated: state is field 3, utime 14, stime 15.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks
}

// fdCount returns how many file descriptors process pid holds.
func fdCount(pid int) int {
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(fds)
}

// selfCPU returns the CPU time this process has used (getrusage).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineCPU returns the busy and total CPU time of the whole machine, from /proc/stat.
func machineCPU() (busy, total time.Duration) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, 0
	}
	var sum, idle int64
	for i, s := range f[1:] {
		if i >= 8 { // guest time is already counted in user
			break
		}
		v, _ := strconv.ParseInt(s, 10, 64)
		sum += v
		if i == 3 || i == 4 { // idle, iowait
			idle += v
		}
	}
	return time.Duration(sum-idle) * time.Second / clockTicks, time.Duration(sum) * time.Second / clockTicks
}

// nofileLimit returns the soft and hard RLIMIT_NOFILE.
func nofileLimit() (soft, hard uint64) {
	var rl syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl)
	return rl.Cur, rl.Max
}
