package connections

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// TestConnectionsGoalsNeedEveryDelivery checks that a run short of one
// delivery misses the delivery goal and that medians come from the runs.
func TestConnectionsGoalsNeedEveryDelivery(t *testing.T) {
	res := &ConnectionsResults{Config: ConnectionsConfig{Connections: 10, Repeat: 3}}
	for i, per := range []float64{20, 10, 30} {
		res.Runs = append(res.Runs,
			ConnectionsRun{System: connectionsLuffyMQ, Repeat: i + 1, Connections: 10, Connected: 10, Subscribed: 10, Delivered: 10 - i%2,
				RSSBeforeBytes: 1, RSSAfterBytes: 2, RSSPerConnBytes: per * 1024, ConnectPerS: 100},
			ConnectionsRun{System: harness.SystemMochi, Repeat: i + 1, Connections: 10, Connected: 10, Subscribed: 10, Delivered: 10,
				RSSBeforeBytes: 1, RSSAfterBytes: 2, RSSPerConnBytes: 40 * 1024, ConnectPerS: 100})
	}
	aggs := Aggregate(res)
	lm := findConnAgg(aggs, connectionsLuffyMQ)
	require.NotNil(t, lm)
	require.InDelta(t, 20, lm.RSSPerConnKiB, 1e-9)
	require.Equal(t, 9, lm.DeliveredMin)
	require.Equal(t, 2, lm.Complete)
	var statuses []string
	for _, g := range Goals(res, aggs) {
		statuses = append(statuses, g.Status)
	}
	// 20 KiB: within 24 KiB; 20/40 = 0.5x Mochi; one run delivered 9 of 10.
	require.Equal(t, []string{"met", "met", "missed"}, statuses)
}
