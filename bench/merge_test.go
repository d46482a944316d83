package main

import "testing"

// TestMergeReport checks that -merge replaces a recorded section by the
// run's section of the same heading, adds a new one at the end, keeps
// every other section and the recorded header, and marks each merged
// section with the run's header bullets.
func TestMergeReport(t *testing.T) {
	recorded := "# Bench\n\n- Command: `go run ./bench`\n- Date: old\n\n## A\n\nold a\n\n## B\n\nkept b\n"
	run := "# Bench\n\n- Command: `go run ./bench -only a,c`\n- Date: new\n\n## A\n\nnew a\n\n## C\n\nnew c\n\n"
	want := "# Bench\n\n- Command: `go run ./bench`\n- Date: old\n\n" +
		"## A\n\nFrom a run of its own:\n\n- Command: `go run ./bench -only a,c`\n- Date: new\n\nnew a\n\n" +
		"## B\n\nkept b\n\n" +
		"## C\n\nFrom a run of its own:\n\n- Command: `go run ./bench -only a,c`\n- Date: new\n\nnew c\n\n"
	if got := mergeReport(recorded, run); got != want {
		t.Errorf("mergeReport:\n%s\nwant:\n%s", got, want)
	}
	// Merging the same run again changes nothing.
	if got := mergeReport(mergeReport(recorded, run), run); got != want {
		t.Errorf("merging twice:\n%s\nwant:\n%s", got, want)
	}
}
