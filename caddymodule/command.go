package caddymodule

import (
	"fmt"
	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/session"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// The `caddy mcp-proxy` subcommand: mcp_proxy without a config file, as
// `caddy reverse-proxy` is reverse_proxy without one. It writes the
// Caddyfile a user would write for the same flags and runs it, so that the
// command and the Caddyfile cannot drift apart, and --print-caddyfile hands
// that Caddyfile over when the user outgrows the command.

// defaultProxyFrom is the address the subcommand listens on by default:
// plain HTTP on loopback, where local MCP clients connect without TLS.
const defaultProxyFrom = "localhost:8000"

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "mcp-proxy",
		Usage: `--to <upstream> [--to <upstream>...] [--from <addr>] [--failover] [--redis <host:port> [--hash-key <key>]] [--seal-key <key>] [--handle '<tool> <where> <Mcp-Param-Name>'...] [--status <path>|off] [--admin <addr>|off] [--access-log] [--debug] [--print-caddyfile]`,
		Short: "An MCP reverse proxy with session affinity, without a config file",
		Long: `
Runs mcp_proxy: every request of an MCP session (Streamable HTTP,
Mcp-Session-Id) goes to the upstream that created the session; requests
without a session are balanced. Repeat --to for each upstream:

  127.0.0.1:9001          a TCP upstream (a port range such as
                          127.0.0.1:9001-9004 is one upstream per port)
  unix//run/mcp.sock      a unix socket
  unix//run/mcp/w-*.sock  every socket matching the pattern, listed again
                          as sockets come and go (gunicorn's per-worker
                          sockets, see docs/python.md)

--from is the address to listen on (default localhost:8000). Without a
scheme it is served over plain HTTP; give https://host for TLS with
Caddy's automatic certificates.

--failover moves a session whose upstream is gone to another upstream
(failover reinitialize). --redis shares the session table with every Caddy
that uses the same Redis, under the secret --hash-key, which every one of
them must share (default {env.MCP_SESSIONS_HASH_KEY}: set that variable,
e.g. to the output of openssl rand -base64 32); --seal-key seals the
upstream into the session ID
instead (32 random bytes in base64; {env.NAME} or {file.path} keep it off
the command line). --admin is Caddy's admin endpoint, where the session
API lives (default localhost:2019; off turns it off).

--handle pins MCP 2026-07-28 handles: calls of <tool> mint a handle at
<where> in their result (a JSON pointer into structuredContent such as
/handle, or text), and the calls carrying it back in header
<Mcp-Param-Name> go to the upstream that minted it (docs/handles.md).
Repeat it for each kind of handle. With --redis, handles are shared too.

--status is the path of the status page (sessions, health and drain state
per upstream; read-only) on the proxy's own address: /mcp-status by
default when --from is a loopback address, off otherwise, since the page
names the upstreams.

--print-caddyfile prints the Caddyfile these flags run, and exits.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().StringP("from", "f", defaultProxyFrom, "Address on which to receive MCP traffic")
			cmd.Flags().StringArrayP("to", "t", nil, "Upstream MCP server: host:port, unix//path or a unix//path/pattern-*.sock (repeatable)")
			cmd.Flags().Bool("failover", false, "Move sessions of an upstream that is gone to another upstream")
			cmd.Flags().StringArray("redis", nil, "Redis address host:port sharing the session table (repeatable for a cluster)")
			cmd.Flags().String("hash-key", "", "Secret the replicas sharing --redis hash session IDs with (default {env.MCP_SESSIONS_HASH_KEY})")
			cmd.Flags().String("seal-key", "", "Key that seals the upstream into session IDs (base64, 32 bytes)")
			cmd.Flags().StringArray("handle", nil, "A handle rule, '<tool> <where> <Mcp-Param-Name>' (repeatable)")
			cmd.Flags().String("status", "", "Path of the status page, or off (default /mcp-status on loopback, else off)")
			cmd.Flags().String("admin", "localhost:2019", "Admin endpoint address, or off")
			cmd.Flags().Bool("access-log", false, "Enable the access log")
			cmd.Flags().BoolP("debug", "v", false, "Enable verbose debug logs")
			cmd.Flags().Bool("print-caddyfile", false, "Print the Caddyfile these flags run, and exit")
			cmd.RunE = caddycmd.WrapCommandFuncForCobra(cmdMCPProxy)
		},
	})
}

// proxyFlags are the subcommand's flags, as given.
type proxyFlags struct {
	from      string
	to        []string
	failover  bool
	redis     []string
	hashKey   string // --hash-key, "" for the default
	sealKey   string
	status    string // the status page's path, "off", or "" for the default
	admin     string
	accessLog bool
	debug     bool
	handles   []HandleRule // --handle
}

// cmdMCPProxy runs the subcommand.
func cmdMCPProxy(fs caddycmd.Flags) (int, error) {
	f, err := readProxyFlags(fs)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	site, err := f.site()
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	cfg, err := f.caddyfile(site)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	config, err := adaptCaddyfile(cfg)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	if fs.Bool("print-caddyfile") {
		fmt.Print(cfg)
		return caddy.ExitCodeSuccess, nil
	}
	if err := f.checkFree(site); err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
	f.warnEmptyPattern()
	caddy.TrapSignals()
	if err := caddy.Load(config, true); err != nil {
		return caddy.ExitCodeFailedStartup, fmt.Errorf("starting the proxy: %v", err)
	}
	f.announce(site)
	select {}
}

// readProxyFlags reads the flags and checks that each value is one
// Caddyfile token.
func readProxyFlags(fs caddycmd.Flags) (proxyFlags, error) {
	f := proxyFlags{
		from: fs.String("from"), failover: fs.Bool("failover"), sealKey: fs.String("seal-key"), status: fs.String("status"),
		hashKey: fs.String("hash-key"),
		admin:   fs.String("admin"), accessLog: fs.Bool("access-log"), debug: fs.Bool("debug"),
	}
	var err error
	if f.to, err = fs.GetStringArray("to"); err != nil {
		return f, fmt.Errorf("invalid --to: %v", err)
	}
	if f.redis, err = fs.GetStringArray("redis"); err != nil {
		return f, fmt.Errorf("invalid --redis: %v", err)
	}
	handles, err := fs.GetStringArray("handle")
	if err != nil {
		return f, fmt.Errorf("invalid --handle: %v", err)
	}
	for _, v := range handles {
		rule, err := parseHandleFlag(v)
		if err != nil {
			return f, err
		}
		f.handles = append(f.handles, rule)
	}
	if args := fs.Args(); len(args) > 0 {
		return f, fmt.Errorf("unexpected argument %q: give upstreams with --to, e.g. --to %s", args[0], args[0])
	}
	return f, f.check()
}

// parseHandleFlag reads one --handle value, `<tool> <where> <header>`.
func parseHandleFlag(v string) (HandleRule, error) {
	args := strings.Fields(v)
	if len(args) != 3 {
		return HandleRule{}, fmt.Errorf("invalid --handle %q: give the tool, where its result holds the handle, and the header that carries it back, "+
			"in one argument, e.g. --handle 'open_browser /browser_id Mcp-Param-Browser'", v)
	}
	rule := HandleRule{Tool: args[0], From: args[1], Header: args[2]}
	for _, a := range args {
		if err := checkToken(a); err != nil {
			return rule, fmt.Errorf("invalid --handle %q: %v", v, err)
		}
	}
	if err := rule.check(); err != nil {
		return rule, fmt.Errorf("invalid --handle %q: %v", v, err)
	}
	return rule, nil
}

// defaultHashKey is --hash-key when not given: the variable the redis
// store's own error names.
const (
	hashKeyEnv     = "MCP_SESSIONS_HASH_KEY"
	defaultHashKey = "{env." + hashKeyEnv + "}"
)

// redisHashKey returns the hash_key the redis store gets, or why there is
// none: the default's variable is unset.
func (f proxyFlags) redisHashKey() (string, error) {
	if f.hashKey != "" {
		return f.hashKey, nil
	}
	if os.Getenv(hashKeyEnv) == "" {
		return "", fmt.Errorf("--redis needs a secret that every Caddy sharing the table knows, to hash session IDs with: "+
			"export %s=\"$(openssl rand -base64 32)\" (the same value on every replica), or give --hash-key {env.NAME} or {file.path}", hashKeyEnv)
	}
	return defaultHashKey, nil
}

// check refuses what cannot become a Caddyfile token: the flags are
// written into a Caddyfile, where a space, quote or brace would change its
// meaning.
func (f proxyFlags) check() error {
	if len(f.to) == 0 {
		return fmt.Errorf("--to is required: give each upstream MCP server, e.g. --to 127.0.0.1:9001 --to 127.0.0.1:9002")
	}
	named := map[string][]string{"--from": {f.from}, "--to": f.to, "--redis": f.redis, "--admin": {f.admin}}
	if f.sealKey != "" {
		named["--seal-key"] = []string{f.sealKey}
	}
	if f.hashKey != "" {
		if len(f.redis) == 0 {
			return fmt.Errorf("--hash-key is the secret of the table shared through --redis; give --redis too, or leave --hash-key out")
		}
		named["--hash-key"] = []string{f.hashKey}
	}
	if f.status != "" {
		named["--status"] = []string{f.status}
		if f.status != "off" && !strings.HasPrefix(f.status, "/") {
			return fmt.Errorf("invalid --status %q: give a path such as /mcp-status, or off", f.status)
		}
		if p := strings.TrimRight(f.status, "/*"); p == "" || p == "/mcp" {
			return fmt.Errorf("invalid --status %q: the status page would hide the MCP endpoint (servers serve /mcp); give another path, such as %s", f.status, defaultStatusPath)
		}
	}
	for flag, values := range named {
		for _, v := range values {
			if err := checkToken(v); err != nil {
				return fmt.Errorf("invalid %s %q: %v", flag, v, err)
			}
		}
	}
	for i, to := range f.to {
		if err := checkUpstream(to); err != nil {
			return fmt.Errorf("invalid --to %q: %v", to, err)
		}
		if slices.Contains(f.to[:i], to) {
			return fmt.Errorf("--to %s is given twice: each upstream once", to)
		}
	}
	return nil
}

// checkUpstream reports why to, a --to value, names no upstream a request
// can reach: a network address without a port, with a path (servers print
// their URL with one), or with a port that is not one.
func checkUpstream(to string) error {
	if strings.HasPrefix(to, "unix/") || to == "" {
		return nil // a socket path; an empty value is refused as a token
	}
	addr := strings.TrimPrefix(strings.TrimPrefix(to, "http://"), "h2c://")
	if host, path, ok := strings.Cut(addr, "/"); ok {
		return fmt.Errorf("give host:port without the path (--to %s): the proxy sends each request to the path the client asked for, so clients use the proxy's URL with /%s", host, path)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("give host:port, such as 127.0.0.1:9001, or unix//path.sock")
	}
	for _, p := range strings.SplitN(port, "-", 2) { // a port or a range, 9001-9003
		switch n, err := strconv.Atoi(p); {
		case err != nil || n < 0 || n > 65535:
			return fmt.Errorf("port %q is not a port number (1-65535) or a range of them", port)
		case n == 0:
			return fmt.Errorf("port 0 is no upstream's port")
		}
	}
	return nil
}

// placeholderKey is the one shape of a value with braces the flags take: a
// key from the environment or a file.
var placeholderKey = regexp.MustCompile(`^\{(env|file)\.[^{}\s]+\}$`)

// checkToken reports why v is not one plain Caddyfile token, or nil.
func checkToken(v string) error {
	switch {
	case v == "":
		return fmt.Errorf("empty")
	case strings.HasPrefix(v, "#"):
		return fmt.Errorf("not an address or key")
	case strings.ContainsAny(v, " \t\r\n\"`\\"):
		return fmt.Errorf("must not contain spaces, quotes or backslashes")
	case strings.ContainsAny(v, "{}") && !placeholderKey.MatchString(v):
		return fmt.Errorf("must not contain braces, except a whole {env.NAME} or {file.path} placeholder")
	}
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("must not contain control characters")
		}
	}
	return nil
}

