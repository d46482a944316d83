package mcpwire

import "testing"

// TestMethodLabels: every spec method is its own label, "" is unknown, any
// other method is other, and the indexes cover Labels exactly.
func TestMethodLabels(t *testing.T) {
	seen := map[string]bool{}
	for i := range Labels {
		l := MethodLabel(i)
		if seen[l] {
			t.Errorf("label %q twice", l)
		}
		seen[l] = true
	}
	for _, m := range Methods {
		if MethodLabel(MethodIndex(m)) != m {
			t.Errorf("method %q labelled %q", m, MethodLabel(MethodIndex(m)))
		}
	}
	if MethodLabel(MethodIndex("")) != MethodUnknown || MethodLabel(MethodIndex("x/y")) != MethodOther || MethodLabel(MethodIndex("Initialize")) != MethodOther {
		t.Error("the empty method is not unknown, or an unlisted one not other")
	}
}
