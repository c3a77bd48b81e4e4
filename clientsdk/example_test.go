package clientsdk_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	"github.com/luffymq/luffymq/clientsdk"
)

// A worker in the shared group "g" that processes four messages at once and
// acknowledges each QoS 1 message when its handler returns.
func ExampleSubscriber() {
	sub, err := clientsdk.NewSubscriber(clientsdk.SubscriberConfig{
		ConnectionConfig: clientsdk.ConnectionConfig{
			Brokers:  []string{"mqtt://localhost:1883"},
			ClientID: "worker-1",
		},
		Group:   "g",
		Filters: []string{"sensors/#"},
		QoS:     1,
		Workers: 4,
		Handler: func(ctx context.Context, m *clientsdk.Message) error {
			fmt.Printf("%s: %s\n", m.Topic, m.Payload)
			return nil // an error retries, then dead-letters to dlq/g
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := sub.Start(ctx); err != nil {
		log.Fatal(err)
	}
	<-ctx.Done()

	closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sub.Close(closeCtx); err != nil {
		log.Print(err)
	}
}

// A publisher that stamps each message with its send time, so subscribers
// can measure end-to-end latency with SentAt.
func ExamplePublisher() {
	pub, err := clientsdk.NewPublisher(clientsdk.PublisherConfig{
		ConnectionConfig: clientsdk.ConnectionConfig{Brokers: []string{"mqtt://localhost:1883"}},
		StampSentAt:      true,
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := pub.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer pub.Close(context.Background())
	err = pub.Publish(ctx, "sensors/1/temp", []byte(`{"value":21.5}`), clientsdk.PublishOptions{
		QoS:           1,
		MessageExpiry: time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}
}

func ExampleSentAt() {
	m := &clientsdk.Message{UserProperties: []clientsdk.UserProperty{
		{Key: clientsdk.SentAtProperty, Value: "1700000000000000000"},
	}}
	received := time.Unix(1700000000, 2_500_000)
	if sent, ok := clientsdk.SentAt(m); ok {
		fmt.Println("latency:", received.Sub(sent))
	}
	// Output: latency: 2.5ms
}

func ExampleParseServiceTime() {
	for _, s := range []string{"25ms", "exp:25ms", "uniform:10ms-40ms"} {
		st, err := clientsdk.ParseServiceTime(s)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(st, "mean", st.Mean())
	}
	// Output:
	// 25ms mean 25ms
	// exp:25ms mean 25ms
	// uniform:10ms-40ms mean 25ms
}

// Three messages that were all waiting start back to back on the virtual
// schedule, however late the emulating goroutine wakes.
func ExampleServiceEmulator() {
	e := &clientsdk.ServiceEmulator{ServiceTime: clientsdk.FixedServiceTime(time.Millisecond)}
	ready := time.Now().Add(-time.Second) // all three were queued a second ago
	for range 3 {
		start, err := e.Serve(context.Background(), ready, time.Millisecond)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("starts", start.Sub(ready), "after it was ready")
	}
	// Output:
	// starts 0s after it was ready
	// starts 1ms after it was ready
	// starts 2ms after it was ready
}
