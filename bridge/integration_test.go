package bridge_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/internal/mqtttest"
	"github.com/luffymq/luffymq/internal/rabbitharness"
	"github.com/luffymq/luffymq/internal/testenv"
)

// site is one running site in a test: its broker and an MQTT client
// subscribed to the test's filter.
type site struct {
	name   string
	broker *broker.Broker
	client *mqtttest.Recorder
}

// startSites starts one bridged broker per test site exporting export, with
// a QoS 1 subscriber on filter at each, and waits until messages published
// at every site reach every other site.
func startSites(t *testing.T, h *rabbitharness.Harness, export, filter, probeTopic string) map[string]*site {
	t.Helper()
	sites := map[string]*site{}
	for _, name := range testSites {
		b := startSite(t, name, h.Node(name).AMQPURL(), export)
		c := mqtttest.ConnectRecorder(t, b.MQTTAddr(), "sub-"+name)
		c.MustSubscribe(t, filter, 1, true)
		sites[name] = &site{name: name, broker: b, client: c}
	}
	waitFederation(t, h, bridge.ExchangeName(export))
	// Bindings propagate asynchronously (bridge -> local exchange ->
	// federation -> upstream queue): probe until every path carries.
	for _, from := range testSites {
		pub := mqtttest.ConnectRecorder(t, sites[from].broker.MQTTAddr(), "probe-"+from)
		prefix := "probe-" + from + "-"
		i := 0
		require.Eventually(t, func() bool {
			i++
			if pub.Send(&paho.Publish{Topic: probeTopic, QoS: 1, Payload: []byte(fmt.Sprintf("%s%d", prefix, i))}) != nil {
				return false
			}
			for _, to := range testSites {
				if len(sites[to].client.Payloads(prefix)) == 0 {
					return false
				}
			}
			return true
		}, 30*time.Second, 200*time.Millisecond, "probes from %s do not reach every site", from)
	}
	return sites
}

