package hooks_test

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/hooks"
	"github.com/luffymq/luffymq/scoring"
)

// TestMochiNextImmediateDeadlockCondition reproduces, deterministically, the
// deadlock that makes the selection hook turn Mochi 2.7.9's send quota off.
// With the quota on, the client's reader calls Inflight.NextImmediate after
// every packet; it read-locks the in-flight store and, inside, GetAll
// read-locks it again. Go's RWMutex blocks new readers once a writer waits,
// so a publisher's Inflight.Set arriving between the two read locks waits
// for the first, and the second waits for the publisher: neither returns.
//
// The interleaving cannot be forced inside NextImmediate itself, so the test
// holds the outer read lock as NextImmediate does, queues a writer exactly
// as a publisher's Set does, detects the queued writer without timing
// (TryRLock fails only then), and shows that the inner GetAll cannot
// proceed. It then releases the outer lock, which NextImmediate could only
// do after GetAll returned, and everything completes.
func TestMochiNextImmediateDeadlockCondition(t *testing.T) {
	inflight := mqtt.NewInflights()
	inflight.Set(packets.Packet{PacketID: 1, Expiry: -1, FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}})

	inflight.RLock() // NextImmediate's own read lock

	setDone := make(chan struct{})
	go func() { // a publisher adding a delivery for the same client
		inflight.Set(packets.Packet{PacketID: 2, FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}})
		close(setDone)
	}()
	require.Eventually(t, func() bool {
		if inflight.TryRLock() {
			inflight.RUnlock()
			return false
		}
		return true // a writer is queued: no new reader can enter
	}, 5*time.Second, time.Millisecond, "the publisher's Set never queued")

	getDone := make(chan struct{})
	go func() { // NextImmediate's inner call
		inflight.GetAll(true)
		close(getDone)
	}()
	select {
	case <-getDone:
		t.Fatal("GetAll returned while a writer was queued behind the outer read lock")
	case <-setDone:
		t.Fatal("Set returned while the outer read lock was held")
	case <-time.After(50 * time.Millisecond):
		// Both are blocked, and by construction stay so: the cycle.
	}

	inflight.RUnlock()
	<-setDone
	<-getDone
	require.Equal(t, 2, inflight.Len())
}

// TestProvidesOnlyTheHandledEvents: the event table matches the handlers
// the hook implements, and answering costs no allocation (Mochi asks on
// every event it dispatches).
func TestProvidesOnlyTheHandledEvents(t *testing.T) {
	h := new(hooks.SelectionHook)
	for _, e := range []byte{mqtt.OnSessionEstablished, mqtt.OnClientExpired, mqtt.OnQosComplete, mqtt.OnSelectSubscribers} {
		require.True(t, h.Provides(e))
	}
	for _, e := range []byte{mqtt.OnConnectAuthenticate, mqtt.OnRetainMessage, mqtt.OnStopped} {
		require.False(t, h.Provides(e))
	}
	require.Zero(t, testing.AllocsPerRun(100, func() { h.Provides(mqtt.OnQosPublish) }))
}

// hookFixture is a selection hook on a Mochi server that is never started:
// the test calls the hook's event handlers as Mochi would.
type hookFixture struct {
	server *mqtt.Server
	engine *scoring.Engine
	hook   *hooks.SelectionHook
}

func newHookFixture(t testing.TB) *hookFixture {
	t.Helper()
	srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	eng, err := scoring.NewEngine(scoring.Config{Strategy: "adaptive"})
	require.NoError(t, err)
	h, err := hooks.NewSelectionHook(hooks.SelectionConfig{Engine: eng, Server: srv})
	require.NoError(t, err)
	require.NoError(t, srv.AddHook(h, nil))
	return &hookFixture{server: srv, engine: eng, hook: h}
}

// connect makes a client as Mochi would for a new connection and
// establishes its session, subscribed to the given filters.
func (f *hookFixture) connect(t testing.TB, id string, filters ...string) *mqtt.Client {
	t.Helper()
	server, client := net.Pipe()
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	cl := f.server.NewClient(server, "test", id, false)
	cl.Properties.ProtocolVersion = 5
	f.hook.OnSessionEstablished(cl, packets.Packet{})
	if len(filters) > 0 {
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}}
		codes := make([]byte, len(filters))
		for i, filter := range filters {
			pk.Filters = append(pk.Filters, packets.Subscription{Filter: filter, Qos: 1})
			codes[i] = 1
		}
		f.hook.OnSubscribed(cl, pk, codes)
	}
	return cl
}

