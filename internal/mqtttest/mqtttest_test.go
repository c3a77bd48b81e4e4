package mqtttest_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/internal/mqtttest"
)

// TestRecorderAndConnect runs a broker on a loopback port: a Recorder
// counts and finds what it receives, and a client from Connect with a
// subscription gets the same messages through its own handler.
func TestRecorderAndConnect(t *testing.T) {
	b, err := broker.New(broker.Config{
		MQTTListen: "127.0.0.1:0",
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Close() })

	sub := mqtttest.ConnectRecorder(t, b.MQTTAddr(), "recorder")
	sub.MustSubscribe(t, "mt/#", 1, false)
	handled := make(chan string, 10)
	mqtttest.Connect(t, b.MQTTAddr(), "handler", paho.ClientConfig{
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				handled <- string(pr.Packet.Payload)
				return true, nil
			},
		},
	}, paho.SubscribeOptions{Topic: "mt/b", QoS: 1})

	pub := mqtttest.ConnectRecorder(t, b.MQTTAddr(), "publisher")
	pub.MustSend(t, &paho.Publish{Topic: "mt/a", QoS: 1, Payload: []byte("x-1")})
	pub.MustSend(t, &paho.Publish{Topic: "mt/b", QoS: 1, Payload: []byte("x-2")})
	pub.MustSend(t, &paho.Publish{Topic: "mt/b", QoS: 0, Payload: []byte("y-1")})
	require.NoError(t, pub.Send(&paho.Publish{Topic: "mt/a", QoS: 1, Payload: []byte("x-1")}))

	require.Eventually(t, func() bool { return sub.Find("y-1") != nil && sub.Payloads("x-")["x-1"] == 2 },
		5*time.Second, 10*time.Millisecond)
	require.Equal(t, map[string]int{"x-1": 2, "x-2": 1}, sub.Payloads("x-"))
	require.Equal(t, "mt/b", sub.Find("x-2").Topic)
	require.Nil(t, sub.Find("x-3"))
	require.Empty(t, pub.Payloads(""), "the publisher subscribed to nothing")
	for _, want := range []string{"x-2", "y-1"} {
		select {
		case got := <-handled:
			require.Equal(t, want, got)
		case <-time.After(5 * time.Second):
			t.Fatalf("the Connect client's handler did not get %s", want)
		}
	}
}
