package connections

import (
	"testing"
	"time"

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

// TestConnectionsMemoryGoalCountsEveryReading checks that the memory
// goals hold only when the readings after the commands and after idling
// are within them too, each against Mochi's at the same point.
func TestConnectionsMemoryGoalCountsEveryReading(t *testing.T) {
	res := &ConnectionsResults{Config: ConnectionsConfig{Connections: 10, Repeat: 1, Idle: time.Minute}}
	run := func(system string, subscribed, commanded, idled float64) ConnectionsRun {
		return ConnectionsRun{System: system, Repeat: 1, Connections: 10, Connected: 10, Subscribed: 10, Delivered: 10, ConnectPerS: 100,
			RSSBeforeBytes: 1, RSSAfterBytes: 2, RSSCommandedBytes: 3, RSSIdledBytes: 4,
			RSSPerConnBytes: subscribed * 1024, RSSPerConnCommandedBytes: commanded * 1024, RSSPerConnIdledBytes: idled * 1024}
	}
	res.Runs = []ConnectionsRun{run(connectionsLuffyMQ, 20, 23, 30), run(harness.SystemMochi, 40, 50, 45)}
	goals := Goals(res, Aggregate(res))
	require.Equal(t, "missed", goals[0].Status, "30 KiB while idling is over 24: %s", goals[0].Detail)
	require.Contains(t, goals[0].Detail, "at most 30.0 KiB while idling 1m0s")
	require.Equal(t, "missed", goals[1].Status, "30/45 = 0.67x Mochi while idling: %s", goals[1].Detail)
	res.Runs[0] = run(connectionsLuffyMQ, 20, 23, 24)
	goals = Goals(res, Aggregate(res))
	require.Equal(t, []string{"met", "met"}, []string{goals[0].Status, goals[1].Status}, "%s / %s", goals[0].Detail, goals[1].Detail)
}