func (f *hookFixture) inflight(t *testing.T, id string) int {
	t.Helper()
	for _, g := range f.engine.Snapshot() {
		for _, m := range g.Members {
			if m.ClientID == id {
				return m.InFlight
			}
		}
	}
	t.Fatalf("%s is in no group", id)
	return 0
}

func qosPacket(typ byte, id uint16) packets.Packet {
	return packets.Packet{FixedHeader: packets.FixedHeader{Type: typ, Qos: 1}, PacketID: id}
}

// TestQosFlowsTellDeliveriesFromTheClientsOwnPublishes: Mochi reports the
// broker's PUBACK to a client's own QoS 1 publish and the client's PUBACK
// of a delivery through the same events, with independent packet IDs; only
// the second is a completion.
func TestQosFlowsTellDeliveriesFromTheClientsOwnPublishes(t *testing.T) {
	f := newHookFixture(t)
	cl := f.connect(t, "worker", "$share/g/t")
	f.hook.OnQosPublish(cl, qosPacket(packets.Publish, 7), 0, 0) // delivery 7
	require.Equal(t, 1, f.inflight(t, "worker"))
	// The client publishes with its own ID 7: the broker acknowledges.
	f.hook.OnQosPublish(cl, qosPacket(packets.Puback, 7), 0, 0)
	f.hook.OnQosComplete(cl, qosPacket(packets.Puback, 7))
	require.Equal(t, 1, f.inflight(t, "worker"), "the broker's own ack is no completion")
	// Its QoS 2 publish completing is none either.
	f.hook.OnQosComplete(cl, qosPacket(packets.Pubrel, 3))
	require.Equal(t, 1, f.inflight(t, "worker"))
	// The client acknowledges delivery 7.
	f.hook.OnQosComplete(cl, qosPacket(packets.Puback, 7))
	require.Zero(t, f.inflight(t, "worker"))
	// A QoS 2 delivery refused with an error PUBREC ends too.
	f.hook.OnQosPublish(cl, qosPacket(packets.Publish, 8), 0, 0)
	f.hook.OnQosDropped(cl, qosPacket(packets.Pubrec, 8))
	require.Zero(t, f.inflight(t, "worker"))
}

// TestNonMembersCostTheEngineNothing: QoS flows of clients in no shared
// group never reach the engine.
func TestNonMembersCostTheEngineNothing(t *testing.T) {
	f := newHookFixture(t)
	cl := f.connect(t, "device", "plain/t")
	for id := uint16(1); id <= 100; id++ {
		f.hook.OnQosPublish(cl, qosPacket(packets.Publish, id), 0, 0)
		f.hook.OnQosComplete(cl, qosPacket(packets.Puback, id))
	}
	members, groups := f.engine.Counts()
	require.Zero(t, members)
	require.Zero(t, groups)
}

// TestSessionEndReleasesEverything: a session that expires while its client
// is away, or ends at disconnect, leaves no state in the hook or engine; a
// connection taken over by a newer one changes nothing.
func TestSessionEndReleasesEverything(t *testing.T) {
	f := newHookFixture(t)
	cl := f.connect(t, "w1", "$share/g/t")
	f.hook.OnDisconnect(cl, nil, false)
	members, _ := f.engine.Counts()
	require.Equal(t, 1, members, "a persistent session keeps its member offline")
	require.Zero(t, f.hook.ConnectionCount())
	f.hook.OnClientExpired(cl)
	members, groups := f.engine.Counts()
	require.Zero(t, members)
	require.Zero(t, groups)

	cl2 := f.connect(t, "w2", "$share/g/t")
	f.hook.OnDisconnect(cl2, nil, true)
	members, _ = f.engine.Counts()
	require.Zero(t, members)
	require.Zero(t, f.hook.ConnectionCount())
}

