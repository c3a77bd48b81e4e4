package bench

import (
	"sync/atomic"
	"time"
)

// DefaultStallWindow is how long the delivered count may stay flat, with
// deliveries still owed, before a broker is said to have stalled.
const DefaultStallWindow = 3 * time.Second

// waitState is what waitVerdict decides.
type waitState int

// waitVerdict decides how waiting for deliveries goes on, given the
// delivered and expected counts, how long the count has not grown, whether
// the publishers are done, the QoS and the stall window. A broker has
// stalled when its delivered count stopped growing for stallWindow with
// messages still owed while publishers are still sending (or waiting for
// acknowledgements), or, at QoS 1, even after they finished (a broker
// cannot drop an acknowledged QoS 1 message). At QoS 0 a count that stops
// short once the publishers are done is legal dropping: after 2 s of no
// growth (or stallWindow if shorter) the wait ends with the drops counted.
// Stalls are checked before the deadline, so a count flat since before the
// deadline is a stall, not a timeout.
// watchDelivered polls delivered every 10 ms until waitVerdict ends the
// wait, and returns the verdict and when the count last grew. finished
// reports whether the publishers are done; stop whether the wait's own
// deadline (or cancellation) has come.
func watchDelivered(delivered *atomic.Int64, expected int64, start time.Time, finished <-chan struct{},
	qos byte, stallWindow time.Duration, stop func(now time.Time) bool) (waitState, time.Time) {
	last, lastGrowth := int64(-1), start
	for {
		time.Sleep(10 * time.Millisecond)
		now := time.Now()
		n := delivered.Load()
		if n != last {
			last, lastGrowth = n, now
		}
		done := false
		select {
		case <-finished:
			done = true
		default:
		}
		if verdict := waitVerdict(n, expected, now.Sub(lastGrowth), done, qos, stallWindow, stop(now)); verdict != waitMore {
			return verdict, lastGrowth
		}
	}
}

func waitVerdict(delivered, expected int64, idle time.Duration, publishersDone bool, qos byte, stallWindow time.Duration, pastDeadline bool) waitState {
	if delivered >= expected {
		return waitComplete
	}
	if publishersDone && qos == 0 && idle >= min(2*time.Second, stallWindow) {
		return waitDrained
	}
	if idle >= stallWindow {
		return waitStalled
	}
	if pastDeadline {
		return waitTimedOut
	}
	return waitMore
}

// cleanupTimeout bounds closing the clients and the broker of one run.
const cleanupTimeout = 10 * time.Second

// within runs fn and reports whether it returned within d; if not, fn is
// left running in the background.
func within(d time.Duration, fn func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
		return true
	case <-timer.C:
		return false
	}
}

const (
	waitMore     waitState = iota // keep waiting
	waitComplete                  // every expected message was delivered
	waitDrained                   // QoS 0: publishers done, deliveries ended short (drops)
	waitStalled                   // deliveries stopped while some are owed
	waitTimedOut                  // the measurement's time is up while deliveries still grew
)
