package hooks

import (
	"io"
	"log/slog"
	"net"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/clientsdk/report"
)

// recordingACL is the operator's access control in these tests: it
// answers allow and counts the checks it was asked.
type recordingACL struct {
	allow bool
	asked int
}

func (a *recordingACL) OnACLCheck(*mqtt.Client, string, bool) bool {
	a.asked++
	return a.allow
}

// newTopicRulesFixture returns a hook over an access control that allows
// everything, and a client of a never-started Mochi server holding the
// given subscriptions.
func newTopicRulesFixture(t testing.TB, filters ...string) (*TopicRulesHook, *recordingACL, *mqtt.Client) {
	t.Helper()
	acl := &recordingACL{allow: true}
	h, err := NewTopicRulesHook(TopicRulesConfig{Access: acl})
	require.NoError(t, err)
	srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	server, client := net.Pipe()
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	cl := srv.NewClient(server, "test", "c1", false)
	cl.Properties.ProtocolVersion = 5
	for _, f := range filters {
		cl.State.Subscriptions.Add(f, packets.Subscription{Filter: f})
	}
	return h, acl, cl
}

// subscribePacket is a SUBSCRIBE for filters, and the reason codes of a
// SUBACK granting them all at QoS 0.
func subscribePacket(filters ...string) (packets.Packet, []byte) {
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}}
	for _, f := range filters {
		pk.Filters = append(pk.Filters, packets.Subscription{Filter: f})
	}
	return pk, make([]byte, len(filters))
}

func TestNewTopicRulesHookNeedsAccessControl(t *testing.T) {
	_, err := NewTopicRulesHook(TopicRulesConfig{})
	require.Error(t, err)
}

// TestTopicRulesWrites: a client may publish to report.LoadTopic if the
// operator allows it, never to another reserved topic; every other topic
// is the operator's decision.
func TestTopicRulesWrites(t *testing.T) {
	for _, c := range []struct {
		topic    string
		reserved bool
	}{
		{report.LoadTopic, false},
		{report.LoadTopic + "/w1", true},
		{report.ReservedTopicPrefix + "other", true},
		{"$luffy", true},
		{"$luffy/", true},
		{"$LUFFY/x", false}, // topic names are case-sensitive
		{"$luffyx/a", false},
		{"$SYS/x", false},
		{"a/$luffy/load", false},
		{"jobs", false},
	} {
		for _, allow := range []bool{true, false} {
			h, acl, cl := newTopicRulesFixture(t)
			acl.allow = allow
			got := h.OnACLCheck(cl, c.topic, true)
			if c.reserved {
				require.False(t, got, c.topic)
				require.Zero(t, acl.asked, "%s: refused without asking the operator", c.topic)
				require.Equal(t, uint64(1), h.Counters.PublishesRefused.Load())
			} else {
				require.Equal(t, allow, got, "%s: the operator decides", c.topic)
				require.Equal(t, 1, acl.asked)
				require.Zero(t, h.Counters.PublishesRefused.Load())
			}
		}
	}
}

// TestTopicRulesReads: no filter that can match a reserved topic is
// granted, shared or not; filters starting with a wildcard cannot match
// one (MQTT-4.7.2-1) and are the operator's decision.
func TestTopicRulesReads(t *testing.T) {
	refused := []string{"$luffy/#", "$luffy/+", "$luffy", "$luffy/load", "$luffy/load/#", "$luffy/+/x",
		"$share/g/$luffy/#", "$SHARE/g/$luffy/load", "$share/g/$luffy"}
	delegated := []string{"#", "+", "+/load", "+/+", "$share/g/#", "$share/g/+/load", "$SYS/#", "$luffyx/#", "a/$luffy/#", "$LUFFY/#"}
	for _, f := range refused {
		h, acl, cl := newTopicRulesFixture(t)
		require.False(t, h.OnACLCheck(cl, f, false), f)
		require.Zero(t, acl.asked, f)
		require.Equal(t, uint64(1), h.Counters.ReadsRefused.Load(), f)
	}
	for _, f := range delegated {
		h, acl, cl := newTopicRulesFixture(t)
		require.True(t, h.OnACLCheck(cl, f, false), f)
		acl.allow = false
		require.False(t, h.OnACLCheck(cl, f, false), f)
		require.Equal(t, 2, acl.asked, f)
		require.Zero(t, h.Counters.ReadsRefused.Load(), f)
	}
}

