package session

import (
	"sync"
	"testing"
	"time"
)

// TestDrainingCountConcurrent toggles draining from many goroutines and
// checks that the table's count of draining upstreams matches its records.
func TestDrainingCountConcurrent(t *testing.T) {
	tbl, _ := newTestTable(t, 10, time.Hour)
	dials := []string{"a:1", "b:1", "c:1"}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				tbl.SetDraining(dials[(g+i)%len(dials)], (g*7+i*13)%3 == 0)
				tbl.AnyDraining()
			}
		})
	}
	wg.Wait()
	want := 0
	for _, u := range tbl.Upstreams() {
		if u.Draining() {
			want++
		}
	}
	if got := tbl.draining.Load(); got != int32(want) {
		t.Errorf("draining count = %d, records draining = %d", got, want)
	}
	for _, d := range dials {
		tbl.SetDraining(d, false)
	}
	if tbl.AnyDraining() || tbl.draining.Load() != 0 {
		t.Errorf("after undraining all: AnyDraining %v, count %d", tbl.AnyDraining(), tbl.draining.Load())
	}
}
