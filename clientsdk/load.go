package clientsdk

import (
	"sync"
	"time"
)

// meanWeight is the weight of the newest handler duration in the running
// mean processing time (an exponentially weighted moving average).
const meanWeight = 0.1

// loadTracker keeps what the Subscriber knows about its own load: running
// handlers, handler durations and the running mean processing time.
type loadTracker struct {
	mu       sync.Mutex
	workers  int
	running  []time.Time // start of the handler running in each worker slot; zero when idle
	inFlight int

	mean      time.Duration // running estimate of the handler duration
	meanKnown bool

	// Since the last report.
	sumSinceReport   time.Duration
	countSinceReport int
}

func newLoadTracker(workers int) *loadTracker {
	return &loadTracker{workers: workers, running: make([]time.Time, workers)}
}

// begin records that the worker in slot started a handler at now.
func (l *loadTracker) begin(slot int, now time.Time) {
	l.mu.Lock()
	l.running[slot] = now
	l.inFlight++
	l.mu.Unlock()
}

// end records that the handler in slot finished at now and returns how many
// handlers finished since the last report.
func (l *loadTracker) end(slot int, now time.Time) (finishedSinceReport int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := now.Sub(l.running[slot])
	if d < 0 {
		d = 0
	}
	l.running[slot] = time.Time{}
	l.inFlight--
	if l.meanKnown {
		l.mean += time.Duration(meanWeight * float64(d-l.mean))
	} else {
		l.mean, l.meanKnown = d, true
	}
	l.sumSinceReport += d
	l.countSinceReport++
	return l.countSinceReport
}

// signal returns what the report schedule needs.
func (l *loadTracker) signal() (finishedSinceReport int, meanKnown bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.countSinceReport, l.meanKnown
}

// meanProcessingTime returns the running mean handler duration (0 if none
// finished yet) and the number of handlers running now.
func (l *loadTracker) meanProcessingTime() (mean time.Duration, inFlight int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mean, l.inFlight
}

// loadSnapshot is the tracker's share of a load report.
type loadSnapshot struct {
	processingTime time.Duration // mean of handlers finished since the last report
	processed      int           // how many handlers that mean covers
	inFlight       int
	backlog        time.Duration
	backlogKnown   bool
}

// take returns the report fields at now for pending queued messages and
// starts a new report period.
func (l *loadTracker) take(now time.Time, pending int) loadSnapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s loadSnapshot
	if l.countSinceReport > 0 {
		s.processingTime = l.sumSinceReport / time.Duration(l.countSinceReport)
		s.processed = l.countSinceReport
	}
	l.sumSinceReport, l.countSinceReport = 0, 0
	s.inFlight = l.inFlight
	if l.meanKnown {
		var elapsed [16]time.Duration
		el := elapsed[:0]
		for _, start := range l.running {
			if !start.IsZero() {
				el = append(el, now.Sub(start))
			}
		}
		s.backlog, s.backlogKnown = estimateBacklog(l.mean, el, pending, l.workers), true
	}
	return s
}

// estimateBacklog returns how long until a newly received message would
// start: the remaining time of the running handlers, each expected to take
// mean, plus pending messages of mean each, shared among workers.
func estimateBacklog(mean time.Duration, elapsed []time.Duration, pending, workers int) time.Duration {
	if workers < 1 {
		workers = 1
	}
	var total time.Duration
	for _, e := range elapsed {
		if rest := mean - e; rest > 0 {
			total += rest
		}
	}
	total += time.Duration(pending) * mean
	return total / time.Duration(workers)
}
