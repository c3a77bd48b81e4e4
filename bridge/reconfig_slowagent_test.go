package bridge_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/internal/mqtttest"
	"github.com/luffymq/luffymq/internal/rabbitharness"
)

// TestReconfigSlowAgentLosesNothing moves an exchange's sync site while
// the old sync site's link from the publisher is connected but lags (its
// prefetch is 1, so it forwards about 20 of the 50 messages a second over
// its 22 ms link and the rest waits in its queue on the publisher's node),
// and while the publisher's conservation agent is slow: it starts on the
// old sync site's request only after that site stopped waiting for the
// answer (reply wait 3 s, agent held 8 s). Under machine load the same
// happens with requests waiting in line and slow management calls. The
// old sync site must keep the running link (removing it makes RabbitMQ
// delete its queue with the backlog) until the agent took what the queue
// holds; the new sync site's subscriber then misses nothing.
func TestReconfigSlowAgentLosesNothing(t *testing.T) {
	const (
		root      = "rcfgslow"
		replyWait = 3 * time.Second
		agentHold = 8 * time.Second
	)
	start := time.Now()
	h := sharedNodes(t)
	exchange := bridge.ExchangeName(root + "/#")
	var held atomic.Bool
	bridge.SetConservationForTest(t, replyWait, func(site, x string) {
		if site == rcOld && x == exchange && held.CompareAndSwap(false, true) {
			time.Sleep(agentHold)
		}
	})
	brokers := map[string]*broker.Broker{}
	for _, s := range testSites {
		fed := bridge.FederationConfig{MaxHops: rcMaxHop}
		if s == rcOld {
			fed.PrefetchCount = 1 // the old sync site's links lag
		}
		b, err := broker.New(broker.Config{
			MQTTListen:        "127.0.0.1:0",
			ReportInterval:    time.Second,
			Logger:            testLogger(t),
			AMQPURL:           h.Node(s).AMQPURL(),
			AMQPManagementURL: h.Node(s).ManagementURL(),
			Site:              s,
			Exports:           []string{root + "/#"},
			WorkQueue:         bridge.WorkQueueConfig{Federation: fed},
		})
		require.NoError(t, err)
		require.NoError(t, b.Start())
		t.Cleanup(func() { _ = b.Close() })
		brokers[s] = b
	}
	t.Cleanup(func() {
		for _, s := range testSites {
			_ = bridge.ApplyFederation(context.Background(), bridge.FederationConfig{
				ManagementURL: h.Node(s).ManagementURL(), Username: rabbitharness.User, Password: rabbitharness.Password,
				Exchanges: []bridge.ExchangeFederation{},
			})
		}
	})
	sub := subscribeStamped(t, brokers[rcNew].MQTTAddr(), "sub-"+root, root+"/#")
	sendSync(t, h, exchange, rcOld)
	waitSync(t, h, exchange, rcOld)
	pub := mqtttest.ConnectRecorder(t, brokers[rcPub].MQTTAddr(), "pub-"+root)
	probe := 0
	require.Eventually(t, func() bool {
		probe++
		payload := "warm-" + root + "-" + strconv.Itoa(probe)
		_ = pub.Send(&paho.Publish{Topic: root + "/warm", QoS: 1, Payload: []byte(payload)})
		deadline := time.Now().Add(2 * time.Second)
		for time.Now().Before(deadline) {
			if len(sub.got(payload)) > 0 {
				return true
			}
			time.Sleep(10 * time.Millisecond)
		}
		return false
	}, 45*time.Second, 10*time.Millisecond, "the new sync site's subscriber is reachable through the old sync site")

	stream := startSteadyPublisher(pub, root, rcRate)
	// The old link's queue on the publisher's node fills while the link
	// runs.
	rh, err := rabbithole.NewClient(h.Node(rcPub).ManagementURL(), rabbitharness.User, rabbitharness.Password)
	require.NoError(t, err)
	oldCluster := clusterName(t, h, rcOld)
	linkQueue := "federation: " + exchange + " -> " + oldCluster
	var backlog int
	require.Eventually(t, func() bool {
		q, err := rh.GetQueue("/", linkQueue)
		if err == nil {
			backlog = q.MessagesReady
		}
		return err == nil && q.Consumers == 1 && q.MessagesReady >= 60
	}, 20*time.Second, 100*time.Millisecond, "queue %q on %s holds a backlog while its link runs", linkQueue, rcPub)
	moveAt := time.Now()
	sendSync(t, h, exchange, rcNew)
	// Meanwhile the old link stays, and the metrics say so.
	var waited int64
	require.Eventually(t, func() bool {
		r := brokers[rcOld].Bridge().ReconfigStats()
		waited = max(waited, r.OldLinksWaiting)
		return r.LinksRemoved >= 1
	}, 90*time.Second, 50*time.Millisecond, "%s removes its link from %s", rcOld, rcPub)
	removedAt := time.Now()
	// An attempt that failed left old links in place, reported waiting
	// until the next attempt a second later. (A link may also go at the
	// first attempt: one that does not run then is removed at once and
	// its queue taken in the background.)
	oldStats := brokers[rcOld].Bridge().ReconfigStats()
	if oldStats.ConfigFailures > 0 {
		require.Positive(t, waited, "%s failed %d attempts but never reported an old link waiting", rcOld, oldStats.ConfigFailures)
	}
	waitSync(t, h, exchange, rcNew)
	time.Sleep(2 * time.Second)
	total := len(stream.stop(t))
	missing := func() []int {
		var m []int
		for i := 0; i < total; i++ {
			if len(sub.got(root+"-"+strconv.Itoa(i))) == 0 {
				m = append(m, i)
			}
		}
		return m
	}
	require.Eventually(t, func() bool { return len(missing()) == 0 }, 60*time.Second, 100*time.Millisecond,
		"%s misses %s of %d messages (the old link's queue held %d when the move began)",
		rcNew, stringer(func() string { return ranges(missing()) }), total, backlog)
	require.True(t, held.Load(), "the agent was held on %s's request", rcOld)
	// Once the configuration applied, no old link waits and nothing is
	// retried.
	require.Eventually(t, func() bool {
		r := brokers[rcOld].Bridge().ReconfigStats()
		return r.OldLinksWaiting == 0 && r.ConfigRetrying == 0
	}, 60*time.Second, 50*time.Millisecond, "%s still reports old links waiting or a configuration to retry: %+v", rcOld,
		stringer(func() string { return fmt.Sprintf("%+v", brokers[rcOld].Bridge().ReconfigStats()) }))
	pubStats := brokers[rcPub].Bridge().ReconfigStats()
	require.NotZero(t, pubStats.Conserved, "%s re-published what the old link's queue held", rcPub)
	dups := 0
	for i := 0; i < total; i++ {
		dups += max(0, len(sub.got(root+"-"+strconv.Itoa(i)))-1)
	}
	require.Zero(t, dups, "the importer drops re-published copies by message ID")
	t.Logf("sent %d, lost 0 at %s; the old link's queue held %d messages when the move began; %s removed the link %v after the move (reply wait %v, agent held %v; most old links reported waiting: %d, failed attempts %d); %s re-published %d, handled %d requests; test took %v",
		total, rcNew, backlog, rcOld, removedAt.Sub(moveAt).Round(time.Millisecond), replyWait, agentHold, waited, oldStats.ConfigFailures, rcPub, pubStats.Conserved,
		pubStats.RequestsHandled, time.Since(start).Round(time.Second))
}

// clusterName returns the cluster name of site's node.
func clusterName(t *testing.T, h *rabbitharness.Harness, site string) string {
	t.Helper()
	rh, err := rabbithole.NewClient(h.Node(site).ManagementURL(), rabbitharness.User, rabbitharness.Password)
	require.NoError(t, err)
	cn, err := rh.GetClusterName()
	require.NoError(t, err)
	return cn.Name
}

// ranges writes sorted integers as ranges ("3-7 9").
func ranges(xs []int) string {
	var b strings.Builder
	for i := 0; i < len(xs); {
		j := i
		for j+1 < len(xs) && xs[j+1] == xs[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		if i == j {
			fmt.Fprint(&b, xs[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", xs[i], xs[j])
		}
		i = j + 1
	}
	return fmt.Sprintf("%d (%s)", len(xs), b.String())
}
