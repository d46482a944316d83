package mcpwire

import "testing"

// TestVersions: protocol versions are YYYY-MM-DD dates compared as
// strings; anything else is no version, older or newer than none.
func TestVersions(t *testing.T) {
	for v, want := range map[string]bool{"2025-03-26": true, "2026-07-28": true, "2025-3-26": false, "2025/03/26": false,
		"": false, "2025-03-26 ": false, "v2025-03-2": false, "abcd-ef-gh": false} {
		if IsVersion(v) != want {
			t.Errorf("IsVersion(%q) = %v", v, !want)
		}
	}
	if !AtLeast("2026-07-28", ModernVersion) || AtLeast("2025-11-25", ModernVersion) || AtLeast("9999", ModernVersion) {
		t.Error("AtLeast misorders versions")
	}
	if !Before("2025-03-26", "2025-06-18") || Before("2025-06-18", "2025-06-18") || Before("", "2025-06-18") {
		t.Error("Before misorders versions")
	}
}
