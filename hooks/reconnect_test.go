package hooks_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/hooks"
)

// teardownGate holds the first connection of client "worker" inside
// Mochi's teardown, between its taken-over check and the deletion of its
// client ID, until a second connection of "worker" is established or
// release passes: the window in which Mochi 2.7.9 deletes the newer
// connection from its registry.
type teardownGate struct {
	mqtt.HookBase
	mu          sync.Mutex
	first       *mqtt.Client
	inWindow    chan struct{}
	established chan struct{}
	gated       atomic.Bool
	release     time.Duration
}

func (g *teardownGate) ID() string { return "test-teardown-gate" }

func (g *teardownGate) Provides(b byte) bool {
	return b == mqtt.OnSessionEstablished || b == mqtt.OnUnsubscribed
}

func (g *teardownGate) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	if cl.ID != "worker" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.first == nil {
		g.first = cl
		return
	}
	close(g.established)
}

func (g *teardownGate) OnUnsubscribed(cl *mqtt.Client, _ packets.Packet) {
	g.mu.Lock()
	first := g.first
	g.mu.Unlock()
	// Only the old connection's own teardown is held: Mochi calls this
	// again for the old client from the new connection's goroutine.
	if cl != first || !g.gated.CompareAndSwap(false, true) {
		return
	}
	close(g.inWindow)
	select {
	case <-g.established:
	case <-time.After(g.release):
	}
}

func TestReconnectDuringTeardown(t *testing.T) {
	for _, tc := range []struct {
		name          string
		withHook      bool
		wantDelivered bool
	}{
		{"with the hook the new connection gets its messages", true, true},
		// Mochi 2.7.9's own behaviour, kept as evidence that the hook is
		// needed: if an upgrade of Mochi fixes the race, this case fails
		// and the hook can go.
		{"without the hook Mochi forgets the new connection", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// With the hook the new connection waits for the teardown, so
			// only release ends the window; without it the new connection's
			// session ends it, and release is a bound that a loaded machine
			// must not reach first (CI: the old teardown finished before the
			// new connection was established, and the race never ran).
			release := 500 * time.Millisecond
			if !tc.withHook {
				release = 10 * time.Second
			}
			gate := &teardownGate{inWindow: make(chan struct{}), established: make(chan struct{}), release: release}
			server := mqtt.New(&mqtt.Options{InlineClient: false, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			var reconnect *hooks.ReconnectOrderHook
			if tc.withHook {
				var err error
				reconnect, err = hooks.NewReconnectOrderHook(server, 0)
				require.NoError(t, err)
				require.NoError(t, server.AddHook(reconnect, nil))
			}
			require.NoError(t, server.AddHook(gate, nil))
			require.NoError(t, server.AddHook(new(auth.AllowHook), nil))
			tcp := listeners.NewTCP(listeners.Config{ID: "t", Address: "127.0.0.1:0"})
			require.NoError(t, server.AddListener(tcp))
			require.NoError(t, server.Serve())
			t.Cleanup(func() { _ = server.Close() })

			received := make(chan string, 4)
			dial := func(id string) (*paho.Client, net.Conn) {
				conn, err := net.DialTimeout("tcp", tcp.Address(), 2*time.Second)
				require.NoError(t, err)
				t.Cleanup(func() { _ = conn.Close() })
				cl := paho.NewClient(paho.ClientConfig{ClientID: id, Conn: conn,
					OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
						received <- id + ":" + string(pr.Packet.Payload)
						return true, nil
					}}})
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				ack, err := cl.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true})
				require.NoError(t, err)
				require.Equal(t, byte(0), ack.ReasonCode)
				_, err = cl.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "t", QoS: 1}}})
				require.NoError(t, err)
				return cl, conn
			}

			_, oldConn := dial("worker")
			require.NoError(t, oldConn.Close()) // dropped without DISCONNECT; session expiry 0
			select {
			case <-gate.inWindow:
			case <-time.After(3 * time.Second):
				t.Fatal("the old connection's teardown never reached the unsubscribe")
			}
			dial("worker") // reconnects while the old connection is being torn down

			pub, _ := dial("publisher")
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err := pub.Publish(ctx, &paho.Publish{Topic: "t", QoS: 1, Payload: []byte("after-reconnect")})
			require.NoError(t, err)

			got := map[string]bool{}
			deadline := time.After(time.Second)
		collect:
			for {
				select {
				case m := <-received:
					got[m] = true
				case <-deadline:
					break collect
				}
			}
			require.True(t, got["publisher:after-reconnect"], "the publisher's own subscription gets it")
			require.Equal(t, tc.wantDelivered, got["worker:after-reconnect"], "delivered to the reconnected worker")
			_, registered := server.Clients.Get("worker")
			require.Equal(t, tc.wantDelivered, registered, "the reconnected worker is in Mochi's client registry")
			if reconnect != nil {
				require.Equal(t, uint64(1), reconnect.Waited.Load(), "the new connection waited once")
				require.Equal(t, uint64(0), reconnect.TimedOut.Load())
			}
		})
	}
}

// A connection that has no predecessor never waits; one whose predecessor
// is still open takes it over without waiting for a teardown in progress
// (the takeover race itself is in reconnect_takeover_test.go).
func TestReconnectOrderHookDoesNotWaitWithoutATeardown(t *testing.T) {
	server := mqtt.New(&mqtt.Options{InlineClient: false, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	reconnect, err := hooks.NewReconnectOrderHook(server, 0)
	require.NoError(t, err)
	require.NoError(t, server.AddHook(reconnect, nil))
	require.NoError(t, server.AddHook(new(auth.AllowHook), nil))
	tcp := listeners.NewTCP(listeners.Config{ID: "t", Address: "127.0.0.1:0"})
	require.NoError(t, server.AddListener(tcp))
	require.NoError(t, server.Serve())
	t.Cleanup(func() { _ = server.Close() })

	var downs atomic.Int32
	connect := func() {
		conn, err := net.DialTimeout("tcp", tcp.Address(), 2*time.Second)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		cl := paho.NewClient(paho.ClientConfig{ClientID: "same", Conn: conn,
			OnServerDisconnect: func(*paho.Disconnect) { downs.Add(1) }})
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		start := time.Now()
		_, err = cl.Connect(ctx, &paho.Connect{ClientID: "same", KeepAlive: 30, CleanStart: true})
		require.NoError(t, err)
		require.Less(t, time.Since(start), time.Second)
	}
	connect()
	connect() // takes the first over
	require.Eventually(t, func() bool { return downs.Load() == 1 }, 3*time.Second, 10*time.Millisecond,
		"the first connection is told it was taken over")
	require.Equal(t, uint64(0), reconnect.Waited.Load())
	require.Equal(t, uint64(1), reconnect.TookOver.Load(), "the open predecessor was taken over by the hook")
	require.Equal(t, uint64(0), reconnect.TakeoverTimedOut.Load())

	_, err = hooks.NewReconnectOrderHook(nil, 0)
	require.ErrorContains(t, err, "the server and its client registry are required")
}
