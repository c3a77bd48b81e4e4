package worker_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/clientsdk"
	"github.com/luffymq/luffymq/examples/internal/worker"
)

func TestStatsLine(t *testing.T) {
	line := worker.StatsLine(clientsdk.Stats{
		Received: 120, Pending: 3, InFlight: 1, Processed: 116,
		MeanProcessingTime: 25100 * time.Microsecond, ReportsSent: 4, ReportVia: clientsdk.ReportViaPingreq,
	}, 40)
	require.Equal(t, "received=40/s (total 120) pending=3 inflight=1 processed=116 mean_processing=25.1ms reports=4 via=pingreq", line)
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestRunPrintsLoadAndClosesGracefully(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	b, err := broker.New(broker.Config{MQTTListen: "127.0.0.1:0", HTTPListen: "127.0.0.1:0", Strategy: "adaptive", ReportInterval: time.Second, Logger: quiet})
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Close() })

	st, err := clientsdk.ParseServiceTime("uniform:1ms-3ms")
	require.NoError(t, err)
	out := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- worker.Run(ctx, worker.Config{
			Broker: "mqtt://" + b.MQTTAddr(), ClientID: "w1", Group: "g", Filters: []string{"sensors/#"},
			QoS: 1, ProcessTime: st, Workers: 2, ReportVia: clientsdk.ReportViaPingreq, Out: out, Logger: quiet,
		})
	}()
	require.Eventually(t, func() bool { return bytes.Contains([]byte(out.String()), []byte("drift-free")) }, 5*time.Second, 10*time.Millisecond)

	pub, err := clientsdk.NewPublisher(clientsdk.PublisherConfig{ConnectionConfig: clientsdk.ConnectionConfig{Brokers: []string{"mqtt://" + b.MQTTAddr()}, Logger: quiet}})
	require.NoError(t, err)
	require.NoError(t, pub.Start(ctx))
	defer pub.Close(context.Background())
	for range 20 {
		require.NoError(t, pub.Publish(ctx, "sensors/1/temp", []byte("21.5"), clientsdk.PublishOptions{QoS: 1}))
	}
	require.Eventually(t, func() bool {
		return bytes.Contains([]byte(out.String()), []byte("(total 20) pending=0 inflight=0 processed=20"))
	}, 5*time.Second, 20*time.Millisecond, "no per-second line showing the 20 messages")

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(8 * time.Second):
		t.Fatal("worker did not stop")
	}
	require.Contains(t, out.String(), "closed: received=20 processed=20 failed=0 dropped=0")
}
