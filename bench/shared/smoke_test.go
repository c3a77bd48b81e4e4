package shared

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/internal/testenv"
)

// TestSharedPipelineSmoke runs thesis-1 shortened to 2 s on the real
// luffymq binary and the oracle and checks that every output exists and the
// counts add up. It asserts nothing about timings.
func TestSharedPipelineSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts luffymq; skipped with -short")
	}
	testenv.RequireBinary(t, "go", "golang-go")
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := RunShared(ctx, SharedConfig{
		Scenarios: []string{"thesis-1"}, Out: out, Duration: 2 * time.Second, Repeat: 1,
		Systems: []string{"luffymq-adaptive", harness.SystemOracle}, DrainTimeout: 20 * time.Second,
	})
	require.NoError(t, err)
	res := checkOutputs(t, out, "thesis-1", KindSDK)
	require.Len(t, res.Runs, 2)
	for _, r := range res.Runs {
		require.Equal(t, 200, r.Sent, r.System)
		require.Equal(t, r.Sent, r.Dequeued+r.Lost, r.System)
		sum := 0
		for _, s := range r.PerSub {
			sum += s.Count
		}
		require.Equal(t, r.Dequeued, sum, r.System)
		require.Equal(t, r.Dequeued, r.Overall.Count, r.System)
	}
	require.Equal(t, 0, res.Runs[1].Lost, "the oracle loses nothing")
}

// TestSharedPipelineMosquittoSmoke runs the same pipeline against Mosquitto
// and vanilla Mochi, both as processes of their own (Mochi through this
// test binary, see TestMain).
func TestSharedPipelineMosquittoSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts mosquitto; skipped with -short")
	}
	testenv.StartMosquitto(t) // skips, or fails under CI=true, when Mosquitto is missing
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := RunShared(ctx, SharedConfig{
		Scenarios: []string{"thesis-2"}, Out: out, Duration: time.Second, Repeat: 1,
		Systems: []string{harness.SystemMosquitto, harness.SystemMochi}, DrainTimeout: 20 * time.Second,
	})
	require.NoError(t, err)
	res := checkOutputs(t, out, "thesis-2", KindSDK)
	require.Len(t, res.Runs, 2)
	for _, r := range res.Runs {
		require.Equal(t, 100, r.Sent, r.System)
		require.Equal(t, r.Sent, r.Dequeued+r.Lost, r.System)
	}
}

func checkOutputs(t *testing.T, out, scenario, kind string) SharedResults {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(out, "results.json"))
	require.NoError(t, err)
	var res SharedResults
	require.NoError(t, json.Unmarshal(data, &res))
	require.NotEmpty(t, res.Machine.CPU)
	require.NotEmpty(t, res.Emulation)
	summary, err := os.ReadFile(filepath.Join(out, "summary.md"))
	require.NoError(t, err)
	require.Contains(t, string(summary), "## "+scenario)
	require.Contains(t, string(summary), "### "+scenario+" · "+kind+" subscribers")
	for _, p := range []string{"subscriber-mean", "latency-over-time", "msgs-per-sec"} {
		st, err := os.Stat(filepath.Join(out, plotFile(scenario, kind, p)))
		require.NoError(t, err)
		require.Greater(t, st.Size(), int64(1000))
	}
	return res
}

// TestSharedPipelinePahoKindsSmoke runs thesis-1 shortened to 2 s with the
// plain paho subscriber kinds on the real luffymq binary and the oracle,
// and checks that results are keyed by kind, the reporters reported and
// the counts add up. It asserts nothing about timings.
func TestSharedPipelinePahoKindsSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts luffymq; skipped with -short")
	}
	testenv.RequireBinary(t, "go", "golang-go")
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kinds := []string{KindThesisReporter, KindPahoQoS1AckAfter}
	err := RunShared(ctx, SharedConfig{
		Scenarios: []string{"thesis-1"}, Out: out, Duration: 2 * time.Second, Repeat: 1,
		Systems: []string{"luffymq-adaptive", harness.SystemOracle}, Subscribers: kinds, DrainTimeout: 20 * time.Second,
	})
	require.NoError(t, err)
	var res SharedResults
	for _, k := range kinds {
		res = checkOutputs(t, out, "thesis-1", k)
	}
	require.Len(t, res.Runs, 4)
	seen := map[runKey]bool{}
	for _, r := range res.Runs {
		require.False(t, seen[r.key()], "one run per (scenario, kind, system): %v", r.key())
		seen[r.key()] = true
		require.Equal(t, 200, r.Sent, r.key())
		require.Equal(t, r.Sent, r.Dequeued+r.Lost, r.key())
		require.Equal(t, 0, r.Duplicated, r.key())
		if r.System == harness.SystemOracle {
			continue
		}
		for _, s := range r.PerSub {
			switch r.Subscriber {
			case KindThesisReporter:
				require.Equal(t, "pingreq", s.ReportVia)
				require.GreaterOrEqual(t, s.ReportsSent, uint64(1), "at least the report after the first processed message")
				require.Equal(t, byte(0), r.Params.QoS)
			case KindPahoQoS1AckAfter:
				require.Equal(t, "none", s.ReportVia)
				require.Zero(t, s.ReportsSent)
				require.Equal(t, byte(1), r.Params.QoS)
			}
		}
	}
	require.FileExists(t, filepath.Join(out, kindsPlotFile("thesis-1")))
}
