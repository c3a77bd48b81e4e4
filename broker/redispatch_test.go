package broker

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"
)

// groupMember is a plain paho.golang client in a shared group that records
// every message it receives (by sequence number) and acknowledges only the
// first ackFirst of them: after that it holds what it gets, like a worker
// that hangs.
type groupMember struct {
	client *paho.Client
	conn   net.Conn

	mu       sync.Mutex
	received map[int]int // sequence number → times received
	dup      int         // deliveries with DUP set
	acked    map[int]bool
	held     int
}

func joinGroup(t *testing.T, addr, id, filter string, qos byte, ackFirst int, connectOpts ...func(*paho.Connect)) *groupMember {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	m := &groupMember{conn: conn, received: map[int]int{}, acked: map[int]bool{}}
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
			ack := len(m.acked) < ackFirst
			if ack {
				m.acked[seq] = true
			} else {
				m.held++
			}
			m.mu.Unlock()
			if ack {
				_ = m.client.Ack(pr.Packet)
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
	_, err = m.client.Connect(ctx, connect)
	require.NoError(t, err)
	_, err = m.client.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: qos}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return m
}

// crash drops the member's TCP connection without DISCONNECT.
func (m *groupMember) crash() { _ = m.conn.Close() }

func (m *groupMember) snapshot() (received map[int]int, acked map[int]bool, held, dup int) {
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
	return received, acked, m.held, m.dup
}

func publishSequence(t *testing.T, addr, topic string, qos byte, from, to int, every time.Duration) {
	t.Helper()
	pub := connectPaho(t, addr, fmt.Sprintf("pub-%d", from), nil)
	for i := from; i < to; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := pub.Publish(ctx, &paho.Publish{Topic: topic, QoS: qos, Payload: []byte(strconv.Itoa(i))})
		cancel()
		require.NoError(t, err)
		time.Sleep(every)
	}
}

// TestCrashedMembersMessagesGoToTheRestOfTheGroup: a member that took
// messages and never acknowledged them crashes (TCP closed, no
// DISCONNECT, clean session); every message it held reaches the other
// member, with DUP set, and nothing is lost or received twice by the
// survivor. QoS 1 and QoS 2.
func TestCrashedMembersMessagesGoToTheRestOfTheGroup(t *testing.T) {
	for _, qos := range []byte{1, 2} {
		t.Run(fmt.Sprintf("qos%d", qos), func(t *testing.T) {
			b := startBroker(t, nil)
			filter := "$share/g/rd/t"
			hanging := joinGroup(t, b.MQTTAddr(), "hanging", filter, qos, 20)
			survivor := joinGroup(t, b.MQTTAddr(), "survivor", filter, qos, 1<<30)

			const n = 300
			publishSequence(t, b.MQTTAddr(), "rd/t", qos, 0, n, time.Millisecond)
			_, _, held, _ := hanging.snapshot()
			require.Positive(t, held, "the hanging member holds unacknowledged messages")

			hanging.crash()
			_, hangingAcked, held, _ := hanging.snapshot()
			eventually(t, 10*time.Second, func() bool {
				got, _, _, _ := survivor.snapshot()
				return len(got)+len(hangingAcked) == n
			}, "every message is processed by someone")

			got, _, _, dup := survivor.snapshot()
			lost, twice := 0, 0
			for i := range n {
				if got[i] == 0 && !hangingAcked[i] {
					lost++
				}
				if got[i] > 1 {
					twice++
				}
			}
			redispatched := b.Selection().Redispatch.Redispatched.Load()
			t.Logf("QoS %d: hanging member acked %d and held %d; survivor got %d (%d with DUP); re-dispatched %d; lost %d; survivor got %d twice",
				qos, len(hangingAcked), held, len(got), dup, redispatched, lost, twice)
			require.Zero(t, lost)
			require.Zero(t, twice)
			require.Equal(t, uint64(held), redispatched)
			require.Equal(t, held, dup, "re-dispatched messages carry DUP")
			require.Contains(t, getMetrics(t, b), fmt.Sprintf("luffymq_redispatched_messages_total{outcome=\"delivered\"} %d\n", held))
			require.Equal(t, uint64(held), b.Overview().Redispatched)
		})
	}
}

