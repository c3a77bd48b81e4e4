package bench

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
		Systems: []string{"luffymq-adaptive", SystemOracle}, DrainTimeout: 20 * time.Second,
	})
	require.NoError(t, err)
	res := checkOutputs(t, out, "thesis-1")
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

// TestSharedPipelineMosquittoSmoke runs the same pipeline against Mosquitto.
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
		Systems: []string{SystemMosquitto, SystemMochi}, DrainTimeout: 20 * time.Second,
	})
	require.NoError(t, err)
	res := checkOutputs(t, out, "thesis-2")
	require.Len(t, res.Runs, 2)
	for _, r := range res.Runs {
		require.Equal(t, 100, r.Sent, r.System)
		require.Equal(t, r.Sent, r.Dequeued+r.Lost, r.System)
	}
}

func checkOutputs(t *testing.T, out, scenario string) SharedResults {
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
	for _, p := range []string{"-subscriber-mean.png", "-latency-over-time.png", "-msgs-per-sec.png"} {
		st, err := os.Stat(filepath.Join(out, scenario+p))
		require.NoError(t, err)
		require.Greater(t, st.Size(), int64(1000))
	}
	return res
}
