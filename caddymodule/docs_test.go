package caddymodule

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// The reference of every Caddyfile option, relative to this package.
const caddyfileDoc = "../docs/caddyfile.md"

// docBlock is one Caddyfile block the plugin parses: how to run its parser
// on one option, which sections of docs/caddyfile.md list its options, and
// which module structs hold their JSON fields.
type docBlock struct {
	name     string
	parse    func(opt string) error // parses a block holding the one line opt
	sections []string               // slugs of docs/caddyfile.md headings
	structs  []string               // Go types whose JSON fields the options set
}

// docBlocks are the plugin's Caddyfile blocks. A new parser needs a row here.
var docBlocks = []docBlock{
	{
		name:     "mcp_proxy",
		parse:    func(opt string) error { return adaptOption("mcp_proxy", opt) },
		sections: []string{"mcp_proxy", "the-mcp_sessions-global-option"},
		structs:  []string{"Handler", "TableSettings", "HandleSettings", "SessionSelection", "TableConfig"},
	},
	{
		name: "mcp_session",
		parse: func(opt string) error {
			return new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser("mcp_session {\n" + opt + "\n}"))
		},
		sections: []string{"mcp_proxy"},
		structs:  []string{"Handler", "TableSettings", "HandleSettings"},
	},
	{
		name: "lb_policy mcp_session",
		parse: func(opt string) error {
			return new(SessionSelection).UnmarshalCaddyfile(caddyfile.NewTestDispenser("mcp_session {\n" + opt + "\n}"))
		},
		sections: []string{"mcp_proxy"},
		structs:  []string{"SessionSelection"},
	},
	{
		name: "lb_policy least_sessions",
		parse: func(opt string) error {
			return new(LeastSessionsSelection).UnmarshalCaddyfile(caddyfile.NewTestDispenser("least_sessions {\n" + opt + "\n}"))
		},
		sections: []string{"lb_policy-least_sessions"},
		structs:  []string{"LeastSessionsSelection"},
	},
	{
		name: "mcp_status",
		parse: func(opt string) error {
			return new(StatusPage).UnmarshalCaddyfile(caddyfile.NewTestDispenser("mcp_status {\n" + opt + "\n}"))
		},
		sections: []string{"mcp_status"},
		structs:  []string{"StatusPage"},
	},
	{
		name: "mcp_sessions",
		parse: func(opt string) error {
			_, err := parseAppOption(caddyfile.NewTestDispenser("mcp_sessions {\n"+opt+"\n}"), nil)
			return err
		},
		sections: []string{"the-mcp_sessions-global-option", "mcp_proxy"},
		structs:  []string{"TableConfig", "TableSettings"},
	},
	{
		name: "store redis",
		parse: func(opt string) error {
			return new(RedisStore).UnmarshalCaddyfile(caddyfile.NewTestDispenser("redis {\n" + opt + "\n}"))
		},
		sections: []string{"store-redis"},
		structs:  []string{"RedisStore"},
	},
	{
		name: "store redis tls",
		parse: func(opt string) error {
			return new(RedisStore).UnmarshalCaddyfile(caddyfile.NewTestDispenser("redis {\ntls {\n" + opt + "\n}\n}"))
		},
		sections: []string{"store-redis"},
		structs:  []string{"RedisTLS"},
	},
	{
		name: "mcp matcher",
		parse: func(opt string) error {
			return new(MatchMCP).UnmarshalCaddyfile(caddyfile.NewTestDispenser("mcp {\n" + opt + "\n}"))
		},
		sections: []string{"the-mcp-matcher"},
		structs:  []string{"MatchMCP"},
	},
	{
		name: "dynamic unix_sockets",
		parse: func(opt string) error {
			return new(UnixSocketUpstreams).UnmarshalCaddyfile(caddyfile.NewTestDispenser("unix_sockets /run/mcp/*.sock {\n" + opt + "\n}"))
		},
		sections: []string{"dynamic-unix_sockets"},
		structs:  []string{"UnixSocketUpstreams"},
	},
}

