package bridge_test

import (
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/internal/mqtttest"
	"github.com/luffymq/luffymq/internal/rabbitharness"
)

// The local intake of a work queue joins the queue's consistent-hash
// dead-letter exchange through one of two ring exchanges, with one binding
// whose key is its weight. RabbitMQ 3.10's consistent-hash exchange drops
// every bucket of a destination when any one of its bindings goes, so a
// ring exchange must never have two bindings: these tests check that
// brokers of one site that export different groups never leave it two.

// ringBindings returns the dead-letter exchange's bindings of group g as
// "<ring exchange>=<weight>", sorted.
func ringBindings(t *testing.T, rh *rabbithole.Client, g string) []string {
	t.Helper()
	bs, err := rh.ListExchangeBindingsWithSource("/", bridge.DeadLetterExchangeName(g))
	require.NoError(t, err)
	var out []string
	for _, b := range bs {
		out = append(out, b.Destination+"="+b.RoutingKey)
	}
	sort.Strings(out)
	return out
}

// declareHashRing declares group g's dead-letter exchange and ring
// exchange ring as the bridge does (same arguments, or the bridge's own
// declarations would fail) and binds them with key weight: a binding made
// by another broker of the site.
func declareHashRing(t *testing.T, ch *amqp.Channel, g, ring, weight string) {
	t.Helper()
	args := amqp.Table{"hash-property": "message_id", "alternate-exchange": bridge.WorkQueuePrefix + g + ".ring0"}
	require.NoError(t, ch.ExchangeDeclare(bridge.DeadLetterExchangeName(g), "x-consistent-hash", true, false, false, false, args))
	require.NoError(t, ch.ExchangeDeclare(ring, amqp.ExchangeFanout, true, false, false, false, nil))
	require.NoError(t, ch.ExchangeBind(ring, weight, bridge.DeadLetterExchangeName(g), false, nil))
}

// removeWorkTopology deletes what a test of group g created on the node.
func removeWorkTopology(ch *amqp.Channel, g string) {
	_, _ = ch.QueueDelete(bridge.WorkQueueName(g), false, false, false)
	_, _ = ch.QueueDelete(bridge.IntakeQueueName(g), false, false, false)
	for _, x := range []string{bridge.DeadLetterExchangeName(g), bridge.IntakeExchangeName(g), bridge.WorkQueuePrefix + g + ".ring0", bridge.WorkQueuePrefix + g + ".ring1"} {
		_ = ch.ExchangeDelete(x, false, false)
	}
}

