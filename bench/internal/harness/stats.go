package harness

import (
	"math"
	"sort"
	"time"
)

// LatencyStats summarises latencies in milliseconds.
type LatencyStats struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// Percentile returns the p-th percentile (0 < p ≤ 100) of sorted values by
// the nearest-rank method: the smallest value with at least p % of the
// values at or below it. It returns NaN for no values.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// Summarise computes count, mean, p50, p99 and max of values (any order);
// the zero LatencyStats with NaNs for no values.
func Summarise(values []float64) LatencyStats {
	if len(values) == 0 {
		nan := math.NaN()
		return LatencyStats{Mean: nan, P50: nan, P99: nan, Max: nan}
	}
	s := append([]float64(nil), values...)
	sort.Float64s(s)
	sum := 0.0
	for _, v := range s {
		sum += v
	}
	return LatencyStats{
		Count: len(s),
		Mean:  sum / float64(len(s)),
		P50:   Percentile(s, 50),
		P99:   Percentile(s, 99),
		Max:   s[len(s)-1],
	}
}

// Median returns the median of values ignoring NaNs (the mean of the two
// middle values for an even count), or NaN if there are none.
func Median(values []float64) float64 {
	s := make([]float64, 0, len(values))
	for _, v := range values {
		if !math.IsNaN(v) {
			s = append(s, v)
		}
	}
	if len(s) == 0 {
		return math.NaN()
	}
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Ratio returns a/b, or NaN when either is NaN or b is 0.
func Ratio(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return math.NaN()
	}
	return a / b
}

func Millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
