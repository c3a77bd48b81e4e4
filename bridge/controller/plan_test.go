package controller

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/bridge/placement"
)

// TestControllerConfigMessage checks the configuration message the
// controller sends through bridge.SiteConfig: the §2.6 JSON the site agent
// parses, validated as the agent validates it.
func TestControllerConfigMessage(t *testing.T) {
	c := bridge.SiteConfig{"pubsub.news": {"amqp://b:5672", "amqp://c:5672"}, "wq.jobs": {"amqp://b:5672"}}
	body, err := c.Marshal()
	require.NoError(t, err)
	require.JSONEq(t, `{"pubsub.news":[{"uri":"amqp://b:5672"},{"uri":"amqp://c:5672"}],"wq.jobs":[{"uri":"amqp://b:5672"}]}`, string(body))
	back, err := bridge.ParseSiteConfig(body)
	require.NoError(t, err)
	require.Equal(t, c, back)

	require.True(t, c.Equal(bridge.SiteConfig{"wq.jobs": {"amqp://b:5672"}, "pubsub.news": {"amqp://c:5672", "amqp://b:5672"}}), "order of upstreams does not matter")
	require.True(t, c.Equal(bridge.SiteConfig{"pubsub.news": {"amqp://b:5672", "amqp://c:5672"}, "wq.jobs": {"amqp://b:5672"}, "pubsub.x": nil}), "no upstream = absent")
	require.False(t, c.Equal(bridge.SiteConfig{"pubsub.news": {"amqp://b:5672"}, "wq.jobs": {"amqp://b:5672"}}))
	require.False(t, c.Equal(nil))
	require.True(t, bridge.SiteConfig{}.Equal(nil))

	for _, bad := range []bridge.SiteConfig{
		{"amq.topic": {"amqp://b"}},
		{"pubsub.x": {"http://user:secret@b:15672"}},
		{"wq.bad name": {"amqp://b"}},
	} {
		_, err := bad.Marshal()
		require.Error(t, err, "%v", bad)
		require.True(t, errors.Is(err, bridge.ErrInvalidConfig))
		require.NotContains(t, err.Error(), "secret")
	}
	_, err = bridge.ParseSiteConfig([]byte(`[1]`))
	require.ErrorIs(t, err, bridge.ErrInvalidConfig)

	for x, want := range map[string]string{"pubsub.a": "pubsub.a", "pubsub_b": "pubsub_b", "wq.jobs.in": "wq.jobs", "wq.jobs.dlx": "", "wq..in": "", "other": ""} {
		got, ok := bridge.SiteConfigEntity(x)
		require.Equal(t, want != "", ok, x)
		require.Equal(t, want, got, x)
	}
}

func threeSites(t *testing.T) *Sites {
	t.Helper()
	ss, err := ParseSites("plan.yaml", []byte(`
sites:
  - name: a
    amqp_url: amqp://a:5672/
    management_url: http://a:15672
  - name: b
    amqp_url: amqp://b:5672/
    management_url: http://b:15672
    federation_url: amqp://b-public:5672/
  - name: c
    amqp_url: amqp://c:5672/
    management_url: http://c:15672
    upstream_urls: {b: "amqp://b-from-c:5672/"}
  - name: d
    amqp_url: amqp://d:5672/
    management_url: http://d:15672
delays_ms:
  a: {b: 1, c: 1, d: 1}
  b: {c: 1, d: 1}
  c: {d: 1}
`))
	require.NoError(t, err)
	return ss
}

// TestControllerConfigsFromPlan checks the translation of a plan into each
// site's links: a star around each exchange's synchronisation site, the URI
// each site reaches the other through, a full mesh for work queues, and
// nothing for a site that holds nothing global.
func TestControllerConfigsFromPlan(t *testing.T) {
	ss := threeSites(t)
	in := placement.Input{Exchanges: []placement.Exchange{
		{Name: "pubsub.x", Instances: []placement.Instance{{Site: "c"}, {Site: "a"}, {Site: "b"}}},
		{Name: "pubsub.y", Instances: []placement.Instance{{Site: "a"}, {Site: "c"}}},
	}}
	plan := placement.Plan{"pubsub.x": "b", "pubsub.y": "a"}
	got := desiredConfigs(ss, in, plan, map[string][]string{"wq.jobs": {"c", "a"}, "wq.solo": {"b"}})
	want := map[string]bridge.SiteConfig{
		"a": {"pubsub.x": {"amqp://b-public:5672/"}, "pubsub.y": {"amqp://c:5672/"}, "wq.jobs": {"amqp://c:5672/"}},
		"b": {"pubsub.x": {"amqp://a:5672/", "amqp://c:5672/"}},
		"c": {"pubsub.x": {"amqp://b-from-c:5672/"}, "pubsub.y": {"amqp://a:5672/"}, "wq.jobs": {"amqp://a:5672/"}},
		"d": {},
	}
	require.Equal(t, want, got)
	for site, c := range got {
		_, err := c.Marshal()
		require.NoError(t, err, site)
	}
	links := 0
	for _, c := range got {
		links += len(c["pubsub.x"])
	}
	require.Equal(t, 2*(3-1), links, "2·(N−1) links for an exchange at N sites")
}

