package clientsdk_test

import (
	"context"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/autopaho/queue/memory"
	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/clientsdk"
)

// connDropper dials the broker for autopaho (as its AttemptConnection) and
// can drop the current network connection without an MQTT DISCONNECT, as a
// crash or a network failure would.
type connDropper struct {
	mu    sync.Mutex
	conn  net.Conn
	dials atomic.Int32
}

func (d *connDropper) attempt(ctx context.Context, _ autopaho.ClientConfig, u *url.URL) (net.Conn, error) {
	var dialer net.Dialer
	c, err := dialer.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.conn = c
	d.mu.Unlock()
	d.dials.Add(1)
	return c, nil
}

func (d *connDropper) drop() {
	d.mu.Lock()
	c := d.conn
	d.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// watchTopic subscribes a plain paho client to filter and returns the
// payloads it receives.
func watchTopic(t *testing.T, addr, filter string) <-chan string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	got := make(chan string, 64)
	c := paho.NewClient(paho.ClientConfig{
		Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			select {
			case got <- string(pr.Packet.Payload):
			default:
				t.Errorf("watcher of %s: too many messages", filter)
			}
			return true, nil
		}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.Connect(ctx, &paho.Connect{ClientID: "watch-" + strings.NewReplacer("/", "-", "#", "all").Replace(filter), KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	_, err = c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}) })
	return got
}

// next returns the next payload from c, failing the test after within.
func next(t *testing.T, c <-chan string, within time.Duration, what string) string {
	t.Helper()
	select {
	case s := <-c:
		return s
	case <-time.After(within):
		t.Fatalf("%s: nothing within %s", what, within)
		return ""
	}
}

// requireNone fails the test if c holds a payload now.
func requireNone(t *testing.T, c <-chan string, what string) {
	t.Helper()
	select {
	case s := <-c:
		t.Fatalf("%s: got %q", what, s)
	default:
	}
}

func brokerURL(t *testing.T, addr string) *url.URL {
	t.Helper()
	u, err := url.Parse("mqtt://" + addr)
	require.NoError(t, err)
	return u
}

// An autopaho program with a Will message adopts the load reporter by adding
// three lines (a constructor, its error check, Adopt); its reports show in
// /api/v1/groups, and its Will is still delivered when its connection drops.
func TestAutopahoProgramAdoptsTheLoadReporter(t *testing.T) {
	b := startBroker(t, "127.0.0.1:0", 200*time.Millisecond)
	wills := watchTopic(t, b.MQTTAddr(), "status/#")
	dropper := &connDropper{}
	var processed atomic.Int32

	// The program as it is without LuffyMQ.
	cfg := autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{brokerURL(t, b.MQTTAddr())},
		KeepAlive:                     5,
		CleanStartOnInitialConnection: true,
		ReconnectBackoff:              autopaho.NewConstantBackoff(100 * time.Millisecond),
		WillMessage:                   &paho.WillMessage{Topic: "status/w-autopaho", Payload: []byte("offline"), QoS: 1},
		AttemptConnection:             dropper.attempt,
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			go func() {
				sub := &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: shareGT, QoS: 1}}}
				if _, err := cm.Subscribe(context.Background(), sub); err != nil {
					t.Logf("subscribe: %v", err)
				}
			}()
		},
		ClientConfig: paho.ClientConfig{
			ClientID: "w-autopaho",
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(paho.PublishReceived) (bool, error) {
				time.Sleep(5 * time.Millisecond) // the work
				processed.Add(1)
				return true, nil
			}},
		},
	}
	// The lines it adds.
	reporter, err := clientsdk.NewLoadReporter(clientsdk.LoadReporterConfig{})
	require.NoError(t, err)
	reporter.Adopt(&cfg)
	// The program goes on as before.
	cm, err := autopaho.NewConnection(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = cm.Disconnect(ctx)
	})

	require.Eventually(t, func() bool {
		_, ok := member(t, b, shareGT, "w-autopaho")
		return ok
	}, 5*time.Second, poll, "never joined the group")
	pub := startPublisher(t, b.MQTTAddr())
	publish(t, pub, "t/1", 10, clientsdk.PublishOptions{QoS: 1})
	require.Eventually(t, func() bool { return processed.Load() == 10 }, 5*time.Second, poll)

	var m broker.MemberStatus
	require.Eventually(t, func() bool {
		var ok bool
		m, ok = member(t, b, shareGT, "w-autopaho")
		return ok && m.Reports > 0 && m.ServiceTimeMs > 0
	}, 5*time.Second, poll, "the broker never showed a report from the autopaho program")
	require.InDelta(t, 5, m.ServiceTimeMs, 4.5, "the handler's run time is the reported processing time")
	require.Equal(t, 1, m.Workers)
	st := reporter.Stats()
	require.Equal(t, uint64(10), st.Received)
	require.Equal(t, uint64(10), st.Processed)
	require.Equal(t, clientsdk.ReportViaPingreq, st.ReportVia)
	require.Equal(t, 200*time.Millisecond, st.ReportInterval, "the broker's CONNACK interval is followed")
	require.Eventually(t, func() bool {
		m, ok := member(t, b, shareGT, "w-autopaho")
		return ok && m.Reports == reporter.Stats().ReportsSent
	}, 3*time.Second, poll, "the broker counts each report once")

	// The Will: not while the program is connected, at once when its
	// connection drops without DISCONNECT.
	requireNone(t, wills, "Will while connected")
	dropped := time.Now()
	dropper.drop()
	require.Equal(t, "offline", next(t, wills, 5*time.Second, "Will after the connection dropped"))

	// autopaho reconnects, and the reporter reports on the new connection.
	require.Eventually(t, func() bool { return dropper.dials.Load() >= 2 }, 5*time.Second, poll)
	require.Eventually(t, func() bool {
		tryPublish(t, pub, "t/2", clientsdk.PublishOptions{QoS: 1})
		m, ok := member(t, b, shareGT, "w-autopaho")
		reportedSinceDrop := ok && m.LastReportAgeMs != nil &&
			time.Duration(*m.LastReportAgeMs*float64(time.Millisecond)) < time.Since(dropped)
		return ok && m.Online && reportedSinceDrop && processed.Load() > 10
	}, 5*time.Second, 100*time.Millisecond, "no reports after the reconnection")
}

