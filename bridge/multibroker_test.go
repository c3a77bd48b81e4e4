package bridge_test

import (
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/internal/mqtttest"
	"github.com/luffymq/luffymq/internal/rabbitharness"
	"github.com/luffymq/luffymq/internal/testenv"
)

// TestMultiBrokerPubSub runs two brokers at berlin (A, and B with a
// derived broker ID) beside one broker at tunis and one at montreal, all
// exporting mb/#: a publish at any broker reaches every subscriber of every
// broker once (B's plain subscriber and B's shared member among them).
func TestMultiBrokerPubSub(t *testing.T) {
	h := federatedNodes(t)
	sites := startSites(t, h, "mb/#", "mb/#", "mb/probe")
	a, tunis := sites["berlin"], sites["tunis"]
	b := startSite(t, "berlin", h.Node("berlin").AMQPURL(), "mb/#")
	idA, idB := a.broker.Bridge().BrokerID(), b.Bridge().BrokerID()
	require.NotEqual(t, idA, idB, "derived broker IDs differ")
	require.Equal(t, bridge.ImportQueueName("berlin", idB), b.Bridge().ImportQueue())

	bSub := mqtttest.ConnectRecorder(t, b.MQTTAddr(), "sub-berlin-b")
	bSub.MustSubscribe(t, "mb/#", 1, false)
	bMember := mqtttest.ConnectRecorder(t, b.MQTTAddr(), "member-berlin-b")
	bMember.MustSubscribe(t, "$share/mbg/mb/#", 1, false)
	// B's bindings propagate (to its import queue, and through federation
	// to tunis): probe every path that involves B until it carries.
	pubs := map[string]*mqtttest.Recorder{
		"berlin-a": mqtttest.ConnectRecorder(t, a.broker.MQTTAddr(), "pub-berlin-a"),
		"berlin-b": mqtttest.ConnectRecorder(t, b.MQTTAddr(), "pub-berlin-b"),
		"tunis":    mqtttest.ConnectRecorder(t, tunis.broker.MQTTAddr(), "pub-tunis"),
	}
	receivers := map[string]*mqtttest.Recorder{
		"berlin-a sub": a.client, "berlin-b sub": bSub, "berlin-b member": bMember,
		"tunis sub": tunis.client, "montreal sub": sites["montreal"].client,
	}
	for from, pub := range pubs {
		prefix := "mbprobe-" + from + "-"
		i := 0
		require.Eventually(t, func() bool {
			i++
			if pub.Send(&paho.Publish{Topic: "mb/probe", QoS: 1, Payload: []byte(prefix + strconv.Itoa(i))}) != nil {
				return false
			}
			for _, r := range receivers {
				if len(r.Payloads(prefix)) == 0 {
					return false
				}
			}
			return true
		}, 30*time.Second, 200*time.Millisecond, "probes from %s do not reach every broker", from)
	}

	const n = 60
	var wg sync.WaitGroup
	errs := make(chan error, len(pubs))
	for from, pub := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				if err := pub.Send(&paho.Publish{Topic: "mb/data", QoS: 1, Payload: []byte(fmt.Sprintf("mbrun-%s-%d", from, i))}); err != nil {
					errs <- err
					return
				}
			}
			errs <- pub.Send(&paho.Publish{Topic: "mb/data", QoS: 1, Payload: []byte("mbfence-" + from)})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	total := n * len(pubs)
	require.Eventually(t, func() bool {
		for _, r := range receivers {
			if len(r.Payloads("mbrun-")) != total || len(r.Payloads("mbfence-")) != len(pubs) {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "not every broker received every message: %v", stringer(func() string {
		out := ""
		for name, r := range receivers {
			out += fmt.Sprintf("%s %d/%d; ", name, len(r.Payloads("mbrun-")), total)
		}
		return out
	}))
	time.Sleep(500 * time.Millisecond) // a copy on a longer path would arrive by now
	for name, r := range receivers {
		got := r.Payloads("mbrun-")
		dups := 0
		for from := range pubs {
			for i := range n {
				c := got[fmt.Sprintf("mbrun-%s-%d", from, i)]
				require.NotZero(t, c, "%s lost mbrun-%s-%d", name, from, i)
				dups += c - 1
			}
		}
		t.Logf("%-16s received %d of %d (%d from each of %d brokers), duplicates %d", name, len(got), total, n, len(pubs), dups)
		require.Zero(t, dups, "duplicates at %s", name)
	}
	// The origin site travels as before; within the site, each broker has
	// the other's messages.
	require.Equal(t, "berlin", bSub.Find("mbrun-berlin-a-0").Properties.User.Get(bridge.OriginUserProperty))
	require.Equal(t, "berlin", a.client.Find("mbrun-berlin-b-0").Properties.User.Get(bridge.OriginUserProperty))
	require.Equal(t, "tunis", bMember.Find("mbrun-tunis-0").Properties.User.Get(bridge.OriginUserProperty))
	// A's import queue carries A's own publishes (A subscribes to mb/#):
	// A skipped them, and injected B's.
	imported := importOutcomes(t, a.broker.Bridge(), "pubsub.mb")
	require.GreaterOrEqual(t, imported["local_origin"], float64(n), "A skips its own messages")
	require.GreaterOrEqual(t, imported["delivered"], float64(2*n), "A injects B's and tunis's messages")

	// One import queue per broker, each with its own exclusive consumer.
	rh, err := rabbithole.NewClient(h.Node("berlin").ManagementURL(), rabbitharness.User, rabbitharness.Password)
	require.NoError(t, err)
	for _, q := range []string{a.broker.Bridge().ImportQueue(), b.Bridge().ImportQueue()} {
		consumers := -1
		require.Eventually(t, func() bool { // the management API's figures lag
			info, err := rh.GetQueue("/", q)
			if err == nil {
				consumers = info.Consumers
			}
			return consumers == 1
		}, 15*time.Second, 100*time.Millisecond, "%s: %v consumers", q, stringer(func() string { return strconv.Itoa(consumers) }))
	}
	// A broker that closes deletes its import queue; the other's stays.
	require.NoError(t, b.Close())
	_, err = rh.GetQueue("/", bridge.ImportQueueName("berlin", idB))
	require.Error(t, err, "B's import queue is deleted when B closes")
	_, err = rh.GetQueue("/", a.broker.Bridge().ImportQueue())
	require.NoError(t, err)
}

// importOutcomes returns the bridge's imported-message counters of
// exchange x by outcome, as Prometheus exposes them.
func importOutcomes(t *testing.T, br *bridge.Bridge, x string) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(br.Collector()))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "luffymq_bridge_messages_imported_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["exchange"] == x {
				out[labels["outcome"]] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestMultiBrokerSecondBrokerWithSameID: a second broker with the same
// site and broker ID cannot take the first one's import queue.
func TestMultiBrokerSecondBrokerWithSameID(t *testing.T) {
	h := sharedNodes(t)
	logs := &testenv.LockedBuffer{}
	start := func(logTo *testenv.LockedBuffer) *broker.Broker {
		cfg := broker.Config{
			MQTTListen: "127.0.0.1:0", Logger: testLogger(t), AMQPURL: h.Node("tunis").AMQPURL(),
			Site: "tunis", BrokerID: "twin", Exports: []string{"twin/#"},
		}
		if logTo != nil {
			cfg.Logger = slog.New(slog.NewTextHandler(logTo, nil))
		}
		b, err := broker.New(cfg)
		require.NoError(t, err)
		require.NoError(t, b.Start())
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	first := start(nil)
	require.Eventually(t, first.Bridge().Connected, 30*time.Second, 20*time.Millisecond)
	sub := mqtttest.ConnectRecorder(t, first.MQTTAddr(), "twin-sub")
	sub.MustSubscribe(t, "twin/#", 1, false)
	second := start(logs)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "is in use by another connection") }, 30*time.Second, 50*time.Millisecond,
		"the second broker names the problem; its logs:\n%s", logs)
	require.Contains(t, logs.String(), "--broker-id")
	require.False(t, second.Bridge().Connected())

	// The first broker keeps its queue and its messages.
	other := startSite(t, "tunis", h.Node("tunis").AMQPURL(), "twin/#")
	pub := mqtttest.ConnectRecorder(t, other.MQTTAddr(), "twin-pub")
	i := 0
	require.Eventually(t, func() bool {
		i++
		_ = pub.Send(&paho.Publish{Topic: "twin/x", QoS: 1, Payload: []byte("twin-" + strconv.Itoa(i))})
		return len(sub.Payloads("twin-")) > 0
	}, 30*time.Second, 200*time.Millisecond, "the first broker still imports")
	require.False(t, second.Bridge().Connected())
}