// proxySite is where the subcommand listens.
type proxySite struct {
	address  string // the Caddyfile site address
	bind     string // the host to bind, "" for all interfaces
	port     string
	url      string // the base URL clients use
	loopback bool   // bound to a loopback address only
}

// defaultStatusPath is the status page's path when --status is not given
// and the proxy listens on loopback.
const defaultStatusPath = "/mcp-status"

// site works out the site from --from: without a scheme, plain HTTP on the
// given host (bound to it) and port; with https, Caddy's automatic HTTPS.
func (f proxyFlags) site() (proxySite, error) {
	from := f.from
	if strings.HasPrefix(from, "unix/") {
		return proxySite{}, fmt.Errorf("invalid --from %q: the command listens on TCP; for a unix socket, write a Caddyfile with `bind unix//path.sock` (start from --print-caddyfile)", f.from)
	}
	if _, err := strconv.Atoi(from); err == nil {
		return proxySite{}, fmt.Errorf("invalid --from %q: give :%s to listen on every interface, or 127.0.0.1:%s for this machine only", f.from, from, from)
	}
	if !strings.Contains(from, "://") {
		from = "http://" + from
	}
	a, err := httpcaddyfile.ParseAddress(from)
	if err != nil {
		return proxySite{}, fmt.Errorf("invalid --from %q: %v", f.from, err)
	}
	if a.Path != "" {
		return proxySite{}, fmt.Errorf("invalid --from %q: paths are not allowed; the proxy serves every path", f.from)
	}
	if a.Scheme == "https" {
		port := a.Port
		if port == "" {
			port = "443"
		}
		return proxySite{address: from, url: strings.TrimSuffix(from, "/"), port: port}, nil
	}
	if a.Port == "" {
		a.Port = "80"
	}
	if a.Port == "0" {
		return proxySite{}, fmt.Errorf("invalid --from %q: give the port to listen on; clients need to know it", f.from)
	}
	host := a.Host
	ip := net.ParseIP(a.Host)
	if host == "" || ip != nil && ip.IsUnspecified() {
		host = "localhost" // all interfaces: this machine's clients reach it so
	}
	loopback := a.Host == "localhost" || ip != nil && ip.IsLoopback()
	return proxySite{address: "http://:" + a.Port, bind: a.Host, port: a.Port, url: "http://" + net.JoinHostPort(host, a.Port), loopback: loopback}, nil
}

