package sensors_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/clientsdk"
	"github.com/luffymq/luffymq/examples/internal/sensors"
)

func TestTopic(t *testing.T) {
	require.Equal(t, "sensors/7/temp", sensors.Topic("sensors/{id}/temp", 7))
	require.Equal(t, "plain", sensors.Topic("plain", 7))
}

func TestReadingIsPaddedJSON(t *testing.T) {
	b := sensors.Reading(3, 12, 21.456, 100)
	require.Len(t, b, 100)
	var r struct {
		Device int     `json:"device"`
		Seq    int     `json:"seq"`
		Value  float64 `json:"value"`
	}
	require.NoError(t, json.Unmarshal(b, &r), "padding is JSON whitespace")
	require.Equal(t, 3, r.Device)
	require.Equal(t, 12, r.Seq)
	require.Equal(t, 21.46, r.Value)
	require.Greater(t, len(sensors.Reading(3, 12, 1, 5)), 5, "never cut below the JSON object")
}

func TestRunRejectsBadConfig(t *testing.T) {
	good := sensors.Config{Broker: "mqtt://127.0.0.1:1", Devices: 1, Rate: 1, TopicPattern: "s/{id}"}
	tests := map[string]func(*sensors.Config){
		"devices": func(c *sensors.Config) { c.Devices = 0 },
		"rate":    func(c *sensors.Config) { c.Rate = -1 },
		"topic":   func(c *sensors.Config) { c.TopicPattern = "s/+/x" },
		"qos":     func(c *sensors.Config) { c.QoS = 3 },
		"broker":  func(c *sensors.Config) { c.Broker = "" },
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			c := good
			mutate(&c)
			_, err := sensors.Run(context.Background(), c)
			require.ErrorContains(t, err, name)
		})
	}
}

func TestRunPublishesEveryReading(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	b, err := broker.New(broker.Config{MQTTListen: "127.0.0.1:0", Strategy: "adaptive", ReportInterval: time.Second, Logger: quiet})
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Close() })

	var got, stamped atomic.Int32
	sub, err := clientsdk.NewSubscriber(clientsdk.SubscriberConfig{
		ConnectionConfig: clientsdk.ConnectionConfig{Brokers: []string{"mqtt://" + b.MQTTAddr()}, Logger: quiet},
		Group:            "g",
		Filters:          []string{"sensors/#"},
		QoS:              1,
		Handler: func(_ context.Context, m *clientsdk.Message) error {
			got.Add(1)
			if _, ok := clientsdk.SentAt(m); ok && strings.HasSuffix(m.Topic, "/temp") {
				stamped.Add(1)
			}
			return nil
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, sub.Start(ctx))
	t.Cleanup(func() { _ = sub.Close(context.Background()) })

	var out strings.Builder
	sum, err := sensors.Run(ctx, sensors.Config{
		Broker: "mqtt://" + b.MQTTAddr(), Devices: 2, Rate: 50, Count: 5, PayloadSize: 64,
		TopicPattern: "sensors/{id}/temp", QoS: 1, ClientIDPrefix: "dev-", Out: &out, Logger: quiet,
	})
	require.NoError(t, err)
	require.Equal(t, sensors.Summary{Sent: 10}, sum)
	require.Contains(t, out.String(), "done: sent=10 failed=0")
	require.Eventually(t, func() bool { return got.Load() == 10 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, int32(10), stamped.Load())
}
