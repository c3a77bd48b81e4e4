package broker

import (
	"log/slog"
	"runtime/debug"
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

// DefaultMemoryTrimStep is MemoryTrimStep when zero.
const DefaultMemoryTrimStep = 1000

// memoryTrimQuiet is how long no connection may arrive, and the
// subscriptions stay as they are, before a trim.
const memoryTrimQuiet = time.Second

// memTrimmer decides when to return memory to the OS from the
// connection counts it is shown.
type memTrimmer struct {
	step  uint64
	quiet time.Duration

	// State of the last look and the last trim.
	lastAccepted  uint64
	lastSubs      int64
	lastChange    time.Time
	trimAccepted  uint64
	trimConnected int64
}

// counts are what memTrimmer looks at: connections accepted so far,
// connected now and subscriptions now.
type counts struct {
	accepted      uint64
	connected     int64
	subscriptions int64
}

// due records the counts seen at now and reports whether the broker
// should trim: enough connections came or went since the last trim, and
// for quiet none came and the subscriptions stayed as they were.
func (t *memTrimmer) due(now time.Time, c counts) bool {
	accepted, connected := c.accepted, c.connected
	if accepted != t.lastAccepted || c.subscriptions != t.lastSubs || t.lastChange.IsZero() {
		t.lastAccepted, t.lastSubs, t.lastChange = accepted, c.subscriptions, now
		return false
	}
	moved := connected - t.trimConnected
	if accepted-t.trimAccepted < t.step && uint64(max(moved, -moved)) < t.step {
		return false
	}
	if now.Sub(t.lastChange) < t.quiet {
		return false
	}
	t.trimAccepted, t.trimConnected = accepted, connected
	return true
}

// memTrimLoop runs a memTrimmer on the broker's counts until stop.
type memTrimLoop struct {
	trimmer memTrimmer
	counts  func() counts
	log     *slog.Logger
	// Trims counts the trims done.
	Trims atomic.Uint64

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
				if !l.trimmer.due(now, c) {
					continue
				}
				began := time.Now()
				debug.FreeOSMemory()
				l.Trims.Add(1)
				l.log.Info("returned free memory to the OS after a connection storm", "connected", c.connected, "took", time.Since(began))
			}
		}
	}()
}

func (l *memTrimLoop) close() {
	close(l.stop)
	l.done.Wait()
}
