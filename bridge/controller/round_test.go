package controller

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/bridge/placement"
	"github.com/luffymq/luffymq/internal/rabbitharness"
	"github.com/luffymq/luffymq/internal/testenv"
)

// TestControllerInputsFromManagementAPI publishes known traffic on two real
// nodes, one federating pubsub.in from the other, and checks what a round
// measures: per instance, local publishes and deliveries and overlay
// traffic in each direction, as counts over the period between two rounds;
// the mean message size; which exchanges are global; work queues.
func TestControllerInputsFromManagementAPI(t *testing.T) {
	h := sharedNodes(t)
	vhost := testVhost(t, h)
	na, nb := h.Node("berlin"), h.Node("tunis")
	sites := sitesFile(t, vhost, []testSite{{name: "a", node: na}, {name: "b", node: nb}}, map[string]float64{"a-b": 20})
	cha, chb := amqpChannel(t, na, vhost), amqpChannel(t, nb, vhost)
	declareExchange(t, cha, "pubsub.in")
	declareExchange(t, chb, "pubsub.in")
	declareExchange(t, cha, "pubsub.solo") // one site only: not global
	_, err := cha.QueueDeclare("wq.jobs", true, false, false, false, nil)
	require.NoError(t, err)
	_, err = chb.QueueDeclare("wq.jobs", true, false, false, false, nil)
	require.NoError(t, err)
	_, err = cha.QueueDeclare("wq.only-here", true, false, false, false, nil)
	require.NoError(t, err)
	// b federates pubsub.in from a, as its site agent would.
	require.NoError(t, bridge.ApplyFederation(context.Background(), bridge.FederationConfig{
		ManagementURL: nb.ManagementURL(), Username: rabbitharness.User, Password: rabbitharness.Password, Vhost: vhost,
		Exchanges: []bridge.ExchangeFederation{{Exchange: "pubsub.in", Upstreams: []bridge.Upstream{{Site: "a", URI: amqpURL(na, vhost)}}}},
	}))
	require.Eventually(t, func() bool {
		links, err := mgmt(t, nb).ListFederationLinksIn(vhost)
		return err == nil && len(links) == 1 && links[0]["status"] == "running"
	}, 30*time.Second, 100*time.Millisecond, "federation link of pubsub.in at b")

	c := newController(t, sites, 0, &testenv.LockedBuffer{})
	first, err := c.Round(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{"pubsub.in"}, exchangeNames(first.Input), "pubsub.solo is at one site only")
	require.InDelta(t, testFirstWindow.Seconds(), c.Status().Sites[0].PeriodSeconds, 0.25, "first read: measured over the first window")

	const size = 1000
	publishN(t, cha, "pubsub.in", 40, size)
	publishN(t, chb, "pubsub.in", 10, size)
	publishN(t, cha, "pubsub.solo", 5, size)
	// a: 40 in, routed to its local queue and to b's federation queue; b:
	// 10 local and 40 federated in, all routed to its local queue.
	waitExchangeCounts(t, na, vhost, "pubsub.in", 40, 80)
	waitExchangeCounts(t, nb, vhost, "pubsub.in", 50, 50)
	require.Eventually(t, func() bool {
		links, err := mgmt(t, nb).ListFederationLinksIn(vhost)
		if err != nil || len(links) != 1 {
			return false
		}
		lc, _ := links[0]["local_channel"].(map[string]any)
		st, _ := lc["message_stats"].(map[string]any)
		pub, _ := st["publish"].(float64)
		q, err := mgmt(t, na).ListQueuesIn(vhost)
		delivered := false
		for _, x := range q {
			if strings.HasPrefix(x.Name, "federation: pubsub.in -> ") && x.MessageStats != nil && x.MessageStats.DeliverGet == 40 {
				delivered = true
			}
		}
		return err == nil && pub == 40 && delivered
	}, 20*time.Second, 100*time.Millisecond, "link and federation queue statistics")
	// Connection byte counters are refreshed apart from the message
	// counters: under load they lagged, and the mean size came out at
	// 225 B. Wait until both nodes' connections count what was sent.
	require.Eventually(t, func() bool {
		return receivedBytes(t, na) >= 45*size && receivedBytes(t, nb) >= 10*size
	}, 20*time.Second, 100*time.Millisecond, "connection byte statistics")

	res, err := c.Round(context.Background())
	require.NoError(t, err)
	st := c.Status()
	period := map[string]float64{}
	for _, s := range st.Sites {
		require.Greater(t, s.PeriodSeconds, 0.0, "second read: rates over the period")
		period[s.Name] = s.PeriodSeconds
	}
	require.Len(t, res.Exchanges, 1)
	x := res.Exchanges[0]
	require.Equal(t, "pubsub.in", x.Name)
	counts := map[string][4]float64{}
	for _, inst := range x.Instances {
		p := period[inst.Site]
		counts[inst.Site] = [4]float64{
			math.Round(inst.LocalPublished * p), math.Round(inst.LocalConsumed * p),
			math.Round(inst.OverlayIn * p), math.Round(inst.OverlayOut * p),
		}
	}
	// [local published, local consumed, overlay in, overlay out]
	require.Equal(t, [4]float64{40, 40, 0, 40}, counts["a"])
	require.Equal(t, [4]float64{10, 50, 40, 0}, counts["b"])
	// Mean message size: the bytes a's publisher sent over its 45 messages
	// of 1000 bytes, AMQP framing and connection set-up included.
	require.Greater(t, x.MeanMessageSize, float64(size))
	require.Less(t, x.MeanMessageSize, float64(size)*1.3)

	// The same figures are what placement was given.
	require.Len(t, res.Input.Exchanges, 1)
	require.Len(t, res.Input.Sites, 2)
	require.Equal(t, sites.Delays, res.Input.Delays)
	for _, inst := range res.Input.Exchanges[0].Instances {
		require.InDelta(t, counts[inst.Site][0], inst.LocalPublished*period[inst.Site], 0.5)
		require.InDelta(t, counts[inst.Site][2], inst.OverlayIn*period[inst.Site], 0.5)
	}
	// Configurations: the exchange between its two instances (the same
	// whichever is the synchronisation site) and wq.jobs between the two
	// sites that have it; wq.only-here stays local.
	ua, ub := amqpURL(na, vhost), amqpURL(nb, vhost)
	require.True(t, res.Configs["a"].Equal(bridge.SiteConfig{"pubsub.in": {ub}, "wq.jobs": {ub}}), "%v", res.Configs["a"])
	require.True(t, res.Configs["b"].Equal(bridge.SiteConfig{"pubsub.in": {ua}, "wq.jobs": {ua}}), "%v", res.Configs["b"])
	require.ElementsMatch(t, []string{"wq.jobs", "wq.only-here"}, st.Sites[0].WorkQueues)
}

