package main

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Variants of the mcp_proxy (3) row: the same row under other settings of
// the Caddy process or the generated Caddyfile, run beside the default row
// so that before and after are measured in one run.
//
//	-variants 'gogc=200,gogc=400+memlimit=1GiB,keepalive_idle_conns=64,flush_interval=-1,h2c,proxy_log=off'
//
// Variants are separated by commas, settings within one by "+".

// variantEnv are settings that become environment variables of Caddy.
var variantEnv = map[string]string{"gogc": "GOGC", "memlimit": "GOMEMLIMIT", "gomaxprocs": "GOMAXPROCS"}

// variantTransport are subdirectives of reverse_proxy's http transport.
var variantTransport = []string{
	"keepalive", "keepalive_interval", "keepalive_idle_conns", "keepalive_idle_conns_per_host",
	"max_conns_per_host", "read_buffer", "write_buffer", "max_response_header", "versions", "compression", "dial_timeout",
}

// variantProxy are subdirectives of reverse_proxy itself.
var variantProxy = []string{"flush_interval", "request_buffers", "response_buffers", "stream_buffer_size", "journal"}

// proxyLogOff is the global option of the proxy_log=off variant: the
// default log leaves out reverse_proxy's logger, so that logger has no core
// and its per-request `zap.Logger.With` encodes nothing.
const proxyLogOff = `
	log default {
		exclude http.handlers.reverse_proxy
	}`

// variant is one extra mcp_proxy row.
type variant struct {
	name      string   // as given: gogc=400+memlimit=1GiB
	env       []string // GOGC=400, GOMEMLIMIT=1GiB
	transport []string // lines of the transport block
	protocol  string   // the transport module: mcp (mcp_proxy's default) or http
	proxy     []string // lines of the mcp_proxy block
	global    string   // global options
}

// parseVariants reads the -variants flag.
func parseVariants(s string) ([]variant, error) {
	var out []variant
	for _, name := range strings.Split(s, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		v, err := parseVariant(name)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func parseVariant(name string) (variant, error) {
	v := variant{name: name}
	for _, set := range strings.Split(name, "+") {
		key, val, hasVal := strings.Cut(set, "=")
		switch {
		case key == "transport" && (val == "http" || val == "mcp"):
			v.protocol = val
		case key == "h2c" && !hasVal:
			v.transport = append(v.transport, "versions h2c")
		case set == "proxy_log=off":
			v.global = proxyLogOff
		case !hasVal || val == "":
			return v, fmt.Errorf("variant %q: %q needs a value (key=value); only h2c stands alone", name, set)
		case variantEnv[key] != "":
			v.env = append(v.env, variantEnv[key]+"="+val)
		case slices.Contains(variantTransport, key):
			v.transport = append(v.transport, key+" "+val)
		case slices.Contains(variantProxy, key):
			v.proxy = append(v.proxy, key+" "+val)
		default:
			return v, fmt.Errorf("variant %q: unknown setting %q; known: h2c, proxy_log=off, transport=http|mcp, %s, %s, %s", name, key,
				strings.Join(slices.Sorted(maps.Keys(variantEnv)), ", "), strings.Join(variantTransport, ", "), strings.Join(variantProxy, ", "))
		}
	}
	return v, nil
}

// block is the variant's lines for the mcp_proxy block (mcpProxyRoute's extra).
func (v variant) block() string {
	var b strings.Builder
	for _, l := range v.proxy {
		fmt.Fprintf(&b, "\t\t%s\n", l)
	}
	if len(v.transport) > 0 || v.protocol != "" {
		fmt.Fprintf(&b, "\t\ttransport %s {\n", cmp.Or(v.protocol, "mcp"))
		for _, l := range v.transport {
			fmt.Fprintf(&b, "\t\t\t%s\n", l)
		}
		b.WriteString("\t\t}\n")
	}
	return b.String()
}

// label is the row's name: the base label and the settings, as a user
// would write them (GOGC=400, keepalive_idle_conns 64).
func (v variant) label(base string) string {
	parts := slices.Concat(v.env, v.proxy, v.transport)
	if v.protocol != "" {
		parts = append(parts, "transport "+v.protocol)
	}
	if v.global != "" {
		parts = append(parts, "reverse_proxy logger excluded")
	}
	return base + " " + strings.Join(parts, ", ")
}

// scenario is the mcp_proxy (3) row under the variant.
func (v variant) scenario(base scenario) scenario {
	sc := base
	sc.key, sc.label, sc.env = base.key+"+"+v.name, v.label(base.label), v.env
	sc.h2c, sc.global = slices.Contains(v.transport, "versions h2c"), v.global
	sc.route = func(u []string) string { return mcpProxyRoute(u, 0, v.block()) }
	return sc
}

// rows returns the throughput rows selected with -scenarios, each variant
// of mcp_proxy3 right after it (or last, when mcp_proxy3 is not selected).
func (o *options) rows() []scenario {
	var out []scenario
	var base scenario
	for _, sc := range scenarios {
		if sc.key == "mcp_proxy3" {
			base = sc
		}
		if !slices.Contains(o.scenarios, sc.key) {
			continue
		}
		out = append(out, sc)
		if sc.key == "mcp_proxy3" {
			out = append(out, o.variantRows(base)...)
		}
	}
	if !slices.Contains(o.scenarios, "mcp_proxy3") {
		out = append(out, o.variantRows(base)...)
	}
	return out
}

func (o *options) variantRows(base scenario) []scenario {
	var out []scenario
	for _, v := range o.variants {
		out = append(out, v.scenario(base))
	}
	return out
}
