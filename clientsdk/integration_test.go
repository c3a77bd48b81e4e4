package clientsdk_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/clientsdk"
)

func TestReportsReachTheBroker(t *testing.T) {
	for _, via := range []clientsdk.ReportChannel{clientsdk.ReportViaPingreq, clientsdk.ReportViaPublish} {
		t.Run(string(via), func(t *testing.T) {
			b := startBroker(t, "127.0.0.1:0", 200*time.Millisecond)
			cfg, _ := subscriberConfig(t, b.MQTTAddr(), "w-"+string(via), fixedWork(5*time.Millisecond))
			cfg.ReportVia = via
			s := startSubscriber(t, cfg)
			pub := startPublisher(t, b.MQTTAddr())
			publish(t, pub, "t/1", 10, clientsdk.PublishOptions{})

			require.Eventually(t, func() bool { return s.Stats().Processed == 10 }, 5*time.Second, poll)
			var m broker.MemberStatus
			require.Eventually(t, func() bool {
				var ok bool
				m, ok = member(t, b, shareGT, cfg.ClientID)
				return ok && m.Reports > 0 && m.ProcessingTimeMs > 0 && m.LastReportAgeMs != nil
			}, 5*time.Second, poll, "the broker never showed a report from the member")
			// processing_time_ms is the thesis's mean of the last five reports,
			// zeros of idle periods included; service_time_ms skips them.
			require.InDelta(t, 5, m.ServiceTimeMs, 4.5, "reported processing time")
			require.Equal(t, 1, m.Workers)
			require.Less(t, *m.LastReportAgeMs, 1000.0)
			require.Equal(t, via, s.Stats().ReportVia, "no fallback against LuffyMQ")
			require.Eventually(t, func() bool {
				m, ok := member(t, b, shareGT, cfg.ClientID)
				return ok && m.Reports == s.Stats().ReportsSent
			}, 3*time.Second, poll, "the broker counts each report once")
		})
	}
}

func TestReportsOffSendsNothing(t *testing.T) {
	b := startBroker(t, "127.0.0.1:0", 100*time.Millisecond)
	cfg, _ := subscriberConfig(t, b.MQTTAddr(), "w-off", fixedWork(time.Millisecond))
	cfg.ReportVia = clientsdk.ReportOff
	s := startSubscriber(t, cfg)
	pub := startPublisher(t, b.MQTTAddr())
	publish(t, pub, "t/1", 5, clientsdk.PublishOptions{})
	require.Eventually(t, func() bool { return s.Stats().Processed == 5 }, 5*time.Second, poll)
	require.Never(t, func() bool {
		m, ok := member(t, b, shareGT, cfg.ClientID)
		return !ok || m.Reports > 0
	}, 400*time.Millisecond, 50*time.Millisecond)
	require.Zero(t, s.Stats().ReportsSent)
}

func TestFirstMeasurementIsReportedAtOnce(t *testing.T) {
	b := startBroker(t, "127.0.0.1:0", time.Hour) // no periodic report within the test
	cfg, _ := subscriberConfig(t, b.MQTTAddr(), "w-first", fixedWork(20*time.Millisecond))
	s := startSubscriber(t, cfg)
	pub := startPublisher(t, b.MQTTAddr())
	publish(t, pub, "t/1", 1, clientsdk.PublishOptions{})
	require.Eventually(t, func() bool {
		m, ok := member(t, b, shareGT, cfg.ClientID)
		return ok && m.Reports >= 1 && m.ProcessingTimeMs >= 15
	}, 3*time.Second, poll)
	require.Equal(t, time.Hour, s.Stats().ReportInterval)
}