// TestControllerRecoversPreviousPlan checks how a restarted controller
// reads the plan off the links: the instance federating an exchange from
// several upstreams is its synchronisation site; two instances, or no
// links, say nothing; the controller's own plan wins.
func TestControllerRecoversPreviousPlan(t *testing.T) {
	in := placement.Input{Exchanges: []placement.Exchange{
		{Name: "pubsub.three", Instances: []placement.Instance{{Site: "a"}, {Site: "b"}, {Site: "c"}}},
		{Name: "pubsub.two", Instances: []placement.Instance{{Site: "a"}, {Site: "b"}}},
		{Name: "pubsub.none", Instances: []placement.Instance{{Site: "a"}, {Site: "c"}}},
		{Name: "pubsub.known", Instances: []placement.Instance{{Site: "a"}, {Site: "b"}, {Site: "c"}}},
	}}
	samples := map[string]*siteSample{
		"a": {links: map[string]int{"pubsub.three": 1, "pubsub.two": 1, "pubsub.known": 2}},
		"b": {links: map[string]int{"pubsub.three": 2, "pubsub.two": 1, "pubsub.known": 1}},
		"c": {links: map[string]int{"pubsub.three": 1, "pubsub.known": 1}},
	}
	got := recoverPrevious(in, samples, map[string]string{"pubsub.known": "c"})
	require.Equal(t, map[string]string{"pubsub.three": "b", "pubsub.known": "c"}, got)
}

// TestControllerRatesOverThePeriod checks the rates between two reads: the
// counters' differences over the time between them, the split into local
// and overlay traffic, and counters that restarted (a federation queue
// recreated, an exchange declared meanwhile) counted from zero.
func TestControllerRatesOverThePeriod(t *testing.T) {
	t0 := time.Unix(1000, 0)
	prev := &siteSample{at: t0, exchanges: map[string]*exchangeSample{
		"pubsub.x": {publishIn: 100, publishOut: 300, overlayIn: 40, overlayOut: 80, overlayEnqueued: 90},
	}, meanMessageSize: 500}
	cur := &siteSample{at: t0.Add(10 * time.Second), exchanges: map[string]*exchangeSample{
		// +50 in (20 of them federated), +150 out (60 into federation
		// queues); the federation queue was recreated: 30 delivered since.
		"pubsub.x":   {publishIn: 150, publishOut: 450, overlayIn: 60, overlayOut: 30, overlayEnqueued: 150, backlogMessages: 3, backlogBytes: 1500},
		"pubsub.new": {publishIn: 20, publishOut: 20},
	}, meanMessageSize: 600}
	r := ratesBetween("s", prev, cur)
	require.Equal(t, 10.0, r.periodSeconds)
	require.Equal(t, 600.0, r.meanMessageSize)
	require.Equal(t, InstanceRates{Site: "s", LocalPublished: 3, LocalConsumed: 9, OverlayIn: 2, OverlayOut: 3, BacklogMessages: 3, BacklogBytes: 1500}, r.exchanges["pubsub.x"])
	require.Equal(t, InstanceRates{Site: "s", LocalPublished: 2, LocalConsumed: 2}, r.exchanges["pubsub.new"])

	// Sites feed placement: an exchange at one site is not global, D(E) is
	// weighted by local publishes.
	ss := threeSites(t)
	rates := map[string]*siteRates{
		"a": {exchanges: map[string]InstanceRates{"pubsub.x": {Site: "a", LocalPublished: 3}, "pubsub.solo": {Site: "a"}}, meanMessageSize: 100},
		"b": {exchanges: map[string]InstanceRates{"pubsub.x": {Site: "b", LocalPublished: 1}}, meanMessageSize: 500},
	}
	in, summary := buildInput(ss, rates, map[string]string{"pubsub.x": "b"}, 7, 3)
	require.Equal(t, []string{"pubsub.x"}, exchangeNames(in))
	require.InDelta(t, (3*100+1*500)/4.0, in.Exchanges[0].MeanMessageSize, 1e-9)
	require.Equal(t, summary[0].MeanMessageSize, in.Exchanges[0].MeanMessageSize)
	require.Equal(t, placement.Plan{"pubsub.x": "b"}, in.Previous)
	require.Equal(t, 7.0, in.Lambda)
	require.Len(t, in.Sites, 4)
}
