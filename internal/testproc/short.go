package testproc

import "testing"

// SkipShort skips t under go test -short, the quick loop, saying why: the
// test starts real processes (what, in why).
func SkipShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipped under -short: " + why)
	}
}