// statusPath returns the status page's path on site, or "" for none.
func (f proxyFlags) statusPath(site proxySite) string {
	switch {
	case f.status == "off":
		return ""
	case f.status != "":
		return f.status
	case site.loopback:
		return defaultStatusPath
	}
	return ""
}

// upstreams splits --to into static upstreams and at most one socket
// pattern (a unix address with a glob in its file name).
func (f proxyFlags) upstreams() (static []string, pattern string, err error) {
	for _, to := range f.to {
		path, unix := strings.CutPrefix(to, "unix/")
		if !unix || !strings.ContainsAny(path, "*?[") {
			static = append(static, to)
			continue
		}
		if pattern != "" {
			return nil, "", fmt.Errorf("--to %s: only one socket pattern can be given, and %s came first", to, pattern)
		}
		pattern = path
	}
	if pattern != "" && len(static) > 0 {
		return nil, "", fmt.Errorf("--to unix/%s: a socket pattern cannot be mixed with fixed upstreams (%s); give one or the other", pattern, strings.Join(static, " "))
	}
	return static, pattern, nil
}

// caddyfile returns the Caddyfile that the flags stand for.
func (f proxyFlags) caddyfile(site proxySite) (string, error) {
	static, pattern, err := f.upstreams()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("{\n")
	fmt.Fprintf(&b, "\tadmin %s\n\tpersist_config off\n", f.admin)
	if f.debug {
		b.WriteString("\tdebug\n")
	}
	if len(f.redis) > 0 {
		key, err := f.redisHashKey()
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "\tmcp_sessions {\n\t\tstore redis {\n\t\t\taddress %s\n\t\t\thash_key %s\n\t\t}\n\t}\n", strings.Join(f.redis, " "), key)
		if len(f.handles) > 0 {
			fmt.Fprintf(&b, "\tmcp_sessions %s%s {\n\t\tstore redis {\n\t\t\taddress %s\n\t\t\thash_key %s\n\t\t}\n\t}\n",
				session.DefaultTableName, DefaultHandleTableSuffix, strings.Join(f.redis, " "), key)
		}
	}
	fmt.Fprintf(&b, "}\n\n%s {\n", site.address)
	if site.bind != "" {
		fmt.Fprintf(&b, "\tbind %s\n", site.bind)
	}
	if f.accessLog {
		// Session IDs are bearer-like: the access log leaves them out
		// (docs/operating.md, "Logs").
		b.WriteString("\tlog {\n\t\tformat filter {\n\t\t\trequest>headers>Mcp-Session-Id delete\n\t\t\tresp_headers>Mcp-Session-Id delete\n\t\t}\n\t}\n")
	}
	indent := "\t"
	if path := f.statusPath(site); path != "" {
		fmt.Fprintf(&b, "\thandle %s {\n\t\tmcp_status\n\t}\n\thandle {\n", path)
		indent = "\t\t"
	}
	b.WriteString(indent + "mcp_proxy")
	for _, u := range static {
		b.WriteString(" " + u)
	}
	b.WriteString(" {\n")
	if pattern != "" {
		fmt.Fprintf(&b, "%s\tdynamic unix_sockets %s\n", indent, pattern)
	}
	if f.failover {
		fmt.Fprintf(&b, "%s\tfailover reinitialize\n", indent)
	}
	if f.sealKey != "" {
		fmt.Fprintf(&b, "%s\tseal_session_ids %s\n", indent, f.sealKey)
	}
	for _, rule := range f.handles {
		fmt.Fprintf(&b, "%s\thandle %s %s %s\n", indent, rule.Tool, rule.From, rule.Header)
	}
	b.WriteString(indent + "}\n")
	if indent != "\t" {
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return string(caddyfile.Format([]byte(b.String()))), nil
}

