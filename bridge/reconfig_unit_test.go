package bridge

import (
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// TestReconfigAssignSlots: an upstream that stays keeps its link's name,
// a new one takes the lowest free slot (never one an old link still uses,
// since both run together for a while), a URI listed twice gets two links.
func TestReconfigAssignSlots(t *testing.T) {
	current := map[string][]exchangeLink{
		"pubsub.a": {
			{name: "luffymq-x:pubsub.a:0", exchange: "pubsub.a", slot: "0", uri: "amqp://b"},
			{name: "luffymq-x:pubsub.a:2", exchange: "pubsub.a", slot: "2", uri: "amqp://c"},
		},
	}
	want := []ExchangeFederation{
		{Exchange: "pubsub.a", Upstreams: []Upstream{{Site: "0", URI: "amqp://d"}, {Site: "1", URI: "amqp://c"}, {Site: "2", URI: "amqp://e"}}},
		{Exchange: "pubsub.new", Upstreams: []Upstream{{Site: "0", URI: "amqp://b"}, {Site: "1", URI: "amqp://b"}}},
	}
	got, err := assignSlots(current, want)
	require.NoError(t, err)
	require.Equal(t, []Upstream{{Site: "1", URI: "amqp://d"}, {Site: "2", URI: "amqp://c"}, {Site: "3", URI: "amqp://e"}}, got[0].Upstreams)
	require.Equal(t, []Upstream{{Site: "0", URI: "amqp://b"}, {Site: "1", URI: "amqp://b"}}, got[1].Upstreams)
	require.Equal(t, "0", want[0].Upstreams[0].Site, "the input is not modified")

	// The upstream exchange is part of a link's identity.
	got, err = assignSlots(current, []ExchangeFederation{{Exchange: "pubsub.a", UpstreamExchange: "other", Upstreams: []Upstream{{URI: "amqp://b"}}}})
	require.NoError(t, err)
	require.Equal(t, "1", got[0].Upstreams[0].Site)

	// Old and new links together must fit the slots.
	var many []Upstream
	for i := 0; i < ExchangeUpstreamSlots-1; i++ {
		many = append(many, Upstream{URI: "amqp://n" + strconv.Itoa(i)})
	}
	_, err = assignSlots(current, []ExchangeFederation{{Exchange: "pubsub.a", Upstreams: many}})
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// TestReconfigWithLinks: while new links start, old ones stay, also for
// an exchange the configuration no longer lists.
func TestReconfigWithLinks(t *testing.T) {
	want := []ExchangeFederation{{Exchange: "pubsub.a", Upstreams: []Upstream{{Site: "1", URI: "amqp://c"}}}}
	removed := []exchangeLink{
		{name: "luffymq-x:pubsub.a:0", exchange: "pubsub.a", slot: "0", uri: "amqp://b"},
		{name: "luffymq-x:wq.g.in:3", exchange: "wq.g.in", slot: "3", uri: "amqp://d", upstreamExchange: "wq.g.dlx"},
	}
	require.Equal(t, []ExchangeFederation{
		{Exchange: "pubsub.a", Upstreams: []Upstream{{Site: "1", URI: "amqp://c"}, {Site: "0", URI: "amqp://b"}}},
		{Exchange: "wq.g.in", UpstreamExchange: "wq.g.dlx", Upstreams: []Upstream{{Site: "3", URI: "amqp://d"}}},
	}, withLinks(want, removed))
	require.Len(t, want[0].Upstreams, 1, "the input is not modified")
	require.Equal(t, "wq.g.dlx", removed[1].readExchange())
	require.Equal(t, "pubsub.a", removed[0].readExchange())
}

// TestReconfigSetMembers: every exchange's upstream set lists all its
// slots, so that adding and removing links never changes a set; names
// outside the slots are listed too.
func TestReconfigSetMembers(t *testing.T) {
	m := exchangeSetMembers("luffymq-x:pubsub.a", []Upstream{{Site: "3"}, {Site: "berlin"}})
	require.Len(t, m, ExchangeUpstreamSlots+1)
	require.Equal(t, map[string]string{"upstream": "luffymq-x:pubsub.a:0"}, m[0])
	require.Equal(t, map[string]string{"upstream": "luffymq-x:pubsub.a:63"}, m[ExchangeUpstreamSlots-1])
	require.Equal(t, map[string]string{"upstream": "luffymq-x:pubsub.a:berlin"}, m[ExchangeUpstreamSlots])
	require.Equal(t, m, exchangeSetMembers("luffymq-x:pubsub.a", []Upstream{{Site: "berlin"}, {Site: "0"}}))
}

// TestReconfigRepublished: a conserved message keeps what the importers
// need (origin, message ID, MQTT headers), loses federation's record of
// the links it crossed, so it is routed as if published where it is, and
// says which node re-published it when.
func TestReconfigRepublished(t *testing.T) {
	d := amqp.Delivery{
		Headers: amqp.Table{
			HeaderOrigin: "berlin", HeaderQoS: int32(1), HeaderUserProperties: []interface{}{[]interface{}{"k", "v"}},
			"x-received-from": []interface{}{amqp.Table{"cluster-name": "site-b"}},
		},
		ContentType: "text/plain", DeliveryMode: amqp.Persistent, MessageId: "berlin-1-7", Expiration: "60000",
		UserId: "someone", AppId: "luffymq", Body: []byte("payload"),
	}
	p := republished(d, "site-a@vm 1700000000000000000")
	require.Equal(t, amqp.Table{
		HeaderOrigin: "berlin", HeaderQoS: int32(1), HeaderUserProperties: []interface{}{[]interface{}{"k", "v"}},
		"x-luffymq-conserved": "site-a@vm 1700000000000000000",
	}, p.Headers)
	require.Equal(t, "berlin-1-7", p.MessageId)
	require.Equal(t, uint8(amqp.Persistent), p.DeliveryMode)
	require.Equal(t, "60000", p.Expiration)
	require.Equal(t, "text/plain", p.ContentType)
	require.Empty(t, p.UserId, "RabbitMQ accepts only the publishing connection's own user ID")
	require.Equal(t, []byte("payload"), p.Body)
	require.Contains(t, d.Headers, "x-received-from", "the delivery is not modified")
	require.NotContains(t, d.Headers, "x-luffymq-conserved", "the delivery is not modified")
}

// TestReconfigBindingSite: a federation binding is made for the site at
// the end of its x-bound-from list (the list grows at its head as the
// binding travels upstream).
func TestReconfigBindingSite(t *testing.T) {
	site, ok := bindingSite(map[string]interface{}{"x-bound-from": []interface{}{
		map[string]interface{}{"cluster-name": "site-montreal@vm", "hops": float64(1)},
		map[string]interface{}{"cluster-name": "site-tunis@vm", "hops": float64(2)},
	}})
	require.True(t, ok)
	require.Equal(t, "site-tunis@vm", site)
	for _, args := range []map[string]interface{}{nil, {"x-bound-from": []interface{}{}}, {"x-bound-from": "x"}, {"other": 1}} {
		_, ok := bindingSite(args)
		require.False(t, ok, "%v", args)
	}
}

// TestReconfigFederationQueueName: the agent finds a link's queue by the
// name RabbitMQ's exchange federation gives it: upstream exchange and
// downstream node, with the downstream exchange when it differs and the
// downstream vhost when that differs too.
func TestReconfigFederationQueueName(t *testing.T) {
	for _, tc := range []struct{ upX, upVhost, down, downX, downVhost, want string }{
		{"pubsub.a", "/", "site-b@vm", "pubsub.a", "/", "federation: pubsub.a -> site-b@vm"},
		{"pubsub.a", "/", "site-b@vm", "", "", "federation: pubsub.a -> site-b@vm"},
		{"wq.g.dlx", "/", "site-b@vm", "wq.g.in", "/", "federation: wq.g.dlx -> site-b@vm:wq.g.in"},
		{"pubsub.a", "/", "site-b@vm", "pubsub.a", "other", "federation: pubsub.a -> site-b@vm:other:pubsub.a"},
	} {
		require.Equal(t, tc.want, federationQueueName(tc.upX, tc.upVhost, tc.down, tc.downX, tc.downVhost), "%+v", tc)
	}
}

// TestReconfigDecideRemoval: a running old link (connected: RabbitMQ would
// delete its queue with what it holds) goes only once its upstream took
// what it holds; one that does not run goes whatever the answer, and the
// request follows in the background unless the upstream took the queue.
func TestReconfigDecideRemoval(t *testing.T) {
	for _, tc := range []struct {
		o              conserveOutcome
		running        bool
		remove, resend bool
	}{
		{conserveTaken, true, true, false},
		{conserveTaken, false, true, false},
		{conserveNotTaken, true, false, false},
		{conserveNotTaken, false, true, true},
		{conserveNoAgent, true, false, false},
		{conserveNoAgent, false, true, true},
		{conserveUndelivered, true, false, false},
		{conserveUndelivered, false, true, true},
	} {
		remove, resend := decideRemoval(tc.o, tc.running)
		require.Equal(t, tc.remove, remove, "%v running=%v: remove", tc.o, tc.running)
		require.Equal(t, tc.resend, resend, "%v running=%v: send again", tc.o, tc.running)
	}
}

// TestReconfigOwnCopy: a queue in custody drops only the copies its own
// node re-published since the custody began (those the covering links
// carried); anything else is re-published.
func TestReconfigOwnCopy(t *testing.T) {
	since := time.Unix(0, 1_700_000_000_000_000_000)
	at := func(v any) amqp.Delivery { return amqp.Delivery{Headers: amqp.Table{"x-luffymq-conserved": v}} }
	require.True(t, ownCopy(at("site-a@vm 1700000000000000000"), "site-a@vm", since))
	require.True(t, ownCopy(at("site-a@vm 1700000000000000001"), "site-a@vm", since))
	require.False(t, ownCopy(at("site-a@vm 1699999999999999999"), "site-a@vm", since), "re-published before the custody began")
	require.False(t, ownCopy(at("site-b@vm 1700000000000000001"), "site-a@vm", since), "re-published by another node")
	require.False(t, ownCopy(at("site-a@vm x"), "site-a@vm", since))
	require.False(t, ownCopy(at(int64(1)), "site-a@vm", since))
	require.False(t, ownCopy(amqp.Delivery{}, "site-a@vm", since))
	require.True(t, ownCopy(at("site a@vm 1700000000000000001"), "site a@vm", since), "a cluster name with a space")
}

func TestConfigRetryPause(t *testing.T) {
	// A second for the first 10 failed attempts, then doubling to 30 s.
	for attempts := 1; attempts <= 10; attempts++ {
		require.Equal(t, time.Second, configRetryPause(attempts), "attempt %d", attempts)
	}
	require.Equal(t, 2*time.Second, configRetryPause(11))
	require.Equal(t, 4*time.Second, configRetryPause(12))
	require.Equal(t, 16*time.Second, configRetryPause(14))
	require.Equal(t, 30*time.Second, configRetryPause(15))
	require.Equal(t, 30*time.Second, configRetryPause(1000))

	// An hour of failures: at most a few hundred attempts, not 3 600.
	attempts, elapsed := 0, time.Duration(0)
	for elapsed < time.Hour {
		attempts++
		elapsed += configRetryPause(attempts)
	}
	require.Less(t, attempts, 150)
}

func TestLogConfigFailure(t *testing.T) {
	var logged []int
	for attempts := 0; attempts <= 200; attempts++ {
		if logConfigFailure(attempts) {
			logged = append(logged, attempts)
		}
	}
	require.Equal(t, []int{1, 2, 4, 8, 16, 32, 64, 128}, logged)
}
