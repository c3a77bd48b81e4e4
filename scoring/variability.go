package scoring

import (
	"math"
	"time"
)

// Variability keeps moving averages of a series of service times and of
// their squares, so that how variable the work is can be told from them.
// The zero value holds nothing. It is not safe for concurrent use.
type Variability struct {
	mean, square float64
	// cv2 is SquaredCV, computed when a sample is folded in: the engine
	// reads it for every candidate of every selection, and its division
	// was an eighth of a QoS 1 message's bookkeeping.
	cv2 float64
}

// variabilityWeight is the weight of a new sample in Variability's moving
// averages.
const variabilityWeight = 1.0 / 16

// Add folds one service time into the moving averages.
func (v *Variability) Add(sample time.Duration) { v.AddMean(sample, 1) }

// AddMean folds in the mean of count service times (a load report's
// processing time). The mean of k has the variance of one divided by k:
// k·mean² − (k−1)·(the running mean)² stands for the square of one.
func (v *Variability) AddMean(mean time.Duration, count int) {
	x, k := float64(mean), float64(max(count, 1))
	if v.mean == 0 {
		v.mean, v.square = x, x*x
	} else {
		q := k*x*x - (k-1)*v.mean*v.mean
		v.mean += variabilityWeight * (x - v.mean)
		v.square += variabilityWeight * (q - v.square)
	}
	v.cv2 = 0
	if v.mean > 0 {
		v.cv2 = min(max(v.square/(v.mean*v.mean)-1, 0), 1)
	}
}

// Mean is the moving average of the service times (0 before any).
func (v *Variability) Mean() time.Duration { return time.Duration(v.mean) }

// SquaredCV is the squared coefficient of variation of the service times,
// within [0, 1]: 0 when every message takes as long, 1 when the work is as
// variable as an exponential distribution's, or more.
func (v *Variability) SquaredCV() float64 { return v.cv2 }

// ExpectedRemaining is how much of a message that has run for ran is
// expected to be left, for work of mean service time mean and squared
// coefficient of variation cv2 (SquaredCV): mean − ran when every message
// takes as long, mean however long it has run when the work is as variable
// as an exponential distribution's (it has no memory), in between
// otherwise.
func ExpectedRemaining(mean, ran time.Duration, cv2 float64) time.Duration {
	left := max(mean-ran, 0)
	return left + time.Duration(cv2*float64(mean-left))
}

// poissonShortfall is E[max(n − N, 0)] for N ~ Poisson(lambda): how many
// of n messages are left after a Poisson count of completions. The sum
// skips the probabilities beyond 12 standard deviations of lambda (below
// 1e-30): n − lambda when n lies that far above it, 0 that far below,
// otherwise only the terms within them, in logarithms so that a large
// lambda does not underflow.
func poissonShortfall(n int, lambda float64) float64 {
	if n <= 0 {
		return 0
	}
	spread := 12 * math.Sqrt(max(lambda, 1))
	switch {
	case float64(n) >= lambda+spread:
		return float64(n) - lambda
	case float64(n) <= lambda-spread:
		return 0
	case lambda <= 50:
		return float64(n) - cappedPoisson(n, lambda).mean
	}
	from := max(int(lambda-spread), 0) // every term below it is negligible
	lg, _ := math.Lgamma(float64(from + 1))
	p := math.Exp(float64(from)*math.Log(lambda) - lambda - lg) // P(N = from)
	left := 0.0
	for j := from; j < n; j++ {
		left += float64(n-j) * p
		p *= lambda / float64(j+1)
	}
	return left
}

// cappedCount describes min(N, n) for N ~ Poisson(lambda).
type cappedCount struct {
	mean, variance float64
	atLeast        float64 // P(N ≥ n)
	atLeastNext    float64 // P(N ≥ n+1)
}

// cappedPoisson sums the Poisson probabilities below n once for what
// poissonShortfall, flushWindows' variability and its run-out times need.
// For a lambda past 745 every probability below n underflows to 0: the
// count is then taken to reach n.
func cappedPoisson(n int, lambda float64) cappedCount {
	p := math.Exp(-lambda) // P(N = j), from j = 0
	below := 0.0           // P(N < j)
	var m1, m2 float64
	for j := range n {
		m1 += float64(j) * p
		m2 += float64(j*j) * p
		below += p
		p *= lambda / float64(j+1)
	}
	atLeast := max(1-below, 0)
	m1 += float64(n) * atLeast
	m2 += float64(n*n) * atLeast
	return cappedCount{mean: m1, variance: max(m2-m1*m1, 0), atLeast: atLeast, atLeastNext: max(atLeast-p, 0)}
}
