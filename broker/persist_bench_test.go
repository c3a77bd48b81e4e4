package broker

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/hooks/storage/badger"
	"github.com/mochi-mqtt/server/v2/hooks/storage/bolt"
	"github.com/mochi-mqtt/server/v2/hooks/storage/pebble"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
)

// BenchmarkPersistQoS1 compares Mochi's storage hooks, and LuffyMQ with
// and without --data-dir, on QoS 1 publish → deliver over loopback: four
// publishers on one connection, each waiting for its PUBACK, and one QoS 1
// subscriber that acknowledges on receipt. One op is one message delivered.
//
// Mochi handles one connection's packets one at a time, so with one
// publishing connection the journal has at most one publish waiting for its
// fsync and group commit cannot batch. The *-4conn cases give each of the
// four publishers its own connection, which is where group commit helps.
// Keep it small on a shared machine:
//
//	go test -run '^$' -bench BenchmarkPersistQoS1 -benchtime 2000x ./broker/
func BenchmarkPersistQoS1(b *testing.B) {
	mochiWith := func(add func(s *mqtt.Server, dir string) error) func(b *testing.B) string {
		return func(b *testing.B) string {
			s := mqtt.New(&mqtt.Options{Logger: discardLogger()})
			require.NoError(b, s.AddHook(new(auth.AllowHook), nil))
			if add != nil {
				require.NoError(b, add(s, b.TempDir()))
			}
			addr := persistBenchAddr(b)
			require.NoError(b, s.AddListener(listeners.NewTCP(listeners.Config{ID: "tcp", Address: addr})))
			require.NoError(b, s.Serve())
			b.Cleanup(func() { _ = s.Close() })
			return addr
		}
	}
	luffymq := func(persist, fsync bool) func(b *testing.B) string {
		return func(b *testing.B) string {
			cfg := Config{MQTTListen: "127.0.0.1:0", Logger: discardLogger(), Fsync: fsync}
			if persist {
				cfg.DataDir = b.TempDir()
			}
			br, err := New(cfg)
			require.NoError(b, err)
			require.NoError(b, br.Start())
			b.Cleanup(func() { _ = br.Close() })
			return br.MQTTAddr()
		}
	}
	cases := []struct {
		name  string
		start func(b *testing.B) string
	}{
		{"mochi-memory", mochiWith(nil)},
		{"mochi-badger", mochiWith(func(s *mqtt.Server, dir string) error {
			return s.AddHook(new(badger.Hook), &badger.Options{Path: dir, Options: badgerOptions(dir, false)})
		})},
		{"mochi-bolt", mochiWith(func(s *mqtt.Server, dir string) error {
			return s.AddHook(new(bolt.Hook), &bolt.Options{Path: filepath.Join(dir, "bolt.db"), Options: &bbolt.Options{Timeout: time.Second}})
		})},
		{"mochi-pebble-nosync", mochiWith(func(s *mqtt.Server, dir string) error {
			return s.AddHook(new(pebble.Hook), &pebble.Options{Path: dir, Mode: pebble.NoSync})
		})},
		{"mochi-pebble-sync", mochiWith(func(s *mqtt.Server, dir string) error {
			return s.AddHook(new(pebble.Hook), &pebble.Options{Path: dir, Mode: pebble.Sync})
		})},
		{"luffymq-memory", luffymq(false, false)},
		{"luffymq-data-dir", luffymq(true, false)},
		{"luffymq-data-dir-fsync", luffymq(true, true)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			addr := c.start(b)
			benchQoS1PublishDeliver(b, addr, 1)
		})
	}
	concurrent := []struct {
		name  string
		start func(b *testing.B) string
	}{
		{"luffymq-memory-4conn", luffymq(false, false)},
		{"luffymq-data-dir-4conn", luffymq(true, false)},
		{"luffymq-data-dir-fsync-4conn", luffymq(true, true)},
	}
	for _, c := range concurrent {
		b.Run(c.name, func(b *testing.B) {
			addr := c.start(b)
			benchQoS1PublishDeliver(b, addr, benchPublishers)
		})
	}
}

// benchPublishers is how many publishers benchQoS1PublishDeliver runs.
const benchPublishers = 4

// benchQoS1PublishDeliver publishes b.N QoS 1 messages to addr from
// benchPublishers publishers spread over connections connections (1 or
// benchPublishers) and waits until the subscriber has them all.
func benchQoS1PublishDeliver(b *testing.B, addr string, connections int) {
	var delivered atomic.Int64
	done := make(chan struct{})
	n := int64(b.N)
	sub := benchPaho(b, addr, "bench-sub", func(paho.PublishReceived) (bool, error) {
		if delivered.Add(1) == n {
			close(done)
		}
		return true, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := sub.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "bench/q", QoS: 1}}})
	cancel()
	require.NoError(b, err)
	pubs := make([]*paho.Client, connections)
	for i := range pubs {
		pubs[i] = benchPaho(b, addr, fmt.Sprintf("bench-pub-%d", i), nil)
	}
	payload := make([]byte, 64)

	b.ResetTimer()
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for i := range benchPublishers {
		pub := pubs[i%connections]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= n {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := pub.Publish(ctx, &paho.Publish{Topic: "bench/q", QoS: 1, Payload: payload})
				cancel()
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		b.Fatalf("delivered %d of %d", delivered.Load(), n)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
}

func benchPaho(b *testing.B, addr, id string, onPublish func(paho.PublishReceived) (bool, error)) *paho.Client {
	conn, err := net.Dial("tcp", addr)
	require.NoError(b, err)
	cfg := paho.ClientConfig{ClientID: id, Conn: conn}
	if onPublish != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){onPublish}
	}
	c := paho.NewClient(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true})
	require.NoError(b, err)
	b.Cleanup(func() { _ = c.Disconnect(&paho.Disconnect{}); _ = conn.Close() })
	return c
}

func persistBenchAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	addr := l.Addr().String()
	require.NoError(b, l.Close())
	return addr
}
