package bridge_test

import (
	"context"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/internal/mqtttest"
)

// TestWorkQueuePullsAsSoonAsMemberFree measures, end to end through
// broker.New and RabbitMQ, how long a work queue's only member (5 ms a
// message) idles between acknowledging one message and receiving the next
// while the queue still holds messages. The pull loop is woken by the
// member's PUBACK; a loop that is not woken, or that wakes before the
// selection engine counted the PUBACK, sees the member still busy and
// sleeps 10 ms before looking again. Two basic.gets and an injection take
// about a millisecond on a loopback node.
//
// Measured on 2 shared cores with -race, alone: mean gap 1.6 ms, median
// 1.4 ms, 1–2 gaps of 9 ms or more in 199. With the wake hook removed the
// loop still finds most messages soon: mean 2.3–2.8 ms, median 1.6–1.8
// ms, 9–10 long gaps (why so few wait out the 10 ms look was not looked
// into). Under make test, where other packages' RabbitMQ nodes share the
// two cores, working paths measured mean 4.98 ms, median 3.09 ms and 14
// long gaps (one gap of 94 ms: a stall of the whole machine), and on the
// CI machine mean 4.61 ms, median 3.24 ms and 22 long gaps. So this
// end-to-end test guards only that the pull path does not wait out the
// loop's 10 ms look as a rule: a median gap under 6 ms and at most a
// quarter of the gaps at 9 ms or more (the mean is logged). That the wake
// comes after the selection engine counted the PUBACK is proven
// deterministically by TestWakeAfterSelectionCounted.
func TestWorkQueuePullsAsSoonAsMemberFree(t *testing.T) {
	const g = "wqwake"
	share := "$share/" + g + "/" + g + "jobs/#"
	b := startWQBroker(t, sharedNodes(t), "berlin", "wqwake", share, bridge.WorkQueueConfig{
		MaxLengthPerMember: 1000,
		TTLPerMember:       30 * time.Second, // nothing overflows: only the pull loop is measured
		RetuneInterval:     100 * time.Millisecond,
	})
	require.Eventually(t, b.Bridge().Connected, 30*time.Second, 20*time.Millisecond)

	// The whole burst is in wq.<g> before the member joins.
	const count = 200
	pub := mqtttest.ConnectRecorder(t, b.MQTTAddr(), g+"-pub")
	for i := range count {
		pub.MustSend(t, &paho.Publish{Topic: g + "jobs/x", QoS: 1, Payload: []byte(strconv.Itoa(i))})
	}
	require.Eventually(t, func() bool {
		exported, _ := b.Bridge().Counts()
		return exported[bridge.WorkQueueName(g)] == count
	}, 10*time.Second, 10*time.Millisecond, "the burst did not reach wq.%s", g)

	// The member acknowledges each message as soon as its handler returns
	// (paho's automatic PUBACK), after 5 ms of work.
	const service = 5 * time.Millisecond
	var mu sync.Mutex
	var received, finished []time.Time
	joinMember(t, b.MQTTAddr(), g+"-member", share, func() {
		start := time.Now()
		time.Sleep(service)
		mu.Lock()
		received = append(received, start)
		finished = append(finished, time.Now())
		mu.Unlock()
	})
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(finished) == count
	}, 30*time.Second, 10*time.Millisecond, "the member did not get every message")

	mu.Lock()
	gaps := make([]time.Duration, 0, count-1)
	for i := 1; i < count; i++ {
		gaps = append(gaps, received[i].Sub(finished[i-1]))
	}
	total := finished[count-1].Sub(received[0])
	mu.Unlock()
	slices.Sort(gaps)
	median, p90, worst := gaps[len(gaps)/2], gaps[len(gaps)*9/10], gaps[len(gaps)-1]
	var sum time.Duration
	for _, d := range gaps {
		sum += d
	}
	mean := sum / time.Duration(len(gaps))
	long := 0 // gaps of a pull loop that slept 10 ms
	for _, d := range gaps {
		if d >= 9*time.Millisecond {
			long++
		}
	}
	t.Logf("%d messages of %v in %v; member idle between messages: mean %v, median %v, p90 %v, max %v, %d gaps of 9 ms or more",
		count, service, total.Round(time.Millisecond), mean.Round(10*time.Microsecond), median.Round(10*time.Microsecond),
		p90.Round(10*time.Microsecond), worst.Round(10*time.Microsecond), long)
	require.Less(t, median, 6*time.Millisecond, "median idle gap")
	require.LessOrEqual(t, long, count/4, "gaps of a pull loop that slept 10 ms")
}

