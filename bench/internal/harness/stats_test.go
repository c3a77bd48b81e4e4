package harness

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPercentileNearestRank(t *testing.T) {
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	tests := []struct {
		values []float64
		p      float64
		want   float64
	}{
		{ten, 50, 5},
		{ten, 99, 10},
		{ten, 10, 1},
		{ten, 11, 2},
		{ten, 100, 10},
		{[]float64{42}, 99, 42},
		{[]float64{1, 2}, 50, 1},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, Percentile(tt.values, tt.p), "p%v of %v", tt.p, tt.values)
	}
	require.True(t, math.IsNaN(Percentile(nil, 50)))
}

func TestSummarise(t *testing.T) {
	s := Summarise([]float64{4, 1, 3, 2})
	require.Equal(t, LatencyStats{Count: 4, Mean: 2.5, P50: 2, P99: 4, Max: 4}, s)
	empty := Summarise(nil)
	require.Equal(t, 0, empty.Count)
	require.True(t, math.IsNaN(empty.Mean))
}

func TestMedian(t *testing.T) {
	require.Equal(t, 3.0, Median([]float64{5, 1, 3}))
	require.Equal(t, 2.5, Median([]float64{4, 1, 3, 2}))
	require.Equal(t, 2.0, Median([]float64{math.NaN(), 2}))
	require.True(t, math.IsNaN(Median(nil)))
}

func TestRatio(t *testing.T) {
	require.Equal(t, 0.5, Ratio(1, 2))
	require.True(t, math.IsNaN(Ratio(1, 0)))
	require.True(t, math.IsNaN(Ratio(math.NaN(), 2)))
}

func TestPayloadRoundTrip(t *testing.T) {
	now := time.Unix(0, 1_700_000_000_123_456_789)
	b := EncodePayload(1234, now)
	require.Len(t, b, PayloadSize)
	seq, sent, ok := DecodePayload(b)
	require.True(t, ok)
	require.Equal(t, 1234, seq)
	require.True(t, sent.Equal(now))
	_, _, ok = DecodePayload([]byte{1, 2})
	require.False(t, ok)
}
