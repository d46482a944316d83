package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/testproc"
)

// The one way tests start a server process: launch it, then wait until it
// is ready with the checks that fit it (testproc.AddrFile for a server
// that writes its address, testproc.Listening for one given an address,
// testproc.LogCount for one that logs when it is up). Its output is kept in
// a log that failures print, and it is killed when the test ends.

// launch starts cmd as the server called name, serving on addr ("" when
// it writes its address to a file, see launchFleet), and kills it (and its
// process group) when t ends.
func launch(t testing.TB, name, addr string, cmd *exec.Cmd) *testproc.Proc {
	t.Helper()
	p, err := testproc.Start(name, addr, cmd, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

// ready waits until every check holds for every process in ps, for at most
// timeout in all; the processes start side by side, so they boot concurrently.
func ready(t testing.TB, timeout time.Duration, ps []*testproc.Proc, checks ...testproc.Check) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for _, p := range ps {
		if err := p.Wait(time.Until(deadline), checks...); err != nil {
			t.Fatal(err)
		}
	}
}

// launchFleet starts n servers named <prefix>1..<prefix>n, mk giving the
// command of each and the file it writes its address to, and waits until
// every one has written its address.
func launchFleet(t testing.TB, n int, prefix string, timeout time.Duration, mk func(name, addrFile string) *exec.Cmd) []*testproc.Proc {
	t.Helper()
	dir := t.TempDir()
	ps := make([]*testproc.Proc, n)
	files := make([]string, n)
	for i := range ps {
		name := fmt.Sprintf("%s%d", prefix, i+1)
		files[i] = filepath.Join(dir, name+".addr")
		ps[i] = launch(t, name, "", mk(name, files[i]))
	}
	deadline := time.Now().Add(timeout)
	for i, p := range ps {
		if err := p.Wait(time.Until(deadline), testproc.AddrFile(files[i])); err != nil {
			t.Fatal(err)
		}
	}
	return ps
}

// withEnv returns cmd with env added to this process's environment.
func withEnv(cmd *exec.Cmd, env ...string) *exec.Cmd {
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// freeAddr returns "127.0.0.1:port" for a TCP port that nothing listens on now.
func freeAddr(t testing.TB) string {
	t.Helper()
	addr, err := testproc.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// mustFreePort returns a TCP port on 127.0.0.1 that nothing listens on now.
func mustFreePort() int {
	port, err := testproc.FreePort()
	if err != nil {
		panic(err)
	}
	return port
}

// addressed is an upstream: a server process or an in-process double.
type addressed interface{ Addr() string }

// upstreams returns the addresses of us, space-separated, as a Caddyfile
// upstream list.
func upstreams[U addressed](us []U) string {
	s := make([]string, len(us))
	for i, u := range us {
		s[i] = u.Addr()
	}
	return strings.Join(s, " ")
}

// whoamiTimeout bounds a whoami-server's start (-race binaries start slowly
// on a loaded machine).
const whoamiTimeout = 10 * time.Second

// startBackends starts n go-sdk whoami servers (examples/whoami-server)
// named s1..sn, answering POSTs with JSON (jsonMode) or SSE.
func startBackends(t testing.TB, n int, jsonMode bool) []*testproc.Proc {
	t.Helper()
	return startBackendsWith(t, n, jsonMode, nil)
}

// startBackendsWith is startBackends with flags(name), if not nil, added to
// the command line of the server called name.
func startBackendsWith(t testing.TB, n int, jsonMode bool, flags func(name string) []string) []*testproc.Proc {
	t.Helper()
	return launchFleet(t, n, "s", whoamiTimeout, func(name, addrFile string) *exec.Cmd {
		args := []string{"-name", name, "-listen", "127.0.0.1:0", "-addr-file", addrFile}
		if jsonMode {
			args = append(args, "-json")
		}
		if flags != nil {
			args = append(args, flags(name)...)
		}
		return exec.Command(whoamiBin, args...)
	})
}

// runProxyCommand runs `caddy <args...>` as a user would, on the real
// binary, and waits until it serves addr.
func runProxyCommand(t *testing.T, name, addr string, args ...string) *testproc.Proc {
	t.Helper()
	return runProxyCommandEnv(t, name, addr, nil, args...)
}

// runProxyCommandEnv is runProxyCommand with env added to the command's
// environment.
func runProxyCommandEnv(t *testing.T, name, addr string, env []string, args ...string) *testproc.Proc {
	t.Helper()
	dir := t.TempDir()
	cmd := withEnv(exec.Command(caddyBinary(t), args...), append([]string{"XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir}, env...)...)
	p := launch(t, name, addr, cmd)
	ready(t, replicaTimeout, []*testproc.Proc{p}, testproc.Listening())
	return p
}

// waitClosesRead waits until every connection to addr, a server that died
// or closed, has been closed by its owner on this host: the proxies have
// read the close of their kept-alive connections to it, so a request sent
// now cannot go out on one of them. It fails t after 5 s.
func waitClosesRead(t testing.TB, addr string) {
	t.Helper()
	var n int
	var err error
	if !testproc.Until(5*time.Second, func() bool { n, err = testproc.OpenConnsTo(addr); return err == nil && n == 0 }) {
		t.Fatalf("%d connections to %s still open 5 s after it closed (%v)", n, addr, err)
	}
}
