package tests

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/net/html"
)

// statusScreenshot, when set, is where TestStatusPageInBrowser saves its
// screenshot of the page, for the docs:
//
//	MCP_STATUS_SCREENSHOT=$PWD/docs/status-page.png go test ./tests -run TestStatusPageInBrowser
const statusScreenshotEnv = "MCP_STATUS_SCREENSHOT"

// statusTable is the session table of TestStatusPageInBrowser, its own so
// that no other test's sessions are counted on its page.
const statusTable = "status_page"

// TestStatusPageInBrowser loads the status page of a running Caddy with
// three upstreams, one draining and one killed, in headless Chromium, and
// reads what a person would read from the rendered DOM: sessions held and
// the bound, each upstream's live sessions, health and drain state, the
// split of requests by era, and no session ID anywhere. The same page on a
// site route sits behind basic_auth and has no buttons; the admin page's
// buttons drain only when posted from the page itself.
func TestStatusPageInBrowser(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		skipInterop(t, "chromium not installed (.ci/install-deps installs it)")
	}
	bs := startBackends(t, 3, false)
	hash, err := bcrypt.GenerateFromPassword([]byte("page-pass"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, fmt.Sprintf(`handle /mcp-status {
		basic_auth {
			ops %s
		}
		mcp_status {
			controls
		}
	}
	handle /mcp-status-ro {
		mcp_status
	}
	handle {
		mcp_proxy %s {
			table status_page
			health_uri /healthz
			health_interval 250ms
		}
	}`, hash, upstreams(bs)))

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	hc := newHTTPClient()
	defer hc.CloseIdleConnections()
	live := openLiveSessions(ctx, t, p.url(), hc, 9)
	owned := map[string]int{}
	var ids []string
	for _, s := range live {
		owned[s.creator]++
		ids = append(ids, s.cs.ID())
	}
	for _, b := range bs {
		if owned[b.Name()] == 0 {
			t.Fatalf("server %s owns no session (%v); the page could not tell its count from zero", b.Name(), owned)
		}
	}
	for _, s := range live { // one session of the first server evicted: the page counts it on that upstream
		if s.creator == bs[0].Name() {
			adminOK(t, http.MethodPost, "/mcp_sessions/evict", map[string]string{"table": statusTable, "session_id": s.cs.ID()}, nil)
			owned[bs[0].Name()]--
			break
		}
	}
	drainDeadline(t, statusTable, bs[1].Addr(), "10m")
	bs[2].Kill()

	page := "http://ops:page-pass@" + p.addr + "/mcp-status?refresh=off"
	var rows map[string]map[string]string
	var dom string
	deadline := time.Now().Add(20 * time.Second)
	for {
		dom = renderedDOM(t, chromium, page)
		rows = statusRows(t, dom)
		if rows[bs[2].Addr()]["health"] == "unavailable" || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("rows read from Chromium's DOM: %v", rows)
	if len(rows) == 0 {
		t.Fatalf("the page has no upstream rows; Chromium rendered:\n%s", dom)
	}

	want := map[string]map[string]string{
		bs[0].Addr(): {"health": "healthy", "live": strconv.Itoa(owned[bs[0].Name()]), "drain": "–", "evicted": "1", "failed_over": "0"},
		bs[1].Addr(): {"health": "healthy", "live": strconv.Itoa(owned[bs[1].Name()]), "evicted": "0"},
		bs[2].Addr(): {"health": "unavailable", "live": strconv.Itoa(owned[bs[2].Name()]), "drain": "–", "evicted": "0"},
	}
	for addr, fields := range want {
		for k, v := range fields {
			if rows[addr][k] != v {
				t.Errorf("upstream %s: the page shows %s %q, want %q", addr, k, rows[addr][k], v)
			}
		}
	}
	if d := rows[bs[1].Addr()]["drain"]; !strings.HasPrefix(d, "draining") || !strings.Contains(d, "deadline") {
		t.Errorf("draining upstream %s: the page shows drain %q, want draining with its deadline", bs[1].Addr(), d)
	}
	fields := statusFields(t, dom)
	for k, v := range map[string]string{"sessions": "8", "max_sessions": "100000", "draining": "1", "unavailable": "1"} {
		if fields[k] != v {
			t.Errorf("the page shows %s %q, want %q", k, fields[k], v)
		}
	}
	if n, _ := strconv.Atoi(fields["era:legacy_session"]); n < 8 {
		t.Errorf("the page shows %q requests of the session era, want at least the 9 sessions' calls", fields["era:legacy_session"])
	}
	for _, id := range ids {
		if strings.Contains(dom, id) {
			t.Fatalf("the page shows session ID %q", id)
		}
	}
	if strings.Count(dom, `<form method="post"`) != 3 || !strings.Contains(dom, `value="undrain"`) {
		t.Errorf("the page with controls should have a drain or undrain button per upstream, undrain for the draining one")
	}
	screenshot(t, chromium, page)

	if st := getStatus(t, hc, "http://"+p.addr+"/mcp-status"); st != http.StatusUnauthorized {
		t.Fatalf("the site's page without credentials answered %d, want 401 from basic_auth", st)
	}
	roDOM := renderedDOM(t, chromium, "http://"+p.addr+"/mcp-status-ro?refresh=off")
	if ro := statusRows(t, roDOM); ro[bs[0].Addr()]["live"] != want[bs[0].Addr()]["live"] || strings.Contains(roDOM, "<form") {
		t.Fatalf("the read-only page in Chromium: want the same figures and no buttons; rows %v, forms %d", ro, strings.Count(roDOM, "<form"))
	}
	rebound, err := http.NewRequest(http.MethodGet, "http://"+p.addr+"/mcp-status-ro", nil)
	if err != nil {
		t.Fatal(err)
	}
	rebound.Host = "evil.example" // a DNS name rebound to this loopback listener
	if resp, err := hc.Do(rebound); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("the page asked for with a foreign Host on loopback: %v %v; want 403 (DNS rebinding protection)", resp, err)
	} else {
		resp.Body.Close()
	}
	if st := postForm(t, hc, "http://"+p.addr+"/mcp-status-ro", "", url.Values{}); st != http.StatusMethodNotAllowed {
		t.Fatalf("a POST to the read-only page answered %d, want 405", st)
	}

	admin := "http://" + adminAddr + "/mcp_sessions/status"
	if st := getStatus(t, hc, admin); st != http.StatusOK {
		t.Fatalf("the admin endpoint's page answered %d, want 200", st)
	}
	checkStatusButtons(t, hc, "http://ops:page-pass@"+p.addr+"/mcp-status", "http://"+p.addr, bs[1].Addr())
	checkStatusButtons(t, hc, admin, "http://"+adminAddr, bs[1].Addr())
}

