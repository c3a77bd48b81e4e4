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
	cfg := DefaultConnectionsConfig()
	cfg.Out, cfg.Connections, cfg.Repeat, cfg.Churn, cfg.SettleWindow, cfg.SettleMax = out, 200, 1, 200, time.Second, 3*time.Second
	require.NoError(t, RunConnections(ctx, cfg))

	data, err := os.ReadFile(filepath.Join(out, "connections.json"))
	require.NoError(t, err)
	var res ConnectionsResults
	require.NoError(t, json.Unmarshal(data, &res))
	require.NotZero(t, res.FDLimit.Hard)
	require.Len(t, res.Runs, len(ConnectionsSystems))
	for _, r := range res.Runs {
		require.Empty(t, r.Error, r.System)
		require.Equal(t, 200, r.Connected, r.System)
		require.Equal(t, 200, r.Subscribed, r.System)
		require.Equal(t, 200, r.Delivered, r.System)
		require.Positive(t, r.ConnectPerS, r.System)
		require.Positive(t, r.RSSBeforeBytes, r.System)
		require.Positive(t, r.RSSAfterBytes, r.System)
	}
	require.Len(t, res.Churn, len(ConnectionsSystems))
	for _, c := range res.Churn {
		require.Empty(t, c.Error, c.System)
		require.Equal(t, 200, c.Completed, c.System)
		require.Positive(t, c.RSSBeforeBytes, c.System)
		require.Positive(t, c.RSSAfterBytes, c.System)
	}
	md, err := os.ReadFile(filepath.Join(out, "connections.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "KiB per idle connection")
	require.Contains(t, string(md), connectionsPlot)
	require.FileExists(t, filepath.Join(out, connectionsPlot))
	summary, err := os.ReadFile(filepath.Join(out, "summary.md"))
	require.NoError(t, err)
	require.Contains(t, string(summary), "## Idle connections")
	require.Contains(t, string(summary), "idle connections: at most 24 KiB", "its goals are among the summary's")
}

// TestConnectionsGoalsNeedEveryDelivery checks that a run short of one
// delivery misses the delivery goal and that medians come from the runs.
func TestConnectionsGoalsNeedEveryDelivery(t *testing.T) {
	res := &ConnectionsResults{Config: ConnectionsConfig{Connections: 10, Repeat: 3}}
	for i, per := range []float64{20, 10, 30} {
		res.Runs = append(res.Runs,
			ConnectionsRun{System: connectionsLuffyMQ, Repeat: i + 1, Connections: 10, Connected: 10, Subscribed: 10, Delivered: 10 - i%2,
				RSSBeforeBytes: 1, RSSAfterBytes: 2, RSSPerConnBytes: per * 1024, ConnectPerS: 100},
			ConnectionsRun{System: SystemMochi, Repeat: i + 1, Connections: 10, Connected: 10, Subscribed: 10, Delivered: 10,
				RSSBeforeBytes: 1, RSSAfterBytes: 2, RSSPerConnBytes: 40 * 1024, ConnectPerS: 100})
	}
	aggs := aggregateConnections(res)
	lm := findConnAgg(aggs, connectionsLuffyMQ)
	require.NotNil(t, lm)
	require.InDelta(t, 20, lm.RSSPerConnKiB, 1e-9)
	require.Equal(t, 9, lm.DeliveredMin)
	require.Equal(t, 2, lm.Complete)
	var statuses []string
	for _, g := range connectionsGoals(res, aggs) {
		statuses = append(statuses, g.Status)
	}
	// 20 KiB: within 24 KiB; 20/40 = 0.5x Mochi; one run delivered 9 of 10.
	require.Equal(t, []string{"met", "met", "missed"}, statuses)
}
