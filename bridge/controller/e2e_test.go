package controller

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/bridge/placement"
	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/internal/mqtttest"
	"github.com/luffymq/luffymq/internal/rabbitharness"
	"github.com/luffymq/luffymq/internal/testenv"
)

// TestControllerEndToEnd runs three real sites — RabbitMQ node and luffymq
// broker with its bridge and site agent each — under the controller.
// Berlin and Tokyo publish and subscribe; Tunis sits between them. The
// first round places pubsub.e2e at Berlin (no traffic yet, ties go by
// name); traffic at both ends moves it to Tunis in the next round, with
// the default damping on; the site agents apply the
// new links, after which a message published at Berlin reaches Tokyo's
// subscriber through Tunis, the only upstream Tokyo has left. A controller
// started afresh recovers the plan from the links and publishes nothing.
func TestControllerEndToEnd(t *testing.T) {
	h := sharedNodes(t)
	vhost := testVhost(t, h)
	names := []string{"berlin", "tunis", "tokyo"}
	brokers := map[string]*broker.Broker{}
	for _, name := range names {
		n := h.Node(name)
		// As luffymq's command line configures a site: the site agent's
		// federation crosses two links by default (--federation-max-hops),
		// as origin -> sync -> destination needs.
		cfg, err := broker.ConfigFromArgs([]string{
			"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
			"--amqp-url", amqpURL(n, vhost), "--amqp-management-url", n.ManagementURL(),
			"--site", name, "--export", "e2e/#", "--export-group", "$share/g/jobs/#",
		}, io.Discard, io.Discard)
		require.NoError(t, err)
		require.Equal(t, 2, cfg.WorkQueue.Federation.MaxHops)
		// The site agent configures the node's default vhost unless told.
		cfg.WorkQueue.Federation.Vhost = vhost
		cfg.Logger = brokerLogger(t, name)
		b, err := broker.New(cfg)
		require.NoError(t, err)
		require.NoError(t, b.Start())
		t.Cleanup(func() { _ = b.Close() })
		brokers[name] = b
	}
	for _, name := range names {
		require.Eventually(t, brokers[name].Bridge().Connected, 30*time.Second, 20*time.Millisecond, "%s bridge", name)
	}
	subBerlin := mqtttest.ConnectRecorder(t, brokers["berlin"].MQTTAddr(), "sub-berlin")
	subBerlin.MustSubscribe(t, "e2e/#", 1, false)
	subTokyo := mqtttest.ConnectRecorder(t, brokers["tokyo"].MQTTAddr(), "sub-tokyo")
	subTokyo.MustSubscribe(t, "e2e/#", 1, false)
	member := mqtttest.ConnectRecorder(t, brokers["tokyo"].MQTTAddr(), "member-tokyo")
	member.MustSubscribe(t, "$share/g/jobs/#", 1, false)

	var ts []testSite
	for _, name := range names {
		ts = append(ts, testSite{name: name, node: h.Node(name), luffyURL: "http://" + brokers[name].HTTPAddr()})
	}
	sites := sitesFile(t, vhost, ts, map[string]float64{"berlin-tunis": 10, "tunis-tokyo": 10, "berlin-tokyo": 100})
	url := func(name string) string { return amqpURL(h.Node(name), vhost) }
	// Every exchange and work queue the brokers declare is in place.
	require.Eventually(t, func() bool {
		for _, name := range names {
			x, _ := mgmt(t, h.Node(name)).GetExchange(vhost, "pubsub.e2e")
			q, _ := mgmt(t, h.Node(name)).GetQueue(vhost, "wq.g")
			if x == nil || q == nil {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "pubsub.e2e and wq.g at every site")

	// Damped as luffy-controller is by default: traffic that appears and
	// stays still moves the site in the next round.
	c := newController(t, sites, 1, &testenv.LockedBuffer{}, withDamping)
	res, err := c.Round(context.Background())
	require.NoError(t, err)
	require.Equal(t, placement.Plan{"pubsub.e2e": "berlin"}, res.Result.Plan)
	require.Equal(t, names, sortedLike(res.Published, names))
	wqMesh := func(site string) []string {
		var ups []string
		for _, other := range names {
			if other != site {
				ups = append(ups, url(other))
			}
		}
		return ups
	}
	require.True(t, res.Configs["tokyo"].Equal(bridge.SiteConfig{"pubsub.e2e": {url("berlin")}, "wq.g": wqMesh("tokyo")}), "%v", res.Configs["tokyo"])
	waitApplied(t, c, res.Configs)

	// Traffic at both ends, delivered through Berlin for now.
	pubBerlin := mqtttest.ConnectRecorder(t, brokers["berlin"].MQTTAddr(), "pub-berlin")
	pubTokyo := mqtttest.ConnectRecorder(t, brokers["tokyo"].MQTTAddr(), "pub-tokyo")
	probe(t, pubBerlin, subTokyo, "warm-berlin-")
	probe(t, pubTokyo, subBerlin, "warm-tokyo-")
	for i := range 20 {
		pubBerlin.MustSend(t, &paho.Publish{Topic: "e2e/x", QoS: 1, Payload: []byte(fmt.Sprintf("load-berlin-%d", i))})
		pubTokyo.MustSend(t, &paho.Publish{Topic: "e2e/x", QoS: 1, Payload: []byte(fmt.Sprintf("load-tokyo-%d", i))})
	}
	require.Eventually(t, func() bool {
		return len(subTokyo.Payloads("load-")) == 40 && len(subBerlin.Payloads("load-")) == 40
	}, 30*time.Second, 20*time.Millisecond)
	for _, name := range []string{"berlin", "tokyo"} {
		require.Eventually(t, func() bool {
			in, _ := exchangeCounts(t, h.Node(name), vhost, "pubsub.e2e")
			return in >= 40
		}, 20*time.Second, 100*time.Millisecond, "statistics at %s", name)
	}

	res, err = c.Round(context.Background())
	require.NoError(t, err)
	require.Equal(t, placement.Plan{"pubsub.e2e": "tunis"}, res.Result.Plan)
	require.Empty(t, res.Held, "the gain is well beyond the move margin")
	require.NotNil(t, res.Change)
	require.Equal(t, Move{Exchange: "pubsub.e2e", From: "berlin", To: "tunis", Reason: res.Change.Moves[0].Reason,
		CostBeforeMs: res.Change.Moves[0].CostBeforeMs, CostAfterMs: res.Change.Moves[0].CostAfterMs}, res.Change.Moves[0])
	require.Less(t, *res.Change.Moves[0].CostAfterMs, *res.Change.Moves[0].CostBeforeMs)
	require.True(t, res.Configs["tokyo"].Equal(bridge.SiteConfig{"pubsub.e2e": {url("tunis")}, "wq.g": wqMesh("tokyo")}), "%v", res.Configs["tokyo"])
	require.True(t, res.Configs["berlin"].Equal(bridge.SiteConfig{"pubsub.e2e": {url("tunis")}, "wq.g": wqMesh("berlin")}), "%v", res.Configs["berlin"])
	require.True(t, res.Configs["tunis"].Equal(bridge.SiteConfig{"pubsub.e2e": {url("berlin"), url("tokyo")}, "wq.g": wqMesh("tunis")}), "%v", res.Configs["tunis"])
	waitApplied(t, c, res.Configs)

	// Berlin -> Tokyo now goes through Tunis: Tokyo federates pubsub.e2e
	// from Tunis only, and Tunis's federation queues deliver it.
	before := federationDeliveries(t, h.Node("tunis"), vhost, "pubsub.e2e")
	probe(t, pubBerlin, subTokyo, "via-tunis-")
	pubBerlin.MustSend(t, &paho.Publish{Topic: "e2e/final", QoS: 1, Payload: []byte("final-berlin")})
	require.Eventually(t, func() bool { return subTokyo.Find("final-berlin") != nil }, 20*time.Second, 20*time.Millisecond)
	got := subTokyo.Find("final-berlin")
	require.Equal(t, "berlin", got.Properties.User.Get(bridge.OriginUserProperty))
	require.Eventually(t, func() bool {
		return federationDeliveries(t, h.Node("tunis"), vhost, "pubsub.e2e") > before
	}, 20*time.Second, 100*time.Millisecond, "Tunis's federation queues carried the messages")

	st := c.Status()
	var tokyo SiteStatus
	for _, s := range st.Sites {
		require.True(t, *s.LuffyMQ.Reachable, s.Name)
		require.True(t, s.LuffyMQConnected, s.Name)
		if s.Name == "tokyo" {
			tokyo = s
		}
	}
	require.Len(t, tokyo.Capacity, 1)
	require.Equal(t, "g", tokyo.Capacity[0].Group)
	require.Equal(t, 1, tokyo.Capacity[0].OnlineMembers, "the shared member at Tokyo")

	// A controller started afresh recovers the plan from the links the
	// sites run (Tunis federates pubsub.e2e from two upstreams) and finds
	// their configurations applied: it publishes nothing. (A large λ keeps
	// the few messages its first window may still count from moving it.)
	fresh := newController(t, sites, 1e9, &testenv.LockedBuffer{})
	res, err = fresh.Round(context.Background())
	require.NoError(t, err)
	require.Equal(t, placement.Plan{"pubsub.e2e": "tunis"}, res.Input.Previous, "recovered from the links")
	require.Equal(t, placement.Plan{"pubsub.e2e": "tunis"}, res.Result.Plan)
	require.Empty(t, res.Published)
	require.Nil(t, res.Change, "the recovered plan is the previous plan")
}

// waitApplied waits until every site runs the federation of configs (read
// back from its management API) with every link running.
func waitApplied(t *testing.T, c *Controller, configs map[string]bridge.SiteConfig) {
	t.Helper()
	last := map[string]string{}
	var mu sync.Mutex
	require.Eventually(t, func() bool {
		for _, st := range c.sites {
			s, err := st.reader.read(context.Background())
			if err != nil {
				return false
			}
			links, err := st.reader.rh.ListFederationLinksIn(st.site.Vhost)
			if err != nil {
				return false
			}
			running := true
			for _, l := range links {
				if l["status"] != "running" {
					running = false
				}
			}
			mu.Lock()
			last[st.site.Name] = fmt.Sprint(s.observed, " running=", running)
			mu.Unlock()
			if !s.observed.Equal(configs[st.site.Name]) || !running {
				return false
			}
		}
		return true
	}, 60*time.Second, 200*time.Millisecond, "configurations not applied: %v", stringer(func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprint(last)
	}))
}

// federationDeliveries sums what node's federation queues of exchange x
// delivered to downstream sites.
func federationDeliveries(t *testing.T, n *rabbitharness.Node, vhost, x string) int64 {
	t.Helper()
	qs, err := mgmt(t, n).ListQueuesIn(vhost)
	require.NoError(t, err)
	var total int64
	for _, q := range qs {
		if strings.HasPrefix(q.Name, "federation: "+x+" -> ") && q.MessageStats != nil {
			total += q.MessageStats.DeliverGet
		}
	}
	return total
}

// probe publishes numbered messages at pub until sub receives one: the
// bindings have propagated along the federation links.
func probe(t *testing.T, pub, sub *mqtttest.Recorder, prefix string) {
	t.Helper()
	i := 0
	require.Eventually(t, func() bool {
		i++
		if pub.Send(&paho.Publish{Topic: "e2e/probe", QoS: 1, Payload: []byte(fmt.Sprintf("%s%d", prefix, i))}) != nil {
			return false
		}
		return len(sub.Payloads(prefix)) > 0
	}, 30*time.Second, 200*time.Millisecond, "probes %s* do not arrive", prefix)
}

func sortedLike(got, order []string) []string {
	var out []string
	for _, o := range order {
		for _, g := range got {
			if g == o {
				out = append(out, g)
			}
		}
	}
	return out
}

func brokerLogger(t *testing.T, site string) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("test", t.Name(), "site", site)
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