func TestPubSubAcrossSites(t *testing.T) {
	h := federatedNodes(t)
	start := time.Now()
	sites := startSites(t, h, "t/#", "t/#", "t/probe")
	t.Logf("sites bridged and federated in %v", time.Since(start).Round(time.Millisecond))

	t.Run("every message reaches every site exactly once", func(t *testing.T) {
		sent := map[string]int{"berlin": 200, "tunis": 100, "montreal": 100}
		var wg sync.WaitGroup
		errs := make(chan error, len(sent))
		for from, n := range sent {
			pub := mqtttest.ConnectRecorder(t, sites[from].broker.MQTTAddr(), "pub-"+from)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range n {
					if err := pub.Send(&paho.Publish{Topic: "t/data", QoS: 1, Payload: []byte(fmt.Sprintf("run-%s-%d", from, i))}); err != nil {
						errs <- err
						return
					}
				}
				// A fence after the counted messages: duplicates on the
				// same path would arrive before it.
				errs <- pub.Send(&paho.Publish{Topic: "t/data", QoS: 1, Payload: []byte("fence-" + from)})
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		total := 0
		for _, n := range sent {
			total += n
		}
		require.Eventually(t, func() bool {
			for _, s := range sites {
				if len(s.client.Payloads("run-")) != total || len(s.client.Payloads("fence-")) != len(sent) {
					return false
				}
			}
			return true
		}, 60*time.Second, 50*time.Millisecond, "not every site received every message")

		for _, to := range testSites {
			got := sites[to].client.Payloads("run-")
			dups, lost := 0, 0
			for from, n := range sent {
				for i := range n {
					switch c := got[fmt.Sprintf("run-%s-%d", from, i)]; {
					case c == 0:
						lost++
					case c > 1:
						dups += c - 1
					}
				}
			}
			received := 0
			for _, c := range got {
				received += c
			}
			t.Logf("site %-8s sent %3d, received %3d (local %3d, remote %3d), duplicates %d, lost %d",
				to, sent[to], received, sent[to], received-sent[to], dups, lost)
			require.Zero(t, dups, "duplicates at %s", to)
			require.Zero(t, lost, "lost at %s", to)
		}
	})

	t.Run("properties and retain cross sites", func(t *testing.T) {
		pub := mqtttest.ConnectRecorder(t, sites["berlin"].broker.MQTTAddr(), "props-berlin")
		pub.MustSend(t, &paho.Publish{
			Topic: "t/props", QoS: 1, Retain: true, Payload: []byte("props-1"),
			Properties: &paho.PublishProperties{
				ContentType:     "text/plain",
				ResponseTopic:   "t/reply",
				CorrelationData: []byte{1, 2, 3},
				User:            paho.UserProperties{{Key: "unit", Value: "celsius"}, {Key: "unit", Value: "kelvin"}},
			},
		})
		var got *paho.Publish
		require.Eventually(t, func() bool {
			got = sites["tunis"].client.Find("props-1")
			return got != nil
		}, 10*time.Second, 20*time.Millisecond)
		require.Equal(t, byte(1), got.QoS)
		require.True(t, got.Retain, "retain flag carried (subscribed with retain-as-published)")
		require.Equal(t, "text/plain", got.Properties.ContentType)
		require.Equal(t, "t/reply", got.Properties.ResponseTopic)
		require.Equal(t, []byte{1, 2, 3}, got.Properties.CorrelationData)
		require.Equal(t, []string{"celsius", "kelvin"}, got.Properties.User.GetAll("unit"))
		require.Equal(t, "berlin", got.Properties.User.Get(bridge.OriginUserProperty))

		// The retained message is kept by the remote broker for later
		// subscribers.
		require.Eventually(t, func() bool { return sites["montreal"].client.Find("props-1") != nil },
			10*time.Second, 20*time.Millisecond)
		late := mqtttest.ConnectRecorder(t, sites["montreal"].broker.MQTTAddr(), "late-montreal")
		late.MustSubscribe(t, "t/props", 1, false)
		require.Eventually(t, func() bool { return late.Find("props-1") != nil }, 5*time.Second, 20*time.Millisecond)
	})

	t.Run("metrics", func(t *testing.T) {
		resp, err := http.Get("http://" + sites["berlin"].broker.HTTPAddr() + "/metrics")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		text := string(body)
		require.Contains(t, text, `luffymq_bridge_link_up{site="berlin"} 1`)
		require.Contains(t, text, `luffymq_bridge_messages_exported_total{exchange="pubsub.t",site="berlin"}`)
		require.Contains(t, text, `luffymq_bridge_messages_imported_total{exchange="pubsub.t",outcome="delivered",site="berlin"}`)
		require.Contains(t, text, `luffymq_bridge_messages_imported_total{exchange="pubsub.t",outcome="local_origin",site="berlin"}`)
		exported, delivered := sites["berlin"].broker.Bridge().Counts()
		require.GreaterOrEqual(t, exported["pubsub.t"], uint64(200))
		require.GreaterOrEqual(t, delivered["pubsub.t"], uint64(200))
	})

	t.Run("bindings follow subscriptions", func(t *testing.T) {
		b := sites["tunis"].broker.Bridge()
		want := bridge.Binding{Exchange: "pubsub.t", Key: "t.*.deep"}
		c := mqtttest.ConnectRecorder(t, sites["tunis"].broker.MQTTAddr(), "binder-tunis")
		c.MustSubscribe(t, "t/+/deep", 0, false)
		c.MustSubscribe(t, "other/#", 0, false) // not exported: no binding
		require.Eventually(t, func() bool { return contains(b.Bindings(), want) }, 5*time.Second, 10*time.Millisecond)
		for _, bd := range b.Bindings() {
			require.Equal(t, "pubsub.t", bd.Exchange)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := c.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{"t/+/deep"}})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return !contains(b.Bindings(), want) }, 5*time.Second, 10*time.Millisecond)
	})
}

func contains(bs []bridge.Binding, b bridge.Binding) bool {
	for _, x := range bs {
		if x == b {
			return true
		}
	}
	return false
}

