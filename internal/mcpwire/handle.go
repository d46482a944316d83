package mcpwire

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// HandleFromText names the text content of a tool result as where its
// handle is, instead of a JSON pointer into its structuredContent.
const HandleFromText = "text"

// ResultHandle reads one JSON-RPC message of a tools/call response body:
// whether it is the call's response (it has an id and a result or an
// error; notifications and requests on the same SSE stream are not), and
// the handle the result holds at from, a JSON pointer (RFC 6901) into
// structuredContent or HandleFromText. The handle is "" for an error, a
// result with isError, or no value there. A string is the handle as it
// is; an integer or a boolean is written as SEP-2243 writes it into its
// Mcp-Param header (decimal digits, true or false); other values are no
// handle.
func ResultHandle(msg []byte, from string) (handle string, response bool) {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Result *toolResult     `json:"result"`
		Error  json.RawMessage `json:"error"`
	}
	if json.Unmarshal(msg, &m) != nil || len(m.ID) == 0 || m.Result == nil && m.Error == nil {
		return "", false
	}
	res := m.Result
	if res == nil || res.IsError {
		return "", true
	}
	if from == HandleFromText {
		for _, c := range res.Content {
			if c.Type == "text" {
				return strings.TrimSpace(c.Text), true
			}
		}
		return "", true
	}
	return primitiveAt(res.StructuredContent, from), true
}

// toolResult is what ResultHandle reads of a CallToolResult.
type toolResult struct {
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StructuredContent json.RawMessage `json:"structuredContent"`
	IsError           bool            `json:"isError"`
}

// primitiveAt returns the string form of the primitive value at JSON
// pointer ptr in doc, or "".
func primitiveAt(doc json.RawMessage, ptr string) string {
	v := doc
	for _, token := range strings.Split(ptr, "/")[1:] {
		token = strings.ReplaceAll(strings.ReplaceAll(token, "~1", "/"), "~0", "~")
		if v = member(v, token); v == nil {
			return ""
		}
	}
	return primitive(v)
}

// member returns the member token of object v, or its element at index
// token if v is an array; nil if there is none.
func member(v json.RawMessage, token string) json.RawMessage {
	v = bytes.TrimSpace(v)
	switch {
	case len(v) == 0:
		return nil
	case v[0] == '{':
		var obj map[string]json.RawMessage
		if json.Unmarshal(v, &obj) != nil {
			return nil
		}
		return obj[token]
	case v[0] == '[':
		i, err := strconv.Atoi(token)
		if err != nil || i < 0 || token != strconv.Itoa(i) {
			return nil
		}
		var arr []json.RawMessage
		if json.Unmarshal(v, &arr) != nil || i >= len(arr) {
			return nil
		}
		return arr[i]
	}
	return nil
}

// primitive returns the header form of a string, integer or boolean JSON
// value (SEP-2243), or "" for any other.
func primitive(v json.RawMessage) string {
	v = bytes.TrimSpace(v)
	if len(v) == 0 {
		return ""
	}
	switch c := v[0]; {
	case c == '"':
		var x string
		if json.Unmarshal(v, &x) == nil {
			return x
		}
	case string(v) == "true" || string(v) == "false":
		return string(v)
	case c == '-' || c >= '0' && c <= '9':
		if i, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return strconv.FormatInt(i, 10)
		}
	}
	return ""
}