// jsonNames maps the Caddyfile options whose JSON fields have other names
// to those names; every other option's field has the option's name.
var jsonNames = map[string][]string{
	"localhost_protection": {"disable_localhost_protection"},
	"legacy_sse":           {"legacy_sse_params", "disable_legacy_sse"},
	"address":              {"addresses"},
	"reclaim_header":       {"reclaim_headers"},
	"handle":               {"handles"},
	"unknown_handle":       {"unknown_handle", "unknown_handle_status"},
}

// adaptOption adapts a site whose directive (mcp_proxy, or reverse_proxy
// for the stock set) holds the one line opt.
func adaptOption(directive, opt string) error {
	_, _, err := adapt(":8000 {\n\t" + directive + " 127.0.0.1:9001 {\n\t\t" + opt + "\n\t}\n}\n")
	return err
}

// TestDocsCoverEveryOption checks, for every Caddyfile block of the plugin,
// that each option its parser accepts has a row in docs/caddyfile.md and a
// documented JSON field, and that each row names an option a parser
// accepts. The accepted options are found by asking the parsers: every
// identifier-shaped string in the package's source is offered to each
// parser, with no argument and with one, and is an option unless the
// parser answers that it does not recognise it. mcp_proxy's own options are
// those it accepts and stock reverse_proxy does not.
func TestDocsCoverEveryOption(t *testing.T) {
	candidates := sourceIdentifiers(t)
	stock := acceptedOptions(func(opt string) error { return adaptOption("reverse_proxy", opt) }, candidates)
	doc := readDoc(t, caddyfileDoc)
	fields := jsonFieldDocs(t)

	documented := map[string]map[string]bool{} // section -> options with a row
	accepted := map[string]bool{}              // section + " " + option, for the reverse check
	for _, b := range docBlocks {
		opts := acceptedOptions(b.parse, candidates)
		if b.name == "mcp_proxy" {
			opts = slices.DeleteFunc(opts, func(o string) bool { return slices.Contains(stock, o) })
		}
		if len(opts) == 0 {
			t.Errorf("%s: its parser accepts no option; is the block's parse function right?", b.name)
		}
		t.Logf("%s: %v", b.name, opts)
		for _, opt := range opts {
			found := false
			for _, sec := range b.sections {
				if documented[sec] == nil {
					documented[sec] = tableOptions(t, doc, sec)
				}
				found = found || documented[sec][opt]
				accepted[sec+" "+opt] = true
			}
			if !found {
				t.Errorf("%s accepts option %q, which has no row in the tables of %s (sections %v)", b.name, opt, caddyfileDoc, b.sections)
			}
			checkFieldDoc(t, fields, b, opt)
		}
	}
	for sec, opts := range documented {
		for opt := range opts {
			if !accepted[sec+" "+opt] {
				t.Errorf("%s, section #%s, has a row for %q, which no parser of that section accepts", caddyfileDoc, sec, opt)
			}
		}
	}
	jsonSection := docSection(t, doc, "json")
	for opt, names := range jsonNames {
		for _, n := range names {
			if !strings.Contains(jsonSection, `"`+n+`"`) {
				t.Errorf("%s#json does not say that option %s is %q in JSON", caddyfileDoc, opt, n)
			}
		}
	}
}

// checkFieldDoc checks that the JSON field that opt of block b sets is
// declared, with a doc comment, on one of b's module structs.
func checkFieldDoc(t *testing.T, fields map[string]map[string]bool, b docBlock, opt string) {
	t.Helper()
	names := jsonNames[opt]
	if names == nil {
		names = []string{opt}
	}
	for _, n := range names {
		found := false
		for _, s := range b.structs {
			if hasDoc, ok := fields[s][n]; ok {
				found = true
				if !hasDoc {
					t.Errorf("%s option %q: field %s.%s has no doc comment", b.name, opt, s, n)
				}
			}
		}
		if !found {
			t.Errorf("%s option %q: no JSON field %q on %v (add it to jsonNames if its name differs)", b.name, opt, n, b.structs)
		}
	}
}

