package session

import (
	"crypto/rand"
	"testing"
)

// TestStripedLockWriterExcludesEveryReader: a writer holds every stripe, so
// no reader of any session ID gets in while it writes, and every reader
// gets in once it is done.
func TestStripedLockWriterExcludesEveryReader(t *testing.T) {
	var l stripedLock
	ids := []string{"", "0", "s7", rand.Text(), "11111111-2222-3333-4444-55555555555f"}
	l.Lock()
	for _, id := range ids {
		if l.stripe(id).TryRLock() {
			t.Errorf("reader of %q got in while the writer held the lock", id)
		}
	}
	if l.stripes[0].TryRLock() {
		t.Error("RLock's stripe is free while the writer held the lock")
	}
	l.Unlock()
	for _, id := range ids {
		s := l.stripe(id)
		if !s.TryRLock() {
			t.Fatalf("reader of %q kept out after the writer unlocked", id)
		}
		s.RUnlock()
	}
}

// TestStripedLockSpreadsIDs: IDs shaped like the go-sdk's (crypto/rand.Text)
// use every stripe, so that lookups on different cores rarely share one.
func TestStripedLockSpreadsIDs(t *testing.T) {
	var l stripedLock
	used := map[any]int{}
	for range 800 {
		used[l.stripe(rand.Text())]++
	}
	if len(used) != lockStripes {
		t.Fatalf("800 random IDs used %d of %d stripes", len(used), lockStripes)
	}
	for s, n := range used {
		if n < 50 {
			t.Errorf("stripe %p got %d of 800 IDs; want about 100", s, n)
		}
	}
}
