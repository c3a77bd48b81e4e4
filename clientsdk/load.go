package clientsdk

import (
	"sync"
	"time"
)

// meanWeight is the weight of the newest handler duration in the running
// mean processing time (an exponentially weighted moving average).
const meanWeight = 0.1

// loadTracker keeps what a LoadReporter knows about its client's load:
// running handlers, handler durations and the running mean processing time.
type loadTracker struct {
	mu      sync.Mutex
	workers int
	running []time.Time // start times of the handlers running now, in no particular order

	mean      time.Duration // running estimate of the handler duration
	meanKnown bool

	// Since the last report.
	sumSinceReport   time.Duration
	countSinceReport int
}

func newLoadTracker(workers int) *loadTracker {
	return &loadTracker{workers: workers, running: make([]time.Time, 0, workers)}
}

// begin records that a handler started at start.
func (l *loadTracker) begin(start time.Time) {
	l.mu.Lock()
	l.running = append(l.running, start)
	l.mu.Unlock()
}

// end records that the handler that started at start finished at now and
// returns how many handlers finished since the last report and how many
// are still running. A start that begin did not record (the caller timed
// the handler itself) counts for the processing time but not for the
// handlers running.
func (l *loadTracker) end(start, now time.Time) (finishedSinceReport, running int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := now.Sub(start)
	if d < 0 {
		d = 0
	}
	for i, r := range l.running {
		if r.Equal(start) {
			last := len(l.running) - 1
			l.running[i] = l.running[last]
			l.running = l.running[:last]
			break
		}
	}
	if l.meanKnown {
		l.mean += time.Duration(meanWeight * float64(d-l.mean))
	} else {
		l.mean, l.meanKnown = d, true
	}
	l.sumSinceReport += d
	l.countSinceReport++
	return l.countSinceReport, len(l.running)
}

// signal returns what the report schedule needs.
func (l *loadTracker) signal() (finishedSinceReport, running int, meanKnown bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.countSinceReport, len(l.running), l.meanKnown
}

// meanProcessingTime returns the running mean handler duration (0 if none
// finished yet) and the number of handlers running now.
func (l *loadTracker) meanProcessingTime() (mean time.Duration, inFlight int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mean, len(l.running)
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
	s.inFlight = len(l.running)
	if l.meanKnown {
		var elapsed [16]time.Duration
		el := elapsed[:0]
		for _, start := range l.running {
			el = append(el, now.Sub(start))
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
