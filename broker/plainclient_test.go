package broker

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"
)

// plainWorker is a paho.golang client with no LuffyMQ code: QoS 1, its own
// FIFO and one worker, acknowledging each message only after processing it
// (paho's manual acknowledgement, flushed every ackEvery), no load reports.
type plainWorker struct {
	client  *paho.Client
	mu      sync.Mutex
	queue   []*paho.Publish
	wake    chan struct{}
	handled int
}

func startPlainWorker(t *testing.T, addr, id, filter string, service, ackEvery time.Duration) *plainWorker {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	w := &plainWorker{wake: make(chan struct{}, 1)}
	w.client = paho.NewClient(paho.ClientConfig{
		ClientID:                   id,
		Conn:                       conn,
		EnableManualAcknowledgment: true,
		SendAcksInterval:           ackEvery,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			w.mu.Lock()
			w.queue = append(w.queue, pr.Packet)
			w.mu.Unlock()
			select {
			case w.wake <- struct{}{}:
			default:
			}
			return true, nil
		}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = w.client.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	_, err = w.client.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-w.wake:
			}
			for {
				w.mu.Lock()
				if len(w.queue) == 0 {
					w.mu.Unlock()
					break
				}
				pb := w.queue[0]
				w.queue = w.queue[1:]
				w.mu.Unlock()
				time.Sleep(service) // the work
				_ = w.client.Ack(pb)
				w.mu.Lock()
				w.handled++
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		close(done)
		_ = w.client.Disconnect(&paho.Disconnect{})
		_ = conn.Close()
	})
	return w
}

// TestPlainQoS1WorkersAreLearntFromTheirAcks: plain paho.golang workers
// that never report but acknowledge after processing teach the broker
// their service times, and the slow one gets fewer messages.
func TestPlainQoS1WorkersAreLearntFromTheirAcks(t *testing.T) {
	if testing.Short() {
		t.Skip("timed run")
	}
	b := startBroker(t, nil)
	const filter = "$share/plain/jobs"
	fast := startPlainWorker(t, b.MQTTAddr(), "fast", filter, 5*time.Millisecond, time.Millisecond)
	slow := startPlainWorker(t, b.MQTTAddr(), "slow", filter, 20*time.Millisecond, time.Millisecond)
	pub := connectPaho(t, b.MQTTAddr(), "jobs-publisher", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const messages = 200 // 5 ms apart: 200/s against a capacity of 200 + 50
	for i := 0; i < messages; i++ {
		_, err := pub.Publish(ctx, &paho.Publish{Topic: "jobs", QoS: 1, Payload: []byte(fmt.Sprint(i))})
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond)
	}
	count := func(w *plainWorker) int {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.handled
	}
	eventually(t, 10*time.Second, func() bool { return count(fast)+count(slow) == messages })
	groups := getGroups(t, b)
	fastStatus, ok := member(groups, filter, "fast")
	require.True(t, ok)
	slowStatus, ok := member(groups, filter, "slow")
	require.True(t, ok)
	require.Zero(t, fastStatus.Reports+slowStatus.Reports, "no reports were sent")
	require.True(t, fastStatus.AcksAreCompletions)
	require.Greater(t, fastStatus.Completions, uint64(10))
	require.Greater(t, slowStatus.Completions, uint64(5))
	require.Greater(t, slowStatus.ServiceTimeMs, 2*fastStatus.ServiceTimeMs,
		"learnt service times: fast %.1f ms, slow %.1f ms", fastStatus.ServiceTimeMs, slowStatus.ServiceTimeMs)
	// Round robin would give the slow one half, four times its capacity.
	require.Less(t, count(slow), messages/3, "fast %d, slow %d", count(fast), count(slow))
	t.Logf("fast: %d messages, %.1f ms learnt; slow: %d messages, %.1f ms learnt",
		count(fast), fastStatus.ServiceTimeMs, count(slow), slowStatus.ServiceTimeMs)
}
