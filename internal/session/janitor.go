package session

import "time"

// janitor runs a table's sweeps: a goroutine that calls sweep every
// interval until Destruct, recomputing the interval when rearmed.
type janitor struct {
	stop  chan struct{}
	done  chan struct{}
	rearm chan struct{} // the TTLs changed: the janitor recomputes its interval
}

// newJanitor returns a janitor that is not started.
func newJanitor() janitor { return janitor{rearm: make(chan struct{}, 1)} }

// StartJanitor starts a goroutine that sweeps expired sessions and unused
// upstream records until [Table.Destruct], every interval(d) for the
// shorter of the table's current TTL and upstream TTL. It is not tied to a
// config's context, which every reload cancels.
func (t *Table) StartJanitor(interval func(ttl time.Duration) time.Duration) {
	t.janitor.start(func() time.Duration { return interval(min(t.TTL(), t.UpstreamTTL())) }, func() { t.Sweep() })
}

// start runs sweep every every() until Destruct.
func (j *janitor) start(every func() time.Duration, sweep func()) {
	j.stop, j.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(j.done)
		timer := time.NewTimer(every())
		defer timer.Stop()
		for {
			select {
			case <-timer.C:
				sweep()
			case <-j.rearm:
				timer.Stop()
			case <-j.stop:
				return
			}
			timer.Reset(every())
		}
	}()
}

// rearmJanitor makes the janitor recompute its interval from the TTLs.
func (j *janitor) rearmJanitor() {
	select {
	case j.rearm <- struct{}{}:
	default:
	}
}

// Destruct stops the janitor. The pool calls it when the last config using
// the table is unloaded. It never returns an error.
func (j *janitor) Destruct() error {
	if j.stop != nil {
		close(j.stop)
		<-j.done
	}
	return nil
}

// janitorInterval returns how often to sweep for a ttl: an eighth of it,
// between 1 s and 1 min.
func JanitorInterval(ttl time.Duration) time.Duration {
	return min(max(ttl/8, time.Second), time.Minute)
}

// Interface guards
var _ interface{ Destruct() error } = (*Table)(nil) // caddy.Destructor, for the app's pool
