package broker

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"
)

// TestDropsAreCountedByClientAndReason: every publish the broker drops for
// a client is counted on that client, by reason, and the per-client counts
// add up to the broker's totals (Mochi's messages_dropped, the outboxes'
// qos0_dropped_slow_client). Two brokers show the two reasons: a
// subscriber that never reads loses QoS 0 messages to its full outbox
// (qos0_outbox_full); with a write queue of one packet per client, four
// publishers outpace the write loops and Mochi drops (write_queue_full).
func TestDropsAreCountedByClientAndReason(t *testing.T) {
	t.Run("outbox", func(t *testing.T) {
		// Default limits: 3 000 messages of 8 KiB are more than the never
		// reading client's socket buffers and 8 MiB outbox hold, while the
		// reader keeps up (the publisher waits for each PUBACK).
		b := startBroker(t, nil)
		reader := subscribeNeverReaderAndReader(t, b)
		publishQoS1(t, b, 3000, 8<<10)
		eventually(t, 10*time.Second, func() bool { return reader.count() == 3000 }, "the reader loses nothing")
		drops := checkDropsAddUp(t, b)
		require.Len(t, drops, 1, "only the subscriber that never reads lost messages")
		require.Equal(t, "never-reads", drops[0].ClientID)
		require.Positive(t, drops[0].QoS0OutboxFull)

		// The clients API and the dashboard's snapshot tell the same.
		for _, c := range b.Clients(0, MaxClientsLimit).Clients {
			if c.ClientID == "never-reads" {
				require.Equal(t, drops[0].QoS0OutboxFull, *c.QoS0Dropped)
				require.Equal(t, drops[0].WriteQueueFull, *c.WriteQueueDropped)
			}
		}
		eventually(t, 5*time.Second, func() bool {
			s := b.Snapshot()
			return len(s.DroppingClients) == 1 && s.DroppingClients[0] == drops[0]
		}, "snapshots list the client that lost messages")
	})
	t.Run("write-queue", func(t *testing.T) {
		b := startBroker(t, func(c *Config) { c.MaxPendingWrites = 1 })
		subscribeNeverReaderAndReader(t, b)
		publishQoS0(t, b, 4, 5000)
		drops := checkDropsAddUp(t, b)
		var writeQueue uint64
		for i, d := range drops {
			writeQueue += d.WriteQueueFull
			if i > 0 {
				require.GreaterOrEqual(t, drops[i-1].Total(), d.Total(), "most lost first")
			}
		}
		require.Positive(t, writeQueue, "a write queue of one packet overflows under 4 publishers")
	})
}

// subscribeNeverReaderAndReader connects two QoS 0 subscribers of
// drops/t: one that never reads its socket ("never-reads") and one that
// does ("reader").
func subscribeNeverReaderAndReader(t *testing.T, b *Broker) *pahoClient {
	conn, err := net.Dial("tcp", b.MQTTAddr())
	require.NoError(t, err)
	require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
	t.Cleanup(func() { _ = conn.Close() })
	stuck := &rawConn{t: t, conn: conn}
	connect := connectPacket("never-reads", "", "")
	connect.Content.(*packets.Connect).KeepAlive = 0
	stuck.write(connect)
	require.Equal(t, packets.CONNACK, stuck.read().Type)
	stuck.subscribe("drops/t", 0)
	reader := connectPaho(t, b.MQTTAddr(), "reader", nil)
	reader.subscribe(t, "drops/t", 0)
	return reader
}

// publishQoS1 sends messages of size bytes to drops/t at QoS 1, one
// after the other.
func publishQoS1(t *testing.T, b *Broker, messages, size int) {
	pub := connectPaho(t, b.MQTTAddr(), "publisher", nil)
	payload := make([]byte, size)
	for i := range messages {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := pub.Publish(ctx, &paho.Publish{Topic: "drops/t", QoS: 1, Payload: payload})
		cancel()
		require.NoError(t, err, "publish %d", i)
	}
}

// publishQoS0 sends each QoS 0 messages of 512 B to drops/t from each of
// publishers connections at once.
func publishQoS0(t *testing.T, b *Broker, publishers, each int) {
	payload := make([]byte, 512)
	var published atomic.Int64
	var wg sync.WaitGroup
	for p := range publishers {
		pub := connectPaho(t, b.MQTTAddr(), "publisher-"+string(rune('a'+p)), nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if _, err := pub.Publish(context.Background(), &paho.Publish{Topic: "drops/t", QoS: 0, Payload: payload}); err != nil {
					return
				}
				published.Add(1)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int64(publishers*each), published.Load())
}

// checkDropsAddUp waits until the per-client drop counts equal the
// broker's totals and have stopped changing (a write loop may still be
// draining into a full outbox after the publishers are done), and returns
// the clients that lost messages.
func checkDropsAddUp(t *testing.T, b *Broker) []ClientDrops {
	const settled = 300 * time.Millisecond
	var drops []ClientDrops
	var writeQueue, outbox uint64
	var lastTotal uint64
	lastChange := time.Now()
	eventually(t, 10*time.Second, func() bool {
		drops = b.droppingClients(1 << 20)
		writeQueue, outbox = 0, 0
		for _, d := range drops {
			writeQueue += d.WriteQueueFull
			outbox += d.QoS0OutboxFull
		}
		if total := writeQueue + outbox; total != lastTotal {
			lastTotal, lastChange = total, time.Now()
			return false
		}
		o := b.Overview()
		return uint64(o.MessagesDropped) == writeQueue && o.QoS0Dropped == outbox && writeQueue+outbox > 0 &&
			time.Since(lastChange) >= settled
	}, "per-client drops add up to the broker's totals and stop changing")
	t.Logf("dropped: write queue %d, QoS 0 outbox %d, by %d clients", writeQueue, outbox, len(drops))
	return drops
}