// ringTestNode returns montreal's node, an AMQP channel and a management
// client to it, with the work-queue topology of groups removed before and
// after the test.
func ringTestNode(t *testing.T, groups ...string) (*rabbitharness.Node, *amqp.Channel, *rabbithole.Client) {
	t.Helper()
	n := sharedNodes(t).Node("montreal")
	conn, err := amqp.Dial(n.AMQPURL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	for _, g := range groups {
		removeWorkTopology(ch, g)
		t.Cleanup(func() { removeWorkTopology(ch, g) })
	}
	rh, err := rabbithole.NewClient(n.ManagementURL(), rabbitharness.User, rabbitharness.Password)
	require.NoError(t, err)
	return n, ch, rh
}

// declareAndWaitForPolicy declares wq.<g> and waits for the event agent's
// last step, the queue's policy.
func declareAndWaitForPolicy(t *testing.T, ch *amqp.Channel, rh *rabbithole.Client, g string) {
	t.Helper()
	_, err := ch.QueueDeclare(bridge.WorkQueueName(g), true, false, false, false, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := rh.GetPolicy("/", bridge.WorkQueuePolicyPrefix+bridge.WorkQueueName(g))
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "event agent did not handle %s", bridge.WorkQueueName(g))
}

// TestEventAgentLeavesAnOwnersRingAlone: a wq.<g> queue appears whose
// hash ring a broker exporting g has already joined (here through ring1,
// after a retune); the event agent of a broker that does not export g
// creates the rest of the overflow topology but binds no ring exchange.
// Before the fix it bound ring0 with weight 1 as well.
func TestEventAgentLeavesAnOwnersRingAlone(t *testing.T) {
	const g, fresh = "ringev", "ringevfresh"
	n, ch, rh := ringTestNode(t, g, fresh)
	startSiteBroker(t, n, broker.Config{})
	waitEventAgent(t, rh)

	declareHashRing(t, ch, g, bridge.WorkQueuePrefix+g+".ring1", "7")
	declareAndWaitForPolicy(t, ch, rh, g)
	_, err := rh.GetExchange("/", bridge.WorkQueuePrefix+g+".ring0")
	require.NoError(t, err, "ring0 not declared")
	require.Equal(t, []string{bridge.WorkQueuePrefix + g + ".ring1=7"}, ringBindings(t, rh, g))

	// With no binding yet, the agent joins the intake with weight 1.
	declareAndWaitForPolicy(t, ch, rh, fresh)
	require.Equal(t, []string{bridge.WorkQueuePrefix + fresh + ".ring0=1"}, ringBindings(t, rh, fresh))
}

// TestRetuneRemovesBindingsItDidNotMake: a broker exporting g owns its
// hash ring binding (ring0, weight 1 with no member). A binding it did not
// make sits on ring1 — what another broker's event agent leaves when it
// handles the queue's creation after the owner's first retune. When a
// member joins, the owner moves its weight to ring1: it ends with ring1's
// one binding, its own. Before the fix ring1 kept both.
func TestRetuneRemovesBindingsItDidNotMake(t *testing.T) {
	const g = "ringown"
	n, ch, rh := ringTestNode(t, g)

	share := "$share/" + g + "/jobs/" + g + "/#"
	b := startSiteBroker(t, n, broker.Config{
		ExportGroups: []string{share},
		WorkQueue: bridge.WorkQueueConfig{
			MaxLengthPerMember: 10,
			TTLPerMember:       200 * time.Millisecond,
			RetuneInterval:     50 * time.Millisecond,
			Route:              bridge.RouteRing,
		},
	})

	ring0, ring1 := bridge.WorkQueuePrefix+g+".ring0", bridge.WorkQueuePrefix+g+".ring1"
	require.Eventually(t, func() bool {
		bs, err := rh.ListExchangeBindingsWithSource("/", bridge.DeadLetterExchangeName(g))
		return err == nil && len(bs) == 1 && bs[0].Destination == ring0 && bs[0].RoutingKey == "1"
	}, 20*time.Second, 50*time.Millisecond, "the owner did not join the hash ring through ring0 with weight 1")
	// Still so after several retunes: with no member, the weight stays 1.
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, []string{ring0 + "=1"}, ringBindings(t, rh, g))
	require.NoError(t, ch.ExchangeBind(ring1, "1", bridge.DeadLetterExchangeName(g), false, nil))

	// A member: maximum length 10, so weight 10, bound through ring1.
	mqtttest.Connect(t, b.MQTTAddr(), "ringown-member", paho.ClientConfig{}, paho.SubscribeOptions{Topic: share, QoS: 1})

	var last []string
	require.Eventually(t, func() bool {
		last = ringBindings(t, rh, g)
		return len(last) == 1 && strings.HasPrefix(last[0], ring1+"=") && last[0] != ring1+"=1"
	}, 20*time.Second, 50*time.Millisecond, "want one binding, through ring1, with the member's weight")
	require.Equal(t, []string{ring1 + "=10"}, last)
}

// startSiteBroker starts a luffymq broker of n's site on node n (its
// virtual host "/" unless cfg.AMQPURL says otherwise) with cfg's other
// settings, stopped when the test ends.
func startSiteBroker(t *testing.T, n *rabbitharness.Node, cfg broker.Config) *broker.Broker {
	t.Helper()
	cfg.MQTTListen, cfg.Logger, cfg.Site = "127.0.0.1:0", testLogger(t), n.Site
	if cfg.AMQPURL == "" {
		cfg.AMQPURL = n.AMQPURL()
	}
	cfg.AMQPManagementURL = n.ManagementURL()
	b, err := broker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// waitEventAgent waits until a broker's event agent consumes its
// (server-named) event queue.
func waitEventAgent(t *testing.T, rh *rabbithole.Client) {
	t.Helper()
	require.Eventually(t, func() bool {
		cs, err := rh.ListConsumersIn("/")
		if err != nil {
			return false
		}
		for _, c := range cs {
			if strings.HasPrefix(c.Queue.Name, "amq.gen-") {
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "event agent not consuming")
}