// postForm posts form to target with the given Origin ("" for none) and
// returns the status, not following redirects.
func postForm(t *testing.T, hc *http.Client, target, origin string, form url.Values) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, target, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	noRedirect := *hc
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// checkStatusButtons posts the undrain button of the page at target the way
// a browser does, from the page (origin) and from another site: only the
// first takes effect. upstream is draining when it is called.
func checkStatusButtons(t *testing.T, hc *http.Client, target, origin, upstream string) {
	t.Helper()
	form := url.Values{"action": {"undrain"}, "table": {statusTable}, "upstream": {upstream}}
	post := func(origin string) int { return postForm(t, hc, target, origin, form) }
	for _, origin := range []string{"", "http://evil.example"} {
		if st := post(origin); st != http.StatusForbidden {
			t.Errorf("undrain button posted with Origin %q answered %d, want 403", origin, st)
		}
	}
	if st := drainDeadline(t, statusTable, upstream, "10m"); !st.Draining {
		t.Fatalf("a refused button post undrained %s", upstream)
	}
	if st := post(origin); st != http.StatusSeeOther {
		t.Fatalf("undrain button posted from the page %s answered %d, want 303 back to the page", target, st)
	}
	var st struct{ Draining bool }
	adminOK(t, http.MethodGet, "/mcp_sessions/upstream?table="+statusTable+"&upstream="+url.QueryEscape(upstream), nil, &st)
	if st.Draining {
		t.Fatalf("the undrain button of %s left %s draining", target, upstream)
	}
	drainDeadline(t, statusTable, upstream, "10m") // as it was
}

