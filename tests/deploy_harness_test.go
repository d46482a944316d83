package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	dfparser "github.com/moby/buildkit/frontend/dockerfile/parser"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.yaml.in/yaml/v3"
	"golang.org/x/mod/modfile"
)

// Deployment helpers: the rolling deploy script's runs and observations,
// and the checks of the recipes (Dockerfiles, Compose, Kubernetes).

// goModFacts are what the recipes must agree with: the module path, the Go
// version (go directive, major.minor) and the Caddy release.
type goModFacts struct {
	module, goVersion, caddy string
}

// readGoMod reads ../go.mod.
func readGoMod(t *testing.T) goModFacts {
	t.Helper()
	data, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse("go.mod", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	facts := goModFacts{module: f.Module.Mod.Path, goVersion: strings.Join(strings.SplitN(f.Go.Version, ".", 3)[:2], ".")}
	for _, r := range f.Require {
		if r.Mod.Path == "github.com/caddyserver/caddy/v2" {
			facts.caddy = strings.TrimPrefix(r.Mod.Version, "v")
		}
	}
	return facts
}

// recipeFiles returns the files under the recipe directories whose names match pattern.
func recipeFiles(t *testing.T, pattern string) []string {
	t.Helper()
	re := regexp.MustCompile(pattern)
	var out []string
	for _, dir := range recipeDirs {
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && re.MatchString(d.Name()) {
				out = append(out, path)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// namedText is a file's, or a YAML value's, text and where it came from.
type namedText struct{ name, text string }

// parseYAML decodes every document of a YAML file; Kubernetes documents
// must name their apiVersion, kind and metadata.name.
func parseYAML(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := decodeYAML(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for i, d := range docs {
		if strings.Contains(path, "kubernetes") && (d["apiVersion"] == nil || d["kind"] == nil || dig(d, "metadata", "name") == nil) {
			t.Errorf("%s: document %d lacks apiVersion, kind or metadata.name", path, i+1)
		}
	}
	return docs
}

// decodeYAML decodes a multi-document YAML stream (yaml.v3, anchors and merge keys resolved).
func decodeYAML(data []byte) ([]map[string]any, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
	if len(docs) == 0 {
		return nil, errors.New("no YAML document")
	}
	return docs, nil
}

// dig walks nested maps by keys; nil when a key is missing.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// embeddedCaddyfiles returns the Caddyfiles held in ConfigMaps.
func embeddedCaddyfiles(path string, docs []map[string]any) []namedText {
	var out []namedText
	for _, d := range docs {
		if d["kind"] != "ConfigMap" {
			continue
		}
		data, _ := d["data"].(map[string]any)
		for key, v := range data {
			if s, ok := v.(string); ok && strings.HasSuffix(key, "Caddyfile") {
				out = append(out, namedText{fmt.Sprintf("%s: ConfigMap %v key %s", path, dig(d, "metadata", "name"), key), s})
			}
		}
	}
	return out
}

// checkCaddyfile adapts a Caddyfile as `caddy adapt` does, requires it to
// configure the plugin, and provisions the result without starting it
// (caddy.Validate), so that module options are checked too.
func checkCaddyfile(text string) error {
	js, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(text), nil)
	if err != nil {
		return fmt.Errorf("caddy adapt: %w", err)
	}
	if len(warnings) > 0 {
		return fmt.Errorf("caddy adapt warns: %v", warnings)
	}
	if !bytes.Contains(js, []byte(`"handler":"mcp_session"`)) {
		return errors.New("it does not configure mcp_proxy (no mcp_session handler)")
	}
	var cfg caddy.Config
	if err := json.Unmarshal(js, &cfg); err != nil {
		return err
	}
	if err := caddy.Validate(&cfg); err != nil {
		return fmt.Errorf("caddy validate: %w", err)
	}
	return nil
}

// imageProblems checks the images of compose services and Kubernetes
// containers: the proxy image is tagged with go.mod's Caddy release.
func imageProblems(path string, docs []map[string]any, facts goModFacts) []string {
	var problems []string
	for _, img := range images(docs) {
		name, tag, _ := strings.Cut(img, ":")
		if name == "caddy-mcp-affinity" && tag != facts.caddy {
			problems = append(problems, fmt.Sprintf("%s: image %s: the tag must be go.mod's Caddy release %s", path, img, facts.caddy))
		}
		if tag == "" || tag == "latest" {
			problems = append(problems, fmt.Sprintf("%s: image %s has no pinned tag", path, img))
		}
	}
	return problems
}

// images lists the images named by compose services and pod templates.
func images(docs []map[string]any) []string {
	var out []string
	for _, d := range docs {
		services, _ := d["services"].(map[string]any)
		for _, s := range services {
			if img, ok := dig(s, "image").(string); ok {
				out = append(out, img)
			}
		}
		for _, spec := range []any{dig(d, "spec"), dig(d, "spec", "template", "spec")} {
			containers, _ := dig(spec, "containers").([]any)
			for _, c := range containers {
				if img, ok := dig(c, "image").(string); ok {
					out = append(out, img)
				}
			}
		}
	}
	return out
}

// dockerfileProblems parses a Dockerfile with BuildKit and checks its base
// images and xcaddy module against go.mod; Docker's lint warnings count too.
func dockerfileProblems(text string, facts goModFacts) []string {
	var problems []string
	res, err := dfparser.Parse(strings.NewReader(text))
	if err != nil {
		return []string{fmt.Sprintf("parse: %v", err)}
	}
	lint := linter.New(&linter.Config{Warn: func(rule, _, _, msg string, _ []dfparser.Range) {
		problems = append(problems, fmt.Sprintf("docker lint %s: %s", rule, msg))
	}})
	stages, metaArgs, err := instructions.Parse(res.AST, lint)
	if err != nil {
		return append(problems, fmt.Sprintf("parse: %v", err))
	}
	args := map[string]string{}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			args[kv.Key] = kv.ValueString()
		}
	}
	for _, s := range stages {
		problems = append(problems, baseImageProblems(s.BaseName, args, facts)...)
	}
	if strings.Contains(text, "xcaddy build") && !strings.Contains(text, "--with "+facts.module+"@") {
		problems = append(problems, fmt.Sprintf("xcaddy does not build go.mod's module %s", facts.module))
	}
	return problems
}

// baseImageProblems expands a FROM image with the Dockerfile's ARG defaults
// and checks caddy and golang tags against go.mod.
func baseImageProblems(base string, args map[string]string, facts goModFacts) []string {
	env := make([]string, 0, len(args))
	for k, v := range args {
		env = append(env, k+"="+v)
	}
	img, _, err := shell.NewLex('\\').ProcessWord(base, shell.EnvsFromSlice(env))
	if err != nil {
		return []string{fmt.Sprintf("FROM %s: %v", base, err)}
	}
	name, tag, _ := strings.Cut(img, ":")
	switch {
	case name == "caddy" && tag != facts.caddy && tag != facts.caddy+"-builder":
		return []string{fmt.Sprintf("FROM %s: the tag must be go.mod's Caddy release %s (or %s-builder)", img, facts.caddy, facts.caddy)}
	case name == "golang" && !strings.HasPrefix(tag, facts.goVersion):
		return []string{fmt.Sprintf("FROM %s: the tag must start with go.mod's Go version %s", img, facts.goVersion)}
	}
	return nil
}

// recipeNegativeControls breaks copies of the recipes and expects each
// check to say so.
func recipeNegativeControls(t *testing.T, facts goModFacts) {
	old := facts
	old.caddy = "2.10.0"
	dockerfile, err := os.ReadFile("../examples/docker/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if p := dockerfileProblems(string(dockerfile), old); len(p) == 0 {
		t.Error("a Dockerfile whose caddy tag differs from go.mod passes")
	}
	if p := dockerfileProblems(strings.Replace(string(dockerfile), "FROM caddy:${CADDY_VERSION}-builder AS builder", "FROM caddy:${CADDY_VERSION}-builder as builder", 1), facts); len(p) == 0 {
		t.Error("a Dockerfile Docker's linter warns about passes")
	}
	if err := checkCaddyfile(":8000 {\n\tmcp_proxy 127.0.0.1:9001 {\n\t\tmax_sesions 10\n\t}\n}\n"); err == nil {
		t.Error("a Caddyfile with a misspelt mcp_proxy option passes")
	}
	missingCA := ":8000 {\n\tmcp_proxy 127.0.0.1:9001 {\n\t\ttransport http {\n\t\t\ttls_trust_pool file /nonexistent/ca.pem\n\t\t}\n\t}\n}\n"
	if err := checkCaddyfile(missingCA); err == nil {
		t.Error("a Caddyfile that adapts but does not provision passes")
	}
	if _, err := decodeYAML([]byte("a: [1, 2\n")); err == nil {
		t.Error("malformed YAML parses")
	}
	docs := []map[string]any{{"services": map[string]any{"caddy": map[string]any{"image": "caddy-mcp-affinity:2.10.0"}}}}
	if p := imageProblems("compose.yaml", docs, facts); len(p) == 0 {
		t.Error("a proxy image tagged with another Caddy release passes")
	}
}

// rdRequireTools skips the test when the script cannot run here.
func rdRequireTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the rolling deploy script needs %s, which is not installed: %v", tool, err)
		}
	}
}

