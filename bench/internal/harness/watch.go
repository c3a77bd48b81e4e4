package harness

import (
	"sync/atomic"
	"time"
)

// DefaultStallWindow is how long the delivered count may stay flat, with
// deliveries still owed, before a broker is said to have stalled.
const DefaultStallWindow = 3 * time.Second

// WaitState is what WaitVerdict decides.
type WaitState int

// WaitVerdict decides how waiting for deliveries goes on, given the
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
// WatchDelivered polls delivered every 10 ms until WaitVerdict ends the
// wait, and returns the verdict and when the count last grew. finished
// reports whether the publishers are done; stop whether the wait's own
// deadline (or cancellation) has come.
func WatchDelivered(delivered *atomic.Int64, expected int64, start time.Time, finished <-chan struct{},
	qos byte, stallWindow time.Duration, stop func(now time.Time) bool) (WaitState, time.Time) {
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
		if verdict := WaitVerdict(n, expected, now.Sub(lastGrowth), done, qos, stallWindow, stop(now)); verdict != WaitMore {
			return verdict, lastGrowth
		}
	}
}

func WaitVerdict(delivered, expected int64, idle time.Duration, publishersDone bool, qos byte, stallWindow time.Duration, pastDeadline bool) WaitState {
	if delivered >= expected {
		return WaitComplete
	}
	if publishersDone && qos == 0 && idle >= min(2*time.Second, stallWindow) {
		return WaitDrained
	}
	if idle >= stallWindow {
		return WaitStalled
	}
	if pastDeadline {
		return WaitTimedOut
	}
	return WaitMore
}

// CleanupTimeout bounds closing the clients and the broker of one run.
const CleanupTimeout = 10 * time.Second

// Within runs fn and reports whether it returned within d; if not, fn is
// left running in the background.
func Within(d time.Duration, fn func()) bool {
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
	WaitMore     WaitState = iota // keep waiting
	WaitComplete                  // every expected message was delivered
	WaitDrained                   // QoS 0: publishers done, deliveries ended short (drops)
	WaitStalled                   // deliveries stopped while some are owed
	WaitTimedOut                  // the measurement's time is up while deliveries still grew
)
