package broker

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"
)

// neverAck is the ackAfter of a member that never acknowledges.
const neverAck = time.Duration(-1)

// timedMember is a plain paho.golang shared-group member that acknowledges
// every message ackAfter after it arrives (at once for 0, never for
// neverAck), as a worker that processes each message for that long and
// acknowledges when done. It records what it received and what it
// acknowledged, by sequence number.
type timedMember struct {
	id     string
	client *paho.Client
	conn   net.Conn
	// sessionPresent is the CONNACK's: the broker resumed a session.
	sessionPresent bool

	mu       sync.Mutex
	received map[int]int
	dup      int
	acked    map[int]bool
}

// joinTimed connects a timedMember and subscribes it to filter (not if
// filter is empty).
func joinTimed(t *testing.T, addr, id, filter string, qos byte, ackAfter time.Duration, connectOpts ...func(*paho.Connect)) *timedMember {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	m := &timedMember{id: id, conn: conn, received: map[int]int{}, acked: map[int]bool{}}
	m.client = paho.NewClient(paho.ClientConfig{
		ClientID:                   id,
		Conn:                       conn,
		EnableManualAcknowledgment: true,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			seq, err := strconv.Atoi(string(pr.Packet.Payload))
			if err != nil {
				return true, err
			}
			m.mu.Lock()
			m.received[seq]++
			if pr.Packet.Duplicate() {
				m.dup++
			}
			m.mu.Unlock()
			if ackAfter < 0 {
				return true, nil
			}
			ack := func() {
				m.mu.Lock()
				m.acked[seq] = true
				m.mu.Unlock()
				_ = m.client.Ack(pr.Packet)
			}
			if ackAfter == 0 {
				ack()
			} else {
				time.AfterFunc(ackAfter, ack)
			}
			return true, nil
		}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	connect := &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true}
	for _, opt := range connectOpts {
		opt(connect)
	}
	connack, err := m.client.Connect(ctx, connect)
	require.NoError(t, err)
	m.sessionPresent = connack.SessionPresent
	if filter != "" {
		_, err = m.client.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: qos}}})
		require.NoError(t, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return m
}

func (m *timedMember) snapshot() (received map[int]int, acked map[int]bool, dup int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	received = make(map[int]int, len(m.received))
	for k, v := range m.received {
		received[k] = v
	}
	acked = make(map[int]bool, len(m.acked))
	for k := range m.acked {
		acked[k] = true
	}
	return received, acked, m.dup
}

// tally counts, over messages 0..n-1, those no member acknowledged (lost)
// and those acknowledged by more than one (processed twice).
func tally(n int, members ...*timedMember) (lost, twice int) {
	times := make([]int, n)
	for _, m := range members {
		_, acked, _ := m.snapshot()
		for seq := range acked {
			if seq >= 0 && seq < n {
				times[seq]++
			}
		}
	}
	for _, c := range times {
		if c == 0 {
			lost++
		}
		if c > 1 {
			twice++
		}
	}
	return lost, twice
}

