package hooks

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
)

// A connection that took a session over and failed before Mochi
// established it (its CONNACK could not be written) reaches neither
// OnSessionEstablished nor OnDisconnect. What the hook kept for it goes,
// lateAdoptWindow later, to the object that holds the session then, and
// the hook forgets the takeover; nothing stays in the hook for good.
func TestTakeoverHookSettlesTakeoversThatNeverEstablished(t *testing.T) {
	server := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	h := NewTakeoverHook(server)
	clock := time.Unix(1000, 0)
	h.now = func() time.Time { return clock }

	connection := func(id string) *mqtt.Client {
		local, remote := net.Pipe()
		go func() { _, _ = io.Copy(io.Discard, remote) }()
		t.Cleanup(func() { _ = local.Close(); _ = remote.Close() })
		cl := server.NewClient(local, "t", id, false)
		cl.Properties.ProtocolVersion = 5
		return cl
	}
	old := connection("worker")
	server.Clients.Add(old)
	failed := connection("worker") // resumes the session (clean start false)
	h.OnSessionEstablish(failed, packets.Packet{})
	server.Clients.Add(failed) // Mochi registers it before writing the CONNACK

	// A delivery Mochi started on the old object while it was taken over.
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, TopicName: "jobs", Payload: []byte("kept"), PacketID: 7, Created: 42}
	h.route(keptDelivery{from: old, pk: pk})
	require.Len(t, h.kept["worker"], 1)

	// Within the window another client's takeover changes nothing.
	other := connection("other")
	clock = clock.Add(lateAdoptWindow / 2)
	h.OnSessionEstablish(other, packets.Packet{})
	require.Len(t, h.kept["worker"], 1, "settled before the window ran out")
	_, held := failed.State.Inflight.Get(7)
	require.False(t, held)

	// After it, the failed connection's object holds the session: the
	// delivery goes there, and the hook holds nothing for the ID.
	clock = clock.Add(lateAdoptWindow)
	h.OnSessionEstablish(other, packets.Packet{})
	got, held := failed.State.Inflight.Get(7)
	require.True(t, held, "the kept delivery did not reach the object holding the session")
	require.Equal(t, []byte("kept"), got.Payload)
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Empty(t, h.kept, "deliveries still kept")
	require.NotContains(t, h.takingOver, "worker", "the failed takeover is still remembered")
	require.EqualValues(t, 1, h.Adopted())
	require.Zero(t, h.Missed())
}

// Kept deliveries whose session no object holds any more (it expired) are
// counted as missed when they are settled, not held.
func TestTakeoverHookCountsOrphansWithoutASessionAsMissed(t *testing.T) {
	server := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	h := NewTakeoverHook(server)
	clock := time.Unix(1000, 0)
	h.now = func() time.Time { return clock }
	old := server.NewClient(nil, "t", "gone", false)
	h.route(keptDelivery{from: old, pk: packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, TopicName: "jobs", PacketID: 1}})
	clock = clock.Add(2 * lateAdoptWindow)
	h.OnSessionEstablished(server.NewClient(nil, "t", "someone-else", false), packets.Packet{})
	require.EqualValues(t, 1, h.Missed())
	h.mu.Lock()
	defer h.mu.Unlock()
	require.Empty(t, h.kept)
}
