package controller

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge/placement"
)

// TestWorkQueueOverflowRates checks the overflow rates read off two
// luffymq status reads: counters' differences over the time between them,
// a counter that went back (luffymq restarted) counted from zero, an
// origin seen for the first time counted whole.
func TestWorkQueueOverflowRates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	prev := &luffyStatus{at: t0, fromSite: map[string]uint64{"a": 100, "b": 500}}
	cur := &luffyStatus{at: t0.Add(10 * time.Second), fromSite: map[string]uint64{"a": 300, "b": 40, "c": 20}}
	require.Equal(t, map[string]float64{"a": 20, "b": 4, "c": 2}, overflowRates(prev, cur))
	require.Empty(t, overflowRates(cur, cur), "no time between the reads")

	got := workQueueTraffic(map[string]map[string]float64{
		"a": {"b": 10, "c": 5, "a": 99}, // a's own: not over the overlay
		"b": {"a": 2},
	}, map[string]float64{"a": 1000, "b": 500})
	require.Equal(t, map[string]WorkQueueTraffic{
		"a": {In: 15_000, Out: 1_000},
		"b": {In: 1_000, Out: 10_000},
		"c": {Out: 5_000},
	}, got)
}

// TestWorkQueueOverflowInPlacement checks that the controller's decision
// step gives placement the bandwidth the work-queue overflow leaves: a is
// pubsub.x's best synchronisation site and keeps it while the overflow it
// receives leaves room for x's sync traffic (60 kB/s of 100 kB/s); when
// the luffymq counters say it receives 70 kB/s of overflow, x moves.
func TestWorkQueueOverflowInPlacement(t *testing.T) {
	c := quietController(t, Config{Sites: triangleSites(t, "100 kB/s")})
	rates := map[string]*siteRates{
		"a": {meanMessageSize: 1000, exchanges: map[string]InstanceRates{"pubsub.x": {Site: "a", LocalPublished: 80, LocalConsumed: 80, OverlayIn: 60, OverlayOut: 60}}},
		"b": {meanMessageSize: 1000, exchanges: map[string]InstanceRates{"pubsub.x": {Site: "b", LocalPublished: 30, LocalConsumed: 30, OverlayIn: 40, OverlayOut: 30}}},
		"c": {meanMessageSize: 1000, exchanges: map[string]InstanceRates{"pubsub.x": {Site: "c", LocalPublished: 30, LocalConsumed: 30, OverlayIn: 40, OverlayOut: 30}}},
	}
	plan := placement.Plan{"pubsub.x": "a"}
	for _, tt := range []struct {
		overflowPerS float64 // messages/s a takes from b and from c, each
		moves        bool
	}{{0, false}, {15, false}, {35, true}} {
		t0 := time.Unix(1000, 0)
		prev := &luffyStatus{at: t0, fromSite: map[string]uint64{"b": 0, "c": 0}}
		n := uint64(tt.overflowPerS * 60)
		cur := &luffyStatus{at: t0.Add(time.Minute), fromSite: map[string]uint64{"b": n, "c": n}}
		wq := workQueueTraffic(map[string]map[string]float64{"a": overflowRates(prev, cur)}, map[string]float64{"a": 1000})
		dec, err := c.decide(rates, nil, wq, plan, 1)
		require.NoError(t, err)
		require.Equal(t, tt.moves, dec.result.Plan["pubsub.x"] != "a", "%v msg/s from each of b and c into a: %v", tt.overflowPerS, dec.result.Plan)
		require.InDelta(t, 2*tt.overflowPerS*1000, dec.in.Sites[0].WorkQueueInbound, 1e-6)
		require.InDelta(t, tt.overflowPerS*1000, dec.in.Sites[1].WorkQueueOutbound, 1e-6)
	}
}

// TestChannelListToleratesEmptyDetails decodes a channel list as RabbitMQ
// writes it while a connection closes: connection details and statistics
// of such a channel come as [] instead of an object. (Under load, the
// whole round used to fail with "cannot unmarshal array into ...
// connection_details".)
func TestChannelListToleratesEmptyDetails(t *testing.T) {
	var channels []channelPublishes
	require.NoError(t, json.Unmarshal([]byte(`[
		{"connection_details": [], "message_stats": []},
		{"connection_details": {"name": "conn-1"}, "message_stats": {"publish": 3}}
	]`), &channels))
	require.Equal(t, "", channels[0].connection())
	require.Zero(t, channels[0].published())
	require.Equal(t, "conn-1", channels[1].connection())
	require.Equal(t, int64(3), channels[1].published())
}
