package scoring

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// timerAckedMember runs one member with a single worker and a FIFO for
// the given time: messages arrive every gap on average (Poisson), each
// takes work() and is acknowledged at the next tick of a flush timer of
// the given period, as paho.golang's manual acks are. It returns the
// member and the means, over every flush from the second second on, of
// the service estimate learnt from the flush windows and of the squared
// coefficient of variation they give.
func timerAckedMember(t *testing.T, seed uint64, gap, period, run time.Duration, work func(*rand.Rand) time.Duration) (m *member, mean time.Duration, cv2 float64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	m = newMember("worker", 0)
	var fifo []time.Duration // work of the messages waiting, the running one first
	var doneAt time.Duration // when the running message ends
	unacked := 0             // finished, not acknowledged yet
	nextArrival := time.Duration(rng.ExpFloat64() * float64(gap))
	nextFlush := period
	var sum time.Duration
	var cv2Sum float64
	samples := 0
	for now := time.Duration(0); now < run; {
		next := min(nextArrival, nextFlush)
		if len(fifo) > 0 {
			next = min(next, doneAt)
		}
		now = next
		switch {
		case len(fifo) > 0 && now == doneAt:
			fifo = fifo[1:]
			unacked++
			if len(fifo) > 0 {
				doneAt = now + fifo[0]
			}
		case now == nextArrival:
			m.deliveryStarted(now)
			fifo = append(fifo, work(rng))
			if len(fifo) == 1 {
				doneAt = now + fifo[0]
			}
			nextArrival = now + time.Duration(rng.ExpFloat64()*float64(gap))
		default:
			for ; unacked > 0; unacked-- {
				m.deliveryAcknowledged(now, 0)
			}
			nextFlush += period
			if now >= time.Second && m.flushWins.known() {
				sum += m.flushWins.mean()
				cv2Sum += m.flushWins.squaredCV()
				samples++
			}
		}
	}
	require.Positive(t, samples)
	return m, sum / time.Duration(samples), cv2Sum / float64(samples)
}

// TestFlushWindowsLearnTheMeanOfTimerAckedWork: acks flushed every 50 ms
// time no single message, yet the windows between bursts give the mean
// service time of memoryless work without bias, busy or not, and tell
// such work from work of fixed length. On fixed work the estimate is
// low (0.75–0.8 of the truth here: a window starts with a message partly
// done), which is why it is used only for work found variable; the burst
// rules keep predicting the rest.
func TestFlushWindowsLearnTheMeanOfTimerAckedWork(t *testing.T) {
	exponential := func(mean time.Duration) func(*rand.Rand) time.Duration {
		return func(r *rand.Rand) time.Duration { return time.Duration(r.ExpFloat64() * float64(mean)) }
	}
	fixed := func(mean time.Duration) func(*rand.Rand) time.Duration {
		return func(*rand.Rand) time.Duration { return mean }
	}
	for _, tc := range []struct {
		name     string
		mean     time.Duration
		load     float64
		work     func(time.Duration) func(*rand.Rand) time.Duration
		variable bool
	}{
		{"memoryless, 12 ms, 85 % busy", 12 * time.Millisecond, 0.85, exponential, true},
		{"memoryless, 30 ms, 60 % busy", 30 * time.Millisecond, 0.6, exponential, true},
		{"memoryless, 90 ms, 85 % busy", 90 * time.Millisecond, 0.85, exponential, true},
		{"fixed, 12 ms, 85 % busy", 12 * time.Millisecond, 0.85, fixed, false},
		{"fixed, 30 ms, 60 % busy", 30 * time.Millisecond, 0.6, fixed, false},
		{"fixed, 90 ms, 85 % busy", 90 * time.Millisecond, 0.85, fixed, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gap := time.Duration(float64(tc.mean) / tc.load)
			var means, cv2s []float64
			variable := 0
			for seed := uint64(1); seed <= 5; seed++ {
				m, mean, cv2 := timerAckedMember(t, seed, gap, 50*time.Millisecond, 60*time.Second, tc.work(tc.mean))
				cv2s = append(cv2s, cv2)
				if tc.variable {
					require.True(t, m.acksOnTimer(), "a 50 ms flush timer's bursts")
				}
				means = append(means, float64(mean)/float64(tc.mean))
				if m.timerVariability() > 0 {
					variable++
				}
			}
			var avg float64
			for _, r := range means {
				avg += r / float64(len(means))
			}
			var avgCV2 float64
			for _, c := range cv2s {
				avgCV2 += c / float64(len(cv2s))
			}
			t.Logf("estimate / true mean: %.3f (runs %.2f); squared CV %.2f (runs %.2f)", avg, means, avgCV2, cv2s)
			if tc.variable {
				// Memoryless work: the estimate the model rests on.
				require.InDelta(t, 1, avg, 0.1, "the mean of memoryless work")
				require.Greater(t, avgCV2, variableTimerWork, "the variability of memoryless work (1)")
			} else {
				require.Less(t, avgCV2, variableTimerWork/2, "the variability of fixed work (0)")
				require.Zero(t, variable, "runs that took fixed work for variable at their end")
			}
		})
	}
}

// TestPoissonShortfall checks E[max(n − N, 0)] against a direct sum, on
// both sides of its shortcuts (n far above or below lambda, a large lambda).
func TestPoissonShortfall(t *testing.T) {
	direct := func(n int, lambda float64) float64 {
		left := 0.0
		for j := 0; j < n; j++ {
			// P(N = j) in logs, so that a large lambda does not underflow.
			lg, _ := math.Lgamma(float64(j + 1))
			left += float64(n-j) * math.Exp(float64(j)*math.Log(lambda)-lambda-lg)
		}
		return left
	}
	require.Zero(t, poissonShortfall(0, 3))
	require.InDelta(t, 3, poissonShortfall(3, 0), 1e-12, "nothing finished")
	require.InDelta(t, math.Exp(-1), poissonShortfall(1, 1), 1e-12)
	for _, tc := range []struct {
		n      int
		lambda float64
		tol    float64
	}{{1, 0.3, 1e-9}, {5, 2.5, 1e-9}, {40, 35, 1e-9}, {60, 10, 1e-9}, {60, 45, 1e-9}, {200, 180, 1e-9}, {1000, 800, 1e-7}, {700, 900, 1e-9}, {100, 60, 1e-9}} {
		require.InDelta(t, direct(tc.n, tc.lambda), poissonShortfall(tc.n, tc.lambda), tc.tol, "n %d, lambda %v", tc.n, tc.lambda)
	}
}
