package caddymodule

import (
	"strings"
)

// placeholder returns the value of an {mcp.*} placeholder of the request.
// Values are computed when a placeholder is used, not per request.
func (ex *exchange) placeholder(key string) (any, bool) {
	name, ok := strings.CutPrefix(key, "mcp.")
	if !ok {
		return nil, false
	}
	switch name {
	case "method":
		return ex.method(), true
	case "name":
		return ex.name(), true
	case "era":
		return ex.era.String(), true
	case "protocol_version":
		return ex.version, true
	case "session_fingerprint":
		if ex.sessionID == "" {
			return "", true
		}
		return fingerprint(ex.sessionID), true
	case "pinned_upstream":
		return ex.pinned, true
	case "decision":
		return string(ex.decision), true
	case "host_for_upstream":
		return hostForUpstream(ex.repl), true
	}
	return nil, false
}
