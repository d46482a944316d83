package tests

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-mcp-affinity/caddy-mcp-affinity/internal/redistest"
)

// revokeTable is one table of a revokeFleet: its name, its mcp_sessions
// settings, whether its handler seals session IDs, and whether it shares
// Redis.
type revokeTable struct {
	name     string
	settings string
	sealed   bool
	shared   bool
}

// startRevokeFleet starts the fleet: every table fails sessions over; a
// sealed table's handler seals IDs with one key the replicas share; a
// shared table keeps its sessions in the Redis too.
func startRevokeFleet(t *testing.T, tables []revokeTable) *fleet {
	global := func(f *fleet) string {
		var global strings.Builder
		for _, tb := range tables {
			store := ""
			if tb.shared {
				store = redisStore(f.redis.Addr, sharedTimeout)
			}
			fmt.Fprintf(&global, "mcp_sessions %s {\n\t\tfailover reinitialize\n\t\t%s\n\t\t%s\n\t}\n\t", tb.name, tb.settings, store)
		}
		global.WriteString(storeLog)
		return global.String()
	}
	body := func(f *fleet) string {
		var body strings.Builder
		for _, tb := range tables {
			seal := ""
			if tb.sealed {
				seal = "seal_session_ids {env.REVOKE_SEAL_KEY}"
			}
			fmt.Fprintf(&body, "handle_path /%s/* {\n\t\tmcp_proxy %s {\n\t\t\ttable %s\n\t\t\t%s\n\t\t}\n\t}\n\t", tb.name, upstreams(f.srv), tb.name, seal)
		}
		return body.String()
	}
	return newFleet(t, withRedis(), withServers(3, false), withReplicas(2, "c", global, body, "REVOKE_SEAL_KEY="+newSealKey(t)))
}

// sessionOn opens raw sessions of table through the first replica until
// one is on the server named server, and returns its ID.
func (f *fleet) sessionOn(t *testing.T, hc *http.Client, table, server string) string {
	t.Helper()
	for range 30 {
		id := mcpInitialize(t, hc, tableURL(f.rs[0], table))
		status, who := rawWhoami(t, hc, tableURL(f.rs[0], table), id)
		if status != http.StatusOK {
			t.Fatalf("table %s: the first call of a new session: %d", table, status)
		}
		if who.Server == server {
			return id
		}
	}
	t.Fatalf("table %s: 30 new sessions, none on %s", table, server)
	return ""
}

// endSession sends the DELETE that ends session id through url and
// returns its status.
func endSession(t testing.TB, hc *http.Client, url, id string) int {
	t.Helper()
	hdr := map[string][]string{"Mcp-Session-Id": {id}, "Mcp-Protocol-Version": {"2025-11-25"}}
	return send(t, hc, http.MethodDelete, url, hdr, "").status
}

// statusesVia returns the status of a whoami call of session id through
// each replica of the fleet, in order, for table.
func (f *fleet) statusesVia(t *testing.T, hc *http.Client, table, id string) []int {
	t.Helper()
	out := make([]int, len(f.rs))
	for i, r := range f.rs {
		out[i], _ = rawWhoami(t, hc, tableURL(r, table), id)
	}
	return out
}

// refusedFailovers returns how many failovers replica r refused on table,
// by any cause.
func refusedFailovers(t testing.TB, r *replica, table string) int {
	return int(metricSum(t, []*replica{r}, "caddy_mcp_failovers_total", map[string]string{"table": table, "result": "refused"}))
}

// tombstonesIn returns how many session tombstones the Redis holds.
func tombstonesIn(s *redistest.Server) int {
	n, _ := strconv.Atoi(s.Do("EVAL", "return #redis.call('KEYS', ARGV[1])", "0", "*:x:*"))
	return n
}

// keepUsing calls whoami in each of ids through each replica in turn,
// every interval, until stop is closed; it returns the statuses that were
// not 200.
func (f *fleet) keepUsing(hc *http.Client, table string, ids []string, interval time.Duration, stop <-chan struct{}) <-chan []int {
	out := make(chan []int, 1)
	go func() {
		var bad []int
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				out <- bad
				return
			case <-tick.C:
			}
			for _, id := range ids {
				if st := tryWhoami(hc, tableURL(f.rs[i%len(f.rs)], table), id); st != http.StatusOK {
					bad = append(bad, st)
				}
			}
		}
	}()
	return out
}

// tryWhoami calls whoami in session id through url, as rawWhoami does, off
// the test's goroutine: it returns the status, or -1 when the call failed.
func tryWhoami(hc *http.Client, url, id string) int {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(tsWhoamiCall))
	if err != nil {
		return -1
	}
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := hc.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}
