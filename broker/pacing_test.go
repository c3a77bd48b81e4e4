package broker

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/broker/pingreq"
	"github.com/luffymq/luffymq/hooks"
)

// burstResult is what one QoS 0 burst delivered.
type burstResult struct {
	expected, delivered int
	perSubscriber       []int
	publishTime         time.Duration
	dropped             int64 // Mochi's drops (full client write queues)
	pacing              pacingCounts
}

// pacingCounts copies a PacingHook's counters (zero with pacing off).
type pacingCounts struct {
	waits, timedOut, notDraining uint64
	waited                       time.Duration
}

func (b *Broker) pacingCounts() pacingCounts {
	if b.pacing == nil {
		return pacingCounts{}
	}
	c := &b.pacing.Counters
	return pacingCounts{waits: c.Waits.Load(), timedOut: c.TimedOut.Load(), notDraining: c.NotDraining.Load(),
		waited: time.Duration(c.WaitNanos.Load())}
}

// burstSpec is a QoS 0 burst: publishers each send messages of
// payloadBytes as fast as they can to subscribers of one topic.
type burstSpec struct {
	publishers, messages, subscribers, payloadBytes int
}

// countingSubscriber is a paho subscriber that only counts.
type countingSubscriber struct {
	client *paho.Client
	n      atomic.Int64
}

// runBurst connects spec's clients to b, runs the burst and waits until
// every delivery arrived, or none arrived for a second after the
// publishers finished (the rest was dropped).
func runBurst(t *testing.T, b *Broker, topic string, spec burstSpec) burstResult {
	t.Helper()
	var total atomic.Int64
	subs := make([]*countingSubscriber, spec.subscribers)
	for i := range subs {
		s := &countingSubscriber{}
		s.client = connectCounting(t, b.MQTTAddr(), fmt.Sprintf("burst-sub-%d", i), func() { s.n.Add(1); total.Add(1) })
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := s.client.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: 0}}})
		cancel()
		require.NoError(t, err)
		subs[i] = s
	}
	pubs := make([]*paho.Client, spec.publishers)
	for i := range pubs {
		pubs[i] = connectCounting(t, b.MQTTAddr(), fmt.Sprintf("burst-pub-%d", i), nil)
	}
	droppedBefore := atomic.LoadInt64(&b.Server().Info.MessagesDropped)
	payload := make([]byte, spec.payloadBytes)
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for _, p := range pubs {
		wg.Go(func() {
			for range spec.messages {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := p.Publish(ctx, &paho.Publish{Topic: topic, QoS: 0, Payload: payload})
				cancel()
				if err != nil {
					failed.Add(1)
					return
				}
			}
		})
	}
	wg.Wait()
	publishTime := time.Since(start)
	require.Zero(t, failed.Load(), "publishes failed")
	expected := spec.publishers * spec.messages * spec.subscribers
	last, lastChange := int64(-1), time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		n := total.Load()
		if n >= int64(expected) {
			break
		}
		if n != last {
			last, lastChange = n, time.Now()
		} else if time.Since(lastChange) > time.Second {
			break
		}
	}
	res := burstResult{expected: expected, delivered: int(total.Load()), publishTime: publishTime,
		dropped: atomic.LoadInt64(&b.Server().Info.MessagesDropped) - droppedBefore, pacing: b.pacingCounts()}
	for _, s := range subs {
		res.perSubscriber = append(res.perSubscriber, int(s.n.Load()))
	}
	return res
}

// connectCounting connects a paho client that calls onMessage for each
// message it receives (and keeps none).
func connectCounting(t *testing.T, addr, clientID string, onMessage func()) *paho.Client {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	cfg := paho.ClientConfig{ClientID: clientID, Conn: conn}
	if onMessage != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){
			func(paho.PublishReceived) (bool, error) { onMessage(); return true, nil },
		}
	}
	c := paho.NewClient(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.Connect(ctx, &paho.Connect{ClientID: clientID, KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = c.Disconnect(&paho.Disconnect{})
		_ = conn.Close()
	})
	return c
}

func (r burstResult) String() string {
	return fmt.Sprintf("delivered %d / %d (%.1f %%), per subscriber %v, dropped at the write queue %d, publishing took %v; paced deliveries %d (waited %v in all, %d reached the bound, %d to clients not draining)",
		r.delivered, r.expected, 100*float64(r.delivered)/float64(r.expected), r.perSubscriber, r.dropped,
		r.publishTime.Round(time.Millisecond), r.pacing.waits, r.pacing.waited.Round(time.Millisecond), r.pacing.timedOut, r.pacing.notDraining)
}

