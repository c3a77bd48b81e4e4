package bridge

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/hooks"
	"github.com/luffymq/luffymq/scoring"
)

// slowHook stands for any hook Mochi runs between the bridge hook and the
// selection hook (the broker's ack-timeout hook sits there): it takes its
// time over the events that end a member's work, so that whatever reacts
// to them before the selection hook has run is caught doing so.
type slowHook struct {
	mqtt.HookBase
	delay time.Duration
	seen  atomic.Int32
}

func (h *slowHook) ID() string { return "test-slow" }

func (h *slowHook) Provides(e byte) bool { return e == mqtt.OnQosComplete || e == mqtt.OnDisconnect }

func (h *slowHook) OnQosComplete(*mqtt.Client, packets.Packet) {
	h.seen.Add(1)
	time.Sleep(h.delay)
}

func (h *slowHook) OnDisconnect(*mqtt.Client, error, bool) {
	h.seen.Add(1)
	time.Sleep(h.delay)
}

// nopAcknowledger settles nothing: the test has no RabbitMQ.
type nopAcknowledger struct{}

func (nopAcknowledger) Ack(uint64, bool) error        { return nil }
func (nopAcknowledger) Nack(uint64, bool, bool) error { return nil }
func (nopAcknowledger) Reject(uint64, bool) error     { return nil }

// TestWakeAfterSelectionCounted checks, without RabbitMQ, the order that
// lets a work-queue consume loop take the next message as soon as a member
// is free: when the loops are woken by a member's PUBACK, the selection
// engine already counts that PUBACK (the member has room), and when they
// are woken by its disconnection, the engine already counts it offline.
// Mochi runs the hooks as broker.New adds them: the bridge hook, a hook
// that takes 30 ms, the selection hook, the bridge's wake hook.
func TestWakeAfterSelectionCounted(t *testing.T) {
	engine, err := scoring.NewEngine(scoring.Config{})
	require.NoError(t, err)
	const share = "$share/wake/wakejobs/#"
	b, err := New(Config{
		Site: "here", BrokerID: "wake", AMQPURL: "amqp://127.0.0.1:1/",
		ExportGroups: []string{share},
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		WorkQueue:    WorkQueueConfig{ManagementURL: "http://127.0.0.1:1", Load: engine},
	})
	require.NoError(t, err)
	server := mqtt.New(&mqtt.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, b.Attach(server))
	slow := &slowHook{delay: 30 * time.Millisecond}
	require.NoError(t, server.AddHook(slow, nil))
	selection, err := hooks.NewSelectionHook(hooks.SelectionConfig{Engine: engine, Server: server})
	require.NoError(t, err)
	require.NoError(t, server.AddHook(selection, nil))
	require.NoError(t, server.AddHook(b.WakeHook(), nil))
	require.NoError(t, server.AddHook(new(auth.AllowHook), nil))
	tcp := listeners.NewTCP(listeners.Config{ID: "wake", Address: "127.0.0.1:0"})
	require.NoError(t, server.AddListener(tcp))
	require.NoError(t, server.Serve())
	t.Cleanup(func() { _ = server.Close() })

	// The member.
	conn, err := net.Dial("tcp", tcp.Address())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	received := make(chan *paho.Publish, 1)
	member := paho.NewClient(paho.ClientConfig{
		ClientID:                   "wake-member",
		Conn:                       conn,
		EnableManualAcknowledgment: true,
		SendAcksInterval:           time.Millisecond,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) { received <- pr.Packet; return true, nil },
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = member.Connect(ctx, &paho.Connect{ClientID: "wake-member", KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	_, err = member.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: share, QoS: 1}}})
	require.NoError(t, err)
	g := b.groups[0]
	inFlight := func() (online, inFlight int) {
		for _, m := range b.membersOf(g) {
			if m.Online {
				online++
				inFlight += m.InFlight
			}
		}
		return online, inFlight
	}
	require.Eventually(t, func() bool { o, _ := inFlight(); return o == 1 }, 5*time.Second, time.Millisecond, "member never online in the engine")

	for i, id := range []string{"wake-1", "wake-2", "wake-3"} {
		d := amqp.Delivery{
			Acknowledger: nopAcknowledger{}, DeliveryTag: uint64(i + 1), MessageId: id,
			Headers: amqp.Table{HeaderTopic: "wakejobs/x", HeaderQoS: int32(1)},
			Body:    []byte(id),
		}
		require.True(t, b.deliverWork(g, d, 1, fromWorkQueue), "no member took %s", id)
		var pk *paho.Publish
		select {
		case pk = <-received:
		case <-ctx.Done():
			t.Fatalf("%s never reached the member", id)
		}
		require.Equal(t, id, string(pk.Payload))
		_, n := inFlight()
		require.Equal(t, 1, n, "the member works on %s", id)
		require.False(t, hasRoom(b.membersOf(g)), "a member working on a message has no room")
		woken := b.wakeChan()
		completions := slow.seen.Load()
		require.NoError(t, member.Ack(pk))
		select {
		case <-woken:
		case <-ctx.Done():
			t.Fatalf("the PUBACK of %s woke no consume loop", id)
		}
		// What a consume loop reads the moment it wakes.
		_, n = inFlight()
		require.Zero(t, n, "woken before the selection engine counted the PUBACK of %s", id)
		require.True(t, hasRoom(b.membersOf(g)), "woken while the member still looks busy (%s)", id)
		require.Greater(t, slow.seen.Load(), completions, "the PUBACK went through the hooks in between")
		require.Zero(t, b.wqTrack.count(g.name), "%s settled", id)
	}

	// A member that leaves: woken once the engine knows it is offline.
	woken := b.wakeChan()
	require.NoError(t, conn.Close())
	select {
	case <-woken:
	case <-ctx.Done():
		t.Fatal("the disconnection woke no consume loop")
	}
	online, _ := inFlight()
	require.Zero(t, online, "woken before the selection engine counted the disconnection")
	b.wqTrack.mu.Lock()
	require.Empty(t, b.wqTrack.wakeDue, "every due wake was sent")
	b.wqTrack.mu.Unlock()
}