// TestWorkQueueIdleLoopLeavesRabbitMQAlone checks that a work queue whose
// member waits for work, with nothing to take, costs its RabbitMQ node no
// basic.gets: the consume loop's arrival bells are consumers of both
// queues, so RabbitMQ hands over the next message the moment it comes.
// Before, the loop also looked at both queues at every round, every 10 to
// 50 ms (in a five-site run of luffy-bench sites the nodes were 7 times as
// busy as queue federation's). And the bells alone still bring a publish
// to the member at once.
func TestWorkQueueIdleLoopLeavesRabbitMQAlone(t *testing.T) {
	const g = "wqidle"
	share := "$share/" + g + "/" + g + "jobs/#"
	b := startWQBroker(t, sharedNodes(t), "berlin", "wqidle", share, bridge.WorkQueueConfig{
		MaxLengthPerMember: 1000,
		TTLPerMember:       30 * time.Second,
	})
	require.Eventually(t, b.Bridge().Connected, 30*time.Second, 20*time.Millisecond)

	received := make(chan time.Time, 4)
	joinMember(t, b.MQTTAddr(), g+"-member", share, func() { received <- time.Now() })

	emptyGets := func() uint64 { return b.Bridge().WorkQueueStats()[g].EmptyGets }
	require.Eventually(t, func() bool { return emptyGets() > 0 }, 10*time.Second, 10*time.Millisecond,
		"the consume loop never looked at its queues")
	time.Sleep(200 * time.Millisecond) // the bells are armed
	before := emptyGets()
	time.Sleep(2 * time.Second)
	idle := emptyGets() - before
	t.Logf("empty basic.gets in 2 s with the member idle: %d", idle)
	require.LessOrEqual(t, idle, uint64(4), "the idle consume loop polls RabbitMQ")

	pub := mqtttest.ConnectRecorder(t, b.MQTTAddr(), g+"-pub")
	sent := time.Now()
	pub.MustSend(t, &paho.Publish{Topic: g + "jobs/x", QoS: 1, Payload: []byte("one")})
	select {
	case at := <-received:
		t.Logf("publish to member: %v", at.Sub(sent).Round(10*time.Microsecond))
		require.Less(t, at.Sub(sent), time.Second, "the bells did not bring the publish at once")
	case <-time.After(10 * time.Second):
		t.Fatal("the member never got the publish")
	}

	// Each publish that rings the work queue's bell costs one basic.get
	// of that queue once taken (empty again); the intake's bell, still
	// armed, says the intake is empty without asking. Both gets at every
	// message would make 2 a publish.
	const spaced = 10
	before = emptyGets()
	for i := range spaced {
		pub.MustSend(t, &paho.Publish{Topic: g + "jobs/x", QoS: 1, Payload: []byte(strconv.Itoa(i))})
		select {
		case <-received:
		case <-time.After(10 * time.Second):
			t.Fatalf("the member never got publish %d", i)
		}
		time.Sleep(100 * time.Millisecond)
	}
	perPublish := float64(emptyGets()-before) / spaced
	t.Logf("empty basic.gets per publish to an idle member: %.1f", perPublish)
	require.LessOrEqual(t, perPublish, 1.5, "a bell's ring made the loop look at both queues")
}

// joinMember connects a plain paho.golang client as clientID, subscribes it
// to share at QoS 1, and runs process on each message it receives before
// paho acknowledges it. It leaves when the test ends.
func joinMember(t *testing.T, addr, clientID, share string, process func()) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	member := paho.NewClient(paho.ClientConfig{
		ClientID: clientID,
		Conn:     conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(paho.PublishReceived) (bool, error) {
				process()
				return true, nil
			},
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = member.Connect(ctx, &paho.Connect{ClientID: clientID, KeepAlive: 30, CleanStart: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = member.Disconnect(&paho.Disconnect{})
		_ = conn.Close()
	})
	_, err = member.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: share, QoS: 1}}})
	require.NoError(t, err)
}