// acceptedOptions returns the candidates that parse accepts as options.
func acceptedOptions(parse func(string) error, candidates []string) []string {
	var opts []string
	for _, c := range candidates {
		if recognised(parse, c) {
			opts = append(opts, c)
		}
	}
	return opts
}

// recognised reports whether parse takes name as an option: neither with
// no argument nor with one does it answer that name is unrecognised. Its
// other errors (a bad value, a missing argument) say it knows the option.
func recognised(parse func(string) error, name string) bool {
	word := regexp.MustCompile(`(^|[^a-z0-9_])` + regexp.QuoteMeta(name) + `([^a-z0-9_]|$)`)
	for _, line := range []string{name, name + " 1"} {
		err := safeParse(parse, line)
		if err != nil && strings.Contains(strings.ToLower(err.Error()), "unrecognized") && word.MatchString(err.Error()) {
			return false
		}
	}
	return true
}

// safeParse runs parse, turning a panic into an error.
func safeParse(parse func(string) error, line string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return parse(line)
}

// sourceIdentifiers returns every distinct string literal of the package's
// non-test source that could be an option name: lower-case letters, digits
// and underscores, starting with a letter.
func sourceIdentifiers(t *testing.T) []string {
	t.Helper()
	ident := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	seen := map[string]bool{}
	for _, f := range parsePackage(t) {
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil && ident.MatchString(s) {
					seen[s] = true
				}
			}
			return true
		})
	}
	names := make([]string, 0, len(seen))
	for s := range seen {
		names = append(names, s)
	}
	slices.Sort(names)
	return names
}

// parsePackage parses the package's non-test Go files with their comments.
func parsePackage(t *testing.T) []*ast.File {
	t.Helper()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	fset := token.NewFileSet()
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// jsonFieldDocs returns, per struct type of the package, its JSON field
// names and whether each has a doc comment.
func jsonFieldDocs(t *testing.T) map[string]map[string]bool {
	t.Helper()
	docs := map[string]map[string]bool{}
	for _, f := range parsePackage(t) {
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return true
			}
			fields := map[string]bool{}
			for _, fd := range st.Fields.List {
				if fd.Tag == nil {
					continue
				}
				tag, _ := strconv.Unquote(fd.Tag.Value)
				name, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
				if name == "" || name == "-" {
					continue
				}
				fields[name] = fd.Doc != nil && strings.TrimSpace(fd.Doc.Text()) != ""
			}
			docs[ts.Name.Name] = fields
			return true
		})
	}
	return docs
}

// tableOptions returns the option names in the first column of the tables
// in the section of doc under the heading whose slug is slug, sub-sections
// included.
func tableOptions(t *testing.T, doc *mdDoc, slug string) map[string]bool {
	t.Helper()
	opts := map[string]bool{}
	code := regexp.MustCompile("`([a-z][a-z0-9_]*)`")
	for _, line := range strings.Split(docSection(t, doc, slug), "\n") {
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimPrefix(line, "|"), "|")
		for _, m := range code.FindAllStringSubmatch(first, -1) {
			opts[m[1]] = true
		}
	}
	return opts
}

// docSection returns the text of doc from the heading whose slug is slug to
// the next heading of the same or a higher level.
func docSection(t *testing.T, doc *mdDoc, slug string) string {
	t.Helper()
	for i, h := range doc.headings {
		if h.slug != slug {
			continue
		}
		end := len(doc.lines)
		for _, next := range doc.headings[i+1:] {
			if next.level <= h.level {
				end = next.line
				break
			}
		}
		return strings.Join(doc.lines[h.line:end], "\n")
	}
	t.Fatalf("%s has no heading #%s", doc.path, slug)
	return ""
}