// TestTopicRulesWithholdRetainedDollarTopics: while Mochi answers a
// SUBSCRIBE that granted a filter starting with a wildcard, a message on a
// '$' topic reaches the client only through another subscription that
// names its first level; before and after, deliveries are the operator's
// decision (Mochi matched them).
func TestTopicRulesWithholdRetainedDollarTopics(t *testing.T) {
	h, acl, cl := newTopicRulesFixture(t, "#")
	require.True(t, h.OnACLCheck(cl, "$app/x", false), "a live delivery Mochi matched")

	pk, codes := subscribePacket("#")
	h.OnSubscribed(cl, pk, codes)
	require.False(t, h.OnACLCheck(cl, "$app/x", false), "retained $ message for #")
	require.Equal(t, uint64(1), h.Counters.RetainedWithheld.Load())
	require.True(t, h.OnACLCheck(cl, "app/x", false), "an ordinary topic")
	require.False(t, h.OnACLCheck(cl, "$luffy/x", false), "reserved: refused as such")
	require.Equal(t, uint64(1), h.Counters.ReadsRefused.Load())

	for _, f := range []string{"$app/+", "$share/g/$app/#", "$app/x", "+/x", "$app"} {
		cl.State.Subscriptions.Add(f, packets.Subscription{Filter: f})
	}
	require.True(t, h.OnACLCheck(cl, "$app/x", false), "the client holds $app/+")
	require.True(t, h.OnACLCheck(cl, "$app/y/z", false), "the client holds $share/g/$app/#")
	require.False(t, h.OnACLCheck(cl, "$other/x", false), "+/x starts with a wildcard")
	require.False(t, h.OnACLCheck(cl, "$ap", false))

	asked := acl.asked
	acl.allow = false
	require.False(t, h.OnACLCheck(cl, "$app/x", false), "the operator still decides")
	require.Equal(t, asked+1, acl.asked)
	acl.allow = true

	h.OnPacketProcessed(cl, pk, nil)
	require.True(t, h.OnACLCheck(cl, "$other/x", false), "the SUBSCRIBE is answered")

	// A SUBSCRIBE without a granted filter starting with a wildcard sends
	// no retained '$' message through one: nothing is withheld.
	for _, c := range []struct {
		filters []string
		codes   []byte
	}{
		{[]string{"$app/#", "a/#"}, []byte{0, 1}},
		{[]string{"#"}, []byte{0x87}},
		{[]string{"+/x"}, nil},
	} {
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}}
		for _, f := range c.filters {
			pk.Filters = append(pk.Filters, packets.Subscription{Filter: f})
		}
		h.OnSubscribed(cl, pk, c.codes)
		require.True(t, h.OnACLCheck(cl, "$other/x", false), "%v %v", c.filters, c.codes)
		h.OnPacketProcessed(cl, pk, nil)
	}

	// A connection that ends while answering is forgotten.
	h.OnSubscribed(cl, pk, codes)
	h.OnPacketProcessed(cl, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}}, nil)
	require.False(t, h.OnACLCheck(cl, "$other/x", false), "only the SUBSCRIBE's end clears the mark")
	h.OnDisconnect(cl, nil, true)
	require.True(t, h.OnACLCheck(cl, "$other/x", false))

	// The inline client's subscriptions get no retained messages.
	inline := mqtt.New(&mqtt.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	il := inline.NewClient(nil, "local", "inline", true)
	h.OnSubscribed(il, pk, codes)
	require.False(t, h.isAnsweringSubscribe(il))
}

