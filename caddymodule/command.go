package caddymodule

import (
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
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
		Usage: `--to <upstream> [--to <upstream>...] [--from <addr>] [--failover] [--redis <host:port>] [--seal-key <key>] [--admin <addr>|off] [--access-log] [--debug] [--print-caddyfile]`,
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
that uses the same Redis; --seal-key seals the upstream into the session ID
instead (32 random bytes in base64; {env.NAME} or {file.path} keep it off
the command line). --admin is Caddy's admin endpoint, where the session
API lives (default localhost:2019; off turns it off).

--print-caddyfile prints the Caddyfile these flags run, and exits.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.Flags().StringP("from", "f", defaultProxyFrom, "Address on which to receive MCP traffic")
			cmd.Flags().StringArrayP("to", "t", nil, "Upstream MCP server: host:port, unix//path or a unix//path/pattern-*.sock (repeatable)")
			cmd.Flags().Bool("failover", false, "Move sessions of an upstream that is gone to another upstream")
			cmd.Flags().StringArray("redis", nil, "Redis address host:port sharing the session table (repeatable for a cluster)")
			cmd.Flags().String("seal-key", "", "Key that seals the upstream into session IDs (base64, 32 bytes)")
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
	sealKey   string
	admin     string
	accessLog bool
	debug     bool
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
	if fs.Bool("print-caddyfile") {
		fmt.Print(cfg)
		return caddy.ExitCodeSuccess, nil
	}
	config, err := adaptCaddyfile(cfg)
	if err != nil {
		return caddy.ExitCodeFailedStartup, err
	}
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
		from: fs.String("from"), failover: fs.Bool("failover"), sealKey: fs.String("seal-key"),
		admin: fs.String("admin"), accessLog: fs.Bool("access-log"), debug: fs.Bool("debug"),
	}
	var err error
	if f.to, err = fs.GetStringArray("to"); err != nil {
		return f, fmt.Errorf("invalid --to: %v", err)
	}
	if f.redis, err = fs.GetStringArray("redis"); err != nil {
		return f, fmt.Errorf("invalid --redis: %v", err)
	}
	return f, f.check()
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
	for flag, values := range named {
		for _, v := range values {
			if err := checkToken(v); err != nil {
				return fmt.Errorf("invalid %s %q: %v", flag, v, err)
			}
		}
	}
	return nil
}

// checkToken reports why v is not one plain Caddyfile token, or nil.
func checkToken(v string) error {
	switch {
	case v == "":
		return fmt.Errorf("empty")
	case v == "{" || v == "}" || strings.HasPrefix(v, "#"):
		return fmt.Errorf("not an address or key")
	case strings.ContainsAny(v, " \t\r\n\"`\\"):
		return fmt.Errorf("must not contain spaces, quotes or backslashes")
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
	address string // the Caddyfile site address
	bind    string // the host to bind, "" for all interfaces
	url     string // the base URL clients use
}

// site works out the site from --from: without a scheme, plain HTTP on the
// given host (bound to it) and port; with https, Caddy's automatic HTTPS.
func (f proxyFlags) site() (proxySite, error) {
	from := f.from
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
		return proxySite{address: from, url: strings.TrimSuffix(from, "/")}, nil
	}
	if a.Port == "" {
		a.Port = "80"
	}
	host := a.Host
	if host == "" {
		host = "localhost"
	}
	return proxySite{address: "http://:" + a.Port, bind: a.Host, url: "http://" + net.JoinHostPort(host, a.Port)}, nil
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
		fmt.Fprintf(&b, "\tmcp_sessions {\n\t\tstore redis {\n\t\t\taddress %s\n\t\t}\n\t}\n", strings.Join(f.redis, " "))
	}
	fmt.Fprintf(&b, "}\n\n%s {\n", site.address)
	if site.bind != "" {
		fmt.Fprintf(&b, "\tbind %s\n", site.bind)
	}
	if f.accessLog {
		b.WriteString("\tlog\n")
	}
	b.WriteString("\tmcp_proxy")
	for _, u := range static {
		b.WriteString(" " + u)
	}
	b.WriteString(" {\n")
	if pattern != "" {
		fmt.Fprintf(&b, "\t\tdynamic unix_sockets %s\n", pattern)
	}
	if f.failover {
		b.WriteString("\t\tfailover reinitialize\n")
	}
	if f.sealKey != "" {
		fmt.Fprintf(&b, "\t\tseal_session_ids %s\n", f.sealKey)
	}
	b.WriteString("\t}\n}\n")
	return b.String(), nil
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

// announce prints what to give MCP clients and where the session API is.
func (f proxyFlags) announce(site proxySite) {
	fmt.Printf("MCP proxy on %s: give MCP clients %s/<path of your server's MCP endpoint, e.g. /mcp>\n", site.url, site.url)
	if f.admin != "off" {
		fmt.Printf("Sessions per upstream: http://%s/mcp_sessions/\n", f.admin)
	}
}
