// Package mqtttest is a test helper: it connects paho.golang MQTT v5
// clients to a broker under test and fails the test when that does not
// work. Only _test.go files import it.
package mqtttest

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"
)

// Dial connects a paho.golang client to addr as clientID with a clean
// start and a 30 s keep-alive, then makes subscriptions; connecting and
// subscribing share one 5 s timeout. cfg configures the client apart from
// its ClientID and Conn, which Dial sets. The caller ends the connection.
func Dial(t testing.TB, addr, clientID string, cfg paho.ClientConfig, subscriptions ...paho.SubscribeOptions) (*paho.Client, net.Conn) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	cfg.ClientID = clientID
	cfg.Conn = conn
	c := paho.NewClient(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.Connect(ctx, &paho.Connect{ClientID: clientID, KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	if len(subscriptions) > 0 {
		_, err = c.Subscribe(ctx, &paho.Subscribe{Subscriptions: subscriptions})
		require.NoError(t, err)
	}
	return c, conn
}

// Connect is Dial, and disconnects the client and closes its connection
// when the test ends.
func Connect(t testing.TB, addr, clientID string, cfg paho.ClientConfig, subscriptions ...paho.SubscribeOptions) *paho.Client {
	t.Helper()
	c, conn := Dial(t, addr, clientID, cfg, subscriptions...)
	t.Cleanup(func() {
		_ = c.Disconnect(&paho.Disconnect{})
		_ = conn.Close()
	})
	return c
}

// Recorder is a connected paho.golang client that records every message
// it receives.
type Recorder struct {
	*paho.Client

	mu       sync.Mutex
	received []*paho.Publish
}

// ConnectRecorder connects a Recorder to addr as clientID (see Connect),
// subscribed to nothing yet.
func ConnectRecorder(t testing.TB, addr, clientID string) *Recorder {
	t.Helper()
	r := &Recorder{}
	r.Client = Connect(t, addr, clientID, paho.ClientConfig{
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				r.mu.Lock()
				r.received = append(r.received, pr.Packet)
				r.mu.Unlock()
				return true, nil
			},
		},
	})
	return r
}

// MustSubscribe subscribes to filter at qos, failing the test when the
// broker does not grant it within 5 s.
func (r *Recorder) MustSubscribe(t testing.TB, filter string, qos byte, retainAsPublished bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := r.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{
		{Topic: filter, QoS: qos, RetainAsPublished: retainAsPublished},
	}})
	require.NoError(t, err)
}

// MustSend is Send, failing the test on error.
func (r *Recorder) MustSend(t testing.TB, p *paho.Publish) {
	t.Helper()
	require.NoError(t, r.Send(p))
}

// Send publishes p and waits up to 10 s for its acknowledgement; it is
// safe off the test goroutine.
func (r *Recorder) Send(p *paho.Publish) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := r.Publish(ctx, p)
	return err
}

// Payloads returns how often each received payload starting with prefix
// was received.
func (r *Recorder) Payloads(prefix string) map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for _, p := range r.received {
		if s := string(p.Payload); strings.HasPrefix(s, prefix) {
			out[s]++
		}
	}
	return out
}

// Find returns the first received message with payload, or nil.
func (r *Recorder) Find(payload string) *paho.Publish {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.received {
		if string(p.Payload) == payload {
			return p
		}
	}
	return nil
}
