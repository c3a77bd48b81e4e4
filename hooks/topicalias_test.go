package hooks_test

import (
	"bytes"
	"io"
	"log/slog"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/hooks"
)

// dialWithAliases connects an MQTT 5 raw client that accepts up to 10
// topic aliases from the server, with the given session expiry.
func dialWithAliases(t *testing.T, addr, clientID string, expiry uint32) *rawClient {
	t.Helper()
	c, _ := dialRawWith(t, addr, clientID, 5, false, expiry, func(pk *packets.Packet) { pk.Properties.TopicAliasMaximum = 10 })
	return c
}

// nextPublish returns the next PUBLISH the client receives.
func (c *rawClient) nextPublish() packets.Packet {
	c.t.Helper()
	return c.take(c.publishes)
}

// puback acknowledges a QoS 1 delivery.
func (c *rawClient) puback(id uint16) {
	c.t.Helper()
	ack := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, ProtocolVersion: c.version, PacketID: id}
	var buf bytes.Buffer
	require.NoError(c.t, ack.PubackEncode(&buf))
	c.write(buf.Bytes())
}

func newAliasServer(t *testing.T, withHook bool) (*mqtt.Server, string) {
	t.Helper()
	server := mqtt.New(&mqtt.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if withHook {
		require.NoError(t, server.AddHook(new(hooks.SessionTopicAliasHook), nil))
	}
	require.NoError(t, server.AddHook(new(auth.AllowHook), nil))
	tcp := listeners.NewTCP(listeners.Config{ID: "t", Address: "127.0.0.1:0"})
	require.NoError(t, server.AddListener(tcp))
	require.NoError(t, server.Serve())
	t.Cleanup(func() { _ = server.Close() })
	return server, tcp.Address()
}

// TestSessionTopicAliasHookKeepsResentMessagesNamed: a client with a
// persistent session acknowledges the first of two messages on one topic
// and resumes; the second is resent with its topic name. Without the hook
// Mochi resends it under the old connection's alias with no name.
func TestSessionTopicAliasHookKeepsResentMessagesNamed(t *testing.T) {
	for _, withHook := range []bool{true, false} {
		name := "with the hook"
		if !withHook {
			name = "Mochi without the hook resends an unknown alias"
		}
		t.Run(name, func(t *testing.T) {
			server, addr := newAliasServer(t, withHook)
			old := dialWithAliases(t, addr, "aliased", 3600)
			first, second := receiveTwoOnJobs(t, server, old)
			old.puback(first.PacketID)
			require.Eventually(t, func() bool {
				cl, _ := server.Clients.Get("aliased")
				return cl.State.Inflight.Len() == 1
			}, 3*time.Second, 5*time.Millisecond)

			resumed := dialWithAliases(t, addr, "aliased", 3600)
			resent := resumed.nextPublish()
			require.Equal(t, "two", string(resent.Payload))
			if withHook {
				require.Equal(t, "jobs", second.TopicName)
				require.Equal(t, "jobs", resent.TopicName, "resent with its topic name")
				require.Zero(t, resent.Properties.TopicAlias)
			} else {
				require.Empty(t, resent.TopicName, "Mochi resent the topic name: the hook may no longer be needed")
				require.NotZero(t, resent.Properties.TopicAlias)
			}
		})
	}
}

// receiveTwoOnJobs subscribes c to "jobs" at QoS 1, publishes "one" and
// "two" there from the server and returns the two PUBLISH packets c reads.
func receiveTwoOnJobs(t *testing.T, server *mqtt.Server, c *rawClient) (first, second packets.Packet) {
	t.Helper()
	c.subscribeAt("jobs", 1)
	require.NoError(t, server.Publish("jobs", []byte("one"), false, 1))
	require.NoError(t, server.Publish("jobs", []byte("two"), false, 1))
	return c.nextPublish(), c.nextPublish()
}

// TestSessionTopicAliasHookLeavesShortSessionsTheirAliases: a session that
// ends with its connection is never resent anything and keeps its aliases.
func TestSessionTopicAliasHookLeavesShortSessionsTheirAliases(t *testing.T) {
	server, addr := newAliasServer(t, true)
	first, second := receiveTwoOnJobs(t, server, dialWithAliases(t, addr, "short", 0))
	require.Equal(t, "jobs", first.TopicName)
	require.NotZero(t, first.Properties.TopicAlias)
	require.Empty(t, second.TopicName, "the alias set up by the first is used")
}