// TestLastMembersMessagesWaitForTheNextMember: when the group's only
// member crashes holding messages, they wait (parked) and go to the next
// member that joins.
func TestLastMembersMessagesWaitForTheNextMember(t *testing.T) {
	b := startBroker(t, nil)
	filter := "$share/g/last/t"
	only := joinGroup(t, b.MQTTAddr(), "only", filter, 1, 0)
	publishSequence(t, b.MQTTAddr(), "last/t", 1, 0, 5, 0)
	eventually(t, 5*time.Second, func() bool {
		_, _, held, _ := only.snapshot()
		return held == 5
	}, "the only member holds all five")
	plain := connectPaho(t, b.MQTTAddr(), "plain", nil)
	plain.subscribe(t, "last/t", 1)
	only.crash()
	eventually(t, 5*time.Second, func() bool { return b.Selection().ParkedRedispatch() == 5 }, "the five wait for a member")

	next := joinGroup(t, b.MQTTAddr(), "next", filter, 1, 1<<30)
	eventually(t, 5*time.Second, func() bool {
		got, _, _, _ := next.snapshot()
		return len(got) == 5
	}, "the next member gets them")
	require.Zero(t, b.Selection().ParkedRedispatch())
	time.Sleep(100 * time.Millisecond)
	require.Zero(t, plain.count(), "a plain subscriber of the topic never gets a re-dispatched copy")
}

// persistent makes a CONNECT resume (or start) a session that outlives the
// connection by 5 minutes.
func persistent(resume bool) func(*paho.Connect) {
	return func(c *paho.Connect) {
		c.CleanStart = !resume
		expiry := uint32(300)
		c.Properties = &paho.ConnectProperties{SessionExpiryInterval: &expiry}
	}
}

// TestPersistentMembersMessagesGoAfterTheGrace: a member with a persistent
// session crashes holding messages; after --redispatch-grace they go to
// the survivor, and when the member comes back to its session it is not
// sent them again. Coming back within the grace, it gets its own
// unacknowledged messages (MQTT session semantics) and nothing is
// re-dispatched.
func TestPersistentMembersMessagesGoAfterTheGrace(t *testing.T) {
	const grace = 300 * time.Millisecond
	run := func(t *testing.T, comeBackAfter time.Duration) (held int, survivorGot, backGot map[int]int, redispatched uint64) {
		b := startBroker(t, func(c *Config) { c.RedispatchGrace = grace })
		filter := "$share/g/ps/t"
		hanging := joinGroup(t, b.MQTTAddr(), "hanging", filter, 1, 10, persistent(false))
		survivor := joinGroup(t, b.MQTTAddr(), "survivor", filter, 1, 1<<30)
		const n = 200
		publishSequence(t, b.MQTTAddr(), "ps/t", 1, 0, n, time.Millisecond)
		_, acked, held, _ := hanging.snapshot()
		require.Positive(t, held)
		hanging.crash()
		time.Sleep(comeBackAfter)
		back := joinGroup(t, b.MQTTAddr(), "hanging", filter, 1, 1<<30, persistent(true))
		eventually(t, 10*time.Second, func() bool {
			got, _, _, _ := survivor.snapshot()
			again, _, _, _ := back.snapshot()
			covered := 0
			for i := range n {
				if got[i] > 0 || again[i] > 0 || acked[i] {
					covered++
				}
			}
			return covered == n
		}, "every message is processed by someone")
		time.Sleep(2 * grace) // anything still to come would come now
		survivorGot, _, _, _ = survivor.snapshot()
		backGot, _, _, _ = back.snapshot()
		return held, survivorGot, backGot, b.Selection().Redispatch.Redispatched.Load()
	}

	t.Run("back after the grace", func(t *testing.T) {
		held, survivorGot, backGot, redispatched := run(t, 3*grace)
		require.Equal(t, uint64(held), redispatched)
		for seq, times := range backGot {
			require.Zero(t, survivorGot[seq], "message %d reached both the survivor and the returning member", seq)
			require.Equal(t, 1, times)
		}
		for _, times := range survivorGot {
			require.Equal(t, 1, times)
		}
	})
	t.Run("back within the grace", func(t *testing.T) {
		held, survivorGot, backGot, redispatched := run(t, 0)
		require.Zero(t, redispatched)
		require.GreaterOrEqual(t, len(backGot), held, "the member gets its own unacknowledged messages again")
		for seq := range backGot {
			require.Zero(t, survivorGot[seq], "message %d reached both", seq)
		}
	})
}
