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
	"github.com/luffymq/luffymq/bench/shared"
	"github.com/luffymq/luffymq/internal/testenv"
)

// TestConnectionsSmoke runs `luffy-bench connections` with 200 devices and
// 200 churn sessions against luffymq, vanilla Mochi and Mosquitto, and
// checks that every device got its command and every number was measured.
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