// TestDocsLinks checks every relative link and #anchor of the README,
// CONTRIBUTING.md, the pages of docs/ and the READMEs of examples/ and
// bench/: the file or directory exists, and the anchor is a heading of the
// target page (GitHub's slugs) or an <a id> or <a name> in it.
func TestDocsLinks(t *testing.T) {
	pages := []string{"../README.md", "../CONTRIBUTING.md"}
	for _, glob := range []string{"../docs/*.md", "../examples/*/README.md", "../bench/README.md"} {
		m, err := filepath.Glob(glob)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, m...)
	}
	docs := map[string]*mdDoc{}
	load := func(p string) *mdDoc {
		if docs[p] == nil {
			docs[p] = readDoc(t, p)
		}
		return docs[p]
	}
	checked := 0
	for _, p := range pages {
		for _, l := range load(p).links {
			target, frag, _ := strings.Cut(l.target, "#")
			path := p
			if target != "" {
				path = filepath.Join(filepath.Dir(p), target)
			}
			fi, err := os.Stat(path)
			switch {
			case err != nil:
				t.Errorf("%s:%d: link %q: %v", p, l.line, l.target, err)
				continue
			case frag == "":
			case fi.IsDir() || !strings.HasSuffix(path, ".md"):
				t.Errorf("%s:%d: link %q: an anchor into a file that is not Markdown", p, l.line, l.target)
			case !load(path).anchors[frag]:
				t.Errorf("%s:%d: link %q: %s has no heading or anchor #%s", p, l.line, l.target, path, frag)
			}
			checked++
		}
	}
	if checked < 100 {
		t.Errorf("checked only %d links; are the pages read?", checked)
	}
}

// mdDoc is a Markdown page: its lines, headings, anchors and links.
type mdDoc struct {
	path     string
	lines    []string
	headings []mdHeading
	anchors  map[string]bool
	links    []mdLink
}

type mdHeading struct {
	level, line int
	slug        string
}

type mdLink struct {
	line   int
	target string
}

var (
	mdHeadingRe = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	mdAnchorRe  = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	mdLinkRe    = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	mdCodeRe    = regexp.MustCompile("`[^`]*`")
	mdInlineRe  = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// readDoc reads and parses the Markdown page at path. Fenced code blocks
// and code spans hold no headings or links.
func readDoc(t *testing.T, path string) *mdDoc {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := &mdDoc{path: path, lines: strings.Split(string(raw), "\n"), anchors: map[string]bool{}}
	used := map[string]int{}
	fence := ""
	for i, line := range d.lines {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		for _, m := range mdAnchorRe.FindAllStringSubmatch(line, -1) {
			d.anchors[m[1]] = true
		}
		if m := mdHeadingRe.FindStringSubmatch(line); m != nil {
			slug := githubSlug(m[2])
			if n := used[slug]; n > 0 {
				used[slug]++
				slug = fmt.Sprintf("%s-%d", slug, n)
			} else {
				used[slug] = 1
			}
			d.headings = append(d.headings, mdHeading{level: len(m[1]), line: i, slug: slug})
			d.anchors[slug] = true
		}
		for _, m := range mdLinkRe.FindAllStringSubmatch(mdCodeRe.ReplaceAllString(line, "``"), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			d.links = append(d.links, mdLink{line: i + 1, target: target})
		}
	}
	return d
}

// githubSlug is the anchor GitHub gives a heading: its text without
// Markdown, lower-cased, without punctuation other than hyphens and
// underscores, spaces turned into hyphens.
func githubSlug(heading string) string {
	text := mdInlineRe.ReplaceAllString(heading, "$1")
	text = strings.NewReplacer("`", "", "*", "").Replace(text)
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestGitHubSlug pins the slugs of headings this repository links to.
func TestGitHubSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"The `mcp_proxy` directive":                          "the-mcp_proxy-directive",
		"Legacy HTTP+SSE transport (2024-11-05)":             "legacy-httpsse-transport-2024-11-05",
		"Session tables: the `mcp_sessions` app":             "session-tables-the-mcp_sessions-app",
		"Where Caddy's CPU goes":                             "where-caddys-cpu-goes",
		"gunicorn with `workers = N`":                        "gunicorn-with-workers--n",
		"[`least_sessions`](x.md)":                           "least_sessions",
		"The proxy on its own core: sidecar and proxy-bound": "the-proxy-on-its-own-core-sidecar-and-proxy-bound",
	} {
		if got := githubSlug(heading); got != want {
			t.Errorf("githubSlug(%q) = %q, want %q", heading, got, want)
		}
	}
}
