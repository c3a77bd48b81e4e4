package bridge_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/internal/rabbitharness"
)

// agentCounters reads a bridge's site agent figures as Prometheus exposes
// them: queue events handled, errors that stopped the event agent, and
// lost connections.
type agentCounters struct{ events, failures, reconnects float64 }

func readAgentCounters(t *testing.T, br *bridge.Bridge) agentCounters {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(br.Collector()))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var c agentCounters
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch {
			case mf.GetName() == "luffymq_bridge_agent_actions_total" && labels["kind"] == "queue_event":
				c.events = m.GetCounter().GetValue()
			case mf.GetName() == "luffymq_bridge_agent_failures_total" && labels["agent"] == "events":
				c.failures = m.GetCounter().GetValue()
			case mf.GetName() == "luffymq_bridge_connection_failures_total":
				c.reconnects = m.GetCounter().GetValue()
			}
		}
	}
	return c
}

// TestEventAgentsRaceAtOneSite: two brokers at one site both run an event
// agent, and both react to every wq.<g> queue that appears or goes (the
// group is exported by neither). Whichever agent comes second finds the
// entities already created or already removed by the other; that is
// success, not an error that stops its agent. Each cycle declares and
// deletes a work queue; the last one deletes it at once, so creations and
// removals of the two agents overlap. After every cycle both agents have
// handled both events, neither stopped nor lost its connection, and the
// overflow topology is gone, except an intake queue that holds messages.
func TestEventAgentsRaceAtOneSite(t *testing.T) {
	h := sharedNodes(t)
	n := h.Node("tunis")
	brokers := map[string]*broker.Broker{}
	for _, id := range []string{"ev-a", "ev-b"} {
		b, err := broker.New(broker.Config{
			MQTTListen:        "127.0.0.1:0",
			Logger:            testLogger(t),
			AMQPURL:           n.AMQPURL(),
			AMQPManagementURL: n.ManagementURL(),
			Site:              "tunis",
			BrokerID:          id,
		})
		require.NoError(t, err)
		require.NoError(t, b.Start())
		t.Cleanup(func() { _ = b.Close() })
		brokers[id] = b
	}
	for id, b := range brokers {
		require.Eventually(t, b.Bridge().Connected, 30*time.Second, 20*time.Millisecond, "broker %s not connected", id)
	}
	rh, err := rabbithole.NewClient(n.ManagementURL(), rabbitharness.User, rabbitharness.Password)
	require.NoError(t, err)
	conn, err := amqp.Dial(n.AMQPURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)

	// The agents declare their event queues after connecting: wait until a
	// probe queue's creation reaches both. An agent whose event queue was
	// bound only after the probe appeared never hears of it, so the probe
	// is shown again (deleted and declared) every 2 s until both did.
	base := map[string]agentCounters{}
	probe := bridge.WorkQueueName("evrace-probe")
	_, err = ch.QueueDeclare(probe, true, false, false, false, nil)
	require.NoError(t, err)
	shown := time.Now()
	require.Eventually(t, func() bool {
		for _, b := range brokers {
			if readAgentCounters(t, b.Bridge()).events < 1 {
				if time.Since(shown) > 2*time.Second {
					_, _ = ch.QueueDelete(probe, false, false, false)
					_, _ = ch.QueueDeclare(probe, true, false, false, false, nil)
					shown = time.Now()
				}
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "the event agents never handled the probe queue: %v", stringer(func() string {
		out := ""
		for id, b := range brokers {
			c := readAgentCounters(t, b.Bridge())
			out += fmt.Sprintf("%s handled %v, stopped %v times, reconnected %v times; ", id, c.events, c.failures, c.reconnects)
		}
		return out
	}))
	// The probe may have been shown more than once: take the counts once
	// they are still for 500 ms, so that no event of it counts later.
	var stillSince time.Time
	require.Eventually(t, func() bool {
		changed := false
		for id, b := range brokers {
			c := readAgentCounters(t, b.Bridge())
			changed = changed || c != base[id]
			base[id] = c
		}
		if changed || stillSince.IsZero() {
			stillSince = time.Now()
		}
		return time.Since(stillSince) >= 500*time.Millisecond
	}, 30*time.Second, 50*time.Millisecond, "the event agents' counts did not settle")

	topology := func(g string) (present []string) {
		for _, x := range []string{bridge.DeadLetterExchangeName(g), bridge.IntakeExchangeName(g), bridge.WorkQueueName(g) + ".ring0", bridge.WorkQueueName(g) + ".ring1"} {
			if _, err := rh.GetExchange("/", x); err == nil {
				present = append(present, "exchange "+x)
			}
		}
		if _, err := rh.GetQueue("/", bridge.IntakeQueueName(g)); err == nil {
			present = append(present, "queue "+bridge.IntakeQueueName(g))
		}
		if _, err := rh.GetPolicy("/", bridge.WorkQueuePolicyPrefix+bridge.WorkQueueName(g)); err == nil {
			present = append(present, "policy")
		}
		return present
	}
	// handled waits until each agent handled want events since base.
	handled := func(want float64, what string) {
		t.Helper()
		require.Eventually(t, func() bool {
			for id, b := range brokers {
				if readAgentCounters(t, b.Bridge()).events-base[id].events < want {
					return false
				}
			}
			return true
		}, 15*time.Second, 20*time.Millisecond, "%s: not every event agent handled %v events: %v", what, want, stringer(func() string {
			out := ""
			for id, b := range brokers {
				c := readAgentCounters(t, b.Bridge())
				out += fmt.Sprintf("%s handled %v, stopped %v times; ", id, c.events-base[id].events, c.failures)
			}
			return out
		}))
	}

	// The probe goes first: both agents remove the same topology.
	_, err = ch.QueueDelete(probe, false, false, false)
	require.NoError(t, err)
	want := 1.0
	handled(want, "probe deleted")
	require.Empty(t, topology("evrace-probe"))
	for i := range 4 {
		g := fmt.Sprintf("evrace%d", i)
		_, err = ch.QueueDeclare(bridge.WorkQueueName(g), true, false, false, false, nil)
		require.NoError(t, err)
		if i < 3 {
			want++
			handled(want, g+" created")
			require.Len(t, topology(g), 6, "%s's overflow topology and policy", g)
		} else {
			want++ // deleted at once: both events race
		}
		_, err = ch.QueueDelete(bridge.WorkQueueName(g), false, false, false)
		require.NoError(t, err)
		want++
		handled(want, g+" deleted")
		require.Empty(t, topology(g), "%s's overflow topology is removed", g)
	}
	// An intake queue that still holds messages is kept by both agents
	// (RabbitMQ refuses the if-empty deletion on their topology channel,
	// not on the channel they consume events on); the rest goes.
	g := "evrace-kept"
	_, err = ch.QueueDeclare(bridge.WorkQueueName(g), true, false, false, false, nil)
	require.NoError(t, err)
	want++
	handled(want, g+" created")
	require.NoError(t, ch.PublishWithContext(context.Background(), "", bridge.IntakeQueueName(g), true, false, amqp.Publishing{Body: []byte("held")}))
	require.Eventually(t, func() bool {
		q, err := ch.QueueDeclarePassive(bridge.IntakeQueueName(g), true, false, false, false, nil)
		return err == nil && q.Messages == 1
	}, 5*time.Second, 10*time.Millisecond)
	_, err = ch.QueueDelete(bridge.WorkQueueName(g), false, false, false)
	require.NoError(t, err)
	want++
	handled(want, g+" deleted")
	require.Equal(t, []string{"queue " + bridge.IntakeQueueName(g)}, topology(g), "only the intake queue holding a message is left")
	q, err := ch.QueueDelete(bridge.IntakeQueueName(g), false, false, false)
	require.NoError(t, err)
	require.Equal(t, 1, q, "the held message stayed in the intake queue")

	for id, b := range brokers {
		c := readAgentCounters(t, b.Bridge())
		require.Zero(t, c.failures, "broker %s's event agent stopped", id)
		require.Equal(t, base[id].reconnects, c.reconnects, "broker %s lost its connection", id)
		require.True(t, b.Bridge().Connected(), "broker %s connected", id)
		require.Equal(t, want, c.events-base[id].events, "broker %s handled each event once", id)
	}
}