func exchangeNames(in placement.Input) []string {
	var names []string
	for _, x := range in.Exchanges {
		names = append(names, x.Name)
	}
	return names
}

// TestControllerRoundPublishesOnlyChanges runs rounds over three real
// nodes: the first publishes each site's configuration, an identical round
// publishes nothing, a traffic change moves the synchronisation site to the
// central site and republishes, and the next identical round publishes
// nothing again. Status and metrics say what moved and why.
func TestControllerRoundPublishesOnlyChanges(t *testing.T) {
	h := sharedNodes(t)
	vhost := testVhost(t, h)
	na, nb, nc := h.Node("berlin"), h.Node("tunis"), h.Node("tokyo")
	// b sits between a and c.
	sites := sitesFile(t, vhost, []testSite{{name: "a", node: na}, {name: "b", node: nb}, {name: "c", node: nc}},
		map[string]float64{"a-b": 10, "b-c": 10, "a-c": 100})
	chs := map[string]*amqp.Channel{}
	for name, n := range map[string]*rabbitharness.Node{"a": na, "b": nb, "c": nc} {
		ch := amqpChannel(t, n, vhost)
		declareExchange(t, ch, "pubsub.r")
		chs[name] = ch
	}
	ua, ub, uc := amqpURL(na, vhost), amqpURL(nb, vhost), amqpURL(nc, vhost)
	c := newController(t, sites, 1, &testenv.LockedBuffer{})

	// Round 1, no traffic: every site costs the same and ties go by name.
	res, err := c.Round(context.Background())
	require.NoError(t, err)
	require.Equal(t, placement.Plan{"pubsub.r": "a"}, res.Result.Plan)
	require.Equal(t, []string{"a", "b", "c"}, res.Published)
	want := map[string]bridge.SiteConfig{
		"a": {"pubsub.r": {ub, uc}}, "b": {"pubsub.r": {ua}}, "c": {"pubsub.r": {ua}},
	}
	for site, ch := range chs {
		got := drainConfigs(t, ch, site)
		require.Len(t, got, 1, site)
		require.True(t, want[site].Equal(got[0]), "%s: %v", site, got[0])
	}
	require.NotNil(t, res.Change, "a first placement is a change")
	require.Equal(t, "", res.Change.Moves[0].From)

	// Round 2, nothing changed: nothing is published.
	res, err = c.Round(context.Background())
	require.NoError(t, err)
	require.Empty(t, res.Published)
	require.Nil(t, res.Change)
	for site, ch := range chs {
		require.Empty(t, drainConfigs(t, ch, site), site)
	}

	// Publishers and consumers at a and c: b, between them, is better.
	publishN(t, chs["a"], "pubsub.r", 30, 100)
	publishN(t, chs["c"], "pubsub.r", 30, 100)
	waitExchangeCounts(t, na, vhost, "pubsub.r", 30, 30)
	waitExchangeCounts(t, nc, vhost, "pubsub.r", 30, 30)
	res, err = c.Round(context.Background())
	require.NoError(t, err)
	require.Equal(t, placement.Plan{"pubsub.r": "b"}, res.Result.Plan)
	require.Equal(t, []string{"a", "b", "c"}, res.Published)
	want = map[string]bridge.SiteConfig{
		"a": {"pubsub.r": {ub}}, "b": {"pubsub.r": {ua, uc}}, "c": {"pubsub.r": {ub}},
	}
	for site, ch := range chs {
		got := drainConfigs(t, ch, site)
		require.Len(t, got, 1, site)
		require.True(t, want[site].Equal(got[0]), "%s: %v", site, got[0])
	}
	require.NotNil(t, res.Change)
	require.Len(t, res.Change.Moves, 1)
	mv := res.Change.Moves[0]
	require.Equal(t, "pubsub.r", mv.Exchange)
	require.Equal(t, "a", mv.From)
	require.Equal(t, "b", mv.To)
	require.NotEmpty(t, mv.Reason)
	require.NotNil(t, mv.CostBeforeMs)
	require.NotNil(t, mv.CostAfterMs)
	require.InDelta(t, 100, *mv.CostBeforeMs, 1, "half the publications cross 100 ms, half the deliveries too")
	require.Less(t, *mv.CostAfterMs, 25.0, "10 + 10 ms plus λ's share")
	require.Less(t, res.Change.PlanCostAfter, res.Change.PlanCostBefore)

	// Round 4, no new traffic: the move stays, nothing is published.
	res, err = c.Round(context.Background())
	require.NoError(t, err)
	require.Equal(t, placement.Plan{"pubsub.r": "b"}, res.Result.Plan)
	require.Empty(t, res.Published)
	for site, ch := range chs {
		require.Empty(t, drainConfigs(t, ch, site), site)
	}

	st := c.Status()
	require.Equal(t, map[string]string{"pubsub.r": "b"}, st.Plan)
	require.NotNil(t, st.LastChange)
	require.Equal(t, uint64(3), st.LastChange.Round)
	require.Equal(t, "a", st.LastChange.Moves[0].From)
	for _, s := range st.Sites {
		require.True(t, *s.Management.Reachable, s.Name)
		require.True(t, *s.AMQP.Reachable, s.Name)
		require.Equal(t, uint64(2), s.ConfigsPublished, s.Name)
		for _, uris := range s.Config {
			for _, u := range uris {
				require.NotContains(t, u, ":guest@", "the status API hides passwords")
			}
		}
	}
	body := scrape(t, c.Handler(), "/api/v1/status")
	var decoded Status
	require.NoError(t, json.Unmarshal([]byte(body), &decoded))
	require.Equal(t, "b", decoded.Exchanges[0].SyncSite)
	require.NotContains(t, body, ":guest@")
	metrics := scrape(t, c.Handler(), "")
	for _, line := range []string{
		`luffy_controller_rounds_total 4`,
		`luffy_controller_plan_changes_total 2`,
		`luffy_controller_moves_total{exchange="pubsub.r"} 1`,
		`luffy_controller_sync_site{exchange="pubsub.r",site="b"} 1`,
		`luffy_controller_configurations_published_total{site="a"} 2`,
		`luffy_controller_site_reachable{api="management",site="c"} 1`,
		`luffy_controller_global_exchanges 1`,
	} {
		require.Contains(t, metrics, line)
	}
	require.NotContains(t, metrics, `luffy_controller_sync_site{exchange="pubsub.r",site="a"}`, "the old site's series is gone")
	require.Contains(t, metrics, "luffy_controller_last_round_duration_seconds")
}

// receivedBytes sums the bytes a node's connections received, as its
// management API reports them.
func receivedBytes(t *testing.T, n *rabbitharness.Node) uint64 {
	conns, err := mgmt(t, n).ListConnections()
	if err != nil {
		return 0
	}
	var sum uint64
	for _, c := range conns {
		sum += c.RecvOct
	}
	return sum
}
