package broker

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/internal/testenv"
)

// queueGroupMembers returns the client IDs of the members of the shared
// group a $queue/<filter> subscription joins.
func queueGroupMembers(t *testing.T, b *Broker, filter string) []string {
	t.Helper()
	var ids []string
	for _, g := range getGroups(t, b).Groups {
		if g.Filter == QueueGroupFilterPrefix+filter {
			for _, m := range g.Members {
				ids = append(ids, m.ClientID)
			}
		}
	}
	return ids
}

// publishJobs publishes n QoS 1 messages "<prefix>-<i>" to topic.
func publishJobs(t *testing.T, pub *pahoClient, topic, prefix string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range n {
		_, err := pub.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: fmt.Appendf(nil, "%s-%d", prefix, i)})
		require.NoError(t, err)
	}
}

// payloads returns the payloads pc received.
func (pc *pahoClient) payloads() []string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	var out []string
	for _, p := range pc.received {
		out = append(out, string(p.Payload))
	}
	return out
}

// TestQueueSubscriptionIsASharedGroup: "$queue/jobs" (EMQX) joins the
// shared group $share/$queue/jobs: each message goes to exactly one
// member, the group is seen by the selection (round_robin here, an EMQX
// name too), and unsubscribing from "$queue/jobs" leaves it.
func TestQueueSubscriptionIsASharedGroup(t *testing.T) {
	b := startBroker(t, func(c *Config) { c.Strategy = "round_robin" })
	w1 := connectPaho(t, b.MQTTAddr(), "w1", nil)
	w1.subscribe(t, "$queue/jobs", 1)
	w2 := connectPaho(t, b.MQTTAddr(), "w2", nil)
	w2.subscribe(t, "$queue/jobs", 1)
	require.ElementsMatch(t, []string{"w1", "w2"}, queueGroupMembers(t, b, "jobs"))

	pub := connectPaho(t, b.MQTTAddr(), "publisher", nil)
	publishJobs(t, pub, "jobs", "a", 20)
	eventually(t, 5*time.Second, func() bool { return w1.count()+w2.count() == 20 })
	got := append(w1.payloads(), w2.payloads()...)
	for i := range 20 {
		require.Contains(t, got, fmt.Sprintf("a-%d", i))
	}
	require.Equal(t, 10, w1.count(), "round robin")
	require.Equal(t, 10, w2.count(), "round robin")
	for _, p := range append(w1.received, w2.received...) {
		require.Equal(t, "jobs", p.Topic)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ua, err := w1.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{"$queue/jobs"}})
	require.NoError(t, err)
	require.Equal(t, []byte{0}, ua.Reasons, "the subscription existed under its rewritten name")
	eventually(t, 5*time.Second, func() bool { return len(queueGroupMembers(t, b, "jobs")) == 1 })
	publishJobs(t, pub, "jobs", "b", 5)
	eventually(t, 5*time.Second, func() bool { return w2.count() == 15 })
	time.Sleep(100 * time.Millisecond)
	require.Equal(t, 10, w1.count(), "w1 left the group")

	// "$queue/" names no filter, and $queue cannot reach $luffy/ topics.
	sa, err := w1.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{
		{Topic: "$queue/", QoS: 0}, {Topic: "$queue/$luffy/#", QoS: 0}, {Topic: "$queue/other/+", QoS: 0},
	}})
	require.Error(t, err, "paho reports the refused filters")
	require.NotNil(t, sa)
	require.Equal(t, []byte{0x8F, 0x87, 0}, sa.Reasons)
}

// TestQueueSubscriptionWithMosquittoSub: two mosquitto_sub processes on
// "$queue/jobs" (MQTT 5 and 3.1.1) share the messages: each arrives once.
func TestQueueSubscriptionWithMosquittoSub(t *testing.T) {
	subBin := testenv.RequireBinary(t, "mosquitto_sub", "mosquitto-clients")
	b := startBroker(t, func(c *Config) { c.Strategy = "round-robin" })
	host, port, err := net.SplitHostPort(b.MQTTAddr())
	require.NoError(t, err)

	var (
		mu    sync.Mutex
		lines = map[string][]string{} // client ID → lines printed
	)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	for _, sub := range []struct{ id, version string }{{"mosq-v5", "mqttv5"}, {"mosq-v311", "mqttv311"}} {
		cmd := exec.CommandContext(ctx, subBin, "-V", sub.version, "-h", host, "-p", port, "-i", sub.id,
			"-q", "1", "-t", "$queue/jobs", "-v")
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		stderr := new(testenv.LockedBuffer)
		cmd.Stderr = stderr
		require.NoError(t, cmd.Start())
		wg.Add(1)
		go func() {
			defer wg.Done()
			scanner := bufio.NewScanner(stdout)
			for scanner.Scan() {
				mu.Lock()
				lines[sub.id] = append(lines[sub.id], scanner.Text())
				mu.Unlock()
			}
			_, _ = io.Copy(io.Discard, stdout)
			_ = cmd.Wait()
		}()
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("%s stderr: %s", sub.id, stderr.String())
			}
		})
	}
	eventually(t, 10*time.Second, func() bool { return len(queueGroupMembers(t, b, "jobs")) == 2 },
		"both mosquitto_sub processes joined $share/$queue/jobs")

	pub := connectPaho(t, b.MQTTAddr(), "publisher", nil)
	const n = 20
	publishJobs(t, pub, "jobs", "job", n)
	eventually(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(lines["mosq-v5"])+len(lines["mosq-v311"]) >= n
	}, "every message reached a member")
	time.Sleep(200 * time.Millisecond) // a duplicate would arrive by now
	mu.Lock()
	defer mu.Unlock()
	seen := map[string]int{}
	for id, ls := range lines {
		for _, l := range ls {
			topic, payload, ok := strings.Cut(l, " ")
			require.True(t, ok, "%s printed %q", id, l)
			require.Equal(t, "jobs", topic)
			seen[payload]++
		}
	}
	require.Len(t, seen, n)
	for payload, count := range seen {
		require.Equal(t, 1, count, "%s delivered once", payload)
	}
	require.NotEmpty(t, lines["mosq-v5"], "both members took messages")
	require.NotEmpty(t, lines["mosq-v311"], "both members took messages")
}
