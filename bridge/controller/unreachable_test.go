package controller

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/bridge/placement"
	"github.com/luffymq/luffymq/internal/rabbitharness"
	"github.com/luffymq/luffymq/internal/testenv"
)

// switchableProxy forwards to a real management API until it is switched
// off; then it answers 503, as a node whose API is down would.
func switchableProxy(t *testing.T, target string) (*httptest.Server, *atomic.Bool) {
	t.Helper()
	u, err := url.Parse(target)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(u)
	var down atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "management API down", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &down
}

// TestControllerUnreachableSiteKeepsLastPlan cuts one site's management
// API while the traffic pattern changes: the controller still moves the
// synchronisation site for the others, sends the unreachable site nothing
// (it keeps its last configuration), logs one line for the outage however
// many rounds it lasts, and sends the site its new configuration once it
// answers again.
func TestControllerUnreachableSiteKeepsLastPlan(t *testing.T) {
	h := sharedNodes(t)
	vhost := testVhost(t, h)
	na, nb, nc := h.Node("berlin"), h.Node("tunis"), h.Node("tokyo")
	proxy, cDown := switchableProxy(t, nc.ManagementURL())
	sites := sitesFile(t, vhost, []testSite{{name: "a", node: na}, {name: "b", node: nb}, {name: "c", node: nc, managementURL: proxy.URL}},
		map[string]float64{"a-b": 10, "b-c": 10, "a-c": 10})
	chs := map[string]*amqp.Channel{}
	for name, n := range map[string]*rabbitharness.Node{"a": na, "b": nb, "c": nc} {
		chs[name] = amqpChannel(t, n, vhost)
		declareExchange(t, chs[name], "pubsub.u")
	}
	ua, ub, uc := amqpURL(na, vhost), amqpURL(nb, vhost), amqpURL(nc, vhost)
	logs := &testenv.LockedBuffer{}
	c := newController(t, sites, 1, logs)

	res, err := c.Round(context.Background())
	require.NoError(t, err)
	require.Equal(t, placement.Plan{"pubsub.u": "a"}, res.Result.Plan)
	require.Equal(t, []string{"a", "b", "c"}, res.Published)
	for site, ch := range chs {
		require.Len(t, drainConfigs(t, ch, site), 1)
	}

	// c's management API goes down; all traffic is now at b.
	cDown.Store(true)
	publishN(t, chs["b"], "pubsub.u", 30, 100)
	waitExchangeCounts(t, nb, vhost, "pubsub.u", 30, 30)
	res, err = c.Round(context.Background())
	require.Error(t, err)
	require.Contains(t, err.Error(), "site c: management API")
	require.Equal(t, placement.Plan{"pubsub.u": "b"}, res.Result.Plan, "c's last measurements stand in")
	require.Equal(t, []string{"a", "b"}, res.Published, "c keeps its last plan")
	got := drainConfigs(t, chs["a"], "a")
	require.Len(t, got, 1)
	require.True(t, got[0].Equal(bridge.SiteConfig{"pubsub.u": {ub}}), "%v", got[0])
	got = drainConfigs(t, chs["b"], "b")
	require.Len(t, got, 1)
	require.True(t, got[0].Equal(bridge.SiteConfig{"pubsub.u": {ua, uc}}), "%v", got[0])
	require.Empty(t, drainConfigs(t, chs["c"], "c"))

	for range 2 {
		res, err = c.Round(context.Background())
		require.Error(t, err)
		require.Empty(t, res.Published)
		require.Empty(t, drainConfigs(t, chs["c"], "c"))
	}
	require.Equal(t, 1, strings.Count(logs.String(), "site c unreachable (management API); keeping its last plan"), logs.String())
	st := c.Status()
	require.True(t, st.Sites[2].Stale)
	require.False(t, *st.Sites[2].Management.Reachable)
	require.Equal(t, map[string][]string{"pubsub.u": {redactURL(ua)}}, st.Sites[2].Config, "c's last configuration")
	metrics := scrape(t, c.Handler(), "")
	require.Contains(t, metrics, `luffy_controller_site_reachable{api="management",site="c"} 0`)
	require.Contains(t, metrics, `luffy_controller_site_unreachable_total{api="management",site="c"} 1`)
	require.Contains(t, metrics, `luffy_controller_site_unreachable_total{api="management",site="a"} 0`)

	// Back: c gets the configuration it missed, once.
	cDown.Store(false)
	res, err = c.Round(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{"c"}, res.Published)
	got = drainConfigs(t, chs["c"], "c")
	require.Len(t, got, 1)
	require.True(t, got[0].Equal(bridge.SiteConfig{"pubsub.u": {ub}}), "%v", got[0])
	require.Equal(t, 1, strings.Count(logs.String(), "site c reachable again (management API)"), logs.String())
	res, err = c.Round(context.Background())
	require.NoError(t, err)
	require.Empty(t, res.Published)
}