// TestOneClientsReportNeverChangesAnother: a report applies to the
// connection it arrived on, whatever it claims.
func TestOneClientsReportNeverChangesAnother(t *testing.T) {
	f := newHookFixture(t)
	a := f.connect(t, "a", "$share/g/t")
	f.connect(t, "b", "$share/g/t")
	payload := []byte(`{"msgsInQueue": 9, "processingTimePerMsg": 40, "clientId": "b"}`)
	_, err := f.hook.OnPublish(a, packets.Packet{TopicName: "$luffy/load", Payload: payload})
	require.ErrorIs(t, err, packets.CodeSuccessIgnore)
	for _, m := range f.engine.Snapshot()[0].Members {
		if m.ClientID == "a" {
			require.Equal(t, 9, m.ReportedPending)
		} else {
			require.Zero(t, m.ReportedPending)
			require.Zero(t, m.Reports)
		}
	}
}

// TestDeliveryOrderOnlyForSessionsThatResume: the order of deliveries is
// what a resumed session is resent in; a session that ends with its
// connection never is, and costs the order nothing.
func TestDeliveryOrderOnlyForSessionsThatResume(t *testing.T) {
	order := hooks.NewDeliveryOrder(1)
	srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	eng, err := scoring.NewEngine(scoring.Config{Strategy: "adaptive"})
	require.NoError(t, err)
	h, err := hooks.NewSelectionHook(hooks.SelectionConfig{Engine: eng, Server: srv, DeliveryOrder: order})
	require.NoError(t, err)
	require.NoError(t, srv.AddHook(h, nil))
	f := &hookFixture{server: srv, engine: eng, hook: h}
	clean := f.connect(t, "clean", "$share/g/t") // MQTT 5, session expiry 0
	kept := f.connect(t, "kept", "$share/g/t")
	kept.Properties.Props.SessionExpiryInterval = 3600
	v3 := f.connect(t, "v3", "$share/g/t")
	v3.Properties.ProtocolVersion, v3.Properties.Clean = 4, false
	for _, cl := range []*mqtt.Client{clean, kept, v3} {
		f.hook.OnQosPublish(cl, qosPacket(packets.Publish, 9), 0, 0)
	}
	_, ok := order.Seq("clean", 9)
	require.False(t, ok, "a session that ends with its connection is not recorded")
	_, ok = order.Seq("kept", 9)
	require.True(t, ok, "an MQTT 5 session with an expiry is recorded")
	_, ok = order.Seq("v3", 9)
	require.True(t, ok, "a 3.1.1 session without clean session is recorded")
	// The in-flight count does not depend on it.
	require.Equal(t, 1, f.inflight(t, "clean"))
}

// TestSelectedMemberJoinsTheRecipientsAsMochiMergesIt: the recipients the
// hook leaves (Mochi selecting and merging what is left after it) are
// exactly those of Mochi merging the hook's choice from SharedSelected:
// for one matched group, which the hook merges itself, with and without a
// plain subscription of the same client, and for two.
func TestSelectedMemberJoinsTheRecipientsAsMochiMergesIt(t *testing.T) {
	f := newHookFixture(t)
	f.connect(t, "m1", "$share/g/t", "$share/h/t")
	shared := func(filter string, id int) packets.Subscription {
		return packets.Subscription{Filter: filter, ShareName: []string{"g"}, Qos: 1, Identifier: id}
	}
	for _, tc := range []struct {
		name   string
		groups []string
		plain  bool
	}{
		{"one group", []string{"$share/g/t"}, false},
		{"one group and a plain subscription", []string{"$share/g/t"}, true},
		{"two groups and a plain subscription", []string{"$share/g/t", "$share/h/t"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			build := func() *mqtt.Subscribers {
				subs := &mqtt.Subscribers{
					Shared:              map[string]map[string]packets.Subscription{},
					SharedSelected:      map[string]packets.Subscription{},
					Subscriptions:       map[string]packets.Subscription{"other": {Filter: "t"}},
					InlineSubscriptions: map[int]mqtt.InlineSubscription{},
				}
				for i, g := range tc.groups {
					subs.Shared[g] = map[string]packets.Subscription{"m1": shared(g, 7+i)}
				}
				if tc.plain {
					subs.Subscriptions["m1"] = packets.Subscription{Filter: "t", Identifier: 3}
				}
				return subs
			}
			// Mochi merging the selection from SharedSelected, the groups
			// taken in the given order. Merge keeps the first group's
			// filter, and Mochi (like the hook) goes through the matched
			// groups in map order: with two, either order is Mochi's.
			mochi := func(groups []string) map[string]packets.Subscription {
				want := build()
				for _, g := range groups {
					sub := want.Shared[g]["m1"]
					if prev, ok := want.SharedSelected["m1"]; ok {
						sub = prev.Merge(sub)
					}
					want.SharedSelected["m1"] = sub
				}
				want.MergeSharedSelected()
				return want.Subscriptions
			}
			wants := []map[string]packets.Subscription{mochi(tc.groups)}
			if len(tc.groups) == 2 {
				wants = append(wants, mochi([]string{tc.groups[1], tc.groups[0]}))
			}

			got := f.hook.OnSelectSubscribers(build(), packets.Packet{TopicName: "t"})
			if len(got.SharedSelected) == 0 { // what Mochi does after the hooks
				got.SelectShared()
			}
			got.MergeSharedSelected()
			require.Contains(t, wants, got.Subscriptions)
		})
	}
}

