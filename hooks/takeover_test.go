package hooks_test

import (
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/hooks"
)

// publishInTakeover publishes one message, from inside Mochi's takeover of
// a session, at the moment the old client object has been marked taken
// over and its in-flight messages copied to the new object: Mochi then
// drops the old object's copies (OnQosDropped), before it registers the
// new object. A publisher's goroutine that looks the subscriber up there
// finds the old object, as one racing the takeover does.
type publishInTakeover struct {
	mqtt.HookBase
	server  *mqtt.Server
	topic   string
	payload string
	once    sync.Once
	done    chan struct{}
}

func (h *publishInTakeover) ID() string { return "test-publish-in-takeover" }

func (h *publishInTakeover) Provides(b byte) bool { return b == mqtt.OnQosDropped }

func (h *publishInTakeover) OnQosDropped(cl *mqtt.Client, _ packets.Packet) {
	if !cl.IsTakenOver() {
		return
	}
	h.once.Do(func() {
		defer close(h.done)
		_ = h.server.Publish(h.topic, []byte(h.payload), false, 1)
	})
}

// newTakeoverRaceServer starts a Mochi server with an inline client, the
// TakeoverHook if takeover is set, the publishing hook and allow-all auth.
func newTakeoverRaceServer(t *testing.T, takeover bool) (*mqtt.Server, *hooks.TakeoverHook, *publishInTakeover, string) {
	t.Helper()
	server := mqtt.New(&mqtt.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var hook *hooks.TakeoverHook
	if takeover {
		hook = hooks.NewTakeoverHook(server)
		require.NoError(t, server.AddHook(hook, nil))
	}
	racer := &publishInTakeover{server: server, topic: "jobs", payload: "racing-the-takeover", done: make(chan struct{})}
	require.NoError(t, server.AddHook(racer, nil))
	require.NoError(t, server.AddHook(new(auth.AllowHook), nil))
	tcp := listeners.NewTCP(listeners.Config{ID: "t", Address: "127.0.0.1:0"})
	require.NoError(t, server.AddListener(tcp))
	require.NoError(t, server.Serve())
	t.Cleanup(func() { _ = server.Close() })
	return server, hook, racer, tcp.Address()
}

// TestTakeoverHookDeliversWhatMochiGaveTheOldClient: a QoS 1 message
// published while a new connection resumes a session, and handed by Mochi
// to the session's old client object, reaches the new connection. Without
// the hook Mochi 2.7.9 loses it (the second subtest shows the loss, so
// that this hook is dropped once Mochi no longer needs it).
func TestTakeoverHookDeliversWhatMochiGaveTheOldClient(t *testing.T) {
	for _, version := range []byte{5, 4} {
		t.Run("MQTT "+versionName(version), func(t *testing.T) {
			server, hook, racer, addr := newTakeoverRaceServer(t, true)
			old, _ := dialRaw(t, addr, "worker", version, false, 3600)
			old.subscribeAt("jobs", 1)
			require.NoError(t, server.Publish("jobs", []byte("queued-before"), false, 1))
			require.True(t, old.received("queued-before", 3*time.Second))

			resumed, ack := dialRaw(t, addr, "worker", version, false, 3600)
			require.True(t, ack.SessionPresent)
			<-racer.done
			require.True(t, resumed.received("queued-before", 3*time.Second), "the in-flight message is resent")
			require.True(t, resumed.received("racing-the-takeover", 3*time.Second),
				"the message Mochi handed to the old client object reached the resumed session")
			require.Equal(t, uint64(1), hook.Adopted())
			require.Equal(t, uint64(0), hook.Missed())
			cl, ok := server.Clients.Get("worker")
			require.True(t, ok)
			require.Equal(t, 2, cl.State.Inflight.Len(), "both unacknowledged messages are in the session")
		})
	}
	t.Run("Mochi without the hook loses it", func(t *testing.T) {
		server, _, racer, addr := newTakeoverRaceServer(t, false)
		old, _ := dialRaw(t, addr, "worker", 5, false, 3600)
		old.subscribeAt("jobs", 1)
		require.NoError(t, server.Publish("jobs", []byte("queued-before"), false, 1))
		require.True(t, old.received("queued-before", 3*time.Second))
		resumed, ack := dialRaw(t, addr, "worker", 5, false, 3600)
		require.True(t, ack.SessionPresent)
		<-racer.done
		require.True(t, resumed.received("queued-before", 3*time.Second))
		require.False(t, resumed.received("racing-the-takeover", 500*time.Millisecond),
			"Mochi delivered the racing message without the hook: it may no longer need it")
	})
}

// TestTakeoverHookWritesLateDeliveriesToTheNewConnection: a publisher that
// looked the subscriber up before the takeover and adds its delivery to the
// old client object after the new connection is established has it written
// to the new connection.
func TestTakeoverHookWritesLateDeliveriesToTheNewConnection(t *testing.T) {
	server, hook, _, addr := newTakeoverRaceServer(t, true)
	old, _ := dialRaw(t, addr, "worker", 5, false, 3600)
	old.subscribeAt("jobs", 1)
	oldClient, ok := server.Clients.Get("worker")
	require.True(t, ok)
	resumed, ack := dialRaw(t, addr, "worker", 5, false, 3600)
	require.True(t, ack.SessionPresent)
	require.True(t, oldClient.IsTakenOver())
	resumed.ping() // the session is established

	// What Mochi's publishToClient does on the object it looked up.
	late := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, TopicName: "jobs",
		Payload: []byte("late"), PacketID: 7, Created: time.Now().Unix()}
	require.True(t, oldClient.State.Inflight.Set(late))
	hook.OnQosPublish(oldClient, late, late.Created, 0)

	require.True(t, resumed.received("late", 3*time.Second))
	cl, _ := server.Clients.Get("worker")
	_, held := cl.State.Inflight.Get(7)
	require.True(t, held, "the delivery is in the resumed session's in-flight messages")
	require.Equal(t, uint64(1), hook.Adopted())
}