// mbWorkQueue is a work-queue group served by two brokers of one site.
type mbWorkQueue struct {
	group, share, topic string
	brokers             map[string]*broker.Broker // by broker ID
	workers             map[string]*worker
	pubs                map[string]*mqtttest.Recorder
	tally               *tally
	rh                  *rabbithole.Client
}

// mbPerMember is MaxLengthPerMember in the work-queue tests: the policy's
// max length is this times the site's availability.
const mbPerMember = 1000

// startMultiBrokerWorkQueue starts brokers "b" and then "a" at montreal,
// both exporting group g, with one worker each (service times serviceA
// and serviceB), and waits until b, the first, retunes the group from both
// members' capacity.
func startMultiBrokerWorkQueue(t *testing.T, h *rabbitharness.Harness, g string, serviceA, serviceB time.Duration) *mbWorkQueue {
	t.Helper()
	n := h.Node("montreal")
	w := &mbWorkQueue{group: g, share: "$share/" + g + "/" + g + "jobs/#", topic: g + "jobs/x",
		brokers: map[string]*broker.Broker{}, workers: map[string]*worker{}, pubs: map[string]*mqtttest.Recorder{}, tally: newTally()}
	for _, id := range []string{"b", "a"} {
		b, err := broker.New(broker.Config{
			MQTTListen:        "127.0.0.1:0",
			ReportInterval:    time.Second,
			Logger:            testLogger(t),
			AMQPURL:           n.AMQPURL(),
			AMQPManagementURL: n.ManagementURL(),
			Site:              "montreal",
			BrokerID:          id,
			ExportGroups:      []string{w.share},
			WorkQueue: bridge.WorkQueueConfig{
				MaxLengthPerMember: mbPerMember,
				TTLPerMember:       30 * time.Second, // nothing overflows: the test is about the split
				RetuneInterval:     100 * time.Millisecond,
			},
		})
		require.NoError(t, err)
		require.NoError(t, b.Start())
		t.Cleanup(func() { _ = b.Close() })
		w.brokers[id] = b
		if id == "b" {
			require.Eventually(t, func() bool { return b.Bridge().RetuneOwner(g) }, 30*time.Second, 10*time.Millisecond, "b never retunes")
		}
	}
	// The workers' PUBACKs leave as soon as each message is processed:
	// paho sends manual acknowledgements every SendAcksInterval (50 ms by
	// default), which would add up to 50 ms to every message and hide the
	// members' speed from the pull loop.
	w.workers["a"] = startWorker(t, w.brokers["a"].MQTTAddr(), g+"-a", w.share, "a", serviceA, time.Millisecond, w.tally)
	w.workers["b"] = startWorker(t, w.brokers["b"].MQTTAddr(), g+"-b", w.share, "b", serviceB, time.Millisecond, w.tally)
	for id, b := range w.brokers {
		w.pubs[id] = mqtttest.ConnectRecorder(t, b.MQTTAddr(), g+"-pub-"+id)
	}
	var err error
	w.rh, err = rabbithole.NewClient(n.ManagementURL(), rabbitharness.User, rabbitharness.Password)
	require.NoError(t, err)
	// One owner, and the policy is the site's: both idle members count.
	require.Eventually(t, func() bool {
		return w.owners() == 1 && w.brokers["b"].Bridge().RetuneOwner(g) && w.policyMaxLength() == 2*mbPerMember
	}, 30*time.Second, 50*time.Millisecond, "no single owner retuning from both brokers: owners %v, max-length %v", stringer(func() string { return strconv.Itoa(w.owners()) }),
		stringer(func() string { return strconv.Itoa(w.policyMaxLength()) }))
	// It stays so: the brokers do not overwrite each other's policy.
	for range 10 {
		time.Sleep(100 * time.Millisecond)
		require.Equal(t, 1, w.owners())
		require.Equal(t, 2*mbPerMember, w.policyMaxLength())
	}
	return w
}

