package shared

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

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

// run builds a RunResult of a three-member scenario with the given overall
// mean and p99.
func run(system string, repeat int, mean, p99 float64, lost int) RunResult {
	return RunResult{Scenario: "thesis-2", System: system, Repeat: repeat, Lost: lost,
		Overall: harness.LatencyStats{Count: 10, Mean: mean, P50: mean, P99: p99, Max: p99},
		PerSub: []SubscriberResult{
			{Member: 1, LatencyStats: harness.LatencyStats{Mean: mean}, MsgsPerSec: 40},
			{Member: 2, LatencyStats: harness.LatencyStats{Mean: mean}, MsgsPerSec: 40},
			{Member: 3, LatencyStats: harness.LatencyStats{Mean: 2 * mean}, MsgsPerSec: 20},
		}}
}
