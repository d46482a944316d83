package journal

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func block(i int) []byte { return fmt.Appendf(nil, "event: message\ndata: %d\n\n", i) }

// follow collects the Seq of every event Follow gives until it returns.
func follow(t *testing.T, j Journal, session, stream string, after uint64) ([]uint64, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got []uint64
	err := j.Follow(ctx, session, stream, after, func(ev Event) error {
		got = append(got, ev.Seq)
		return nil
	})
	return got, err
}

func TestMemoryReplaysThenFollowsLive(t *testing.T) {
	ctx := context.Background()
	m := NewMemory(Limits{})
	for i := 1; i <= 3; i++ {
		_ = m.Append(ctx, "s", "a", Event{Seq: uint64(i), Block: block(i)})
	}
	done := make(chan []uint64)
	go func() {
		got, err := follow(t, m, "s", "a", 1)
		if err != nil {
			t.Error(err)
		}
		done <- got
	}()
	time.Sleep(20 * time.Millisecond)
	_ = m.Append(ctx, "s", "a", Event{Seq: 4, Block: block(4)})
	_ = m.Append(ctx, "s", "b", Event{Seq: 1, Block: block(1)}) // another stream: not given
	_ = m.Append(ctx, "s", "a", Event{Seq: 5, Block: block(5)})
	_ = m.End(ctx, "s", "a")
	if got := <-done; fmt.Sprint(got) != "[2 3 4 5]" {
		t.Errorf("followed %v; want [2 3 4 5], each once, in order", got)
	}
}

func TestMemoryNotHeld(t *testing.T) {
	ctx := context.Background()
	m := NewMemory(Limits{SessionBytes: 3 * (int64(len(block(1))) + eventOverhead)})
	for i := 1; i <= 5; i++ {
		_ = m.Append(ctx, "s", "a", Event{Seq: uint64(i), Block: block(i)})
	}
	_ = m.End(ctx, "s", "a")
	if _, err := follow(t, m, "s", "a", 1); !errors.Is(err, ErrNotHeld) {
		t.Errorf("after event 1, with 2 pushed out: %v; want ErrNotHeld", err)
	}
	if got, err := follow(t, m, "s", "a", 2); err != nil || fmt.Sprint(got) != "[3 4 5]" {
		t.Errorf("after event 2: %v, %v; want [3 4 5]", got, err)
	}
	if _, err := follow(t, m, "s", "other", 1); !errors.Is(err, ErrNotHeld) {
		t.Errorf("unknown stream: %v; want ErrNotHeld", err)
	}
	if _, err := follow(t, m, "other", "a", 1); !errors.Is(err, ErrNotHeld) {
		t.Errorf("unknown session: %v; want ErrNotHeld", err)
	}
	if st := m.Stats(); st.Trimmed[TrimSessionBytes] != 2 || st.Appended != 5 {
		t.Errorf("stats %+v; want 2 trimmed for session_bytes, 5 appended", st)
	}
}

func TestMemoryWindowAndTotal(t *testing.T) {
	ctx := context.Background()
	size := int64(len(block(1))) + eventOverhead
	m := NewMemory(Limits{Window: time.Minute, TotalBytes: 4 * size})
	now := time.Unix(1000, 0)
	m.now = func() time.Time { return now }
	_ = m.Append(ctx, "old", "a", Event{Seq: 1, Block: block(1)})
	_ = m.End(ctx, "old", "a")
	now = now.Add(2 * time.Minute)
	_ = m.Append(ctx, "new", "a", Event{Seq: 1, Block: block(1)})
	if st := m.Stats(); st.Sessions != 1 || st.Bytes != size || st.Trimmed[TrimWindow] != 1 {
		t.Fatalf("after the window: %+v; want the old session gone", st)
	}
	for i := 2; i <= 6; i++ {
		_ = m.Append(ctx, "new", "a", Event{Seq: uint64(i), Block: block(i)})
	}
	if st := m.Stats(); st.Bytes != 4*size || st.Trimmed[TrimTotalBytes] != 2 {
		t.Errorf("over total_bytes: %+v; want 4 events held, 2 trimmed", st)
	}
	_ = m.Drop(ctx, "new")
	if st := m.Stats(); st.Bytes != 0 || st.Sessions != 0 {
		t.Errorf("after Drop: %+v; want empty", st)
	}
}

func TestMemoryFollowEndsWithContext(t *testing.T) {
	m := NewMemory(Limits{})
	_ = m.Append(context.Background(), "s", "a", Event{Seq: 1, Block: block(1)})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := m.Follow(ctx, "s", "a", 1, func(Event) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Follow of an open stream = %v; want the context's error", err)
	}
}