// checkFree refuses to start when another process listens on the site's
// or the admin endpoint's address. Caddy listens with SO_REUSEPORT, so a
// second proxy on the same address would start, and the kernel would
// split connections between two session tables: exactly the broken
// sessions the proxy exists to prevent.
func (f proxyFlags) checkFree(site proxySite) error {
	addrs := map[string]string{"--from": net.JoinHostPort(site.bind, site.port)}
	if f.admin != "off" {
		if _, _, err := net.SplitHostPort(f.admin); err != nil {
			return fmt.Errorf("invalid --admin %q: give host:port, such as localhost:2019, or off", f.admin)
		}
		addrs["--admin"] = f.admin
	}
	for flag, addr := range addrs {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s %s: %v; is another caddy mcp-proxy (or another server) running there? Stop it or choose another address", flag, addr, err)
		}
		ln.Close()
	}
	return nil
}

// warnEmptyPattern warns when a socket pattern matches no socket yet: the
// proxy then answers 503 until one appears, and a typo in the pattern
// would go unnoticed.
func (f proxyFlags) warnEmptyPattern() {
	_, pattern, _ := f.upstreams()
	if pattern == "" {
		return
	}
	if matches, _ := filepath.Glob(pattern); len(matches) == 0 {
		fmt.Fprintf(os.Stderr, "warning: no socket matches %s yet; requests get 503 until one does (check the pattern and its directory)\n", pattern)
	}
}