// TestSelectedMemberWithoutIdentifierDeliversAsMochiWould: a member whose
// subscription has no subscription identifier joins the recipients as it
// is; Mochi's self-merge would give it the identifier map {filter: 0},
// which its publishToClient turns into an identifier list that encodes to
// nothing. The delivered PUBLISH is the same either way: no identifier.
func TestSelectedMemberWithoutIdentifierDeliversAsMochiWould(t *testing.T) {
	f := newHookFixture(t)
	f.connect(t, "m1", "$share/g/t")
	sub := packets.Subscription{Filter: "$share/g/t", ShareName: []string{"g"}, Qos: 1}
	subs := &mqtt.Subscribers{
		Shared:              map[string]map[string]packets.Subscription{"$share/g/t": {"m1": sub}},
		SharedSelected:      map[string]packets.Subscription{},
		Subscriptions:       map[string]packets.Subscription{},
		InlineSubscriptions: map[int]mqtt.InlineSubscription{},
	}
	got := f.hook.OnSelectSubscribers(subs, packets.Packet{TopicName: "t"})
	require.Empty(t, got.Shared)
	require.Equal(t, map[string]packets.Subscription{"m1": sub}, got.Subscriptions)

	mochi := sub.Merge(sub) // what MergeSharedSelected would have put there
	require.Equal(t, map[string]int{"$share/g/t": 0}, mochi.Identifiers)
	for name, s := range map[string]packets.Subscription{"hook": got.Subscriptions["m1"], "mochi": mochi} {
		// publishToClient: an identifier list from the map, encoded with
		// every identifier above 0.
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, TopicName: "t", PacketID: 1, ProtocolVersion: 5}
		for _, id := range s.Identifiers {
			pk.Properties.SubscriptionIdentifier = append(pk.Properties.SubscriptionIdentifier, id)
		}
		var buf bytes.Buffer
		require.NoError(t, pk.PublishEncode(&buf), name)
		plain := packets.Packet{FixedHeader: pk.FixedHeader, TopicName: "t", PacketID: 1, ProtocolVersion: 5}
		var want bytes.Buffer
		require.NoError(t, plain.PublishEncode(&want))
		require.Equal(t, want.Bytes(), buf.Bytes(), "%s: the PUBLISH carries no subscription identifier", name)
	}
}

// BenchmarkOnSelectSubscribers is the selection hook's part of a message
// to a shared group of 3: picking the member (the engine's selection
// included) and adding it to the recipients.
func BenchmarkOnSelectSubscribers(b *testing.B) {
	f := newHookFixture(b)
	const filter = "$share/g/t"
	members := map[string]packets.Subscription{}
	for _, id := range []string{"m1", "m2", "m3"} {
		f.connect(b, id, filter)
		members[id] = packets.Subscription{Filter: filter, ShareName: []string{"g"}, Qos: 0}
	}
	subs := &mqtt.Subscribers{
		Shared:              map[string]map[string]packets.Subscription{},
		SharedSelected:      map[string]packets.Subscription{},
		Subscriptions:       map[string]packets.Subscription{},
		InlineSubscriptions: map[int]mqtt.InlineSubscription{},
	}
	pk := packets.Packet{TopicName: "t", Origin: "pub", FixedHeader: packets.FixedHeader{Type: packets.Publish}}
	b.ReportAllocs()
	for b.Loop() {
		subs.Shared[filter] = members // as Mochi's index gives it
		clear(subs.Subscriptions)
		clear(subs.SharedSelected)
		f.hook.OnSelectSubscribers(subs, pk)
	}
}
