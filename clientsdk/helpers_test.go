package clientsdk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/clientsdk"
)

// logBuffer collects a client's logs; the test prints them if it fails.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) count(s string) int { return strings.Count(b.String(), s) }

// testLogger returns a debug logger whose output is shown if t fails.
func testLogger(t *testing.T) (*slog.Logger, *logBuffer) {
	t.Helper()
	buf := &logBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("client logs:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})), buf
}

// startBroker starts a LuffyMQ broker on mqttAddr ("127.0.0.1:0" for any
// port) announcing the given report interval, and closes it after the test.
func startBroker(t *testing.T, mqttAddr string, interval time.Duration) *broker.Broker {
	t.Helper()
	b, err := broker.New(broker.Config{
		MQTTListen:     mqttAddr,
		HTTPListen:     "127.0.0.1:0",
		Strategy:       "adaptive",
		ReportInterval: interval,
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// member fetches GET /api/v1/groups and returns the member clientID of the
// group with the given filter. It does not fail the test (it runs inside
// polling conditions, off the test's goroutine): errors are logged and
// count as "not found".
func member(t *testing.T, b *broker.Broker, filter, clientID string) (broker.MemberStatus, bool) {
	resp, err := http.Get("http://" + b.HTTPAddr() + "/api/v1/groups")
	if err != nil {
		t.Logf("GET /api/v1/groups: %v", err)
		return broker.MemberStatus{}, false
	}
	defer resp.Body.Close()
	var groups broker.GroupsResponse
	if resp.StatusCode != http.StatusOK {
		t.Logf("GET /api/v1/groups: %s", resp.Status)
		return broker.MemberStatus{}, false
	}
	if err := json.NewDecoder(resp.Body).Decode(&groups); err != nil {
		t.Logf("GET /api/v1/groups: %v", err)
		return broker.MemberStatus{}, false
	}
	for _, g := range groups.Groups {
		if g.Filter != filter {
			continue
		}
		for _, m := range g.Members {
			if m.ClientID == clientID {
				return m, true
			}
		}
	}
	return broker.MemberStatus{}, false
}

// subscriberConfig returns a Subscriber configuration for tests.
func subscriberConfig(t *testing.T, addr, clientID string, handler clientsdk.Handler) (clientsdk.SubscriberConfig, *logBuffer) {
	logger, logs := testLogger(t)
	return clientsdk.SubscriberConfig{
		ConnectionConfig: clientsdk.ConnectionConfig{
			Brokers:          []string{"mqtt://" + addr},
			ClientID:         clientID,
			KeepAlive:        5 * time.Second,
			ConnectTimeout:   3 * time.Second,
			MaxReconnectWait: 200 * time.Millisecond,
			Logger:           logger,
		},
		Group:   "g",
		Filters: []string{"t/#"},
		Handler: handler,
	}, logs
}

// startSubscriber starts a Subscriber and closes it after the test.
func startSubscriber(t *testing.T, cfg clientsdk.SubscriberConfig) *clientsdk.Subscriber {
	t.Helper()
	s, err := clientsdk.NewSubscriber(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

// startPublisher starts a Publisher stamping send times and closes it after
// the test.
func startPublisher(t *testing.T, addr string) *clientsdk.Publisher {
	t.Helper()
	p, err := clientsdk.NewPublisher(clientsdk.PublisherConfig{
		ConnectionConfig: clientsdk.ConnectionConfig{
			Brokers:          []string{"mqtt://" + addr},
			MaxReconnectWait: 200 * time.Millisecond,
			Logger:           slog.New(slog.NewTextHandler(io.Discard, nil)),
		},
		StampSentAt:    true,
		StampMessageID: true,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = p.Close(ctx)
	})
	return p
}

// tryPublish sends one message, logging a failure; for polling conditions.
func tryPublish(t *testing.T, p *clientsdk.Publisher, topic string, opts clientsdk.PublishOptions) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := p.Publish(ctx, topic, []byte("x"), opts); err != nil {
		t.Logf("publish to %s: %v", topic, err)
	}
}

// publish sends n messages to topic.
func publish(t *testing.T, p *clientsdk.Publisher, topic string, n int, opts clientsdk.PublishOptions) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range n {
		require.NoError(t, p.Publish(ctx, topic, []byte{byte(i)}, opts))
	}
}

// fixedWork returns a drift-free handler that works d per message.
func fixedWork(d time.Duration) clientsdk.Handler {
	e := &clientsdk.ServiceEmulator{ServiceTime: clientsdk.FixedServiceTime(d)}
	return e.Handle
}

const (
	poll    = 10 * time.Millisecond
	shareGT = "$share/g/t/#"
)
