// Command oldsdk is a whoami MCP server built on go-sdk v1.0.0, whose newest
// protocol version is 2025-06-18, for the tests of failover across servers
// of mixed versions (tests/version_failover_test.go). It is a module of its
// own so that its go-sdk version stays apart from the tests' v1.8.0.
//
// Usage: oldsdk -name NAME -addr-file FILE
//
// It serves Streamable HTTP on /mcp at 127.0.0.1 on a free port, writes the
// address to FILE once listening, and has one tool, whoami, answering
// {"server": NAME, "session": <the session ID it sees>}.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"net/http"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// identity is the whoami tool's answer.
type identity struct {
	Server  string `json:"server"`
	Session string `json:"session"`
}

func main() {
	name := flag.String("name", "old", "the server's name, which whoami reports")
	addrFile := flag.String("addr-file", "", "write the listen address to this file once listening")
	flag.Parse()

	server := mcp.NewServer(&mcp.Implementation{Name: *name, Version: "v1.0.0"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "whoami", Description: "Report the server and the session ID it sees."},
		func(_ context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, identity, error) {
			return nil, identity{Server: *name, Session: req.Session.ID()}, nil
		})
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	if *addrFile != "" {
		tmp := *addrFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(ln.Addr().String()+"\n"), 0o644); err != nil {
			log.Fatal(err)
		}
		if err := os.Rename(tmp, *addrFile); err != nil {
			log.Fatal(err)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", handler)
	log.Printf("oldsdk %s listening on http://%s/mcp", *name, ln.Addr())
	log.Fatal(http.Serve(ln, mux))
}
