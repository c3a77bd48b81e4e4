package broker

import (
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// Returning memory after a connection storm.
//
// Setting up a connection takes more stack than keeping it: Mochi's
// reader goroutine reaches 32 KiB while it writes a client's first SUBACK
// (vanilla Mochi's too) and needs 16 KiB once the client idles. Go shrinks
// a stack only at a garbage collection, and keeps the memory it frees for
// reuse, giving it back to the OS only down to its heap goal (three times
// the live heap with --gc-percent 200). A fleet that connects at once, or
// churns, leaves that memory resident while nothing allocates. So once
// the connections settle after a storm (Step connections accepted, or
// the connected count moved by Step, and then no connection accepted and
// no subscription made or ended for a second), the broker collects once
// and returns what is free (debug.FreeOSMemory).
// That costs one collection and a scan of the free memory per storm.
//
// Garbage while idle. An idle broker still allocates: Mochi copies its
// map of clients twice a second to sweep expired sessions and in-flight
// messages, about 2 MiB/s at 10 000 clients. Go collects when the heap
// reaches its goal, which counts goroutine stacks (Mochi's two per
// client) as well as the live heap, and keeps what it frees for reuse up
// to that goal: with --gc-percent 200 an idle broker of 10 000 devices
// grew by about 2.8 MiB/s for two minutes, from 369 to 690 MiB. So once
// the broker allocates lightly (under lightAllocRate over the quiet time)
// and the garbage not yet collected exceeds a quarter of the live heap
// and stacks (at least minIdleGarbage), it collects and returns what is
// free (debug.FreeOSMemory), while a busy broker keeps the collector's
// own pace, which --gc-percent sets for throughput. A collection costs
// in proportion to the live heap and stacks, and comes after a quarter
// of them was allocated: at most about 3 % of a core at lightAllocRate,
// whatever the fleet (measured: 0.3 s per collection at 10 000 idle
// devices, one every 50 s).

// DefaultMemoryTrimStep is MemoryTrimStep when zero.
const DefaultMemoryTrimStep = 1000

// memoryTrimQuiet is how long no connection may arrive, and the
// subscriptions stay as they are, before a trim.
const memoryTrimQuiet = time.Second

// Idle collections: the allocation rate under which the broker counts as
// lightly loaded, and the least garbage worth a collection.
const (
	lightAllocRate = 8 << 20 // bytes per second
	minIdleGarbage = 32 << 20
)

// memTrimmer decides when to return memory to the OS, or to collect, from
// the counts it is shown.
type memTrimmer struct {
	step  uint64
	quiet time.Duration

	// State of the last look and the last trim.
	lastAccepted  uint64
	lastSubs      int64
	lastChange    time.Time
	trimAccepted  uint64
	trimConnected int64
	// Allocation: the window being measured (its start and the
	// cumulative count then), and the end of the last busy window.
	windowStart     time.Time
	windowAllocated uint64
	lastBusy        time.Time
}

// counts are what memTrimmer looks at: connections accepted so far,
// connected now, subscriptions now, and the Go heap.
type counts struct {
	accepted      uint64
	connected     int64
	subscriptions int64
	heap          heapCounts
}

// heapCounts describe the Go heap (runtime/metrics).
type heapCounts struct {
	allocated uint64 // bytes allocated since the start (/gc/heap/allocs:bytes)
	objects   uint64 // bytes in heap objects, live or not yet collected
	live      uint64 // heap bytes the last collection found live
	stacks    uint64 // goroutine stacks
}

// garbage returns the bytes in heap objects that the last collection did
// not find live: garbage, and what was allocated since.
func (h heapCounts) garbage() uint64 {
	if h.objects < h.live {
		return 0
	}
	return h.objects - h.live
}

// trimAction is what memTrimmer asks for.
type trimAction int

const (
	trimNone    trimAction = iota
	trimReturn             // collect and return free memory to the OS (a connection storm settled)
	trimCollect            // collect and return free memory to the OS (garbage piled up while the broker idles)
)

// due records the counts seen at now and says what the broker should do:
// return memory when enough connections came or went since the last trim
// and, for quiet, none came and the subscriptions stayed as they were;
// collect when it allocated lightly for quiet and the garbage is over a
// quarter of the live heap and stacks (see above).
func (t *memTrimmer) due(now time.Time, c counts) trimAction {
	t.lookAtAllocation(now, c.heap.allocated)
	accepted, connected := c.accepted, c.connected
	if accepted != t.lastAccepted || c.subscriptions != t.lastSubs || t.lastChange.IsZero() {
		t.lastAccepted, t.lastSubs, t.lastChange = accepted, c.subscriptions, now
		return trimNone
	}
	moved := connected - t.trimConnected
	storm := accepted-t.trimAccepted >= t.step || uint64(max(moved, -moved)) >= t.step
	if storm && now.Sub(t.lastChange) >= t.quiet {
		t.trimAccepted, t.trimConnected = accepted, connected
		return trimReturn
	}
	idle := now.Sub(t.lastBusy) >= t.quiet
	if idle && c.heap.garbage() >= max(minIdleGarbage, (c.heap.live+c.heap.stacks)/4) {
		return trimCollect
	}
	return trimNone
}

// lookAtAllocation measures the allocation rate over windows of the
// quiet time (Mochi's sweeps allocate in bursts, once a second) and notes
// the end of the last window faster than lightAllocRate.
func (t *memTrimmer) lookAtAllocation(now time.Time, allocated uint64) {
	if t.windowStart.IsZero() {
		t.windowStart, t.windowAllocated, t.lastBusy = now, allocated, now
		return
	}
	elapsed := now.Sub(t.windowStart)
	if elapsed < t.quiet {
		return
	}
	if allocated > t.windowAllocated && float64(allocated-t.windowAllocated) > lightAllocRate*elapsed.Seconds() {
		t.lastBusy = now
	}
	t.windowStart, t.windowAllocated = now, allocated
}

// heapReader reads heapCounts from runtime/metrics into samples it keeps.
type heapReader struct {
	samples [4]metrics.Sample
}

func newHeapReader() *heapReader {
	r := new(heapReader)
	for i, name := range []string{"/gc/heap/allocs:bytes", "/memory/classes/heap/objects:bytes", "/gc/heap/live:bytes", "/memory/classes/heap/stacks:bytes"} {
		r.samples[i].Name = name
	}
	return r
}

// read returns the heap's counts now (0 for a metric this Go lacks).
func (r *heapReader) read() heapCounts {
	metrics.Read(r.samples[:])
	v := func(i int) uint64 {
		if r.samples[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return r.samples[i].Value.Uint64()
	}
	return heapCounts{allocated: v(0), objects: v(1), live: v(2), stacks: v(3)}
}

// memTrimLoop runs a memTrimmer on the broker's counts until stop.
type memTrimLoop struct {
	trimmer memTrimmer
	counts  func() counts
	log     *slog.Logger
	// Trims counts the trims done after connection storms, Collections
	// the collections of garbage piled up while idle.
	Trims       atomic.Uint64
	Collections atomic.Uint64

	stop chan struct{}
	done sync.WaitGroup
}

func newMemTrimLoop(step int, c func() counts, log *slog.Logger) *memTrimLoop {
	return &memTrimLoop{trimmer: memTrimmer{step: uint64(step), quiet: memoryTrimQuiet},
		counts: c, log: log, stop: make(chan struct{})}
}

func (l *memTrimLoop) start() {
	l.done.Add(1)
	go func() {
		defer l.done.Done()
		tick := time.NewTicker(memoryTrimQuiet / 4)
		defer tick.Stop()
		for {
			select {
			case <-l.stop:
				return
			case now := <-tick.C:
				c := l.counts()
				switch l.trimmer.due(now, c) {
				case trimReturn:
					began := time.Now()
					debug.FreeOSMemory()
					l.Trims.Add(1)
					l.log.Info("returned free memory to the OS after a connection storm", "connected", c.connected, "took", time.Since(began))
				case trimCollect:
					began := time.Now()
					debug.FreeOSMemory()
					l.Collections.Add(1)
					l.log.Debug("collected the garbage of an idle broker", "garbage_bytes", c.heap.garbage(), "live_bytes", c.heap.live, "stack_bytes", c.heap.stacks, "took", time.Since(began))
				}
			}
		}
	}()
}

func (l *memTrimLoop) close() {
	close(l.stop)
	l.done.Wait()
}
