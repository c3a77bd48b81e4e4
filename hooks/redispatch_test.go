package hooks_test

import (
	"io"
	"log/slog"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/hooks"
	"github.com/luffymq/luffymq/scoring"
)

// allowReading adds Mochi's allow-all auth hook, as the broker has one
// (without any, Mochi's ACL check refuses every delivery).
func (f *hookFixture) allowReading(t *testing.T) {
	t.Helper()
	require.NoError(t, f.server.AddHook(new(auth.AllowHook), nil))
}

// subscribeInMochi puts cl and its subscriptions into Mochi's own client
// list and topic index, as a real SUBSCRIBE would.
func (f *hookFixture) subscribeInMochi(cl *mqtt.Client, filters ...string) {
	f.server.Clients.Add(cl)
	for _, filter := range filters {
		f.server.Topics.Subscribe(cl.ID, packets.Subscription{Filter: filter, Qos: 1})
		cl.State.Subscriptions.Add(filter, packets.Subscription{Filter: filter, Qos: 1})
	}
}

// unacknowledged gives cl a QoS 1 delivery on topic that it has not
// acknowledged.
func unacknowledged(cl *mqtt.Client, id uint16, topic string) {
	cl.State.Inflight.Set(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		PacketID:    id,
		TopicName:   topic,
		Payload:     []byte("work"),
	})
}

// publishesIn returns the QoS≥1 publishes in cl's session.
func publishesIn(cl *mqtt.Client) []packets.Packet {
	var out []packets.Packet
	for _, pk := range cl.State.Inflight.GetAll(false) {
		if pk.FixedHeader.Type == packets.Publish {
			out = append(out, pk)
		}
	}
	return out
}

// TestRedispatchGoesToTheGroupOnly: a departed member's unacknowledged
// deliveries go to one other member of its group, marked as re-dispatched,
// and to nobody else: not to a plain subscriber of the topic, not to a
// second group, not back to the departed member.
func TestRedispatchGoesToTheGroupOnly(t *testing.T) {
	f := newHookFixture(t)
	f.allowReading(t)
	gone := f.connect(t, "gone", "$share/g/jobs")
	f.subscribeInMochi(gone, "$share/g/jobs")
	other := f.connect(t, "other", "$share/g/jobs")
	f.subscribeInMochi(other, "$share/g/jobs")
	plain := f.connect(t, "plain", "jobs")
	f.subscribeInMochi(plain, "jobs")
	elsewhere := f.connect(t, "elsewhere", "$share/h/jobs")
	f.subscribeInMochi(elsewhere, "$share/h/jobs")

	unacknowledged(gone, 1, "jobs")
	unacknowledged(gone, 2, "jobs")
	f.hook.OnDisconnect(gone, nil, true)

	require.Empty(t, publishesIn(gone), "taken out of the departed session")
	got := publishesIn(other)
	require.Len(t, got, 2)
	for _, pk := range got {
		require.Equal(t, hooks.RedispatchOrigin, pk.Origin)
		require.Equal(t, "jobs", pk.TopicName)
		require.Equal(t, []byte("work"), pk.Payload)
		require.True(t, f.hook.OnPacketEncode(other, pk).FixedHeader.Dup, "DUP is set on the wire")
	}
	require.Empty(t, publishesIn(plain))
	require.Empty(t, publishesIn(elsewhere))
	require.Equal(t, uint64(2), f.hook.Redispatch.Redispatched.Load())
}

// TestRedispatchParksUntilAMemberJoins: with no other member, the messages
// wait and go to the first member that joins the group.
func TestRedispatchParksUntilAMemberJoins(t *testing.T) {
	f := newHookFixture(t)
	f.allowReading(t)
	gone := f.connect(t, "gone", "$share/g/jobs")
	f.subscribeInMochi(gone, "$share/g/jobs")
	unacknowledged(gone, 1, "jobs")
	f.hook.OnDisconnect(gone, nil, true)
	f.server.Topics.Unsubscribe("$share/g/jobs", gone.ID)
	require.Equal(t, 1, f.hook.ParkedRedispatch())
	require.Equal(t, uint64(1), f.hook.Redispatch.Parked.Load())

	// A member of another group does not take them.
	f.subscribeInMochi(f.connect(t, "elsewhere", "$share/h/jobs"), "$share/h/jobs")
	require.Equal(t, 1, f.hook.ParkedRedispatch())

	next := f.server.NewClient(nil, "test", "next", false)
	next.Properties.ProtocolVersion = 5
	f.subscribeInMochi(next, "$share/g/jobs")
	f.hook.OnSubscribed(next, packets.Packet{Filters: []packets.Subscription{{Filter: "$share/g/jobs", Qos: 1}}}, []byte{1})
	require.Zero(t, f.hook.ParkedRedispatch())
	require.Len(t, publishesIn(next), 1)
}

// TestPlainDeliveriesAreNotRedispatched: what a member received through a
// plain subscription stays its own.
func TestPlainDeliveriesAreNotRedispatched(t *testing.T) {
	f := newHookFixture(t)
	f.allowReading(t)
	gone := f.connect(t, "gone", "$share/g/jobs")
	f.subscribeInMochi(gone, "$share/g/jobs", "news")
	other := f.connect(t, "other", "$share/g/jobs")
	f.subscribeInMochi(other, "$share/g/jobs")
	unacknowledged(gone, 1, "news")
	f.hook.OnDisconnect(gone, nil, true)
	require.Empty(t, publishesIn(other))
	require.Zero(t, f.hook.Redispatch.Redispatched.Load())
}

// TestRedispatchLeavesRequeuedGroupsToTheirOwner: deliveries of a group
// whose owner puts them back itself (the bridge's work queues) stay in the
// departed session: no copy to the other member, nothing parked, counted
// as left to the owner. Other groups are re-dispatched as usual.
func TestRedispatchLeavesRequeuedGroupsToTheirOwner(t *testing.T) {
	srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	eng, err := scoring.NewEngine(scoring.Config{Strategy: "adaptive"})
	require.NoError(t, err)
	h, err := hooks.NewSelectionHook(hooks.SelectionConfig{Engine: eng, Server: srv,
		RequeuedElsewhere: func(group string) bool { return group == "$share/wq/jobs" }})
	require.NoError(t, err)
	require.NoError(t, srv.AddHook(h, nil))
	f := &hookFixture{server: srv, engine: eng, hook: h}
	f.allowReading(t)

	gone := f.connect(t, "gone", "$share/wq/jobs", "$share/g/news")
	f.subscribeInMochi(gone, "$share/wq/jobs", "$share/g/news")
	other := f.connect(t, "other", "$share/wq/jobs", "$share/g/news")
	f.subscribeInMochi(other, "$share/wq/jobs", "$share/g/news")
	unacknowledged(gone, 1, "jobs")
	unacknowledged(gone, 2, "jobs")
	unacknowledged(gone, 3, "news")
	f.hook.OnDisconnect(gone, nil, true)

	got := publishesIn(other)
	require.Len(t, got, 1, "only the ordinary group's delivery is re-dispatched")
	require.Equal(t, "news", got[0].TopicName)
	require.Len(t, publishesIn(gone), 2, "the work-queue deliveries stay for their owner")
	require.Equal(t, uint64(2), h.Redispatch.LeftToOwner.Load())
	require.Equal(t, uint64(1), h.Redispatch.Redispatched.Load())
	require.Zero(t, h.Redispatch.Parked.Load())
	require.Zero(t, h.ParkedRedispatch())
}
