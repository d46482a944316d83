// Package mcpwire holds the wire facts of MCP's Streamable HTTP and legacy
// HTTP+SSE transports that the plugin reads and writes, with no Caddy
// import: the JSON-RPC head scanner and the initialize check built on it
// (rpc.go, with fold.go's key folding rule), the one JSON-RPC error body
// and writer (errors.go), the one SSE event parser (sse.go), the
// Mcp-Session-Id checks (session.go), protocol versions (version.go), the
// method labels of the metrics (methods.go) and the handle a tool result
// holds (handle.go).
package mcpwire
