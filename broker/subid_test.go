package broker

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/internal/testenv"
)

// TestSharedGroupSubscriptionIdentifiersAsPeers: plain paho.golang
// members of shared groups get the subscription identifier they
// subscribed with, and none when they gave none, from luffymq as from
// vanilla Mochi and Mosquitto in the same test (MQTT-3.3.4-3). LuffyMQ's
// selection adds the chosen member to Mochi's recipients itself, and
// leaves a subscription without an identifier unmerged.
func TestSharedGroupSubscriptionIdentifiersAsPeers(t *testing.T) {
	peers := map[string]func(t *testing.T) string{
		"luffymq":   func(t *testing.T) string { return startBroker(t, nil).MQTTAddr() },
		"mochi":     startVanillaMochi,
		"mosquitto": func(t *testing.T) string { return testenv.StartMosquitto(t) },
	}
	got := map[string][2]int{} // 0: none
	for name, start := range peers {
		t.Run(name, func(t *testing.T) {
			addr := start(t)
			id := 5
			with := connectPaho(t, addr, "with-id", nil)
			subscribeWith(t, with, "$share/g/jobs/x", &id)
			without := connectPaho(t, addr, "without-id", nil)
			subscribeWith(t, without, "$share/h/jobs/+", nil)

			pub := connectPaho(t, addr, "pub", nil)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := pub.Publish(ctx, &paho.Publish{Topic: "jobs/x", QoS: 1, Payload: []byte("job")})
			require.NoError(t, err)
			eventually(t, 5*time.Second, func() bool { return with.count() == 1 && without.count() == 1 }, "each group's member gets the job once")

			with.mu.Lock()
			without.mu.Lock()
			g := [2]*int{with.received[0].Properties.SubscriptionIdentifier, without.received[0].Properties.SubscriptionIdentifier}
			without.mu.Unlock()
			with.mu.Unlock()
			require.NotNil(t, g[0], "the member that subscribed with identifier 5 gets it")
			require.Equal(t, 5, *g[0])
			require.Nil(t, g[1], "the member that subscribed without an identifier gets none")
			got[name] = [2]int{*g[0], 0}
		})
	}
	t.Logf("subscription identifiers delivered (with, without): %v", got)
}

func subscribeWith(t *testing.T, pc *pahoClient, filter string, id *int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sub := &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}
	if id != nil {
		sub.Properties = &paho.SubscribeProperties{SubscriptionIdentifier: id}
	}
	_, err := pc.Subscribe(ctx, sub)
	require.NoError(t, err)
}

// startVanillaMochi starts Mochi MQTT with default options and allow-all
// authentication on a free loopback port, and stops it when the test ends.
func startVanillaMochi(t *testing.T) string {
	t.Helper()
	s := mqtt.New(&mqtt.Options{InlineClient: false, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, s.AddHook(new(auth.AllowHook), nil))
	tcp := listeners.NewTCP(listeners.Config{ID: "t", Address: "127.0.0.1:0"})
	require.NoError(t, s.AddListener(tcp))
	require.NoError(t, s.Serve())
	t.Cleanup(func() { _ = s.Close() })
	return tcp.Address()
}