func (w *mbWorkQueue) owners() int {
	n := 0
	for _, b := range w.brokers {
		if b.Bridge().RetuneOwner(w.group) {
			n++
		}
	}
	return n
}

// policyMaxLength reads the max length of wq.<g>'s policy (0 if unset).
func (w *mbWorkQueue) policyMaxLength() int {
	p, err := w.rh.GetPolicy("/", bridge.WorkQueuePolicyPrefix+bridge.WorkQueueName(w.group))
	if err != nil {
		return 0
	}
	v, _ := p.Definition["max-length"].(float64)
	return int(v)
}

// publish sends messages 0..count-1, the even ones at broker a and the
// odd ones at broker b, both at once.
func (w *mbWorkQueue) publish(t *testing.T, count int) {
	t.Helper()
	errs := make(chan error, 2)
	for first, id := range []string{"a", "b"} {
		go func() {
			for i := first; i < count; i += 2 {
				if err := w.pubs[id].Send(&paho.Publish{Topic: w.topic, QoS: 1, Payload: []byte(strconv.Itoa(i))}); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
}

// waitProcessed waits until every message 0..count-1 was processed.
func (w *mbWorkQueue) waitProcessed(t *testing.T, count int) {
	t.Helper()
	require.Eventually(t, func() bool {
		d, _, _, _ := w.tally.counts()
		return d == count
	}, 60*time.Second, 20*time.Millisecond, "not every message was processed: %v", stringer(func() string {
		d, dups, _, by := w.tally.counts()
		return fmt.Sprintf("distinct %d/%d, duplicates %d, by broker %v", d, count, dups, by)
	}))
}

// queueEmpty reports whether wq.<g> holds no message, ready or unacknowledged.
func (w *mbWorkQueue) queueEmpty() bool {
	q, err := w.rh.GetQueue("/", bridge.WorkQueueName(w.group))
	return err == nil && q.Messages == 0
}

// TestMultiBrokerWorkQueueSplit: a group with a 10 ms member at broker a
// and a 40 ms member at broker b of one site, given a burst published at
// both, is served as one group: each broker takes messages as fast as its
// member finishes them, so a processes about 4/5 of them.
func TestMultiBrokerWorkQueueSplit(t *testing.T) {
	h := sharedNodes(t)
	w := startMultiBrokerWorkQueue(t, h, "mbsplit", 10*time.Millisecond, 40*time.Millisecond)
	const count = 240
	start := time.Now()
	w.publish(t, count)
	w.waitProcessed(t, count)
	elapsed := time.Since(start)
	distinct, dups, ids, by := w.tally.counts()
	require.Equal(t, count, distinct, "lost messages")
	require.Zero(t, dups, "messages processed twice")
	require.Equal(t, count, ids, "one message ID per message")
	// Capacity shares: 1/10 ms against 1/40 ms, a's ideal share 0.8. Per
	// message each broker also spends two basic.gets, an injection and the
	// PUBACK's way back (about 1 ms: the pull loop wakes once the
	// selection hook counted the PUBACK, see Bridge.WakeHook), which weigh
	// more on the fast member: 0.74..0.78 measured on a shared machine.
	// Allow 0.65..0.92.
	shareA := float64(by["a"]) / float64(count)
	t.Logf("%d messages in %v: broker a (10 ms member) %d, broker b (40 ms member) %d; a's share %.3f (capacity share 0.800)",
		count, elapsed.Round(time.Millisecond), by["a"], by["b"], shareA)
	require.GreaterOrEqual(t, shareA, 0.65)
	require.LessOrEqual(t, shareA, 0.92)
	for id, b := range w.brokers {
		require.Positive(t, b.Bridge().WorkQueueStats()[w.group].Local, "broker %s took messages from wq.%s", id, w.group)
	}
	// Each message is acknowledged to RabbitMQ once, after its PUBACK.
	var completed uint64
	require.Eventually(t, func() bool {
		completed = 0
		for _, b := range w.brokers {
			completed += b.Bridge().WorkQueueStats()[w.group].Completed
		}
		return completed == count
	}, 10*time.Second, 20*time.Millisecond, "completed %v of %d", stringer(func() string { return strconv.FormatUint(completed, 10) }), count)
	require.Eventually(t, w.queueEmpty, 10*time.Second, 50*time.Millisecond)
}

// TestMultiBrokerWorkQueueStop: broker b, which retunes the group for the
// site, stops while it holds a message and the queue still holds its
// share: broker a processes everything left, takes the retune over, and
// the site's capacity falls to a's alone.
func TestMultiBrokerWorkQueueStop(t *testing.T) {
	h := sharedNodes(t)
	w := startMultiBrokerWorkQueue(t, h, "mbstop", 10*time.Millisecond, 40*time.Millisecond)
	const count = 300
	w.publish(t, count)
	// Every message is in RabbitMQ before b stops (what b's outbox has not
	// published yet would go with it).
	require.Eventually(t, func() bool {
		var sum uint64
		for _, b := range w.brokers {
			exported, _ := b.Bridge().Counts()
			sum += exported[bridge.WorkQueueName(w.group)]
		}
		return sum == count
	}, 10*time.Second, 10*time.Millisecond, "not every message reached wq.%s", w.group)
	require.Eventually(t, func() bool {
		_, _, _, by := w.tally.counts()
		return by["b"] >= 3 && w.workers["b"].busy.Load()
	}, 30*time.Second, time.Millisecond, "broker b's member never busy")
	require.True(t, w.brokers["b"].Bridge().RetuneOwner(w.group))
	require.NoError(t, w.brokers["b"].Close())
	_, _, _, by := w.tally.counts()
	atStop := by["b"]
	processedAtStop, _, _, _ := w.tally.counts()
	require.Less(t, processedAtStop, count-20, "the test stops b while the queue still holds messages")

	w.waitProcessed(t, count)
	distinct, dups, ids, by := w.tally.counts()
	t.Logf("b stopped after %d of %d processed (b %d); then a processed the rest: a %d, b %d, duplicates %d (b's member finishing the message it held)",
		processedAtStop, count, atStop, by["a"], by["b"], dups)
	require.Equal(t, count, distinct, "lost messages")
	require.Equal(t, count, ids, "one message ID per message")
	require.LessOrEqual(t, by["b"], atStop+1, "b's member gets nothing after b stopped but the message it held")
	require.LessOrEqual(t, dups, 1, "at most the message b's member held is processed twice")
	require.Eventually(t, w.queueEmpty, 10*time.Second, 50*time.Millisecond)
	// a retunes alone now, from its own capacity.
	require.Eventually(t, func() bool {
		return w.brokers["a"].Bridge().RetuneOwner(w.group) && w.policyMaxLength() == mbPerMember
	}, 10*time.Second, 50*time.Millisecond, "a does not retune from its capacity alone: owner %v, max-length %v",
		stringer(func() string { return strconv.FormatBool(w.brokers["a"].Bridge().RetuneOwner(w.group)) }),
		stringer(func() string { return strconv.Itoa(w.policyMaxLength()) }))
	// The new owner reads the weights back before changing them: the
	// dead-letter exchange keeps one binding to the local intake's ring.
	require.Eventually(t, func() bool { return w.ringBindings() == 1 }, 10*time.Second, 50*time.Millisecond)
	for range 10 {
		time.Sleep(100 * time.Millisecond)
		require.LessOrEqual(t, w.ringBindings(), 2, "at most the new weight beside the old one while it is replaced")
	}
	require.Eventually(t, func() bool { return w.ringBindings() == 1 }, 10*time.Second, 50*time.Millisecond)
}

// ringBindings counts the bindings of wq.<g>.dlx to its ring exchanges.
func (w *mbWorkQueue) ringBindings() int {
	bs, err := w.rh.ListExchangeBindingsWithSource("/", bridge.DeadLetterExchangeName(w.group))
	if err != nil {
		return -1
	}
	n := 0
	for _, b := range bs {
		if strings.HasPrefix(b.Destination, bridge.WorkQueueName(w.group)+".ring") {
			n++
		}
	}
	return n
}

// TestMultiBrokerFlags checks --broker-id.
func TestMultiBrokerFlags(t *testing.T) {
	base := []string{"--listen", "127.0.0.1:0", "--amqp-url", "amqp://127.0.0.1/", "--site", "berlin"}
	c, err := broker.ConfigFromArgs(append(base, "--broker-id", "edge-2"), io.Discard, io.Discard)
	require.NoError(t, err)
	require.Equal(t, "edge-2", c.BrokerID)
	_, err = broker.ConfigFromArgs(append(base, "--broker-id", "edge.2"), io.Discard, io.Discard)
	require.ErrorContains(t, err, `broker-id "edge.2"`)
	_, err = broker.ConfigFromArgs([]string{"--listen", "127.0.0.1:0", "--broker-id", "edge-2"}, io.Discard, io.Discard)
	require.ErrorContains(t, err, "broker-id needs amqp-url")

	// Without the flag the broker derives an ID once, from the host name
	// and the MQTT port.
	c, err = broker.ConfigFromArgs([]string{"--listen", "127.0.0.1:18830", "--http", "", "--amqp-url", "amqp://127.0.0.1:1/", "--site", "berlin"}, io.Discard, io.Discard)
	require.NoError(t, err)
	require.Empty(t, c.BrokerID)
	c.Logger = testLogger(t)
	b, err := broker.New(c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	require.Regexp(t, `^[A-Za-z0-9_-]+-18830$`, b.Bridge().BrokerID())
	require.Equal(t, bridge.ImportQueueName("berlin", b.Bridge().BrokerID()), b.Bridge().ImportQueue())
}
