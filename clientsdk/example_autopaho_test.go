package clientsdk_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/clientsdk"
)

// exampleBroker is a LuffyMQ broker the examples run against, on free
// loopback ports; in a real program it is the broker's URL.
type exampleBroker struct {
	b *broker.Broker
}

func startExampleBroker() *exampleBroker {
	b, err := broker.New(broker.Config{
		MQTTListen:     "127.0.0.1:0",
		HTTPListen:     "127.0.0.1:0",
		Strategy:       "adaptive",
		ReportInterval: 100 * time.Millisecond,
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := b.Start(); err != nil {
		log.Fatal(err)
	}
	return &exampleBroker{b: b}
}

func (e *exampleBroker) url() *url.URL { return &url.URL{Scheme: "mqtt", Host: e.b.MQTTAddr()} }

func (e *exampleBroker) close() { _ = e.b.Close() }

// publish sends payloads to topic at QoS 1, one after the other.
func (e *exampleBroker) publish(topic string, payloads ...string) {
	pub, err := clientsdk.NewPublisher(clientsdk.PublisherConfig{
		ConnectionConfig: clientsdk.ConnectionConfig{Brokers: []string{e.url().String()}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := pub.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer pub.Close(ctx)
	for _, p := range payloads {
		if err := pub.Publish(ctx, topic, []byte(p), clientsdk.PublishOptions{QoS: 1}); err != nil {
			log.Fatal(err)
		}
	}
}

// awaitReports waits until GET /api/v1/groups shows a load report from
// clientID in the group with filter, and says whether it did within 5 s.
func (e *exampleBroker) awaitReports(filter, clientID string) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://" + e.b.HTTPAddr() + "/api/v1/groups")
		if err != nil {
			continue
		}
		var groups broker.GroupsResponse
		err = json.NewDecoder(resp.Body).Decode(&groups)
		resp.Body.Close()
		if err != nil {
			continue
		}
		for _, g := range groups.Groups {
			for _, m := range g.Members {
				if g.Filter == filter && m.ClientID == clientID && m.Reports > 0 && m.ServiceTimeMs > 0 {
					return true
				}
			}
		}
	}
	return false
}

// An autopaho program, Will message included, reports its load to LuffyMQ
// once it adds a LoadReporter: NewLoadReporter and Adopt. The handler's run
// time is the processing time it reports, in the keep-alive PINGREQs.
func ExampleLoadReporter_Adopt() {
	lm := startExampleBroker() // LuffyMQ on a free loopback port
	defer lm.close()

	subscribed := make(chan struct{}, 1)
	cfg := autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{lm.url()},
		KeepAlive:                     30,
		CleanStartOnInitialConnection: true,
		WillMessage:                   &paho.WillMessage{Topic: "status/worker-1", Payload: []byte("offline"), QoS: 1},
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			go func() {
				sub := &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "$share/workers/jobs/#", QoS: 1}}}
				if _, err := cm.Subscribe(context.Background(), sub); err == nil {
					subscribed <- struct{}{}
				}
			}()
		},
		ClientConfig: paho.ClientConfig{
			ClientID: "worker-1",
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				time.Sleep(10 * time.Millisecond) // the work
				fmt.Println("done:", string(pr.Packet.Payload))
				return true, nil
			}},
		},
	}

	// What the program adds to report its load.
	reporter, err := clientsdk.NewLoadReporter(clientsdk.LoadReporterConfig{})
	if err != nil {
		log.Fatal(err)
	}
	reporter.Adopt(&cfg)

	cm, err := autopaho.NewConnection(context.Background(), cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer cm.Disconnect(context.Background())
	<-subscribed

	lm.publish("jobs/resize", "job 1", "job 2", "job 3")
	for reporter.Stats().Processed < 3 {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("the broker has the worker's reports:", lm.awaitReports("$share/workers/jobs/#", "worker-1"))
	// Output:
	// done: job 1
	// done: job 2
	// done: job 3
	// the broker has the worker's reports: true
}

// A Subscriber built from an autopaho program's configuration keeps its Will
// message and callbacks, and serves two groups on one connection with one
// pending queue, one worker and one load report.
func ExampleSubscriber_autopaho() {
	lm := startExampleBroker() // LuffyMQ on a free loopback port
	defer lm.close()

	cfg := autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{lm.url()},
		KeepAlive:                     30,
		CleanStartOnInitialConnection: true,
		WillMessage:                   &paho.WillMessage{Topic: "status/worker-2", Payload: []byte("offline"), QoS: 1},
		ClientConfig:                  paho.ClientConfig{ClientID: "worker-2"},
	}
	sub, err := clientsdk.NewSubscriber(clientsdk.SubscriberConfig{
		ConnectionConfig: clientsdk.ConnectionConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		Autopaho:         &cfg,
		Groups: []clientsdk.GroupSubscription{
			{Group: "resizers", Filters: []string{"jobs/resize"}, QoS: 1},
			{Group: "mailers", Filters: []string{"jobs/mail"}, QoS: 1},
		},
		Handler: func(ctx context.Context, m *clientsdk.Message) error {
			time.Sleep(10 * time.Millisecond) // the work
			fmt.Printf("%s: %s\n", m.Group, m.Payload)
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sub.Start(ctx); err != nil {
		log.Fatal(err)
	}

	lm.publish("jobs/resize", "photo.jpg")
	lm.publish("jobs/mail", "welcome")
	for sub.Stats().Processed < 2 {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("the broker has the worker's reports:", lm.awaitReports("$share/mailers/jobs/mail", "worker-2"))
	if err := sub.Close(ctx); err != nil {
		log.Fatal(err)
	}
	<-sub.Done()
	fmt.Println("stopped; error:", sub.Err())
	// Output:
	// resizers: photo.jpg
	// mailers: welcome
	// the broker has the worker's reports: true
	// stopped; error: <nil>
}
