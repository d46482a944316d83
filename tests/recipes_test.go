package tests

import (
	"bytes"
	"encoding/base64"
	"os"
	"testing"
)

// recipeDirs hold the deployment recipes: Dockerfiles, compose and
// Kubernetes YAML, and the Caddyfiles in them.
var recipeDirs = []string{"../examples/docker", "../examples/kubernetes"}

// TestDeploymentRecipes checks examples/docker and examples/kubernetes as
// far as can be done without a container runtime or a cluster: every YAML
// file parses, every Caddyfile (files and ConfigMaps) adapts and provisions
// with this repository's Caddy and configures mcp_proxy, the Dockerfiles
// parse and pass Docker's own checks (BuildKit's parser and linter), and
// every image tag and module path agrees with go.mod. Broken copies show
// that each check fails.
func TestDeploymentRecipes(t *testing.T) {
	// The replicas' shared secret, which their pods take from a Secret.
	t.Setenv("MCP_SESSIONS_HASH_KEY", base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)))
	facts := readGoMod(t)
	var caddyfiles []namedText
	for _, path := range recipeFiles(t, `\.ya?ml$`) {
		docs := parseYAML(t, path)
		caddyfiles = append(caddyfiles, embeddedCaddyfiles(path, docs)...)
		for _, p := range imageProblems(path, docs, facts) {
			t.Error(p)
		}
	}
	for _, path := range append(recipeFiles(t, `^Caddyfile$`), "../Caddyfile.example") {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		caddyfiles = append(caddyfiles, namedText{path, string(data)})
	}
	if len(caddyfiles) < 2 {
		t.Fatalf("found %d Caddyfiles in the recipes, want the docker one and the Kubernetes ConfigMap's", len(caddyfiles))
	}
	for _, c := range caddyfiles {
		if err := checkCaddyfile(c.text); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	dockerfiles := recipeFiles(t, `Dockerfile$`)
	if len(dockerfiles) < 2 {
		t.Fatalf("found Dockerfiles %v, want the Caddy one and the whoami one", dockerfiles)
	}
	for _, path := range dockerfiles {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range dockerfileProblems(string(data), facts) {
			t.Errorf("%s: %s", path, p)
		}
	}
	t.Run("negative controls", func(t *testing.T) { recipeNegativeControls(t, facts) })
}