// metricValue returns the value of the sample named by series (name and
// labels, as exposed) in the broker's /metrics, or "" if absent.
func metricValue(t *testing.T, b *Broker, series string) string {
	t.Helper()
	for _, line := range strings.Split(getMetrics(t, b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

// TestAckTimeoutRedispatchesAStalledMembersMessages: a member that takes
// messages and never acknowledges them, while staying connected, has each
// of them given to another member after --ack-timeout 1s, with DUP set and
// never back to it. Every message is processed (lost 0), none twice (the
// stalled member never finishes any), and the stalled member is still
// connected. QoS 1 (no PUBACK) and QoS 2 (no PUBREC).
func TestAckTimeoutRedispatchesAStalledMembersMessages(t *testing.T) {
	for _, qos := range []byte{1, 2} {
		t.Run(fmt.Sprintf("qos%d", qos), func(t *testing.T) {
			b := startBroker(t, func(c *Config) { c.AckTimeout = time.Second })
			filter := "$share/g/at/t"
			stalled := joinTimed(t, b.MQTTAddr(), "stalled", filter, qos, neverAck)
			w1 := joinTimed(t, b.MQTTAddr(), "w1", filter, qos, 0)
			w2 := joinTimed(t, b.MQTTAddr(), "w2", filter, qos, 0)

			const n = 200
			publishSequence(t, b.MQTTAddr(), "at/t", qos, 0, n, 2*time.Millisecond)
			eventually(t, 10*time.Second, func() bool {
				lost, _ := tally(n, stalled, w1, w2)
				return lost == 0
			}, "every message is processed by someone")

			held, _, _ := stalled.snapshot()
			_, _, dup1 := w1.snapshot()
			_, _, dup2 := w2.snapshot()
			lost, twice := tally(n, stalled, w1, w2)
			rd := &b.Selection().Redispatch
			t.Logf("QoS %d: stalled member held %d; re-dispatched on ack timeout %d (delivered %d); others got %d with DUP; lost %d, processed twice %d, late acks %d",
				qos, len(held), rd.AckTimeouts.Load(), rd.Redispatched.Load(), dup1+dup2, lost, twice, rd.LateAcks.Load())
			require.Positive(t, len(held), "the stalled member was given messages")
			require.Zero(t, lost)
			require.Zero(t, twice)
			for seq, times := range held {
				require.Equal(t, 1, times, "message %d went back to the stalled member", seq)
			}
			require.Equal(t, uint64(len(held)), rd.AckTimeouts.Load(), "each held message taken once")
			require.Equal(t, uint64(len(held)), rd.Redispatched.Load())
			require.Equal(t, len(held), dup1+dup2, "re-dispatched messages carry DUP")
			require.Zero(t, rd.LateAcks.Load())
			require.Equal(t, strconv.Itoa(len(held)), metricValue(t, b, `luffymq_redispatched_messages_total{outcome="ack_timeout"}`))

			cl, ok := b.Server().Clients.Get("stalled")
			require.True(t, ok)
			require.False(t, cl.Closed(), "the stalled member stays connected")
		})
	}
}

// TestAckTimeoutLateFinisherDuplicates: a member that takes 2 s to process
// each message, with --ack-timeout 1s, loses each message it is given to
// another member and then acknowledges it all the same: those messages are
// processed twice. The duplicates are counted by the broker
// (outcome="late_ack") exactly as the clients saw them, and bounded by what
// the ack timeout took; nothing is lost.
func TestAckTimeoutLateFinisherDuplicates(t *testing.T) {
	b := startBroker(t, func(c *Config) { c.AckTimeout = time.Second })
	filter := "$share/g/late/t"
	slow := joinTimed(t, b.MQTTAddr(), "slow", filter, 1, 2*time.Second)
	w1 := joinTimed(t, b.MQTTAddr(), "w1", filter, 1, 0)
	w2 := joinTimed(t, b.MQTTAddr(), "w2", filter, 1, 0)

	const n = 200
	publishSequence(t, b.MQTTAddr(), "late/t", 1, 0, n, 2*time.Millisecond)
	rd := &b.Selection().Redispatch
	eventually(t, 10*time.Second, func() bool {
		got, acked, _ := slow.snapshot()
		lost, twice := tally(n, slow, w1, w2)
		return lost == 0 && len(acked) == len(got) && uint64(twice) == rd.LateAcks.Load()
	}, "every message is processed, the slow member has finished its own, and the broker counted every duplicate")

	got, _, _ := slow.snapshot()
	lost, twice := tally(n, slow, w1, w2)
	t.Logf("slow member got %d; re-dispatched on ack timeout %d; lost %d, processed twice %d, late acks counted %d",
		len(got), rd.AckTimeouts.Load(), lost, twice, rd.LateAcks.Load())
	require.Positive(t, len(got))
	require.Zero(t, lost)
	require.Positive(t, twice, "the slow member finishes after the timeout: its messages are processed twice")
	require.LessOrEqual(t, uint64(twice), rd.AckTimeouts.Load(), "duplicates only from what the timeout took")
	require.LessOrEqual(t, twice, len(got))
	require.Equal(t, strconv.Itoa(twice), metricValue(t, b, `luffymq_redispatched_messages_total{outcome="late_ack"}`))
}

// TestAckTimeoutOffByDefault: without --ack-timeout, a stalled but
// connected member keeps what it was given: nothing is re-dispatched, and
// those messages are processed by nobody (what the option is for).
func TestAckTimeoutOffByDefault(t *testing.T) {
	b := startBroker(t, nil)
	require.Zero(t, b.cfg.AckTimeout)
	filter := "$share/g/off/t"
	stalled := joinTimed(t, b.MQTTAddr(), "stalled", filter, 1, neverAck)
	w1 := joinTimed(t, b.MQTTAddr(), "w1", filter, 1, 0)

	const n = 100
	publishSequence(t, b.MQTTAddr(), "off/t", 1, 0, n, 2*time.Millisecond)
	time.Sleep(2500 * time.Millisecond) // well past the 1 s the other tests use
	held, _, _ := stalled.snapshot()
	_, _, dup := w1.snapshot()
	lost, twice := tally(n, stalled, w1)
	rd := &b.Selection().Redispatch
	t.Logf("off: stalled member held %d; re-dispatched %d; lost %d, processed twice %d", len(held), rd.Redispatched.Load(), lost, twice)
	require.Positive(t, len(held))
	require.Zero(t, rd.AckTimeouts.Load())
	require.Zero(t, rd.Redispatched.Load())
	require.Zero(t, dup)
	require.Equal(t, len(held), lost, "what the stalled member holds waits with it")
	require.Equal(t, "0", metricValue(t, b, `luffymq_redispatched_messages_total{outcome="ack_timeout"}`))
}

// inflightOf returns how many packets are in flight in clientID's session.
func inflightOf(b *Broker, clientID string) int {
	cl, ok := b.Server().Clients.Get(clientID)
	if !ok {
		return 0
	}
	return cl.State.Inflight.Len()
}

// TestRedispatchedMessagesStayOutOfTheStoreAcrossRestart: with --data-dir,
// messages re-dispatched away from a persistent session are deleted from
// the store too, so after a restart the session's member is not sent them
// again: neither a member that crashed (re-dispatched after
// --redispatch-grace) nor one that stalled while connected (re-dispatched
// after --ack-timeout).
func TestRedispatchedMessagesStayOutOfTheStoreAcrossRestart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(*Config)
		leave func(*timedMember)
	}{
		{"member crashed", func(c *Config) { c.RedispatchGrace = 200 * time.Millisecond }, func(m *timedMember) { _ = m.conn.Close() }},
		{"member stalled", func(c *Config) { c.AckTimeout = 500 * time.Millisecond }, func(*timedMember) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			start := func() *Broker {
				return startBroker(t, func(c *Config) { c.DataDir = dir; tc.setup(c) })
			}
			b1 := start()
			filter := "$share/g/st/t"
			member := joinTimed(t, b1.MQTTAddr(), "member", filter, 1, neverAck, persistent(false))
			survivor := joinTimed(t, b1.MQTTAddr(), "survivor", filter, 1, 0)
			const n = 100
			publishSequence(t, b1.MQTTAddr(), "st/t", 1, 0, n, 2*time.Millisecond)
			held, _, _ := member.snapshot()
			require.Positive(t, len(held))
			tc.leave(member)
			eventually(t, 10*time.Second, func() bool {
				lost, _ := tally(n, member, survivor)
				return lost == 0 && inflightOf(b1, "survivor") == 0
			}, "the survivor processes everything and the broker has its acknowledgements")
			require.Equal(t, uint64(len(held)), b1.Selection().Redispatch.Redispatched.Load())
			require.NoError(t, b1.Close())
			_ = member.conn.Close()

			b2 := start()
			// No SUBSCRIBE: the restored session has the subscription.
			back := joinTimed(t, b2.MQTTAddr(), "member", "", 1, 0, persistent(true))
			require.True(t, back.sessionPresent, "the member's session was restored from the store")
			time.Sleep(time.Second) // a resumed session's messages are sent at once
			again, _, _ := back.snapshot()
			t.Logf("%s: held %d, re-dispatched %d, sent again to the member after the restart %d",
				tc.name, len(held), b1.Selection().Redispatch.Redispatched.Load(), len(again))
			require.Empty(t, again, "re-dispatched messages came back from the store")
		})
	}
}

// TestAckTimeoutSetting: --ack-timeout, the ack-timeout key of --config
// and LUFFYMQ_ACK_TIMEOUT set Config.AckTimeout; the default is 0 (off);
// a negative value is refused in one line naming it.
func TestAckTimeoutSetting(t *testing.T) {
	cfg, err := LoadConfig(nil, nil, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Zero(t, cfg.AckTimeout, "off by default")

	cfg, err = LoadConfig([]string{"--ack-timeout", "1500ms"}, nil, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 1500*time.Millisecond, cfg.AckTimeout)

	file := filepath.Join(t.TempDir(), "luffymq.yaml")
	require.NoError(t, os.WriteFile(file, []byte("ack-timeout: 2s\n"), 0o600))
	cfg, err = LoadConfig([]string{"--config", file}, nil, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 2*time.Second, cfg.AckTimeout)

	cfg, err = LoadConfig(nil, []string{"LUFFYMQ_ACK_TIMEOUT=3s"}, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, cfg.AckTimeout)

	_, err = LoadConfig([]string{"--ack-timeout", "-1s"}, nil, io.Discard, io.Discard)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Contains(t, err.Error(), "ack-timeout")
	require.NotContains(t, err.Error(), "\n")
}