func TestLinkCutLosesNothing(t *testing.T) {
	h := federatedNodes(t)
	sites := startSites(t, h, "cut/#", "cut/#", "cut/probe")
	link, err := h.Link(h.Node("tunis"), h.Node("berlin")) // tunis's federation upstream berlin
	require.NoError(t, err)

	pub := mqtttest.ConnectRecorder(t, sites["berlin"].broker.MQTTAddr(), "pub-cut")
	link.Cut()
	cutAt := time.Now()
	const n = 100
	for i := range n {
		pub.MustSend(t, &paho.Publish{Topic: "cut/data", QoS: 1, Payload: []byte(fmt.Sprintf("cut-%d", i))})
	}
	// Montréal's link is intact: it gets everything during the cut.
	require.Eventually(t, func() bool { return len(sites["montreal"].client.Payloads("cut-")) == n },
		10*time.Second, 20*time.Millisecond)
	require.Empty(t, sites["tunis"].client.Payloads("cut-"), "nothing crosses a cut link")

	// Keep the link down for 10 s, then restore it.
	down := time.NewTimer(10*time.Second - time.Since(cutAt))
	<-down.C
	require.Empty(t, sites["tunis"].client.Payloads("cut-"))
	require.NoError(t, link.Restore())
	restored := time.Now()

	require.Eventually(t, func() bool { return len(sites["tunis"].client.Payloads("cut-")) == n },
		30*time.Second, 20*time.Millisecond, "messages held during the cut arrive once the link returns")
	pub.MustSend(t, &paho.Publish{Topic: "cut/data", QoS: 1, Payload: []byte("fence-cut")})
	require.Eventually(t, func() bool { return sites["tunis"].client.Find("fence-cut") != nil }, 10*time.Second, 20*time.Millisecond)
	got := sites["tunis"].client.Payloads("cut-")
	dups := 0
	for i := range n {
		c := got[fmt.Sprintf("cut-%d", i)]
		require.NotZero(t, c, "cut-%d lost", i)
		dups += c - 1
	}
	t.Logf("link tunis->berlin cut for %v: sent %d, tunis received %d after restore (in %v), montreal %d, duplicates %d, lost 0",
		restored.Sub(cutAt).Round(time.Millisecond), n, len(got), time.Since(restored).Round(time.Millisecond),
		len(sites["montreal"].client.Payloads("cut-")), dups)
	require.Zero(t, dups)
}

func TestUnreachableRabbitMQ(t *testing.T) {
	h := sharedNodes(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there now

	logs := &testenv.LockedBuffer{}
	cfg, err := broker.ConfigFromArgs([]string{
		"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--amqp-url", "amqp://guest:guest@" + addr + "/",
		"--site", "lonely", "--export", "u/#",
	}, io.Discard, logs)
	require.NoError(t, err)
	b, err := broker.New(cfg)
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Close() })

	// Local MQTT keeps working.
	sub := mqtttest.ConnectRecorder(t, b.MQTTAddr(), "local-sub")
	sub.MustSubscribe(t, "u/#", 1, false)
	pub := mqtttest.ConnectRecorder(t, b.MQTTAddr(), "local-pub")
	pub.MustSend(t, &paho.Publish{Topic: "u/x", QoS: 1, Payload: []byte("local-1")})
	require.Eventually(t, func() bool { return sub.Find("local-1") != nil }, 5*time.Second, 10*time.Millisecond)

	// One clear line names the URL (without the password) and says what
	// still works.
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "RabbitMQ unreachable") }, 5*time.Second, 10*time.Millisecond)
	var line string
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "RabbitMQ unreachable") {
			line = l
			break
		}
	}
	require.Contains(t, line, "amqp://guest:xxxxx@"+addr+"/")
	require.Contains(t, line, "local MQTT clients are still served")
	require.NotContains(t, line, "guest:guest", "the password is not logged")
	require.False(t, b.Bridge().Connected())

	// A node appears at that address: the bridge connects and exports what
	// was published meanwhile.
	_, err = h.Expose(addr, h.Node("berlin"))
	require.NoError(t, err)
	require.Eventually(t, b.Bridge().Connected, 30*time.Second, 20*time.Millisecond, "logs:\n%s", logs)
	require.Eventually(t, func() bool {
		exported, _ := b.Bridge().Counts()
		return exported["pubsub.u"] == 1
	}, 10*time.Second, 20*time.Millisecond, "the message published while RabbitMQ was away is exported once it is back")
	require.Contains(t, logs.String(), "bridge connected to RabbitMQ")
}

