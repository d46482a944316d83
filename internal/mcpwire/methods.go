package mcpwire

// Methods are the JSON-RPC methods an MCP client sends a server, in
// protocol versions 2025-03-26 to 2026-07-28 (MCP schema, ClientRequest
// and ClientNotification of each version). They, [MethodOther] and
// [MethodUnknown] are the values of the metrics' `method` label, which
// keeps its cardinality bounded; a label's index is its place in Methods,
// then MethodOther, then MethodUnknown.
var Methods = [...]string{
	"initialize", "ping", "server/discover",
	"tools/list", "tools/call",
	"resources/list", "resources/templates/list", "resources/read", "resources/subscribe", "resources/unsubscribe",
	"prompts/list", "prompts/get",
	"completion/complete", "logging/setLevel", "subscriptions/listen",
	"tasks/get", "tasks/result", "tasks/list", "tasks/cancel",
	"notifications/initialized", "notifications/cancelled", "notifications/progress", "notifications/roots/list_changed",
}

// Label values beyond the spec's methods.
const (
	// MethodOther labels a method the spec does not define.
	MethodOther = "other"
	// MethodUnknown labels a request whose method the plugin did not read:
	// a request older than 2026-07-28 (no trusted Mcp-Method header) whose
	// body no `mcp` matcher read, a GET stream, a DELETE.
	MethodUnknown = "unknown"
)

// The label indexes beyond Methods, and their count.
const (
	IndexOther   = len(Methods)
	IndexUnknown = IndexOther + 1
	Labels       = IndexUnknown + 1
)

// methodIndexes maps a method to its index in Methods.
var methodIndexes = func() map[string]int {
	m := make(map[string]int, len(Methods))
	for i, name := range Methods {
		m[name] = i
	}
	return m
}()

// MethodIndex returns the label index of a method: "" is unknown, a method
// not in Methods other.
func MethodIndex(method string) int {
	if method == "" {
		return IndexUnknown
	}
	if i, ok := methodIndexes[method]; ok {
		return i
	}
	return IndexOther
}

// MethodLabel returns the label value of index i, 0 <= i < Labels.
func MethodLabel(i int) string {
	switch i {
	case IndexOther:
		return MethodOther
	case IndexUnknown:
		return MethodUnknown
	}
	return Methods[i]
}