// rdProcessGone reports whether process pid has exited. A zombie, which
// nobody reaped yet, has exited too.
func rdProcessGone(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return true
	}
	if err := p.Signal(syscall.Signal(0)); err != nil {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces, so look after the last ')'.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && strings.HasPrefix(s[i+1:], " Z")
}

// runRollingDeploy runs the script with args and returns its combined
// output and exit code.
func runRollingDeploy(t testing.TB, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{rdScript}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second // a background process holding the output must not hang the test
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		return out.String(), exit.ExitCode()
	default:
		t.Fatalf("running %s: %v\n%s", rdScript, err, out.String())
		return "", -1
	}
}

// rdObservation is one poll of an upstream's status by the test.
type rdObservation struct {
	at       time.Time // when the answer arrived
	draining bool
	live     int64
}

// rdSessionOn opens sessions until one is owned by server and returns it.
// The others stay open until the test ends, so that a least_sessions
// fallback, whose ties are broken at random, soon picks server too.
func rdSessionOn(ctx context.Context, t testing.TB, url string, hc *http.Client, server string) *mcp.ClientSession {
	t.Helper()
	var landed []string
	for range 12 {
		s := openLiveSession(ctx, t, url, hc)
		if s.first.Server == server {
			return s.cs
		}
		landed = append(landed, s.first.Server)
	}
	var health, tables any
	_, _ = adminDo(http.MethodGet, "/reverse_proxy/upstreams", nil, &health)
	_, _ = adminDo(http.MethodGet, "/mcp_sessions/", nil, &tables)
	t.Fatalf("no session landed on %s in 12 tries: %v; upstream health %v; tables %v", server, landed, health, tables)
	return nil
}
