package clientsdk_test

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/clientsdk"
)

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

func TestWebSocketSubscriberReports(t *testing.T) {
	for _, via := range []clientsdk.ReportChannel{clientsdk.ReportViaPingreq, clientsdk.ReportViaPublish} {
		t.Run(string(via), func(t *testing.T) {
			wsAddr := freeAddr(t)
			b, err := broker.New(broker.Config{
				MQTTListen: "127.0.0.1:0", WSListen: wsAddr, HTTPListen: "127.0.0.1:0",
				Strategy: "adaptive", ReportInterval: 200 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			require.NoError(t, err)
			require.NoError(t, b.Start())
			t.Cleanup(func() { _ = b.Close() })

			cfg, _ := subscriberConfig(t, b.MQTTAddr(), "w-ws-"+string(via), fixedWork(2*time.Millisecond))
			cfg.Brokers = []string{"ws://" + wsAddr + "/mqtt"}
			cfg.ReportVia = via
			s := startSubscriber(t, cfg)
			pub := startPublisher(t, b.MQTTAddr())
			publish(t, pub, "t/ws", 5, clientsdk.PublishOptions{QoS: 1})
			require.Eventually(t, func() bool { return s.Stats().Processed == 5 }, 5*time.Second, poll)
			require.Eventually(t, func() bool {
				m, ok := member(t, b, shareGT, cfg.ClientID)
				return ok && m.Reports > 0 && m.ProcessingTimeMs > 0
			}, 3*time.Second, poll, "reports over WebSocket never reached the broker")
		})
	}
}