// getStatus GETs url and returns the status.
func getStatus(t *testing.T, hc *http.Client, url string) int {
	t.Helper()
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// chromiumArgs are the flags of a headless Chromium run on this machine:
// its own profile directory, no sandbox (CI runs as root).
func chromiumArgs(t *testing.T, size string) []string {
	return []string{"--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
		"--user-data-dir=" + t.TempDir(), "--window-size=" + size}
}

// renderedDOM loads url in headless Chromium and returns the DOM it
// rendered.
func renderedDOM(t *testing.T, chromium, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, chromium, append(chromiumArgs(t, "1200,900"), "--dump-dom", url)...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil || out.Len() == 0 {
		t.Fatalf("chromium --dump-dom %s: %v\n%s", url, err, errOut.String())
	}
	return out.String()
}

// screenshot takes a PNG of url in Chromium, checks that it is one, and
// saves it where MCP_STATUS_SCREENSHOT says, if set.
func screenshot(t *testing.T, chromium, url string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "status.png")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, chromium, append(chromiumArgs(t, "1200,600"), "--hide-scrollbars", "--screenshot="+file, url)...).CombinedOutput()
	if err != nil {
		t.Fatalf("chromium --screenshot: %v\n%s", err, out)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(bytes.NewReader(b)); err != nil {
		t.Fatalf("the screenshot is not a PNG: %v", err)
	}
	if dst := os.Getenv(statusScreenshotEnv); dst != "" {
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot saved to %s", dst)
	}
}

// statusRows returns, per upstream row of the page (tr[data-upstream]),
// the text of its cells by data-field.
func statusRows(t *testing.T, dom string) map[string]map[string]string {
	t.Helper()
	rows := map[string]map[string]string{}
	walkDOM(t, dom, func(n *html.Node) {
		if n.Data != "tr" || attr(n, "data-upstream") == "" {
			return
		}
		row := map[string]string{}
		walkNode(n, func(c *html.Node) {
			if f := attr(c, "data-field"); f != "" {
				row[f] = strings.Join(strings.Fields(textOf(c)), " ")
			}
		})
		rows[attr(n, "data-upstream")] = row
	})
	return rows
}

// statusFields returns the page's data-field values outside the upstream
// rows, and its data-era values as "era:<label>".
func statusFields(t *testing.T, dom string) map[string]string {
	t.Helper()
	fields := map[string]string{}
	walkDOM(t, dom, func(n *html.Node) {
		if f := attr(n, "data-field"); f != "" && n.Data == "dd" {
			fields[f] = strings.TrimSpace(textOf(n))
		}
		if e := attr(n, "data-era"); e != "" {
			fields["era:"+e] = strings.TrimSpace(textOf(n))
		}
	})
	return fields
}

// walkDOM parses dom and calls f on every element.
func walkDOM(t *testing.T, dom string, f func(*html.Node)) {
	t.Helper()
	root, err := html.Parse(strings.NewReader(dom))
	if err != nil {
		t.Fatal(err)
	}
	walkNode(root, f)
}

// walkNode calls f on n and every element below it.
func walkNode(n *html.Node, f func(*html.Node)) {
	if n.Type == html.ElementNode {
		f(n)
	}
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		walkNode(c, f)
	}
}

// attr returns n's attribute key, or "".
func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

// textOf returns the text below n.
func textOf(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return b.String()
}
