package mcpwire

import "testing"

func TestResultHandle(t *testing.T) {
	for _, tc := range []struct {
		msg, from, want string
		response        bool
	}{
		{`{"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":{"handle":"h-1"}}}`, "/handle", "h-1", true},
		{`{"jsonrpc":"2.0","id":"a","result":{"structuredContent":{"s":{"id":42}}}}`, "/s/id", "42", true},
		{`{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"list":[{"x":true}]}}}`, "/list/0/x", "true", true},
		{`{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"a/b":"slash","m~n":"tilde"}}}`, "/a~1b", "slash", true},
		{`{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"a/b":"slash","m~n":"tilde"}}}`, "/m~0n", "tilde", true},
		{`{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"n":1.5}}}`, "/n", "", true},
		{`{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"o":{}}}}`, "/o", "", true},
		{`{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"list":[1]}}}`, "/list/01", "", true},
		{`{"jsonrpc":"2.0","id":1,"result":{"isError":true,"structuredContent":{"handle":"h"}}}`, "/handle", "", true},
		{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"image"},{"type":"text","text":" cur-7\n"}]}}`, HandleFromText, "cur-7", true},
		{`{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"no"}}`, "/handle", "", true},
		{`{"jsonrpc":"2.0","method":"notifications/progress","params":{}}`, "/handle", "", false},
		{`{"jsonrpc":"2.0","id":1,"method":"sampling/createMessage","params":{}}`, "/handle", "", false},
		{`not json`, "/handle", "", false},
	} {
		got, response := ResultHandle([]byte(tc.msg), tc.from)
		if got != tc.want || response != tc.response {
			t.Errorf("ResultHandle(%s, %q) = %q, %v; want %q, %v", tc.msg, tc.from, got, response, tc.want, tc.response)
		}
	}
}

func FuzzResultHandle(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"handle":"h-1"}}}`), "/handle")
	f.Add([]byte(`{"id":1,"result":{"structuredContent":[[{"":"x"}]]}}`), "/0/0/")
	f.Fuzz(func(t *testing.T, msg []byte, from string) {
		if from == "" || from[0] != '/' {
			from = HandleFromText
		}
		ResultHandle(msg, from) // must not panic
	})
}