// An application that queues messages and processes them on its own
// goroutine reports with Received, Start and Done.
func TestLoadReporterManualProcessing(t *testing.T) {
	b := startBroker(t, "127.0.0.1:0", 100*time.Millisecond)
	queue := make(chan *paho.Publish, 100)
	release := make(chan struct{})

	reporter, err := clientsdk.NewLoadReporter(clientsdk.LoadReporterConfig{})
	require.NoError(t, err)
	cfg := autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{brokerURL(t, b.MQTTAddr())},
		KeepAlive:                     5,
		CleanStartOnInitialConnection: true,
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			go func() {
				_, _ = cm.Subscribe(context.Background(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: shareGT}}})
			}()
		},
		ClientConfig: paho.ClientConfig{
			ClientID: "w-manual",
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				queue <- pr.Packet
				reporter.Received()
				return true, nil
			}},
		},
	}
	reporter.AdoptForManualProcessing(&cfg)
	worker := make(chan struct{})
	go func() {
		defer close(worker)
		<-release
		for range 5 {
			<-queue
			start := reporter.Start()
			time.Sleep(10 * time.Millisecond)
			reporter.Done(start, nil)
		}
	}()
	cm, err := autopaho.NewConnection(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = cm.Disconnect(ctx)
	})
	require.Eventually(t, func() bool {
		_, ok := member(t, b, shareGT, "w-manual")
		return ok
	}, 5*time.Second, poll)

	pub := startPublisher(t, b.MQTTAddr())
	publish(t, pub, "t/1", 5, clientsdk.PublishOptions{})
	require.Eventually(t, func() bool {
		m, ok := member(t, b, shareGT, "w-manual")
		return ok && m.ReportedPending == 5
	}, 3*time.Second, poll, "the queued messages were never reported")

	close(release)
	<-worker
	require.Eventually(t, func() bool {
		m, ok := member(t, b, shareGT, "w-manual")
		return ok && m.ReportedPending == 0 && m.ServiceTimeMs >= 8
	}, 3*time.Second, poll, "the processing time was never reported")
	st := reporter.Stats()
	require.Equal(t, uint64(5), st.Processed)
	require.Zero(t, st.Pending)
	require.Zero(t, st.InFlight)
}

