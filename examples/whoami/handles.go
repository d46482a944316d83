package whoami

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// HandleHeader is the x-mcp-header name of the count tool's handle
// parameter: 2026-07-28 clients send the handle in Mcp-Param-Handle too.
const HandleHeader = "Handle"

// Counter is the structured output of the open_counter and count tools.
type Counter struct {
	// Handle names the counter; open_counter mints it.
	Handle string `json:"handle" jsonschema:"the counter's handle"`
	// Server is the name of the server that holds the counter.
	Server string `json:"server" jsonschema:"name of the server that holds the counter"`
	// Count is how many times count was called with the handle.
	Count int `json:"count" jsonschema:"calls of count with this handle so far"`
}

// CountInput is the input of the count tool.
type CountInput struct {
	// Handle is a handle that open_counter returned.
	Handle string `json:"handle"`
}

// counters is the state that handles name: it lives in this process's
// memory only, as a browser or a database cursor would.
type counters struct {
	mu   sync.Mutex
	byID map[string]int
}

// addHandleTools adds open_counter, which mints a handle to a counter held
// in this process's memory, and count, which takes the handle as an
// argument marked x-mcp-header (SEP-2243) and answers an unknown handle
// with a tool error.
func addHandleTools(server *mcp.Server, name string) {
	c := &counters{byID: map[string]int{}}
	mcp.AddTool(server, &mcp.Tool{
		Name:        "open_counter",
		Description: "Open a counter held in this server's memory; later calls name it by the handle returned.",
	}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, Counter, error) {
		handle := rand.Text()
		c.mu.Lock()
		c.byID[handle] = 0
		c.mu.Unlock()
		return nil, Counter{Handle: handle, Server: name}, nil
	})
	mcp.AddTool(server, &mcp.Tool{
		Name:        "count",
		Description: "Count one more call on the counter the handle names.",
		InputSchema: map[string]any{
			"type":     "object",
			"required": []string{"handle"},
			"properties": map[string]any{
				"handle": map[string]any{"type": "string", "x-mcp-header": HandleHeader},
			},
		},
	}, func(_ context.Context, _ *mcp.CallToolRequest, in CountInput) (*mcp.CallToolResult, Counter, error) {
		c.mu.Lock()
		n, ok := c.byID[in.Handle]
		if ok {
			n++
			c.byID[in.Handle] = n
		}
		c.mu.Unlock()
		if !ok {
			return nil, Counter{}, fmt.Errorf("server %s holds no counter with handle %q", name, in.Handle)
		}
		return nil, Counter{Handle: in.Handle, Server: name, Count: n}, nil
	})
}
