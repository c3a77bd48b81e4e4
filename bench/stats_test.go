package bench

import (
	"math"
	"strings"
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

// run builds a RunResult of a three-member scenario with the given overall
// mean and p99.
func run(system string, repeat int, mean, p99 float64, lost int) RunResult {
	return RunResult{Scenario: "thesis-2", System: system, Repeat: repeat, Lost: lost,
		Overall: LatencyStats{Count: 10, Mean: mean, P50: mean, P99: p99, Max: p99},
		PerSub: []SubscriberResult{
			{Member: 1, LatencyStats: LatencyStats{Mean: mean}, MsgsPerSec: 40},
			{Member: 2, LatencyStats: LatencyStats{Mean: mean}, MsgsPerSec: 40},
			{Member: 3, LatencyStats: LatencyStats{Mean: 2 * mean}, MsgsPerSec: 20},
		}}
}

func TestAggregateTakesMediansOverRepeats(t *testing.T) {
	aggs := aggregateRuns([]RunResult{
		run("luffymq-adaptive", 1, 1, 10, 0),
		run("oracle", 1, 2, 4, 0),
		run("luffymq-adaptive", 2, 5, 30, 2),
		run("luffymq-adaptive", 3, 3, 20, 0),
	})
	require.Len(t, aggs, 2)
	ad := aggs[0]
	require.Equal(t, "luffymq-adaptive", ad.System)
	require.Equal(t, 3, ad.Runs)
	require.Equal(t, 3.0, ad.Overall.Mean)
	require.Equal(t, 20.0, ad.Overall.P99)
	require.Equal(t, []float64{3, 3, 6}, ad.SubMean)
	require.Equal(t, 0.0, ad.Lost)
	require.Equal(t, 2, ad.LostMax)
	require.Equal(t, "oracle", aggs[1].System)
}

func TestScenarioTableRatioColumns(t *testing.T) {
	adaptive1, adaptive2 := run("luffymq-adaptive", 1, 4, 10, 0), run("luffymq-adaptive", 2, 4, 10, 0)
	// Each run against the oracle on its own network: 4 ÷ 2.5 and 4 ÷ 3.2.
	adaptive1.OracleSameDelaysMean, adaptive2.OracleSameDelaysMean = 2.5, 3.2
	aggs := aggregateRuns([]RunResult{
		adaptive1, adaptive2,
		run("mosquitto", 1, 1600, 9000, 0),
		run("oracle", 1, 2, 5, 0),
	})
	table := scenarioTable(aggs)
	var adaptive, mosq, oracle string
	for _, l := range strings.Split(table, "\n") {
		switch {
		case strings.HasPrefix(l, "| luffymq-adaptive "):
			adaptive = l
		case strings.HasPrefix(l, "| mosquitto "):
			mosq = l
		case strings.HasPrefix(l, "| "+OracleName+" "):
			oracle = l
		}
	}
	// mean ÷ Mosquitto, mean ÷ oracle, then the median of each run's
	// mean ÷ the oracle replayed on that run's network ((1.6 + 1.25) / 2).
	require.True(t, strings.HasSuffix(adaptive, "| 0.0025× | 2.00× | 1.43× |"), adaptive)
	require.True(t, strings.HasSuffix(mosq, "| 1.00× | 800× | — |"), mosq)
	require.True(t, strings.HasSuffix(oracle, "| 0.0013× | 1.00× | — |"), oracle)
}

func TestRollingP99AndRecovery(t *testing.T) {
	var ds []Delivery
	// 10 messages per 100 ms for 3 s; those published in [1 s, 1.5 s) wait
	// 80 ms, the rest 1 ms.
	for i := range 300 {
		sent := time.Duration(i) * 10 * time.Millisecond
		lat := time.Millisecond
		if sent >= time.Second && sent < 1500*time.Millisecond {
			lat = 80 * time.Millisecond
		}
		ds = append(ds, Delivery{Seq: i, Sent: sent, Start: sent + lat})
	}
	series := RollingP99(ds, 500*time.Millisecond, 100*time.Millisecond)
	require.NotEmpty(t, series)
	for _, p := range series {
		switch {
		case p.T <= 1.0+1e-9 || p.T >= 2.0-1e-9:
			require.Equal(t, 1.0, p.V, "t=%v", p.T)
		default:
			require.Equal(t, 80.0, p.V, "t=%v", p.T)
		}
	}
	// Windows end-exclusive: the last one over 50 ms ends at 1.9 s, so the
	// p99 is back 0.9 s after an event at 1.0 s.
	require.InDelta(t, 0.9, recoveryTime(series, 1.0, 50), 1e-9)
	require.Equal(t, 0.0, recoveryTime(series, 2.5, 50))
	require.Equal(t, -1.0, recoveryTime([]TimePoint{{1, 1}, {2, 60}}, 0.5, 50))
}

func TestBuildResultCountsLostAndDuplicates(t *testing.T) {
	s := Scenario{ID: "x", Members: []Member{{Service: time.Millisecond}, {Service: time.Millisecond}}}
	ds := []Delivery{
		{Seq: 0, Member: 0, Sent: 0, Start: time.Millisecond},
		{Seq: 1, Member: 1, Sent: 0, Start: 2 * time.Millisecond},
		{Seq: 1, Member: 0, Sent: 0, Start: 5 * time.Millisecond}, // redelivery
	}
	r := buildResult(s, KindSDK, "luffymq-adaptive", 1, nil, 4, 1, ds)
	require.Equal(t, 2, r.Dequeued)
	require.Equal(t, 2, r.Lost)
	require.Equal(t, 1, r.Duplicated)
	require.Equal(t, 1, r.PerSub[0].Count)
	require.Equal(t, 1, r.PerSub[1].Count)
	require.Equal(t, 1.5, r.Overall.Mean)
}

func TestPayloadRoundTrip(t *testing.T) {
	now := time.Unix(0, 1_700_000_000_123_456_789)
	b := encodePayload(1234, now)
	require.Len(t, b, PayloadSize)
	seq, sent, ok := decodePayload(b)
	require.True(t, ok)
	require.Equal(t, 1234, seq)
	require.True(t, sent.Equal(now))
	_, _, ok = decodePayload([]byte{1, 2})
	require.False(t, ok)
}