// TestPublisherPacingDeliversQoS0Burst is luffy-bench reliability's
// qos0-burst scaled down: 4 publishers send 5 000 QoS 0 messages of 100 B
// each, as fast as they can, to 3 subscribers that keep up on average.
// Without pacing the publishers' read goroutines fill the subscribers'
// write queues (8192 packets) faster than the subscribers' write loops
// drain them, and Mochi drops what does not fit; with pacing (the
// default) the publishers wait for the draining subscribers and at least
// 99 % arrives. Both runs are logged.
func TestPublisherPacingDeliversQoS0Burst(t *testing.T) {
	spec := burstSpec{publishers: 4, messages: 5000, subscribers: 3, payloadBytes: 100}
	var off, on burstResult
	t.Run("pacing off", func(t *testing.T) {
		b := startBroker(t, func(c *Config) { c.PublisherPacingMaxWait = -1 })
		require.Nil(t, b.pacing)
		off = runBurst(t, b, "burst/t", spec)
		t.Logf("pacing off: %s", off)
	})
	t.Run("pacing on (default)", func(t *testing.T) {
		b := startBroker(t, nil)
		require.NotNil(t, b.pacing, "pacing is on by default")
		on = runBurst(t, b, "burst/t", spec)
		t.Logf("pacing on: %s", on)
		require.GreaterOrEqual(t, float64(on.delivered), 0.99*float64(on.expected),
			"with pacing at least 99 %% of the burst arrives")
		metrics := getMetrics(t, b)
		require.Contains(t, metrics, "luffymq_publisher_pacing_waits_total ")
		require.Contains(t, metrics, "luffymq_publisher_pacing_wait_seconds_total ")
		require.Contains(t, metrics, fmt.Sprintf("luffymq_publisher_pacing_waits_total %d\n", b.pacing.Counters.Waits.Load()))
	})
	if off.delivered == off.expected {
		t.Logf("this run did not reproduce the drops without pacing (the machine kept up)")
	}
}

// TestPublisherPacingNeverWaitsForStuckSubscriber: a QoS 0 subscriber
// that never reads its socket (keep-alive 0, like luffy-bench's stuck
// subscriber) shares the topic with a healthy one while 4 publishers
// burst 20 MiB at it. With pacing on, the publishers may wait for the
// healthy subscriber, which drains, never for the stuck one: the burst is
// published at full speed (a publisher waiting the 5 ms bound for each of
// its 5 000 deliveries would take 25 s), the healthy subscriber gets at
// least 99 % of it, and the stuck client loses its own messages only.
func TestPublisherPacingNeverWaitsForStuckSubscriber(t *testing.T) {
	b := startBroker(t, nil)
	require.NotNil(t, b.pacing)

	connectStuckSubscriber(t, b, "stuck/t", 0)

	spec := burstSpec{publishers: 4, messages: 5000, subscribers: 1, payloadBytes: 1024}
	res := runBurst(t, b, "stuck/t", spec)
	t.Logf("healthy subscriber beside a stuck one, pacing on: %s", res)
	require.GreaterOrEqual(t, float64(res.delivered), 0.99*float64(res.expected),
		"the healthy subscriber gets at least 99 %% of the burst")
	require.Less(t, res.publishTime, 15*time.Second, "the publishers were not held back by the stuck subscriber")

	cl, ok := b.Server().Clients.Get("stuck")
	require.True(t, ok, "the stuck client is still connected (QoS 0 never disconnects it)")
	ws, ok := cl.Net.Conn.(writeStatsSource)
	require.True(t, ok)
	st := ws.WriteStats()
	t.Logf("stuck subscriber: %d QoS 0 dropped at its outbox, %d at its write queue, %d bytes queued", st.DroppedQoS0, st.DroppedWriteQueue, st.QueuedBytes)
	require.Positive(t, st.DroppedQoS0+st.DroppedWriteQueue, "the stuck subscriber lost its own messages")
	require.LessOrEqual(t, st.QueuedBytes, cmp.Or(b.cfg.MaxQueuedBytes, pingreq.DefaultMaxQueuedBytes), "its memory stays bounded")
	d, ok := cl.Net.Conn.(hooks.WriteDrainer)
	require.True(t, ok)
	eventually(t, 2*time.Second, func() bool { return !d.Draining(hooks.DefaultPacingStallAfter) },
		"the stuck subscriber does not count as draining")
}

// TestPublisherPacingFlags checks --publisher-pacing and
// --publisher-pacing-max-wait.
func TestPublisherPacingFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want time.Duration
	}{
		{nil, hooks.DefaultPacingMaxWait},
		{[]string{"--publisher-pacing-max-wait", "20ms"}, 20 * time.Millisecond},
		{[]string{"--publisher-pacing=false"}, -1},
	} {
		cfg, err := ConfigFromArgs(append([]string{"--listen", "127.0.0.1:0", "--http", ""}, tt.args...), io.Discard, io.Discard)
		require.NoError(t, err, tt.args)
		require.Equal(t, tt.want, cfg.PublisherPacingMaxWait, tt.args)
		b, err := New(cfg)
		require.NoError(t, err, tt.args)
		require.Equal(t, tt.want > 0, b.pacing != nil, tt.args)
		require.NoError(t, b.Close())
	}
	requireFlagRefused(t, "publisher-pacing-max-wait", "0", "-1ms", "2s")
}