// TestTakeoverHookLeavesCleanStartAlone: a connection that starts clean
// discards the old session; nothing kept for it is delivered.
func TestTakeoverHookLeavesCleanStartAlone(t *testing.T) {
	server, hook, _, addr := newTakeoverRaceServer(t, true)
	old, _ := dialRaw(t, addr, "worker", 5, false, 3600)
	old.subscribeAt("jobs", 1)
	oldClient, _ := server.Clients.Get("worker")
	fresh, ack := dialRaw(t, addr, "worker", 5, true, 3600)
	require.False(t, ack.SessionPresent)
	require.True(t, oldClient.IsTakenOver())
	fresh.ping()
	stale := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, TopicName: "jobs",
		Payload: []byte("for-the-old-session"), PacketID: 3}
	hook.OnQosPublish(oldClient, stale, 0, 0)
	// The next resumption (clean start false) resumes the clean
	// connection's session, not the old one.
	fresh2, ack2 := dialRaw(t, addr, "worker", 5, false, 3600)
	require.True(t, ack2.SessionPresent)
	require.False(t, fresh2.received("for-the-old-session", 300*time.Millisecond))
	require.False(t, fresh.received("for-the-old-session", 100*time.Millisecond))
	require.Equal(t, uint64(0), hook.Adopted())
}

// BenchmarkTakeoverHookOnQosPublish is the hook's cost on every QoS≥1
// delivery to a client that is not being taken over.
func BenchmarkTakeoverHookOnQosPublish(b *testing.B) {
	server := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	hook := hooks.NewTakeoverHook(server)
	cl := server.NewClient(nil, "t", "worker", false)
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, TopicName: "jobs", PacketID: 1}
	b.ReportAllocs()
	for b.Loop() {
		hook.OnQosPublish(cl, pk, 0, 0)
	}
}