func TestFollowsTheBrokersReportInterval(t *testing.T) {
	b := startBroker(t, "127.0.0.1:0", 300*time.Millisecond)
	cfg, _ := subscriberConfig(t, b.MQTTAddr(), "w-interval", fixedWork(time.Millisecond))
	s := startSubscriber(t, cfg)
	require.Equal(t, 300*time.Millisecond, s.Stats().ReportInterval)

	require.Eventually(t, func() bool {
		m, ok := member(t, b, shareGT, cfg.ClientID)
		return ok && m.LastReportAgeMs != nil
	}, 3*time.Second, poll)
	first := s.Stats().ReportsSent
	start := time.Now()
	maxAge := 0.0
	require.Eventually(t, func() bool {
		if m, ok := member(t, b, shareGT, cfg.ClientID); ok && m.LastReportAgeMs != nil {
			maxAge = max(maxAge, *m.LastReportAgeMs)
		}
		return s.Stats().ReportsSent >= first+5
	}, 5*time.Second, poll)
	elapsed := time.Since(start)
	// Five more reports at 300 ms take about 1.5 s; at the 1 s default
	// they would take about 5 s.
	require.Greater(t, elapsed, 1100*time.Millisecond)
	require.Less(t, elapsed, 2500*time.Millisecond)
	require.Less(t, maxAge, 700.0, "the broker never went much longer than the interval without a report")
}

