package main

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// CPU placement of the sidecar and proxy-bound parts: the proxy on its own
// cores, the load generator and the upstreams on the others, set with
// sched_setaffinity(2). A child process inherits the affinity of the
// thread that forks it, so children are started from a thread pinned for
// the purpose; the Go runtime of every child then sizes GOMAXPROCS from its
// affinity, and the benchmark sets GOMAXPROCS explicitly as well.

// placement is where the processes of a part run.
type placement struct {
	part  string // sidecar or proxybound
	proxy []int  // CPUs of the proxy process (Caddy, HAProxy, Redis)
	rest  []int  // CPUs of the load generator and the upstreams
}

// parseCPUList reads a CPU list in the kernel's cpuset syntax ("0",
// "1-3", "0,2-3"), sorted and without duplicates.
func parseCPUList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(f), "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a {
			return nil, fmt.Errorf("CPU list %q: %q is not a CPU number or a range lo-hi", s, f)
		}
		for c := a; c <= b; c++ {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// formatCPUList writes cpus back in cpuset syntax, ranges joined.
func formatCPUList(cpus []int) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(cpus[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", cpus[i], cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// newPlacement checks the two CPU lists against each other and against the
// CPUs this process may run on (allowed).
func newPlacement(proxy, rest string, allowed []int) (placement, error) {
	p, err := parseCPUList(proxy)
	if err != nil {
		return placement{}, fmt.Errorf("-proxy-cpus: %w", err)
	}
	r, err := parseCPUList(rest)
	if err != nil {
		return placement{}, fmt.Errorf("-rest-cpus: %w", err)
	}
	for _, c := range p {
		if slices.Contains(r, c) {
			return placement{}, fmt.Errorf("CPU %d is in both -proxy-cpus and -rest-cpus: the proxy must have its own cores", c)
		}
	}
	for _, c := range slices.Concat(p, r) {
		if !slices.Contains(allowed, c) {
			return placement{}, fmt.Errorf("CPU %d is not one this process may run on (%s)", c, formatCPUList(allowed))
		}
	}
	return placement{proxy: p, rest: r}, nil
}

// allowedCPUs returns the CPUs this process may run on.
func allowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	return cpusOf(&set), nil
}

func cpusOf(set *unix.CPUSet) []int {
	var out []int
	for c := range 1024 { // CPU_SETSIZE
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out
}

func cpuSet(cpus []int) *unix.CPUSet {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	return &set
}

// startPinned calls start (which forks a child) on an OS thread restricted
// to cpus, so that the child and every thread it creates run on cpus only,
// then gives the thread its affinity back. The thread must live on: the
// children get SIGKILL when the thread that forked them exits
// (PR_SET_PDEATHSIG, which testproc sets, follows the thread), and while
// it is locked the Go runtime creates no threads from it.
func startPinned(cpus []int, start func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return err
	}
	if err := unix.SchedSetaffinity(0, cpuSet(cpus)); err != nil {
		return fmt.Errorf("sched_setaffinity %s: %w", formatCPUList(cpus), err)
	}
	defer unix.SchedSetaffinity(0, &old)
	return start()
}

// pinSelf restricts every thread of this process (the load generator) to
// cpus and sets GOMAXPROCS to their number. Threads created later inherit
// the affinity of the thread creating them; the loop repeats until a pass
// finds no thread it had not pinned yet. The returned func undoes both.
func pinSelf(cpus []int) (restore func(), err error) {
	allowed, err := allowedCPUs()
	if err != nil {
		return nil, err
	}
	if err := setAllThreads(cpus); err != nil {
		return nil, err
	}
	runtime.GOMAXPROCS(len(cpus))
	return func() {
		_ = setAllThreads(allowed)
		runtime.SetDefaultGOMAXPROCS()
	}, nil
}

// setAllThreads sets the affinity of every thread in /proc/self/task.
func setAllThreads(cpus []int) error {
	done := map[int]bool{}
	for {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		fresh := 0
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil || done[tid] {
				continue
			}
			// A thread may have exited since the listing: ESRCH is not an error.
			if err := unix.SchedSetaffinity(tid, cpuSet(cpus)); err != nil && err != unix.ESRCH {
				return fmt.Errorf("sched_setaffinity thread %d: %w", tid, err)
			}
			done[tid], fresh = true, fresh+1
		}
		if fresh == 0 {
			return nil
		}
	}
}

// threadsOn reports whether every thread of process pid may run only on
// cpus: the check that a child was started pinned.
func threadsOn(pid int, cpus []int) (bool, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false, err
	}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &set); err != nil {
			continue
		}
		if !slices.Equal(cpusOf(&set), cpus) {
			return false, nil
		}
	}
	return true, nil
}