// TestMappingAgreesWithRabbitMQ checks on a real node that a mapped topic
// matches a mapped filter exactly when MQTT says it should.
func TestMappingAgreesWithRabbitMQ(t *testing.T) {
	h := sharedNodes(t)
	conn, err := amqp.Dial(h.Node("montreal").AMQPURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	const x = "mapping-test"
	require.NoError(t, ch.ExchangeDeclare(x, amqp.ExchangeTopic, false, true, false, false, nil))

	filters := []string{"a/+", "a/#", "+/+", "#", "a//b", "a/+/b", "a.b/*", "+", "100%/#", "a/b/+"}
	topics := []string{"a", "a/", "a/b", "a//b", "a/x/b", "a.b/*", "a.b/c", "/", "100%/q", "x", "a/b/c", "a/b/"}
	queues := map[string]string{}
	for _, f := range filters {
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		require.NoError(t, err)
		require.NoError(t, ch.QueueBind(q.Name, bridge.MQTTToAMQP(f), x, false, nil))
		queues[f] = q.Name
	}
	require.NoError(t, ch.Confirm(false))
	for _, topic := range topics {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), x, bridge.MQTTToAMQP(topic), false, false,
			amqp.Publishing{Body: []byte(topic)})
		require.NoError(t, err)
		require.True(t, dc.Wait())
	}
	for _, f := range filters {
		var got []string
		for {
			d, ok, err := ch.Get(queues[f], true)
			require.NoError(t, err)
			if !ok {
				break
			}
			back, err := bridge.AMQPToMQTT(d.RoutingKey)
			require.NoError(t, err)
			require.Equal(t, string(d.Body), back)
			got = append(got, back)
		}
		var want []string
		for _, topic := range topics {
			if bridge.MatchFilter(f, topic) {
				want = append(want, topic)
			}
		}
		require.Equal(t, want, got, "filter %q (binding key %q)", f, bridge.MQTTToAMQP(f))
	}
}

func TestFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(t *testing.T, c broker.Config)
	}{
		{
			name: "bridge flags",
			args: []string{"--amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "--site", "berlin",
				"--export", "sensors/#,alerts/+", "--export", "weather/#"},
			check: func(t *testing.T, c broker.Config) {
				require.Equal(t, "amqp://guest:guest@127.0.0.1:5672/", c.AMQPURL)
				require.Equal(t, "berlin", c.Site)
				require.Equal(t, []string{"sensors/#", "alerts/+", "weather/#"}, c.Exports)
			},
		},
		{name: "site needs amqp-url", args: []string{"--site", "berlin"}, wantErr: "need amqp-url"},
		{name: "amqp-url needs site", args: []string{"--amqp-url", "amqp://127.0.0.1/"}, wantErr: "amqp-url needs site"},
		{name: "bad export", args: []string{"--amqp-url", "amqp://127.0.0.1/", "--site", "b", "--export", "a/#/b"}, wantErr: `export "a/#/b" is not a valid MQTT topic filter`},
		{name: "system export", args: []string{"--amqp-url", "amqp://127.0.0.1/", "--site", "b", "--export", "$SYS/#"}, wantErr: `export "$SYS/#"`},
		{name: "bad url", args: []string{"--amqp-url", "http://x/", "--site", "b"}, wantErr: `amqp-url "http://x/"`},
		{name: "bad site", args: []string{"--amqp-url", "amqp://127.0.0.1/", "--site", "a b"}, wantErr: `site "a b"`},
		{name: "export-group needs management", args: []string{"--amqp-url", "amqp://127.0.0.1/", "--site", "b", "--export-group", "$share/g/jobs/#"}, wantErr: "--amqp-management-url"},
		{
			name: "export-group",
			args: []string{"--amqp-url", "amqp://127.0.0.1/", "--site", "b", "--export-group", "$share/g/jobs/#",
				"--amqp-management-url", "http://127.0.0.1:15672"},
			check: func(t *testing.T, c broker.Config) {
				require.Equal(t, []string{"$share/g/jobs/#"}, c.ExportGroups)
				require.Equal(t, "http://127.0.0.1:15672", c.AMQPManagementURL)
			},
		},
		{name: "management needs amqp-url", args: []string{"--amqp-management-url", "http://127.0.0.1:15672"}, wantErr: "need amqp-url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := broker.ConfigFromArgs(append([]string{"--listen", "127.0.0.1:0"}, tt.args...), io.Discard, io.Discard)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				require.NotContains(t, err.Error(), "\n")
				return
			}
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

// TestPublishesDoNotWaitForEarlierConfirms checks that the bridge writes a
// message to RabbitMQ as soon as it is published, not once the messages
// before it are confirmed. Over a link of 100 ms each way a confirm comes
// back 200 ms after its publish: a bridge that waited for it would hold a
// message published meanwhile until then, and it would reach the node
// 200–300 ms after its publish instead of about 100.
func TestPublishesDoNotWaitForEarlierConfirms(t *testing.T) {
	h := sharedNodes(t)
	const delay = 100 * time.Millisecond
	node := h.Node("berlin")
	link, err := h.LinkWithDelay(&rabbitharness.Node{Site: "confirm-pipeline"}, node, delay)
	require.NoError(t, err)
	b := startSite(t, "pipeline", link.AMQPURL(), "pipe/#")
	require.Eventually(t, b.Bridge().Connected, 30*time.Second, 20*time.Millisecond)

	conn, err := amqp.Dial(node.AMQPURL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		probe, err := conn.Channel()
		if err != nil {
			return false
		}
		defer probe.Close()
		return probe.ExchangeDeclarePassive(bridge.ExchangeName("pipe/x"), amqp.ExchangeTopic, true, false, false, false, nil) == nil
	}, 30*time.Second, 50*time.Millisecond, "the bridge declares the export's exchange")
	require.NoError(t, ch.QueueBind(q.Name, "#", bridge.ExchangeName("pipe/x"), false, nil))
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	type arrival struct {
		body string
		at   time.Time
	}
	arrivals := make(chan arrival, 100)
	go func() {
		for d := range deliveries {
			arrivals <- arrival{string(d.Body), time.Now()}
		}
	}()

	pub := mqtttest.ConnectRecorder(t, b.MQTTAddr(), "pub-pipeline")
	const n = 10
	sent := make(map[string]time.Time, n)
	for i := range n {
		p := fmt.Sprintf("pipe-%d", i)
		sent[p] = time.Now()
		pub.MustSend(t, &paho.Publish{Topic: "pipe/x", QoS: 1, Payload: []byte(p)})
		time.Sleep(20 * time.Millisecond)
	}
	var worst time.Duration
	timeout := time.After(10 * time.Second)
	for got := 0; got < n; got++ {
		select {
		case a := <-arrivals:
			at, ok := sent[a.body]
			require.True(t, ok, "unexpected message %q", a.body)
			worst = max(worst, a.at.Sub(at))
		case <-timeout:
			t.Fatalf("%d of %d messages reached the node", got, n)
		}
	}
	t.Logf("%d messages published 20 ms apart over a link of %v each way: the slowest reached the node %v after its publish", n, delay, worst.Round(time.Millisecond))
	require.Less(t, worst, delay+90*time.Millisecond, "a publish waited for an earlier one's confirm")
}