func TestReportingResumesAfterBrokerRestart(t *testing.T) {
	b1 := startBroker(t, "127.0.0.1:0", 200*time.Millisecond)
	addr := b1.MQTTAddr()
	cfg, _ := subscriberConfig(t, addr, "w-restart", fixedWork(2*time.Millisecond))
	s := startSubscriber(t, cfg)
	require.Eventually(t, func() bool {
		m, ok := member(t, b1, shareGT, cfg.ClientID)
		return ok && m.Reports > 0
	}, 3*time.Second, poll)
	require.NoError(t, b1.Close())

	// A new broker on the same port.
	var b2 *broker.Broker
	require.Eventually(t, func() bool {
		nb, err := broker.New(broker.Config{MQTTListen: addr, HTTPListen: "127.0.0.1:0", Strategy: "adaptive", ReportInterval: 200 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Logf("broker.New: %v", err)
			return false
		}
		if err := nb.Start(); err != nil {
			_ = nb.Close()
			return false
		}
		b2 = nb
		return true
	}, 5*time.Second, 50*time.Millisecond, "port %s not free again", addr)
	t.Cleanup(func() { _ = b2.Close() })

	pub := startPublisher(t, addr)
	require.Eventually(t, func() bool {
		tryPublish(t, pub, "t/again", clientsdk.PublishOptions{})
		m, ok := member(t, b2, shareGT, cfg.ClientID)
		return ok && m.Reports > 0 && m.ProcessingTimeMs > 0 && s.Stats().Processed > 0
	}, 8*time.Second, 50*time.Millisecond, "no reports or messages after the restart")
	require.Equal(t, clientsdk.ReportViaPingreq, s.Stats().ReportVia, "a restart is not a rejection")
}

func TestQoS1IsAcknowledgedOnlyAfterTheHandler(t *testing.T) {
	b := startBroker(t, "127.0.0.1:0", 200*time.Millisecond)
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	cfg, _ := subscriberConfig(t, b.MQTTAddr(), "w-ack", func(ctx context.Context, _ *clientsdk.Message) error {
		started <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	cfg.QoS = 1
	s := startSubscriber(t, cfg)
	pub := startPublisher(t, b.MQTTAddr())
	publish(t, pub, "t/1", 1, clientsdk.PublishOptions{QoS: 1})

	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("handler not called")
	}
	unacked := func() int {
		cl, ok := b.Server().Clients.Get(cfg.ClientID)
		if !ok {
			return -1
		}
		return cl.State.Inflight.Len()
	}
	require.Eventually(t, func() bool {
		m, ok := member(t, b, shareGT, cfg.ClientID)
		return ok && m.InFlight == 1
	}, 3*time.Second, poll, "the broker should count the message as in flight")
	// Acknowledgements are flushed every millisecond: an early one would
	// show within this window.
	require.Never(t, func() bool { return unacked() != 1 }, 300*time.Millisecond, poll)

	close(release)
	require.Eventually(t, func() bool { return unacked() == 0 }, 3*time.Second, poll)
	require.Eventually(t, func() bool {
		m, ok := member(t, b, shareGT, cfg.ClientID)
		return ok && m.InFlight == 0
	}, 3*time.Second, poll)
	require.Equal(t, uint64(1), s.Stats().Processed)
}

func TestFailedMessagesAreDeadLettered(t *testing.T) {
	b := startBroker(t, "127.0.0.1:0", 200*time.Millisecond)
	got := make(chan *clientsdk.Message, 1)
	watchCfg, _ := subscriberConfig(t, b.MQTTAddr(), "dlq-watch", func(_ context.Context, m *clientsdk.Message) error {
		got <- m
		return nil
	})
	watchCfg.Group, watchCfg.Filters, watchCfg.QoS = "watch", []string{"dlq/g"}, 1
	startSubscriber(t, watchCfg)

	var calls atomic.Int32
	cfg, _ := subscriberConfig(t, b.MQTTAddr(), "w-fail", func(context.Context, *clientsdk.Message) error {
		calls.Add(1)
		return errors.New("database unavailable")
	})
	cfg.QoS, cfg.RetryBackoff = 1, 10*time.Millisecond
	s := startSubscriber(t, cfg)
	pub := startPublisher(t, b.MQTTAddr())
	before := time.Now()
	require.NoError(t, pub.Publish(context.Background(), "t/orders", []byte("order 42"), clientsdk.PublishOptions{
		QoS: 1, ContentType: "text/plain", UserProperties: []clientsdk.UserProperty{{Key: "tenant", Value: "acme"}},
	}))

	var m *clientsdk.Message
	select {
	case m = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("nothing reached the dead-letter topic")
	}
	require.Equal(t, "dlq/g", m.Topic)
	require.Equal(t, "order 42", string(m.Payload))
	require.Equal(t, "text/plain", m.ContentType)
	prop := func(k string) string {
		v, ok := m.UserProperty(k)
		require.True(t, ok, "dead-lettered message lacks %s", k)
		return v
	}
	require.Equal(t, "3", prop(clientsdk.AttemptsProperty))
	require.Equal(t, "database unavailable", prop(clientsdk.ErrorProperty))
	require.Equal(t, "t/orders", prop(clientsdk.OriginalTopicProperty))
	require.Equal(t, "acme", prop("tenant"))
	require.NotEmpty(t, m.ID, "the publisher's message ID travels along")
	first, err := time.Parse(time.RFC3339Nano, prop(clientsdk.FirstFailureProperty))
	require.NoError(t, err)
	require.WithinRange(t, first, before, time.Now())

	require.Equal(t, int32(3), calls.Load())
	require.Eventually(t, func() bool { return s.Stats().DeadLettered == 1 }, 3*time.Second, poll)
	st := s.Stats()
	require.Equal(t, uint64(1), st.Failed)
	require.Equal(t, uint64(2), st.Retries)
	require.Zero(t, st.Processed)
	require.Eventually(t, func() bool {
		cl, ok := b.Server().Clients.Get(cfg.ClientID)
		return ok && cl.State.Inflight.Len() == 0
	}, 3*time.Second, poll, "the failed message is acknowledged once dead-lettered")
}

func TestCloseFinishesReceivedWork(t *testing.T) {
	b := startBroker(t, "127.0.0.1:0", 200*time.Millisecond)
	cfg, _ := subscriberConfig(t, b.MQTTAddr(), "w-close", fixedWork(50*time.Millisecond))
	cfg.QoS = 1
	s, err := clientsdk.NewSubscriber(cfg)
	require.NoError(t, err)
	require.NoError(t, s.Start(context.Background()))
	pub := startPublisher(t, b.MQTTAddr())
	publish(t, pub, "t/1", 6, clientsdk.PublishOptions{QoS: 1})
	require.Eventually(t, func() bool { return s.Stats().Received == 6 }, 5*time.Second, poll)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s.Close(ctx))
	st := s.Stats()
	require.Equal(t, uint64(6), st.Processed, "received messages are processed before disconnecting")
	require.Zero(t, st.Pending)
	require.Eventually(t, func() bool {
		_, ok := member(t, b, shareGT, cfg.ClientID)
		return !ok
	}, 3*time.Second, poll, "the member left the group")
}

func TestCloseGivesUpWhenContextEnds(t *testing.T) {
	b := startBroker(t, "127.0.0.1:0", 200*time.Millisecond)
	cancelled := make(chan struct{})
	started := make(chan struct{}, 1)
	cfg, _ := subscriberConfig(t, b.MQTTAddr(), "w-abandon", func(ctx context.Context, _ *clientsdk.Message) error {
		started <- struct{}{}
		<-ctx.Done()
		close(cancelled)
		return ctx.Err()
	})
	cfg.QoS = 1
	s, err := clientsdk.NewSubscriber(cfg)
	require.NoError(t, err)
	require.NoError(t, s.Start(context.Background()))
	pub := startPublisher(t, b.MQTTAddr())
	publish(t, pub, "t/1", 1, clientsdk.PublishOptions{QoS: 1})
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("handler not called")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = s.Close(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	select {
	case <-cancelled:
	case <-time.After(3 * time.Second):
		t.Fatal("the handler's context was not cancelled")
	}
	st := s.Stats()
	require.Zero(t, st.Processed)
	require.Zero(t, st.Failed, "an abandoned message is neither failed nor dead-lettered")
}

func TestFullQueuePushesBackWithoutDropping(t *testing.T) {
	b := startBroker(t, "127.0.0.1:0", 200*time.Millisecond)
	release := make(chan struct{})
	cfg, _ := subscriberConfig(t, b.MQTTAddr(), "w-full", func(ctx context.Context, _ *clientsdk.Message) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	cfg.QueueCapacity = 2
	s := startSubscriber(t, cfg)
	pub := startPublisher(t, b.MQTTAddr())
	publish(t, pub, "t/1", 20, clientsdk.PublishOptions{})

	// Pending: two in the queue and the one whose hand-over blocks (it is
	// received and waits like them).
	require.Eventually(t, func() bool { return s.Stats().Pending == 3 }, 3*time.Second, poll)
	// One in the handler, three pending, at most a few more in paho's own
	// receive buffer (sized by the same Receive Maximum): reading has
	// stopped.
	require.Never(t, func() bool { return s.Stats().Received > 6 }, 300*time.Millisecond, poll)

	close(release)
	require.Eventually(t, func() bool { return s.Stats().Processed == 20 }, 5*time.Second, poll, "every message is processed")
	require.Zero(t, s.Stats().Dropped)
}

func TestFallsBackToPublishWhenBrokerClosesOnExtendedPingreq(t *testing.T) {
	b := startBroker(t, "127.0.0.1:0", 100*time.Millisecond)
	proxy := startStrictProxy(t, b.MQTTAddr())
	cfg, logs := subscriberConfig(t, proxy.addr(), "w-strict", fixedWork(2*time.Millisecond))
	s := startSubscriber(t, cfg)
	pub := startPublisher(t, b.MQTTAddr())

	// The first measurement is reported at once by extended PINGREQ; the
	// strict broker closes the connection on it.
	publish(t, pub, "t/1", 1, clientsdk.PublishOptions{})
	require.Eventually(t, func() bool { return s.Stats().ReportVia == clientsdk.ReportViaPublish }, 5*time.Second, poll, "no fallback")
	require.Equal(t, int32(1), proxy.rejected.Load())
	require.Equal(t, 1, logs.count("reporting load by PUBLISH"), "the fallback is logged once")

	// Reports now reach the broker by PUBLISH, messages flow, and the
	// connection holds.
	require.Eventually(t, func() bool {
		tryPublish(t, pub, "t/2", clientsdk.PublishOptions{})
		m, ok := member(t, b, shareGT, cfg.ClientID)
		return ok && m.Reports > 0 && m.ProcessingTimeMs > 0 && proxy.loadPublishes.Load() > 0
	}, 5*time.Second, 20*time.Millisecond, "no report by PUBLISH after the fallback")
	processed := s.Stats().Processed
	publish(t, pub, "t/3", 10, clientsdk.PublishOptions{QoS: 1})
	require.Eventually(t, func() bool { return s.Stats().Processed >= processed+10 }, 5*time.Second, poll)
	loads := proxy.loadPublishes.Load()
	require.Eventually(t, func() bool { return proxy.loadPublishes.Load() >= loads+3 }, 3*time.Second, poll)
	require.Equal(t, int32(1), proxy.rejected.Load(), "no more extended PINGREQs")
	require.Equal(t, 1, logs.count("connection to broker lost"), "only the first connection was lost")
	require.Equal(t, 1, logs.count("reporting load by PUBLISH"))
}
