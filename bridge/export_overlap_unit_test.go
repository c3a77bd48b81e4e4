package bridge

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/hooks"
	"github.com/luffymq/luffymq/scoring"
)

// pipeSubscriber is an MQTT v5 client on an in-memory connection to a
// Mochi server, subscribed to one filter, recording payloads in order.
type pipeSubscriber struct {
	mu  sync.Mutex
	got []string
}

func connectPipeSubscriber(t *testing.T, ctx context.Context, server *mqtt.Server, id, filter string) *pipeSubscriber {
	t.Helper()
	clientSide := pipeConn(server)
	s := &pipeSubscriber{}
	c := paho.NewClient(paho.ClientConfig{
		ClientID: id,
		Conn:     clientSide,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				s.mu.Lock()
				s.got = append(s.got, string(pr.Packet.Payload))
				s.mu.Unlock()
				return true, nil
			},
		},
	})
	_, err := c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	_, err = c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}); _ = clientSide.Close() })
	return s
}

func (s *pipeSubscriber) payloads() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

// TestExportOverlapImportSkipsQueuedGroups checks, without RabbitMQ, both
// halves of the rule for a topic that is exported and covered by an
// exported group: the origin names the group in x-luffymq-work-groups
// when it exports the message, and an importer keeps a message naming
// one of its exported groups from that group's members only, while plain
// subscribers and groups it does not export get it as before. Each case
// ends with a fence, a message without the header that the exported
// group's member gets: Mochi delivers to one client in order, so a
// member that has the fence and not the case's message never gets it.
func TestExportOverlapImportSkipsQueuedGroups(t *testing.T) {
	engine, err := scoring.NewEngine(scoring.Config{})
	require.NoError(t, err)
	const exported, notExported = "$share/ovuw/ovu/#", "$share/ovuo/ovu/#"
	b, err := New(Config{
		Site: "here", BrokerID: "ovu", AMQPURL: "amqp://127.0.0.1:1/",
		Exports:      []string{"ovu/#"},
		ExportGroups: []string{exported},
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		WorkQueue:    WorkQueueConfig{ManagementURL: "http://127.0.0.1:1", Load: engine},
	})
	require.NoError(t, err)
	server := mqtt.New(&mqtt.Options{InlineClient: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, b.Attach(server))
	selection, err := hooks.NewSelectionHook(hooks.SelectionConfig{Engine: engine, Server: server})
	require.NoError(t, err)
	require.NoError(t, server.AddHook(selection, nil))
	require.NoError(t, server.AddHook(new(auth.AllowHook), nil))
	require.NoError(t, server.Serve())
	t.Cleanup(func() { _ = server.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	plain := connectPipeSubscriber(t, ctx, server, "ovu-plain", "ovu/#")
	member := connectPipeSubscriber(t, ctx, server, "ovu-member", exported)
	other := connectPipeSubscriber(t, ctx, server, "ovu-other", notExported)

	imported := func(payload string, h amqp.Table) {
		t.Helper()
		headers := amqp.Table{HeaderOrigin: "there", HeaderBroker: "x", HeaderQoS: int32(1)}
		for k, v := range h {
			headers[k] = v
		}
		d := amqp.Delivery{Exchange: "pubsub.ovu", RoutingKey: "ovu.data", MessageId: "there-" + payload, Headers: headers, Body: []byte(payload)}
		require.Equal(t, importDelivered, b.inject(d))
	}
	fences := 0
	fence := func() {
		t.Helper()
		fences++
		f := "fence-" + strconv.Itoa(fences)
		imported(f, nil)
		require.Eventually(t, func() bool {
			for _, s := range []*pipeSubscriber{plain, member, other} {
				if !slices.Contains(s.payloads(), f) {
					return false
				}
			}
			return true
		}, 10*time.Second, time.Millisecond, "fence %s not delivered", f)
	}
	memberGets := func(payload string, want bool) {
		t.Helper()
		fence()
		require.Equal(t, want, slices.Contains(member.payloads(), payload), "exported group's member got %s: %v", payload, member.payloads())
		require.Contains(t, plain.payloads(), payload, "plain subscriber")
		require.Contains(t, other.payloads(), payload, "member of the group not exported")
	}

	// The origin put it in our group's work queue: the member gets it
	// from there, not here.
	imported("queued", amqp.Table{HeaderWorkGroups: []interface{}{"ovuw"}})
	memberGets("queued", false)
	// The origin exports other groups only, or none: the message reaches
	// the group here, as it reaches any shared group.
	imported("queued-elsewhere", amqp.Table{HeaderWorkGroups: []interface{}{"ovuq", "ovuz"}})
	memberGets("queued-elsewhere", true)
	imported("plain", nil)
	memberGets("plain", true)

	// The origin side: a local publish on the overlap goes to the work
	// queue and to the exchange, naming the group there.
	before := b.outbox.len()
	pubConn := pipeConn(server)
	pub := paho.NewClient(paho.ClientConfig{ClientID: "ovu-pub", Conn: pubConn})
	_, err = pub.Connect(ctx, &paho.Connect{ClientID: "ovu-pub", KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Disconnect(&paho.Disconnect{}); _ = pubConn.Close() })
	_, err = pub.Publish(ctx, &paho.Publish{Topic: "ovu/local", QoS: 1, Payload: []byte("local")})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.outbox.len() == before+2 }, 5*time.Second, time.Millisecond)
	batch, err := b.outbox.take(ctx, 10)
	require.NoError(t, err)
	var toQueue, toExchange *outMsg
	for _, m := range batch {
		switch {
		case m.exchange == "" && m.key == WorkQueueName("ovuw"):
			toQueue = m
		case m.exchange == "pubsub.ovu":
			toExchange = m
		}
	}
	require.NotNil(t, toQueue, "not sent to the work queue: %+v", batch)
	require.NotNil(t, toExchange, "not exported: %+v", batch)
	require.Equal(t, []interface{}{"ovuw"}, toExchange.pub.Headers[HeaderWorkGroups])
	require.NotContains(t, toQueue.pub.Headers, HeaderWorkGroups)
	// The local publish reached the plain subscriber and the group not
	// exported directly, and the exported group not at all (its work
	// queue has it).
	fence()
	require.Contains(t, plain.payloads(), "local")
	require.Contains(t, other.payloads(), "local")
	require.NotContains(t, member.payloads(), "local")
	for _, s := range []*pipeSubscriber{plain, member, other} {
		seen := map[string]int{}
		for _, p := range s.payloads() {
			seen[p]++
			require.Equal(t, 1, seen[p], "%s delivered twice", p)
		}
	}
}

// pipeConn connects to server over an in-memory connection. paho writes
// a packet in several Writes, which its pinger's PINGREQ could split on a
// net.Pipe (each Write is a separate read): the connection is a
// sync.Locker, so paho holds it for a whole packet.
func pipeConn(server *mqtt.Server) net.Conn {
	brokerSide, clientSide := net.Pipe()
	go func() { _ = server.EstablishConnection("pipe", brokerSide) }()
	return packets.NewThreadSafeConn(clientSide)
}