// TestTopicRulesKeepDollarTopicsFromWildcardSharedGroups: a message on a
// '$' topic is kept from every shared group whose filter starts with a
// wildcard; other messages and groups are untouched.
func TestTopicRulesKeepDollarTopicsFromWildcardSharedGroups(t *testing.T) {
	h, _, _ := newTopicRulesFixture(t)
	groups := func() *mqtt.Subscribers {
		subs := &mqtt.Subscribers{Shared: map[string]map[string]packets.Subscription{}, SharedSelected: map[string]packets.Subscription{}}
		for _, f := range []string{"$share/a/#", "$share/b/+/x", "$SHARE/c/+", "$share/d/$app/#", "$share/e/$app/x"} {
			subs.Shared[f] = map[string]packets.Subscription{"m": {Filter: f}}
		}
		return subs
	}
	subs := h.OnSelectSubscribers(groups(), packets.Packet{TopicName: "$app/x"})
	require.Len(t, subs.Shared, 2)
	require.Contains(t, subs.Shared, "$share/d/$app/#")
	require.Contains(t, subs.Shared, "$share/e/$app/x")
	require.Equal(t, uint64(3), h.Counters.SharedWithheld.Load())

	subs = h.OnSelectSubscribers(groups(), packets.Packet{TopicName: "app/x"})
	require.Len(t, subs.Shared, 5)
	require.Equal(t, uint64(3), h.Counters.SharedWithheld.Load())
}

// TestTopicRulesOnPublish: publishes no ACL check saw (the inline
// client's) never put a reserved topic in the retained store or reach
// subscribers, except the load report, which loses its retain flag.
func TestTopicRulesOnPublish(t *testing.T) {
	h, _, cl := newTopicRulesFixture(t)
	pub := func(topic string) packets.Packet {
		return packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Retain: true}, TopicName: topic}
	}

	pk, err := h.OnPublish(cl, pub(report.LoadTopic))
	require.NoError(t, err)
	require.False(t, pk.FixedHeader.Retain)

	_, err = h.OnPublish(cl, pub(report.ReservedTopicPrefix+"x"))
	require.ErrorIs(t, err, packets.ErrRejectPacket)
	require.Equal(t, uint64(1), h.Counters.PublishesRefused.Load())

	for _, topic := range []string{"$app/x", "plain", "$LUFFY/x"} {
		pk, err = h.OnPublish(cl, pub(topic))
		require.NoError(t, err)
		require.True(t, pk.FixedHeader.Retain, topic)
	}
}

// TestTopicRulesOnWill: a will on a reserved topic is not retained.
func TestTopicRulesOnWill(t *testing.T) {
	h, _, cl := newTopicRulesFixture(t)
	w, err := h.OnWill(cl, mqtt.Will{TopicName: report.ReservedTopicPrefix + "x", Retain: true})
	require.NoError(t, err)
	require.False(t, w.Retain)
	w, err = h.OnWill(cl, mqtt.Will{TopicName: "dev/1/status", Retain: true})
	require.NoError(t, err)
	require.True(t, w.Retain)
}

// TestWithoutACLCheck: Mochi initialises and calls the wrapped auth hook
// as before, but never asks it for ACL decisions; the topic rules ask it,
// so a ledger rule still refuses.
func TestWithoutACLCheck(t *testing.T) {
	ledger := new(auth.Hook)
	wrapped := WithoutACLCheck(ledger)
	require.Equal(t, ledger.ID(), wrapped.ID())
	require.False(t, wrapped.Provides(mqtt.OnACLCheck))
	require.True(t, wrapped.Provides(mqtt.OnConnectAuthenticate))
	require.False(t, wrapped.Provides(mqtt.OnPublish), "nothing the hook does not provide")

	h, err := NewTopicRulesHook(TopicRulesConfig{Access: ledger})
	require.NoError(t, err)
	srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, srv.AddHook(h, nil))
	require.NoError(t, srv.AddHook(wrapped, &auth.Options{Data: []byte(`
auth:
  - username: w
    password: p
    allow: true
acl:
  - username: w
    filters:
      "$luffy/load": 1
      "secret/#": 0
  - username: readonly
    filters:
      "#": 1
`)}))
	server, client := net.Pipe()
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	cl := srv.NewClient(server, "test", "c1", false)
	cl.Properties.Username = []byte("w")
	connect := packets.Packet{Connect: packets.ConnectParams{Username: []byte("w"), Password: []byte("p")}}
	require.True(t, wrapped.OnConnectAuthenticate(cl, connect), "Init reached the ledger")
	require.False(t, h.OnACLCheck(cl, report.LoadTopic, true), "the ledger restricts the load topic")
	require.False(t, h.OnACLCheck(cl, "secret/x", true))
	require.True(t, h.OnACLCheck(cl, "open/x", true))

	// The ledger's "#" matches '$' topics: a read-only "#" rule withholds
	// the load topic too.
	cl.Properties.Username = []byte("readonly")
	require.False(t, h.OnACLCheck(cl, report.LoadTopic, true))
	require.True(t, h.OnACLCheck(cl, "$app/x", false))
}

