package hooks_test

import (
	"io"
	"log/slog"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/hooks"
	"github.com/luffymq/luffymq/scoring"
)

// newLateBindingFixture is a hook fixture whose engine holds messages
// while every member is predicted busy for more than 5 ms.
func newLateBindingFixture(t *testing.T) (*hookFixture, *scoring.ManualClock) {
	t.Helper()
	clock := scoring.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	eng, err := scoring.NewEngine(scoring.Config{Strategy: "adaptive", Clock: clock, HoldLead: 5 * time.Millisecond})
	require.NoError(t, err)
	h, err := hooks.NewSelectionHook(hooks.SelectionConfig{Engine: eng, Server: srv})
	require.NoError(t, err)
	require.NoError(t, srv.AddHook(h, nil))
	require.NoError(t, srv.AddHook(new(auth.AllowHook), nil))
	t.Cleanup(func() { require.NoError(t, h.Stop()) })
	return &hookFixture{server: srv, engine: eng, hook: h}, clock
}

// publishJob publishes one QoS 1 message on jobs as a client would.
func publishJob(t *testing.T, f *hookFixture, publisher *mqtt.Client, payload string) {
	t.Helper()
	require.NoError(t, f.server.InjectPacket(publisher, packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		PacketID:    1,
		TopicName:   "jobs",
		Payload:     []byte(payload),
	}))
}

// reportIdle tells the engine that id finished its work: 20 ms a message.
func reportIdle(t *testing.T, f *hookFixture, id string, received uint64) {
	t.Helper()
	require.True(t, f.engine.Report(id, scoring.Load{ProcessingTime: 20 * time.Millisecond, Processed: 1,
		Workers: 1, HasReceived: true, Received: received}))
}

// TestLateBindingHoldsWhileEveryMemberIsBusy: with both members busy, a
// third message waits at the broker, in order behind nothing, and goes to
// the first member that reports it is free; a plain subscriber of the
// topic gets every message at once.
func TestLateBindingHoldsWhileEveryMemberIsBusy(t *testing.T) {
	f, _ := newLateBindingFixture(t)
	a := f.connect(t, "a", "$share/g/jobs")
	f.subscribeInMochi(a, "$share/g/jobs")
	b := f.connect(t, "b", "$share/g/jobs")
	f.subscribeInMochi(b, "$share/g/jobs")
	plain := f.connect(t, "plain", "jobs")
	f.subscribeInMochi(plain, "jobs")
	reportIdle(t, f, "a", 0)
	reportIdle(t, f, "b", 0)
	publisher := f.server.NewClient(nil, "local", "publisher", true)

	publishJob(t, f, publisher, "1")
	publishJob(t, f, publisher, "2")
	require.Len(t, publishesIn(a), 1)
	require.Len(t, publishesIn(b), 1)
	require.Equal(t, 0, f.hook.HeldMessages())

	publishJob(t, f, publisher, "3")
	publishJob(t, f, publisher, "4")
	require.Equal(t, 2, f.hook.HeldMessages(), "both members busy for 20 ms: held")
	require.Len(t, publishesIn(a), 1)
	require.Len(t, publishesIn(b), 1)
	require.Len(t, publishesIn(plain), 4, "plain subscribers are never held")

	// b says it is idle: the oldest held message goes to b, the next one
	// stays (b is busy again, a still is).
	reportIdle(t, f, "b", 1)
	require.Eventually(t, func() bool { return len(publishesIn(b)) == 2 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 1, f.hook.HeldMessages())
	got := publishesIn(b)
	require.ElementsMatch(t, []string{"2", "3"}, []string{string(got[0].Payload), string(got[1].Payload)})
	for _, pk := range got {
		require.False(t, f.hook.OnPacketEncode(b, pk).FixedHeader.Dup, "a first delivery, not a re-dispatch")
	}

	reportIdle(t, f, "a", 1)
	require.Eventually(t, func() bool { return len(publishesIn(a)) == 2 }, 5*time.Second, time.Millisecond)
	require.Equal(t, 0, f.hook.HeldMessages())
	require.Equal(t, uint64(2), f.hook.LateBinding.Held.Load())
	require.Equal(t, uint64(2), f.hook.LateBinding.Released.Load())
	require.Equal(t, int64(4), f.server.Info.MessagesReceived, "a held message is received once")
}

// TestLateBindingReleasesOnTime: without any news, a held message goes
// over once the engine's clock reaches the lead before a member's
// predicted start.
func TestLateBindingReleasesOnTime(t *testing.T) {
	f, clock := newLateBindingFixture(t)
	a := f.connect(t, "a", "$share/g/jobs")
	f.subscribeInMochi(a, "$share/g/jobs")
	reportIdle(t, f, "a", 0)
	publisher := f.server.NewClient(nil, "local", "publisher", true)
	publishJob(t, f, publisher, "1")
	publishJob(t, f, publisher, "2")
	require.Equal(t, 1, f.hook.HeldMessages())
	clock.Advance(16 * time.Millisecond)
	require.Eventually(t, func() bool { return len(publishesIn(a)) == 2 }, 5*time.Second, time.Millisecond,
		"the binder looks again when the engine said to (15 ms)")
}

// TestLateBindingParksWhenTheGroupEmpties: held messages of a group whose
// last member leaves wait for the next member, as re-dispatched ones do.
func TestLateBindingParksWhenTheGroupEmpties(t *testing.T) {
	f, _ := newLateBindingFixture(t)
	a := f.connect(t, "a", "$share/g/jobs")
	f.subscribeInMochi(a, "$share/g/jobs")
	reportIdle(t, f, "a", 0)
	publisher := f.server.NewClient(nil, "local", "publisher", true)
	publishJob(t, f, publisher, "1")
	publishJob(t, f, publisher, "2")
	require.Equal(t, 1, f.hook.HeldMessages())

	f.server.Topics.Unsubscribe("$share/g/jobs", "a")
	f.hook.OnUnsubscribed(a, packets.Packet{Filters: packets.Subscriptions{{Filter: "$share/g/jobs"}}})
	f.hook.OnDisconnect(a, nil, true)
	// As Mochi does: the topic index first, then OnSubscribed.
	newcomer := f.connect(t, "newcomer")
	f.subscribeInMochi(newcomer, "$share/g/jobs")
	f.hook.OnSubscribed(newcomer, packets.Packet{Filters: packets.Subscriptions{{Filter: "$share/g/jobs", Qos: 1}}}, []byte{1})
	require.Eventually(t, func() bool { return len(publishesIn(newcomer)) == 1 }, 5*time.Second, time.Millisecond,
		"held %d, released %d, parked %d, redispatched %d", f.hook.HeldMessages(), f.hook.LateBinding.Released.Load(),
		f.hook.ParkedRedispatch(), f.hook.Redispatch.Redispatched.Load())
	require.Equal(t, "2", string(publishesIn(newcomer)[0].Payload))
}
