package testproc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// handedOut holds the ports FreePort returned in this process: a port
// picked but not listened on yet looks free, and the kernel may offer it
// again (two sites of one config once got the same port that way).
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// FreePort returns a loopback TCP port that nothing listens on now and
// that it never returned before in this process. It checks /proc/net/tcp
// as well as binding the port, because Caddy and HAProxy listen with
// SO_REUSEPORT: a second process listening on a port another process holds
// would silently take a share of its connections. It fails when no port
// is found in 50 tries, or /proc cannot be read.
func FreePort() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = map[int]bool{}
	}
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if handedOut.ports[port] {
			continue
		}
		inodes, err := listeningInodes(port)
		if err != nil {
			return 0, err
		}
		if len(inodes) == 0 {
			handedOut.ports[port] = true
			return port, nil
		}
	}
	return 0, errors.New("no free port found in 50 tries")
}

// FreeAddr is FreePort as "127.0.0.1:port", with FreePort's errors.
func FreeAddr() (string, error) {
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", port), nil
}

// SoleListener holds once the process listens on its Addr's port and no
// other process does (SO_REUSEPORT lets two listen on one port). It fails
// when another process listens there too.
func SoleListener() Check {
	return func(p *Proc) (bool, error) {
		_, portStr, err := net.SplitHostPort(p.addr)
		if err != nil {
			return false, err
		}
		port, err := strconv.Atoi(portStr)
		if err != nil {
			return false, err
		}
		inodes, err := listeningInodes(port)
		if err != nil || len(inodes) == 0 {
			return false, err
		}
		owned, err := socketsOf(p.Pid(), inodes)
		if err != nil || owned == len(inodes) {
			return err == nil, err
		}
		return false, fmt.Errorf("port %d: another process listens on it too (SO_REUSEPORT); rerun", port)
	}
}

// listeningInodes returns the socket inodes listening on TCP port (any
// local address, IPv4 or IPv6).
func listeningInodes(port int) (map[string]bool, error) {
	inodes := map[string]bool{}
	hexPort := fmt.Sprintf(":%04X", port)
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(file)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) >= 10 && f[3] == "0A" && strings.HasSuffix(f[1], hexPort) {
				inodes[f[9]] = true
			}
		}
	}
	return inodes, nil
}

// socketsOf counts the sockets of process pid among inodes.
func socketsOf(pid int, inodes map[string]bool) (int, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, err
	}
	owned := 0
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] {
			owned++
		}
	}
	return owned, nil
}

// OpenConnsTo returns how many TCP sockets on this host are connected to
// addr (an IPv4 "host:port") and not yet closed by their owner: in state
// ESTABLISHED, or CLOSE_WAIT (the peer closed, the owner has not read it).
// After a server dies, 0 means every client (a proxy's transport, say) has
// read the close of its kept-alive connections.
func OpenConnsTo(addr string) (int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	ip := net.ParseIP(host).To4()
	port, err := strconv.Atoi(portStr)
	if ip == nil || err != nil {
		return 0, fmt.Errorf("%q is not an IPv4 host:port", addr)
	}
	remote := fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], port)
	data, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n")[1:] {
		if f := strings.Fields(line); len(f) >= 4 && f[2] == remote && (f[3] == "01" || f[3] == "08") {
			n++
		}
	}
	return n, nil
}
