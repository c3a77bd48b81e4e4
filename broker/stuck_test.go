package broker

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"
)

// TestStuckSubscriberStallsNobody: a QoS 1 subscriber that stops reading
// its socket (keep-alive 0, so no keep-alive timeout ever ends it) must not
// slow the publisher or the other subscriber of the topic. Before writes
// went through the connection's own writer, its full socket blocked Mochi's
// write while holding its client lock, which every QoS 1 delivery to it
// needs for a packet ID: the publisher got about one PUBACK a second.
// Here 3 000 messages of 8 KiB (24 MB, more than the socket buffers and
// the outbox hold) must all reach the healthy subscriber quickly, and the
// stuck client is disconnected once its outbox is full instead of growing
// without bound.
func TestStuckSubscriberStallsNobody(t *testing.T) {
	b := startBroker(t, nil)

	// The stuck subscriber: subscribes, then never reads again.
	connectStuckSubscriber(t, b, "stuck/t", 1)

	healthy := connectPaho(t, b.MQTTAddr(), "healthy", nil)
	healthy.subscribe(t, "stuck/t", 1)
	publisher := connectPaho(t, b.MQTTAddr(), "publisher", nil)

	const messages = 3000
	payload := make([]byte, 8<<10)
	start := time.Now()
	for i := range messages {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := publisher.Publish(ctx, &paho.Publish{Topic: "stuck/t", QoS: 1, Payload: payload})
		cancel()
		require.NoError(t, err, "publish %d: the publisher was stalled", i)
	}
	eventually(t, 10*time.Second, func() bool { return healthy.count() == messages },
		"the healthy subscriber receives every message")
	elapsed := time.Since(start)
	t.Logf("%d QoS 1 messages of %d B to a healthy and a stuck subscriber in %v (%.0f msg/s)",
		messages, len(payload), elapsed, messages/elapsed.Seconds())
	// At one message a second (the stall) this would take half an hour;
	// even the race detector on two busy cores does thousands a second.
	require.Less(t, elapsed, 20*time.Second)

	eventually(t, 10*time.Second, func() bool {
		_, online := b.Server().Clients.Get("stuck")
		cl, _ := b.Server().Clients.Get("stuck")
		return !online || cl.Closed()
	}, "the stuck subscriber, whose outbox filled, is disconnected")
	require.Equal(t, uint64(1), b.Overview().SlowClientsDisconnected)
	require.Contains(t, getMetrics(t, b), `luffymq_slow_clients_disconnected_total{reason="outbox_full"} 1`)
}

// connectStuckSubscriber connects a raw MQTT v5 client "stuck" with
// keep-alive 0 and a 4 KiB socket read buffer, subscribes it to topic at
// qos, and never reads from it again: its socket fills up and stays full.
func connectStuckSubscriber(t *testing.T, b *Broker, topic string, qos byte) {
	t.Helper()
	conn, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
	stuck := &rawConn{t: t, conn: conn}
	t.Cleanup(func() { _ = conn.Close() })
	connect := connectPacket("stuck", "", "")
	connect.Content.(*packets.Connect).KeepAlive = 0
	stuck.write(connect)
	require.Equal(t, packets.CONNACK, stuck.read().Type)
	stuck.subscribe(topic, qos)
}
