package hooks

import (
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
)

// drainConn is a client connection whose Draining answer the test sets;
// what Mochi writes to it is counted and discarded.
type drainConn struct {
	net.Conn
	draining atomic.Bool
	writes   atomic.Int64
}

func (c *drainConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return len(p), nil
}

func (c *drainConn) Draining(time.Duration) bool { return c.draining.Load() }

// pacingFixture is a Mochi server with a pacing hook, an allow-all hook
// and one subscriber of "t" whose write loop does not run until the test
// starts it, so its write queue holds what is published.
type pacingFixture struct {
	server *mqtt.Server
	hook   *PacingHook
	client *mqtt.Client
	conn   *drainConn
}

const pacingTestQueue = 64 // the subscriber's write queue, in packets

func newPacingFixture(t *testing.T, maxWait time.Duration) *pacingFixture {
	t.Helper()
	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumClientWritesPending = pacingTestQueue
	server := mqtt.New(&mqtt.Options{
		InlineClient: true, // Server.Publish, the publisher here
		Capabilities: caps,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	hook, err := NewPacingHook(PacingConfig{Server: server, MaxWait: maxWait})
	require.NoError(t, err)
	require.NoError(t, server.AddHook(hook, nil))
	require.NoError(t, server.AddHook(new(auth.AllowHook), nil))

	local, remote := net.Pipe()
	t.Cleanup(func() { _ = remote.Close() })
	conn := &drainConn{Conn: local}
	conn.draining.Store(true)
	cl := server.NewClient(conn, "test", "sub", false)
	cl.Properties.ProtocolVersion = 5
	server.Clients.Add(cl)
	require.True(t, server.Topics.Subscribe(cl.ID, packets.Subscription{Filter: "t"}))
	t.Cleanup(func() { cl.Stop(nil) })
	return &pacingFixture{server: server, hook: hook, client: cl, conn: conn}
}

// fill publishes until the subscriber's queue holds n packets.
func (f *pacingFixture) fill(t *testing.T, n int) {
	t.Helper()
	for writeQueueLen(f.client) < n {
		require.NoError(t, f.server.Publish("t", []byte("x"), false, 0))
	}
	require.Equal(t, n, writeQueueLen(f.client))
}

// publishTimed publishes one message and returns how long it took.
func (f *pacingFixture) publishTimed(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	require.NoError(t, f.server.Publish("t", []byte("x"), false, 0))
	return time.Since(start)
}

func TestPacingReadsMochiWriteQueue(t *testing.T) {
	require.GreaterOrEqual(t, writeQueueField, 0, "Mochi's ClientState.outbound not found")
	f := newPacingFixture(t, time.Millisecond)
	require.Equal(t, 0, writeQueueLen(f.client))
	f.fill(t, 10)
	require.Equal(t, pacingTestQueue*3/4, f.hook.HighWater(), "default mark: 3/4 of the queue")
}

// Below the mark nobody waits; at the mark a publisher waits for a
// draining client until the wait bound, then the delivery is queued.
func TestPacingWaitsForDrainingClientAtMostMaxWait(t *testing.T) {
	const maxWait = 30 * time.Millisecond
	f := newPacingFixture(t, maxWait)
	f.fill(t, f.hook.HighWater())
	require.Zero(t, f.hook.Counters.Waits.Load(), "no wait below the mark")

	took := f.publishTimed(t)
	require.GreaterOrEqual(t, took, maxWait, "the publisher waited for the draining client")
	require.Less(t, took, maxWait+500*time.Millisecond, "and no longer than the bound (plus scheduling)")
	require.Equal(t, uint64(1), f.hook.Counters.Waits.Load())
	require.Equal(t, uint64(1), f.hook.Counters.TimedOut.Load())
	require.GreaterOrEqual(t, time.Duration(f.hook.Counters.WaitNanos.Load()), maxWait)
	require.Equal(t, f.hook.HighWater()+1, writeQueueLen(f.client), "queued after the wait")
}

// A client that does not drain never makes the publisher wait: it loses
// its own messages once its queue is full.
func TestPacingNeverWaitsForStuckClient(t *testing.T) {
	f := newPacingFixture(t, time.Second)
	f.conn.draining.Store(false)
	f.fill(t, pacingTestQueue)
	for range 20 {
		require.Less(t, f.publishTimed(t), 100*time.Millisecond)
	}
	require.Zero(t, f.hook.Counters.Waits.Load())
	require.Equal(t, uint64(pacingTestQueue-f.hook.HighWater()+20), f.hook.Counters.NotDraining.Load())
	require.Equal(t, int64(20), atomic.LoadInt64(&f.server.Info.MessagesDropped), "the stuck client lost its own messages")
}

// The wait ends as soon as the client's write loop brings the queue
// below the mark, long before the bound.
func TestPacingResumesWhenQueueDrains(t *testing.T) {
	f := newPacingFixture(t, time.Second)
	f.fill(t, f.hook.HighWater())
	go func() {
		time.Sleep(20 * time.Millisecond)
		f.client.WriteLoop() // drains the queue into drainConn; ends with the client
	}()
	took := f.publishTimed(t)
	require.Less(t, took, 900*time.Millisecond, "resumed before the 1 s bound")
	require.Equal(t, uint64(1), f.hook.Counters.Waits.Load())
	require.Zero(t, f.hook.Counters.TimedOut.Load())
	require.Eventually(t, func() bool { return writeQueueLen(f.client) == 0 },
		5*time.Second, time.Millisecond, "the write loop sent the queue")
	require.Positive(t, f.conn.writes.Load())
}

// A client that stops draining while a publisher waits releases it.
func TestPacingStopsWaitingWhenClientStalls(t *testing.T) {
	f := newPacingFixture(t, time.Second)
	f.fill(t, f.hook.HighWater())
	go func() {
		time.Sleep(20 * time.Millisecond)
		f.conn.draining.Store(false)
	}()
	require.Less(t, f.publishTimed(t), 900*time.Millisecond)
	require.Zero(t, f.hook.Counters.TimedOut.Load())
}

// The hook allows nothing itself, so the deciding hook's answer stands,
// and a SUBSCRIBE's filter never waits.
func TestPacingACLAnswerAndFilters(t *testing.T) {
	f := newPacingFixture(t, time.Second)
	f.conn.draining.Store(false) // fill without waiting
	f.fill(t, pacingTestQueue)
	f.conn.draining.Store(true)
	for _, filter := range []string{"a/+", "a/#", "$share/g/t"} {
		start := time.Now()
		require.False(t, f.hook.OnACLCheck(f.client, filter, false), filter)
		require.Less(t, time.Since(start), 100*time.Millisecond, filter)
	}
	require.False(t, f.hook.OnACLCheck(f.client, "t", true), "a publisher's own write check")
	require.Zero(t, f.hook.Counters.Waits.Load())
	require.True(t, f.hook.Provides(mqtt.OnACLCheck))
	require.False(t, f.hook.Provides(mqtt.OnPublish))
}

func TestNewPacingHookValidates(t *testing.T) {
	server := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	_, err := NewPacingHook(PacingConfig{})
	require.Error(t, err)
	for _, cfg := range []PacingConfig{
		{Server: server, MaxWait: -time.Millisecond},
		{Server: server, MaxWait: 2 * MaxPacingMaxWait},
		{Server: server, HighWater: 1 << 30},
		{Server: server, StallAfter: -time.Second},
	} {
		_, err := NewPacingHook(cfg)
		require.Error(t, err, "%+v", cfg)
	}
	h, err := NewPacingHook(PacingConfig{Server: server})
	require.NoError(t, err)
	require.Equal(t, int(server.Options.Capabilities.MaximumClientWritesPending)*3/4, h.HighWater())
}

// BenchmarkPacingACLCheck is what pacing adds to every delivery that is
// not paced: the hook's ACL check on a client below the mark.
func BenchmarkPacingACLCheck(b *testing.B) {
	server := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	h, err := NewPacingHook(PacingConfig{Server: server})
	require.NoError(b, err)
	local, remote := net.Pipe()
	defer func() { _ = local.Close(); _ = remote.Close() }()
	cl := server.NewClient(local, "bench", "sub", false)
	b.ReportAllocs()
	for b.Loop() {
		if h.OnACLCheck(cl, "bench/t", false) {
			b.Fatal("pacing allowed a read")
		}
	}
}
