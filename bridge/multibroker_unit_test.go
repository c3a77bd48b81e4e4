package bridge

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

func TestMultiBrokerID(t *testing.T) {
	require.Equal(t, "my-host_1-example-1883", brokerIDFor("my.host_1.example", "0.0.0.0:1883"))
	require.Equal(t, "h-8883", brokerIDFor("h", "[::1]:8883"))
	for _, listen := range []string{"", "127.0.0.1:0", ":x", "nonsense"} {
		id := brokerIDFor("h", listen)
		require.Regexp(t, `^h-[0-9a-f]{8}$`, id, "listen %q", listen)
		require.NotEqual(t, id, brokerIDFor("h", listen), "random suffixes differ")
	}
	long := brokerIDFor(strings.Repeat("é", 100), "127.0.0.1:65535")
	require.Len(t, long, 64)
	require.True(t, validName(long), long)
	require.True(t, strings.HasSuffix(long, "-65535"))
	require.True(t, validName(DefaultBrokerID("")))

	require.Equal(t, "luffymq.import.berlin.b-1", ImportQueueName("berlin", "b-1"))

	cfg := Config{Site: "berlin", AMQPURL: "amqp://127.0.0.1/"}
	full, err := cfg.withDefaults()
	require.NoError(t, err)
	require.True(t, validName(full.BrokerID), "a derived ID: %q", full.BrokerID)
	for _, bad := range []string{"a.b", "a b", strings.Repeat("x", 65), "ü"} {
		cfg.BrokerID = bad
		err := cfg.Validate()
		require.ErrorIs(t, err, ErrInvalidConfig)
		require.ErrorContains(t, err, fmt.Sprintf("broker-id %q", bad))
	}
}

// TestMultiBrokerOriginRule: a broker skips what it published itself and
// what came back to its site through federation, and injects what the
// other brokers of its site and other sites published.
func TestMultiBrokerOriginRule(t *testing.T) {
	b, err := New(Config{Site: "berlin", BrokerID: "a", AMQPURL: "amqp://127.0.0.1/"})
	require.NoError(t, err)
	require.Equal(t, "luffymq.import.berlin.a", b.ImportQueue())
	fed := []interface{}{amqp.Table{"uri": "amqp://tunis", "exchange": "pubsub.t"}}
	tests := []struct {
		name    string
		headers amqp.Table
		skip    bool
	}{
		{"published by this broker", amqp.Table{HeaderOrigin: "berlin", HeaderBroker: "a"}, true},
		{"published by another broker of the site", amqp.Table{HeaderOrigin: "berlin", HeaderBroker: "b"}, false},
		{"published at the site without a broker ID", amqp.Table{HeaderOrigin: "berlin"}, false},
		{"came back to the site through federation", amqp.Table{HeaderOrigin: "berlin", HeaderBroker: "b", headerReceivedFrom: fed}, true},
		{"another site's broker with the same ID", amqp.Table{HeaderOrigin: "tunis", HeaderBroker: "a", headerReceivedFrom: fed}, false},
		{"another site", amqp.Table{HeaderOrigin: "tunis", HeaderBroker: "t"}, false},
		{"no origin", amqp.Table{}, false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.skip, b.localAlready(tt.headers), tt.name)
	}
	// What this broker publishes carries its site and ID, and it would
	// skip it.
	pub := b.publishing(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, TopicName: "t/x"})
	require.Equal(t, "berlin", pub.Headers[HeaderOrigin])
	require.Equal(t, "a", pub.Headers[HeaderBroker])
	require.True(t, b.localAlready(pub.Headers))
}

// TestMultiBrokerSiteShares: the retune owner sums its own capacity and the
// other brokers' shares still valid, ignoring its own ID.
func TestMultiBrokerSiteShares(t *testing.T) {
	c, err := WorkQueueConfig{MaxLengthPerMember: 100, TTLPerMember: time.Second}.withDefaults("amqp://127.0.0.1/", false)
	require.NoError(t, err)
	now := time.Unix(1000, 0)
	s := siteShares{self: "a"}
	own := c.capacity(nil) // no member here
	site, unacked := s.sum(c, own, 0, now)
	require.Equal(t, Capacity{MaxLength: 1, TTL: time.Millisecond}, site, "no capacity at all: eq. 2.12's floor")
	require.Zero(t, unacked)

	own = Capacity{Online: 1, Available: 0.5}
	require.False(t, s.add(capacityShare{Broker: "a", Online: 9, Available: 9, ValidMs: 300}, now), "own ID")
	require.True(t, s.add(capacityShare{Broker: "b", Online: 2, Available: 1.5, Unacked: 3, ValidMs: 300}, now))
	require.True(t, s.add(capacityShare{Broker: "c", Online: 1, Available: 1, Unacked: 1, ValidMs: 100}, now))
	site, unacked = s.sum(c, own, 2, now.Add(50*time.Millisecond))
	require.Equal(t, 4, site.Online)
	require.InDelta(t, 3.0, site.Available, 1e-9)
	require.Equal(t, 300, site.MaxLength, "eq. 2.12 on the site's sum")
	require.Equal(t, 3*time.Second, site.TTL)
	require.Equal(t, 6, unacked)

	// c's share expired; b sent a newer one that replaces its first.
	require.True(t, s.add(capacityShare{Broker: "b", Online: 1, Available: 1, ValidMs: 300}, now.Add(100*time.Millisecond)))
	site, unacked = s.sum(c, own, 2, now.Add(200*time.Millisecond))
	require.Equal(t, 2, site.Online)
	require.InDelta(t, 1.5, site.Available, 1e-9)
	require.Equal(t, 150, site.MaxLength)
	require.Equal(t, 2, unacked)
	require.NotContains(t, s.peers, "c", "expired shares are forgotten")

	// Every share expired: the owner's own capacity alone.
	site, _ = s.sum(c, own, 0, now.Add(time.Hour))
	require.Equal(t, Capacity{Online: 1, Available: 0.5, MaxLength: 50, TTL: 500 * time.Millisecond}, site)
}

// TestMultiBrokerInUseError: a second broker with the same ID is told so,
// not that its credentials are wrong.
func TestMultiBrokerInUseError(t *testing.T) {
	b, err := New(Config{Site: "berlin", BrokerID: "a", AMQPURL: "amqp://127.0.0.1/"})
	require.NoError(t, err)
	refused := &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED - queue in exclusive use"}
	err = b.queueInUse(fmt.Errorf("consuming: %w", refused), amqp.AccessRefused)
	var inUse *ImportQueueInUseError
	require.True(t, errors.As(err, &inUse))
	msg := describe(err, "amqp://guest:secret@127.0.0.1/")
	require.Contains(t, msg, "luffymq.import.berlin.a is in use")
	require.Contains(t, msg, "--broker-id")
	require.NotContains(t, msg, "credentials")
	// Other errors pass unchanged.
	other := fmt.Errorf("x: %w", &amqp.Error{Code: amqp.NotFound})
	require.Same(t, other, b.queueInUse(other, amqp.AccessRefused))
}
