package connections_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench/connections"
	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/bench/shared"
	"github.com/luffymq/luffymq/internal/testenv"
)

// TestConnectionsSmoke runs `luffy-bench connections` with 200 devices,
// 2 s of idling and 200 churn sessions against luffymq, vanilla Mochi and
// Mosquitto, and checks that every device got its command and every
// number was measured (the Go runtime's gauges for the Go brokers only).
func TestConnectionsSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts brokers; skipped with -short")
	}
	testenv.RequireBinary(t, "go", "golang-go")
	testenv.StartMosquitto(t) // skips, or fails under CI=true, when Mosquitto is missing
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := connections.DefaultConnectionsConfig()
	cfg.Out, cfg.Connections, cfg.Repeat, cfg.Churn, cfg.SettleWindow, cfg.SettleMax = out, 200, 1, 200, time.Second, 3*time.Second
	cfg.Idle = 2 * time.Second
	cfg.WriteSummary = shared.WriteSummary
	require.NoError(t, connections.RunConnections(ctx, cfg))

	data, err := os.ReadFile(filepath.Join(out, "connections.json"))
	require.NoError(t, err)
	var res connections.ConnectionsResults
	require.NoError(t, json.Unmarshal(data, &res))
	require.NotZero(t, res.FDLimit.Hard)
	require.Len(t, res.Runs, len(connections.ConnectionsSystems))
	for _, r := range res.Runs {
		require.Empty(t, r.Error, r.System)
		require.Equal(t, 200, r.Connected, r.System)
		require.Equal(t, 200, r.Subscribed, r.System)
		require.Equal(t, 200, r.Delivered, r.System)
		require.Positive(t, r.ConnectPerS, r.System)
		require.Positive(t, r.RSSBeforeBytes, r.System)
		require.Positive(t, r.RSSAfterBytes, r.System)
		require.Positive(t, r.RSSCommandedBytes, r.System)
		require.Positive(t, r.RSSIdledBytes, r.System)
		if r.System == harness.SystemMosquitto {
			require.Nil(t, r.GoBefore, "Mosquitto has no Go runtime")
			continue
		}
		for _, m := range []*harness.GoMemory{r.GoBefore, r.GoSubscribed, r.GoCommanded, r.GoIdled} {
			require.NotNil(t, m, r.System)
			require.Positive(t, m.HeapInuseBytes, r.System)
		}
		// Mochi runs two goroutines per client, each with a stack (a few
		// of the broker's own come and go).
		require.InDelta(t, 2*200, r.GoSubscribed.Goroutines-r.GoBefore.Goroutines, 10, r.System)
		require.Greater(t, r.GoCommanded.StackBytes, r.GoBefore.StackBytes+200*8<<10, r.System)
	}
	require.Len(t, res.Churn, len(connections.ConnectionsSystems))
	for _, c := range res.Churn {
		require.Empty(t, c.Error, c.System)
		require.Equal(t, 200, c.Completed, c.System)
		require.Positive(t, c.RSSBeforeBytes, c.System)
		require.Positive(t, c.RSSAfterBytes, c.System)
	}
	md, err := os.ReadFile(filepath.Join(out, "connections.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "KiB per idle connection")
	require.Contains(t, string(md), connections.RSSPlotFile)
	require.FileExists(t, filepath.Join(out, connections.RSSPlotFile))
	summary, err := os.ReadFile(filepath.Join(out, "summary.md"))
	require.NoError(t, err)
	require.Contains(t, string(summary), "## Idle connections")
	require.Contains(t, string(summary), "idle connections: at most 24 KiB", "its goals are among the summary's")
}
