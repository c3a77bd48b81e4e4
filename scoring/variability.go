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
// of n messages are left after a Poisson count of completions. Far from
// the edge (n > 40 and lambda below n/2) the count almost never reaches
// n, and it is n − lambda; for a large lambda the count is taken as
// normal.
func poissonShortfall(n int, lambda float64) float64 {
	if n <= 0 {
		return 0
	}
	if n > 40 && lambda < float64(n)/2 {
		return float64(n) - lambda
	}
	if lambda > 50 {
		// The Poisson count is all but normal, and exp(−lambda) would
		// underflow past 745.
		sd := math.Sqrt(lambda)
		z := (float64(n) - lambda) / sd
		cdf := 0.5 * math.Erfc(-z/math.Sqrt2)
		pdf := math.Exp(-z*z/2) / math.Sqrt(2*math.Pi)
		return (float64(n)-lambda)*cdf + sd*pdf
	}
	p := math.Exp(-lambda) // P(N = 0)
	left := 0.0
	for j := range n {
		left += float64(n-j) * p
		p *= lambda / float64(j+1)
	}
	return left
}