func TestFilterMatches(t *testing.T) {
	for _, c := range []struct {
		filter, topic string
		want          bool
	}{
		{"a/b", "a/b", true},
		{"a/b", "a/c", false},
		{"a/b", "a", false},
		{"a", "a/b", false},
		{"a/+", "a/b", true},
		{"a/+", "a/", true},
		{"a/+", "a", false},
		{"a/+", "a/b/c", false},
		{"a/#", "a", true},
		{"a/#", "a/b/c", true},
		{"a/#", "ab", false},
		{"+/+", "a/b", true},
		{"+", "a/b", false},
		{"#", "a/b", true},
		{"$app/+", "$app/x", true},
		{"", "", true},
		{"a//b", "a//b", true},
		{"a/+/b", "a//b", true},
	} {
		require.Equal(t, c.want, filterMatches(c.filter, c.topic), "%q %q", c.filter, c.topic)
	}
}

// TestTopicRulesOrdinaryTopicsCostNoAllocation: what the hook does for
// every publish and delivery on an ordinary topic allocates nothing.
func TestTopicRulesOrdinaryTopicsCostNoAllocation(t *testing.T) {
	h, _, cl := newTopicRulesFixture(t, "sensors/#")
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, TopicName: "sensors/1/temp"}
	subs := &mqtt.Subscribers{Shared: map[string]map[string]packets.Subscription{
		"$share/g/#": {"m": {Filter: "$share/g/#"}},
	}}
	require.Zero(t, testing.AllocsPerRun(1000, func() { publishPath(h, cl, pk, subs) }))
	require.Len(t, subs.Shared, 1)
}

// publishPath calls what Mochi calls on the hook for one publish with one
// delivery: the write check, OnPublish, OnSelectSubscribers, the read
// check, and Provides before each event.
func publishPath(h *TopicRulesHook, cl *mqtt.Client, pk packets.Packet, subs *mqtt.Subscribers) {
	for _, e := range []byte{mqtt.OnACLCheck, mqtt.OnPublish, mqtt.OnSelectSubscribers, mqtt.OnPublished} {
		_ = h.Provides(e)
	}
	_ = h.OnACLCheck(cl, pk.TopicName, true)
	pk, _ = h.OnPublish(cl, pk)
	_ = h.OnSelectSubscribers(subs, pk)
	_ = h.OnACLCheck(cl, pk.TopicName, false)
}

// BenchmarkTopicRulesPerPublish measures the hook's cost for one publish
// with one delivery (publishPath), on an ordinary topic and on a '$'
// topic.
func BenchmarkTopicRulesPerPublish(b *testing.B) {
	for _, topic := range []string{"sensors/1/temp", "$app/status"} {
		b.Run(topic, func(b *testing.B) {
			h, _, cl := newTopicRulesFixture(b, "sensors/#", "$app/#")
			pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish}, TopicName: topic}
			subs := &mqtt.Subscribers{Shared: map[string]map[string]packets.Subscription{
				"$share/g/$app/#": {"m": {Filter: "$share/g/$app/#"}},
			}}
			b.ReportAllocs()
			for b.Loop() {
				publishPath(h, cl, pk, subs)
			}
		})
	}
}
