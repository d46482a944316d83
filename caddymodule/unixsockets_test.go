package caddymodule

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// listenUnix listens on a unix socket at path until the test ends.
func listenUnix(t *testing.T, path string) net.Listener {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// socketDir returns a short temporary directory: socket paths must stay under 108 bytes.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mcpus")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func provisionedSource(t *testing.T, pattern string, refresh time.Duration) *UnixSocketUpstreams {
	t.Helper()
	u := &UnixSocketUpstreams{Pattern: pattern, Refresh: caddy.Duration(refresh)}
	if err := u.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	return u
}

func dialsOf(t *testing.T, u *UnixSocketUpstreams) []string {
	t.Helper()
	ups, err := u.GetUpstreams(nil)
	if err != nil {
		t.Fatal(err)
	}
	dials := make([]string, len(ups))
	for i, up := range ups {
		dials[i] = up.Dial
	}
	return dials
}

// TestUnixSocketUpstreamsLists: only sockets whose names match are
// upstreams; regular files, other names and the hook's temporary
// `.worker-N.sock.PID` sockets are not.
func TestUnixSocketUpstreamsLists(t *testing.T) {
	dir := socketDir(t)
	for _, name := range []string{"worker-1.sock", "worker-0.sock", "other.sock", ".worker-2.sock.123"} {
		listenUnix(t, filepath.Join(dir, name))
	}
	if err := os.WriteFile(filepath.Join(dir, "worker-9.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	u := provisionedSource(t, filepath.Join(dir, "worker-*.sock"), time.Hour)
	want := []string{"unix/" + filepath.Join(dir, "worker-0.sock"), "unix/" + filepath.Join(dir, "worker-1.sock")}
	if got := dialsOf(t, u); !slices.Equal(got, want) {
		t.Errorf("upstreams %v, want %v", got, want)
	}
}

// TestUnixSocketUpstreamsRefresh: a listing is reused until refresh has
// passed or ResetCache (a retry) asks for a new one; sockets that come and
// go are then seen.
func TestUnixSocketUpstreamsRefresh(t *testing.T) {
	dir := socketDir(t)
	listenUnix(t, filepath.Join(dir, "worker-0.sock"))
	u := provisionedSource(t, filepath.Join(dir, "*.sock"), time.Hour)
	if got := dialsOf(t, u); len(got) != 1 {
		t.Fatalf("upstreams %v, want 1", got)
	}
	listenUnix(t, filepath.Join(dir, "worker-1.sock"))
	if got := dialsOf(t, u); len(got) != 1 {
		t.Errorf("within refresh: upstreams %v, want the cached 1", got)
	}
	if err := u.ResetCache(nil); err != nil {
		t.Fatal(err)
	}
	if got := dialsOf(t, u); len(got) != 2 {
		t.Errorf("after ResetCache: upstreams %v, want 2", got)
	}

	short := provisionedSource(t, filepath.Join(dir, "*.sock"), time.Millisecond)
	if got := dialsOf(t, short); len(got) != 2 {
		t.Fatalf("upstreams %v, want 2", got)
	}
	if err := os.Remove(filepath.Join(dir, "worker-0.sock")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if got := dialsOf(t, short); len(got) != 1 {
		t.Errorf("after refresh: upstreams %v, want 1", got)
	}
}

// TestUnixSocketUpstreamsMissingDir: a directory that does not exist yet
// (the server has not started) is no upstreams, not an error.
func TestUnixSocketUpstreamsMissingDir(t *testing.T) {
	u := provisionedSource(t, filepath.Join(socketDir(t), "not-yet", "*.sock"), time.Second)
	if got := dialsOf(t, u); len(got) != 0 {
		t.Errorf("upstreams %v, want none", got)
	}
}

func TestUnixSocketUpstreamsBadPattern(t *testing.T) {
	for pattern, want := range map[string]string{
		"":                  "a pattern is required",
		"run/mcp/*.sock":    "the directory must be an absolute path without wildcards",
		"/run/*/w.sock":     "the directory must be an absolute path without wildcards",
		"/run/mcp/[.sock":   "syntax error in pattern",
		"/run/mcp\\/x.sock": "without wildcards",
	} {
		err := (&UnixSocketUpstreams{Pattern: pattern}).Provision(caddy.Context{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("pattern %q: error %v, want one containing %q", pattern, err, want)
		}
	}
}

func TestUnixSocketUpstreamsCaddyfile(t *testing.T) {
	u := new(UnixSocketUpstreams)
	if err := u.UnmarshalCaddyfile(caddyfile.NewTestDispenser("unix_sockets /run/mcp/*.sock {\n refresh 5s\n}")); err != nil {
		t.Fatal(err)
	}
	if u.Pattern != "/run/mcp/*.sock" || u.Refresh != caddy.Duration(5*time.Second) {
		t.Errorf("got %+v", u)
	}
	for input, want := range map[string]string{
		"unix_sockets":                             "unix_sockets needs a pattern",
		"unix_sockets /a/*.sock /b/*.sock":         "after '/b/*.sock'",
		"unix_sockets /a/*.sock {\n bogus 1\n}":    "unrecognized unix_sockets option 'bogus'",
		"unix_sockets /a/*.sock {\n refresh x\n}":  "refresh: 'x' is not a positive duration",
		"unix_sockets /a/*.sock {\n refresh 0s\n}": "refresh: '0s' is not a positive duration",
	} {
		err := new(UnixSocketUpstreams).UnmarshalCaddyfile(caddyfile.NewTestDispenser(input))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one containing %q", input, err, want)
		}
	}
}