// adaptCaddyfile adapts cfg to Caddy's JSON, as `caddy adapt` does.
func adaptCaddyfile(cfg string) ([]byte, error) {
	adapter := caddyconfig.GetAdapter("caddyfile")
	if adapter == nil {
		return nil, fmt.Errorf("this Caddy has no caddyfile adapter")
	}
	out, warnings, err := adapter.Adapt([]byte(cfg), map[string]any{"filename": "mcp-proxy"})
	if err != nil {
		return nil, fmt.Errorf("building the config: %v\nthe Caddyfile was:\n%s", err, cfg)
	}
	for _, w := range warnings {
		fmt.Fprintln(os.Stderr, "warning:", w.String())
	}
	return out, nil
}

// announce prints what to give MCP clients, the status page and where the
// session API is.
func (f proxyFlags) announce(site proxySite) {
	fmt.Printf("MCP proxy on %s: give MCP clients %s/<path of your server's MCP endpoint, e.g. /mcp>\n", site.url, site.url)
	if path := f.statusPath(site); path != "" {
		fmt.Printf("Status page: %s%s\n", site.url, path)
		if !site.loopback {
			fmt.Fprintf(os.Stderr, "warning: the status page names the upstreams to anyone who reaches %s; "+
				"behind authentication, use a Caddyfile (see --print-caddyfile and mcp_status in docs/caddyfile.md)\n", site.url)
		}
	}
	if f.admin != "off" {
		fmt.Printf("Sessions per upstream: http://%s/mcp_sessions/\n", f.admin)
	}
}
