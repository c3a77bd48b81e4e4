package broker

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"
)

// readPublishesUntilMarker reads packets until a PUBLISH on the marker
// topic and returns the QoS≥1 publishes seen before it.
func (rc *rawConn) readPublishesUntilMarker(marker string) []*packets.Publish {
	rc.t.Helper()
	var got []*packets.Publish
	for {
		cp := rc.read()
		if cp.Type != packets.PUBLISH {
			continue
		}
		pub := cp.Content.(*packets.Publish)
		if pub.Topic == marker {
			return got
		}
		got = append(got, pub)
	}
}

func (rc *rawConn) ack(pub *packets.Publish) {
	rc.t.Helper()
	cp := packets.NewControlPacket(packets.PUBACK)
	cp.Content.(*packets.Puback).PacketID = pub.PacketID
	rc.write(cp)
}

// TestReceiveMaximumIsHonouredForEverySubscription: a QoS 1 subscriber with
// Receive Maximum 2 that does not acknowledge gets two deliveries and no
// more (MQTT-3.3.4-9), for a plain subscription as for a shared one; each
// acknowledgement lets exactly one more through, in order. A QoS 0 marker
// published after the QoS 1 messages passes the held ones, so the test
// knows the broker has handled them all without waiting on a clock.
func TestReceiveMaximumIsHonouredForEverySubscription(t *testing.T) {
	for _, filter := range []string{"flow/t", "$share/g/flow/t"} {
		t.Run(filter, func(t *testing.T) {
			b := startBroker(t, nil)
			conn, err := net.Dial("tcp", b.MQTTAddr())
			require.NoError(t, err)
			rc := &rawConn{t: t, conn: conn}
			t.Cleanup(func() { _ = conn.Close() })
			connect := connectPacket("limited", "", "")
			rm := uint16(2)
			connect.Content.(*packets.Connect).Properties = &packets.Properties{ReceiveMaximum: &rm}
			rc.write(connect)
			require.Equal(t, packets.CONNACK, rc.read().Type)
			rc.subscribe(filter, 1)
			rc.subscribe("flow/marker", 0)

			pub := connectPaho(t, b.MQTTAddr(), "publisher", nil)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			send := func(topic string, qos byte, payload string) {
				_, err := pub.Publish(ctx, &paho.Publish{Topic: topic, QoS: qos, Payload: []byte(payload)})
				require.NoError(t, err)
			}
			for i := 0; i < 10; i++ {
				send("flow/t", 1, fmt.Sprint(i))
			}
			send("flow/marker", 0, "m1")
			got := rc.readPublishesUntilMarker("flow/marker")
			require.Len(t, got, 2, "deliveries beyond Receive Maximum 2")
			require.Equal(t, "0", string(got[0].Payload))
			require.Equal(t, "1", string(got[1].Payload))

			// The PINGRESP comes after the broker handled the PUBACK (one
			// reader per connection), and what that released is written
			// before it.
			rc.ack(got[0])
			rc.write(packets.NewControlPacket(packets.PINGREQ))
			var more []*packets.Publish
			for cp := rc.read(); cp.Type != packets.PINGRESP; cp = rc.read() {
				if cp.Type == packets.PUBLISH {
					more = append(more, cp.Content.(*packets.Publish))
				}
			}
			require.Len(t, more, 1, "one acknowledgement, one more delivery")
			require.Equal(t, "2", string(more[0].Payload))
			send("flow/marker", 0, "m2")
			require.Empty(t, rc.readPublishesUntilMarker("flow/marker"), "still at Receive Maximum")

			// Acknowledging everything drains the rest in order.
			rc.ack(got[1])
			rc.ack(more[0])
			next := 3
			for next < 10 {
				cp := rc.read()
				if cp.Type != packets.PUBLISH {
					continue
				}
				p := cp.Content.(*packets.Publish)
				require.Equal(t, fmt.Sprint(next), string(p.Payload))
				rc.ack(p)
				next++
			}
		})
	}
}

// TestChurnReleasesEveryBitOfState: thousands of short-lived clients with
// session expiry and a shared subscription leave nothing behind once their
// sessions expire: no engine member, no group, no per-connection state, no
// metrics series, and the heap returns near its baseline.
func TestChurnReleasesEveryBitOfState(t *testing.T) {
	if testing.Short() {
		t.Skip("churn test")
	}
	b := startBroker(t, nil)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	base := heap()
	const clients = 2000
	expiry := uint32(1)
	for i := 0; i < clients; i++ {
		conn, err := net.Dial("tcp", b.MQTTAddr())
		require.NoError(t, err)
		rc := &rawConn{t: t, conn: conn}
		connect := connectPacket(fmt.Sprintf("churn-%d", i), "", "")
		connect.Content.(*packets.Connect).CleanStart = false
		connect.Content.(*packets.Connect).Properties = &packets.Properties{SessionExpiryInterval: &expiry}
		rc.write(connect)
		require.Equal(t, packets.CONNACK, rc.read().Type)
		if i%2 == 0 {
			rc.subscribe(fmt.Sprintf("$share/g%d/churn/t", i%20), 1)
		} else {
			rc.subscribe("churn/plain", 1)
		}
		require.NoError(t, conn.Close())
	}
	members, _ := b.Engine().Counts()
	require.NotZero(t, members, "members are kept while their sessions live")
	eventually(t, 30*time.Second, func() bool {
		members, groups := b.Engine().Counts()
		return members == 0 && groups == 0 && b.server.Clients.Len() == 0
	}, "expired sessions leave engine state behind")
	require.Zero(t, b.selection.ConnectionCount(), "per-connection state left behind")
	metrics := getMetrics(t, b)
	require.NotContains(t, metrics, "churn-", "metrics still name expired clients")
	after := heap()
	require.Less(t, int64(after)-int64(base), int64(8<<20),
		"heap grew from %d to %d bytes after %d expired sessions", base, after, clients)
}

// getMetrics fetches GET /metrics.
func getMetrics(t *testing.T, b *Broker) string {
	t.Helper()
	resp, err := http.Get("http://" + b.HTTPAddr() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}
