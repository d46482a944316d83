package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Shape of the uploads part (issue 24, point 3: memory of sessionless POST bodies).
const (
	uploadClients = 128     // concurrent clients, each on its own connection
	uploadSize    = 4 << 20 // bytes of each POST's body: the go-sdk server's bound
	uploadRounds  = 4       // POSTs per client
)

// uploadRow is one proxy's figures in the uploads part.
type uploadRow struct {
	name     string
	route    string
	uploads  int           // answered 200 with the whole body counted
	failures int           // anything else
	took     time.Duration // all rounds of all clients
	hwm      int64         // Caddy's peak RSS, bytes
}

// uploadsPart starts 3 upstream doubles and, for stock reverse_proxy and
// the plugin's mcp_proxy in turn, a fresh Caddy in front of them; then
// uploadClients clients at once each POST uploadRounds bodies of exactly
// uploadSize bytes without Mcp-Session-Id to the doubles' /upload, which
// reads and counts them. It reports each Caddy's peak RSS.
func (e *env) uploadsPart() ([]uploadRow, error) {
	defer e.stopAll()
	_, addrs, err := e.startDoubles(3, time.Millisecond, time.Second, false)
	if err != nil {
		return nil, err
	}
	body := bytes.Repeat([]byte("0123456789abcdef"), uploadSize/16)
	rows := []uploadRow{
		{name: "stock `reverse_proxy`", route: stockRoute(addrs, "")},
		{name: "`mcp_proxy`", route: mcpProxyRoute(addrs, 0, "")},
	}
	for i := range rows {
		px, err := e.startCaddy("uploads-"+fmt.Sprint(i), rows[i].route)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(e.log, "uploads: %d clients × %d POSTs of %d MiB through %s\n", uploadClients, uploadRounds, uploadSize>>20, rows[i].name)
		rows[i].uploads, rows[i].failures, rows[i].took = upload(px.Addr(), body)
		rows[i].hwm = procStatus(px.Pid(), "VmHWM")
		px.Stop(5 * time.Second)
	}
	return rows, nil
}

// upload sends uploadRounds POSTs of body from each of uploadClients
// clients at once to addr's /upload and counts the answers that report
// the whole body.
func upload(addr string, body []byte) (ok, failed int, took time.Duration) {
	tr := &http.Transport{MaxConnsPerHost: uploadClients, MaxIdleConnsPerHost: uploadClients}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	want := fmt.Sprintf(`{"bytes":%d}`, len(body))
	var good, bad atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range uploadClients {
		wg.Go(func() {
			for range uploadRounds {
				req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/upload", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				resp, err := hc.Do(req)
				if err != nil {
					bad.Add(1)
					continue
				}
				got, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK && string(got) == want {
					good.Add(1)
				} else {
					bad.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(good.Load()), int(bad.Load()), time.Since(start)
}

func (r *report) writeUploads(w io.Writer) {
	fmt.Fprintf(w, "## Sessionless uploads\n\n")
	if r.uploadsErr != nil {
		fmt.Fprintf(w, "Error: %s\n\n", oneLine(r.uploadsErr.Error()))
		return
	}
	fmt.Fprintf(w, "%d clients at once, each on its own connection, POST %d bodies of exactly %d MiB without `Mcp-Session-Id` "+
		"through a fresh Caddy to 3 upstream doubles that read and count them.\n\n", uploadClients, uploadRounds, uploadSize>>20)
	fmt.Fprintf(w, "| proxy | uploads | failed | MiB/s | Caddy peak RSS (VmHWM) |\n|---|--:|--:|--:|--:|\n")
	for _, row := range r.uploads {
		fmt.Fprintf(w, "| %s | %d | %d | %.0f | %s |\n", row.name, row.uploads, row.failures,
			float64(row.uploads)*uploadSize/(1<<20)/row.took.Seconds(), mib(row.hwm))
	}
	if len(r.uploads) == 2 {
		fmt.Fprintf(w, "\nPeak RSS, `mcp_proxy` / stock: **%s×** (target: within 1.5×, %s).\n",
			ratio(float64(r.uploads[1].hwm), float64(r.uploads[0].hwm)),
			mark(r.uploads[0].hwm > 0 && float64(r.uploads[1].hwm) <= 1.5*float64(r.uploads[0].hwm)))
	}
	fmt.Fprintln(w)
}