// A Subscriber built from an application's autopaho.ClientConfig keeps its
// Will, callbacks, own subscriptions and publish queue, serves several
// groups on one connection, and stops for good, saying why, when the
// application's OnConnectionDown declines to reconnect.
func TestSubscriberFromAutopahoConfig(t *testing.T) {
	b := startBroker(t, "127.0.0.1:0", 200*time.Millisecond)
	status := watchTopic(t, b.MQTTAddr(), "status/#")
	dropper := &connDropper{}
	var ups atomic.Int32
	var reconnect atomic.Bool
	reconnect.Store(true)
	own := make(chan string, 16)
	logger, _ := testLogger(t)

	cfg := autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{brokerURL(t, b.MQTTAddr())},
		KeepAlive:                     5,
		CleanStartOnInitialConnection: true,
		ReconnectBackoff:              autopaho.NewConstantBackoff(100 * time.Millisecond),
		WillMessage:                   &paho.WillMessage{Topic: "status/w-sub", Payload: []byte("offline"), QoS: 1},
		AttemptConnection:             dropper.attempt,
		Queue:                         memory.New(),
		OnConnectionUp:                func(*autopaho.ConnectionManager, *paho.Connack) { ups.Add(1) },
		OnConnectionDown:              func() bool { return reconnect.Load() },
		ClientConfig: paho.ClientConfig{
			ClientID: "w-sub",
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				if !pr.AlreadyHandled {
					own <- pr.Packet.Topic
				}
				return true, nil
			}},
		},
	}
	var mu sync.Mutex
	byGroup := map[string][]string{}
	handler := func(_ context.Context, m *clientsdk.Message) error {
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		byGroup[m.Group] = append(byGroup[m.Group], m.Topic)
		mu.Unlock()
		return nil
	}
	count := func(group string) int {
		mu.Lock()
		defer mu.Unlock()
		return len(byGroup[group])
	}
	s, err := clientsdk.NewSubscriber(clientsdk.SubscriberConfig{
		ConnectionConfig: clientsdk.ConnectionConfig{Logger: logger, MaxReconnectWait: 200 * time.Millisecond},
		Autopaho:         &cfg,
		Groups: []clientsdk.GroupSubscription{
			{Group: "g", Filters: []string{"t/#"}, QoS: 1},
			{Group: "h", Filters: []string{"u/#", "v/#"}, QoS: 1},
		},
		Handler: handler,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	require.Equal(t, int32(1), ups.Load(), "the application's OnConnectionUp runs")

	// The application's own subscription and its publish queue, on the
	// Subscriber's connection.
	cm := s.ConnectionManager()
	_, err = cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "own/#", QoS: 1}}})
	require.NoError(t, err)
	require.NoError(t, cm.PublishViaQueue(ctx, &autopaho.QueuePublish{Publish: &paho.Publish{Topic: "status/w-sub", QoS: 1, Payload: []byte("online")}}))
	require.Equal(t, "online", next(t, status, 3*time.Second, "publish through the session queue"))

	pub := startPublisher(t, b.MQTTAddr())
	publish(t, pub, "t/1", 4, clientsdk.PublishOptions{QoS: 1})
	publish(t, pub, "u/1", 3, clientsdk.PublishOptions{QoS: 1})
	publish(t, pub, "v/1", 2, clientsdk.PublishOptions{QoS: 1})
	publish(t, pub, "own/1", 1, clientsdk.PublishOptions{QoS: 1})
	require.Equal(t, "own/1", next(t, own, 3*time.Second, "the application's own subscription"))
	require.Eventually(t, func() bool { return count("g") == 4 && count("h") == 5 }, 5*time.Second, poll,
		"each group's messages to its handler")
	require.Never(t, func() bool { return count("g") > 4 || count("h") > 5 || len(own) > 0 }, 200*time.Millisecond, poll)
	mu.Lock()
	require.Equal(t, []string{"u/1", "u/1", "u/1", "v/1", "v/1"}, byGroup["h"], "one worker takes them in arrival order")
	mu.Unlock()
	st := s.Stats()
	require.Equal(t, uint64(9), st.Processed)
	for _, filter := range []string{"$share/g/t/#", "$share/h/u/#", "$share/h/v/#"} {
		require.Eventually(t, func() bool {
			m, ok := member(t, b, filter, "w-sub")
			return ok && m.Reports > 0 && m.ServiceTimeMs > 0
		}, 5*time.Second, poll, "no reports seen in %s", filter)
	}

	// A dropped connection: the Will goes out, the Subscriber reconnects
	// (the application's OnConnectionUp sees it) and goes on.
	requireNone(t, status, "Will while connected")
	dropper.drop()
	require.Equal(t, "offline", next(t, status, 5*time.Second, "Will after the connection dropped"))
	require.Eventually(t, func() bool { return ups.Load() == 2 }, 5*time.Second, poll)
	require.Eventually(t, func() bool {
		tryPublish(t, pub, "u/2", clientsdk.PublishOptions{QoS: 1})
		return count("h") > 5
	}, 5*time.Second, 50*time.Millisecond, "nothing processed after the reconnection")
	select {
	case <-s.Done():
		t.Fatalf("stopped after a reconnection: %v", s.Err())
	default:
	}
	require.NoError(t, s.Err())

	// The application declines to reconnect: the Subscriber stops for good.
	reconnect.Store(false)
	dropper.drop()
	require.Equal(t, "offline", next(t, status, 5*time.Second, "second Will"))
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after OnConnectionDown declined to reconnect")
	}
	require.ErrorContains(t, s.Err(), "OnConnectionDown declined to reconnect")
	require.Equal(t, int32(2), dropper.dials.Load(), "no reconnection")
	require.NoError(t, s.Close(context.Background()), "Close after a stop")
}

// A subscription the broker refuses fails Start, closes Done and is Err.
func TestSubscriberRefusedSubscriptionIsPermanent(t *testing.T) {
	b := startBroker(t, "127.0.0.1:0", time.Second)
	cfg, _ := subscriberConfig(t, b.MQTTAddr(), "w-refused", fixedWork(time.Millisecond))
	cfg.Filters = []string{"$luffy/load"} // the broker's own topic: refused
	s, err := clientsdk.NewSubscriber(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = s.Start(ctx)
	require.ErrorContains(t, err, "refused")
	select {
	case <-s.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("Done not closed")
	}
	require.Equal(t, err, s.Err())
}
