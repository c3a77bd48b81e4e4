package scoring

import (
	"math"
	"time"
)

// flushWindows learns a member's service time from acknowledgements that
// a timer flushes (paho.golang's manual acks, every 50 ms). Such an ack
// says only that its message ended some time since the previous flush,
// so no single ack times a message. What can be timed is a window from
// one burst to the next: the member held some messages at its start (or
// was given one while idle), and the next burst says how many of them it
// finished by then.
//
//   - If it finished only some, it was busy throughout: the window's
//     length is exposure, the finished ones are events.
//   - If it finished them all, it ran out some time before the flush and
//     may have idled: the exposure is the expected time at which the last
//     of them ended (ranOutAfter).
//
// Finished messages over exposure is then the estimate of a censored
// count, unbiased whatever the share of windows in which the member ran
// out (counting only the windows in which it stayed busy would favour
// those with few completions, and make it look slow).
//
// How far each window's count strays from what the mean expects tells
// how variable the work is (squaredCV). The sums decay per message
// finished, so the estimate follows a member whose speed changes. The
// zero value has seen nothing. It is not safe for concurrent use.
type flushWindows struct {
	exposure float64 // decayed sum of the windows' exposure, in ns
	finished float64 // decayed sum of the messages finished in them
	// For squaredCV, decayed sums over windows: of the squared
	// difference between the count finished and what memoryless work of
	// the mean so far would finish, of the variance of that count for
	// memoryless work, and of its variance for work whose every message
	// takes as long.
	strayed, memorylessVar, fixedVar float64
	// cv2 is squaredCV, computed when a window is added: selections read
	// it for every candidate.
	cv2 float64
}

// flushWindowMemory is how many finished messages the estimate mostly
// rests on: each weighs 1/flushWindowMemory less per message finished
// since.
const flushWindowMemory = 32

// minFlushWindowEvidence is how many finished messages (decayed) the
// estimate must rest on before it is used.
const minFlushWindowEvidence = 4

// add records a window of length span that began with held messages (at
// least 1), of which the member finished n by its end; period is the
// timer's (0: not known yet).
func (f *flushWindows) add(span, period time.Duration, held, n int) {
	if span <= 0 || n <= 0 {
		return
	}
	held = max(held, n)
	exposure := float64(span)
	if n >= held {
		exposure = f.ranOutAfter(float64(span), float64(period), n)
	}
	keep := math.Pow(1-1.0/flushWindowMemory, float64(min(n, 4*flushWindowMemory)))
	if f.finished > 0 && held <= maxCountedHeld {
		lambda := float64(span) / (f.exposure / f.finished)
		if lambda <= maxCountedLambda {
			count := cappedPoisson(held, lambda)
			d := float64(n) - count.mean
			f.strayed = f.strayed*keep + d*d
			f.memorylessVar = f.memorylessVar*keep + count.variance
			f.fixedVar = f.fixedVar*keep + cappedFixedVariance(held, lambda)
		}
	}
	f.exposure = f.exposure*keep + exposure
	f.finished = f.finished*keep + float64(n)
	f.cv2 = f.computeSquaredCV()
}

// ranOutAfter is the expected time, into a window span long, at which a
// member that finished all n messages it held finished the last: its
// exposure in that window.
//
//   - A window longer than the timer's period had flushes that brought no
//     ack: all n ended within its last period, and the last of them at
//     n/(n+1) of it on average.
//   - Otherwise, the n-th completion of memoryless work at the mean so far,
//     given that it came within the window: n·mean·P(N ≥ n+1)/P(N ≥ n),
//     N the Poisson count of the window (n/(n+1) of the window before any
//     mean is known).
func (f *flushWindows) ranOutAfter(span, period float64, n int) float64 {
	share := float64(n) / float64(n+1)
	if period > 0 && span > period*(1+1.0/16) {
		return span - period + period*share
	}
	if f.finished == 0 || n > maxCountedHeld {
		return span * share
	}
	mean := f.exposure / f.finished
	count := cappedPoisson(n, span/mean)
	if count.atLeast <= 0 {
		return span * share
	}
	return min(float64(n)*mean*count.atLeastNext/count.atLeast, span)
}

// minCVSpread is how far, in summed variance, the windows seen must tell
// memoryless work from work of fixed length before squaredCV says more
// than 0. In the simulator (TestSimulationFleetVariableWork and
// TestSimulationFleet, 50 ms flushes), 2 let fixed work pass for variable
// in fleets of 20 and cost it 7 %; 4 left it as it was, and 8 gave back
// most of what exponential work gained.
const minCVSpread = 4

// Windows beyond these bounds are left out of squaredCV (their counts
// would take a longer sum than is worth it, and they are rare).
const (
	maxCountedHeld   = 40
	maxCountedLambda = 30
)

// known reports whether the windows seen are evidence enough for mean.
func (f *flushWindows) known() bool { return f.finished >= minFlushWindowEvidence }

// mean is the estimated mean service time (0 before any window).
func (f *flushWindows) mean() time.Duration {
	if f.finished == 0 {
		return 0
	}
	return time.Duration(f.exposure / f.finished)
}

// squaredCV is the squared coefficient of variation of the member's work
// as the windows show it, within [0, 1]: where the windows' counts strayed
// from the mean between what memoryless work (1) and work of fixed length
// (0) would give. Windows shorter than a message tell the two apart
// poorly (either way a message ends in them or not); until the windows
// seen tell them apart by at least minCVSpread in summed variance, it
// says 0.
func (f *flushWindows) squaredCV() float64 { return f.cv2 }

func (f *flushWindows) computeSquaredCV() float64 {
	spread := f.memorylessVar - f.fixedVar
	if spread < minCVSpread {
		return 0
	}
	return min(max((f.strayed-f.fixedVar)/spread, 0), 1)
}

// cappedFixedVariance is the variance of the count of messages, of held,
// that work of fixed length finishes in a window lambda messages long,
// whose start falls anywhere in a message: floor(lambda + U) for U uniform,
// which varies by frac·(1 − frac), unless every message held is done.
func cappedFixedVariance(held int, lambda float64) float64 {
	if lambda >= float64(held) {
		return 0
	}
	frac := lambda - math.Floor(lambda)
	return frac * (1 - frac)
}
