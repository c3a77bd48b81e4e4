package bridge_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/internal/mqtttest"
	"github.com/luffymq/luffymq/internal/rabbitharness"
)

// The tests of this file export a topic tree (--export '<root>/#') and a
// shared group over the same tree (--export-group '$share/<g>/<root>/#')
// together, with plain subscribers, members of the exported group and
// members of a group that is not exported, and count every delivery of
// every published message per client:
//
//   - a plain subscriber gets each message once, at every broker and site;
//   - the exported group gets each message once in all, through its work
//     queue (the delivery carries luffymq-message-id);
//   - a group that is not exported gets each message once at each broker
//     where it has members, as before.

// overlapCounter counts the deliveries of "run-" messages by receiver.
// Probes ("probe-" messages) are only noted as received.
type overlapCounter struct {
	mu     sync.Mutex
	got    map[string]map[string]int // receiver -> payload -> deliveries
	noID   map[string]int            // receiver -> deliveries without luffymq-message-id
	probed map[string]bool           // receiver -> had a probe
}

func newOverlapCounter() *overlapCounter {
	return &overlapCounter{got: map[string]map[string]int{}, noID: map[string]int{}, probed: map[string]bool{}}
}

func (c *overlapCounter) record(receiver string, p *paho.Publish) {
	payload := string(p.Payload)
	c.mu.Lock()
	defer c.mu.Unlock()
	if strings.HasPrefix(payload, "probe-") {
		c.probed[receiver] = true
		return
	}
	if c.got[receiver] == nil {
		c.got[receiver] = map[string]int{}
	}
	c.got[receiver][payload]++
	if p.Properties == nil || p.Properties.User.Get(bridge.MessageIDUserProperty) == "" {
		c.noID[receiver]++
	}
}

// deliveries returns how often each payload reached any of receivers.
func (c *overlapCounter) deliveries(receivers ...string) map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for _, r := range receivers {
		for p, n := range c.got[r] {
			out[p] += n
		}
	}
	return out
}

// withoutID counts the deliveries to receivers that did not come from a
// work queue.
func (c *overlapCounter) withoutID(receivers ...string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range receivers {
		n += c.noID[r]
	}
	return n
}

// lostAndDuplicated compares deliveries with the payloads sent.
func lostAndDuplicated(got map[string]int, sent []string) (lost, dups int) {
	for _, p := range sent {
		switch n := got[p]; {
		case n == 0:
			lost++
		case n > 1:
			dups += n - 1
		}
	}
	return lost, dups
}

// overlapReceiver is an expectation: the receivers that together must get
// every sent message exactly once.
type overlapReceiver struct {
	name    string
	clients []string
	// viaWorkQueue: every delivery carries luffymq-message-id.
	viaWorkQueue bool
}

// waitExactlyOnce waits until every receiver has every message of sent,
// gives late copies time to arrive, and then requires each receiver to
// have had each message exactly once.
func waitExactlyOnce(t *testing.T, c *overlapCounter, sent []string, receivers []overlapReceiver) {
	t.Helper()
	describe := func() string {
		var b strings.Builder
		for _, r := range receivers {
			got := c.deliveries(r.clients...)
			lost, dups := lostAndDuplicated(got, sent)
			fmt.Fprintf(&b, "\n%-28s %v: distinct %d of %d, lost %d, duplicated %d", r.name, r.clients, len(got), len(sent), lost, dups)
		}
		return b.String()
	}
	require.Eventually(t, func() bool {
		for _, r := range receivers {
			if lost, _ := lostAndDuplicated(c.deliveries(r.clients...), sent); lost > 0 {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "not every receiver got every message:%s", stringer(describe))
	// A second copy, through RabbitMQ or a work queue, would be here by
	// now: every path is a few milliseconds long on loopback.
	time.Sleep(time.Second)
	t.Logf("%d messages:%s", len(sent), describe())
	for _, r := range receivers {
		got := c.deliveries(r.clients...)
		lost, dups := lostAndDuplicated(got, sent)
		require.Zero(t, lost, "%s lost messages", r.name)
		require.Zero(t, dups, "%s had messages more than once:%s", r.name, stringer(describe))
		if r.viaWorkQueue {
			require.Zero(t, c.withoutID(r.clients...), "%s had messages that did not come through its work queue", r.name)
		}
	}
}

// connectOverlapClient connects an MQTT v5 client subscribed to filter at
// QoS 1 that records what it receives as receiver, working service on
// each message before its PUBACK.
func connectOverlapClient(t *testing.T, addr, receiver, filter string, service time.Duration, c *overlapCounter) {
	t.Helper()
	mqtttest.Connect(t, addr, receiver, paho.ClientConfig{
		EnableManualAcknowledgment: true,
		SendAcksInterval:           time.Millisecond,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				time.Sleep(service)
				c.record(receiver, pr.Packet)
				_ = pr.Client.Ack(pr.Packet)
				return true, nil
			},
		},
	}, paho.SubscribeOptions{Topic: filter, QoS: 1})
}

// startOverlapBroker starts a broker of site at node n exporting exports
// and the groups in exportGroups.
func startOverlapBroker(t *testing.T, n *rabbitharness.Node, site, brokerID string, exports, exportGroups []string, wq bridge.WorkQueueConfig) *broker.Broker {
	t.Helper()
	b, err := broker.New(broker.Config{
		MQTTListen:        "127.0.0.1:0",
		ReportInterval:    time.Second,
		Logger:            testLogger(t),
		AMQPURL:           n.AMQPURL(),
		AMQPManagementURL: n.ManagementURL(),
		Site:              site,
		BrokerID:          brokerID,
		Exports:           exports,
		ExportGroups:      exportGroups,
		WorkQueue:         wq,
	})
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// probeUntilReceived publishes probes on topic from pub until every one
// of receivers got one (bindings and federation propagate
// asynchronously).
func probeUntilReceived(t *testing.T, pub *mqtttest.Recorder, topic string, c *overlapCounter, receivers ...string) {
	t.Helper()
	i := 0
	require.Eventually(t, func() bool {
		i++
		if pub.Send(&paho.Publish{Topic: topic, QoS: 1, Payload: []byte("probe-" + strconv.Itoa(i))}) != nil {
			return false
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, r := range receivers {
			if !c.probed[r] {
				return false
			}
		}
		return true
	}, 60*time.Second, 200*time.Millisecond, "probes on %s do not reach every receiver", topic)
}

// publishRun publishes count QoS 1 messages "run-<from>-<i>" under root
// from pub, every interval, and returns their payloads.
func publishRun(t *testing.T, pub *mqtttest.Recorder, root, from string, count int, interval time.Duration) []string {
	t.Helper()
	var sent []string
	for i := range count {
		payload := fmt.Sprintf("run-%s-%d", from, i)
		pub.MustSend(t, &paho.Publish{Topic: fmt.Sprintf("%s/data/%d", root, i%5), QoS: 1, Payload: []byte(payload)})
		sent = append(sent, payload)
		time.Sleep(interval)
	}
	return sent
}

// overlapShares returns the exported group's and the non-exported group's
// filters for root.
func overlapShares(root string) (exported, local string) {
	return "$share/" + root + "w/" + root + "/#", "$share/" + root + "o/" + root + "/#"
}

// TestExportOverlapOneBroker is the reported configuration on one broker:
// --export '<root>/#' --export-group '$share/<g>/<root>/#'.
func TestExportOverlapOneBroker(t *testing.T) {
	h := sharedNodes(t)
	const root = "ovl1"
	share, other := overlapShares(root)
	b := startOverlapBroker(t, h.Node("berlin"), "berlin", "ovl1", []string{root + "/#"}, []string{share},
		bridge.WorkQueueConfig{TTLPerMember: 30 * time.Second, RetuneInterval: 100 * time.Millisecond})
	c := newOverlapCounter()
	connectOverlapClient(t, b.MQTTAddr(), "ovl1-sub", root+"/#", 0, c)
	connectOverlapClient(t, b.MQTTAddr(), "ovl1-w1", share, 5*time.Millisecond, c)
	connectOverlapClient(t, b.MQTTAddr(), "ovl1-w2", share, 5*time.Millisecond, c)
	connectOverlapClient(t, b.MQTTAddr(), "ovl1-o1", other, 0, c)
	pub := mqtttest.ConnectRecorder(t, b.MQTTAddr(), "ovl1-pub")
	probeUntilReceived(t, pub, root+"/probe", c, "ovl1-sub", "ovl1-o1")
	probeUntilReceived(t, pub, root+"/probe", c, "ovl1-w1")
	probeUntilReceived(t, pub, root+"/probe", c, "ovl1-w2")

	sent := publishRun(t, pub, root, "berlin", 100, 0)
	waitExactlyOnce(t, c, sent, []overlapReceiver{
		{name: "plain subscriber", clients: []string{"ovl1-sub"}},
		{name: "exported group", clients: []string{"ovl1-w1", "ovl1-w2"}, viaWorkQueue: true},
		{name: "group not exported", clients: []string{"ovl1-o1"}},
	})
}

// TestExportOverlapTwoBrokers runs two brokers of one site with the same
// overlapping exports, publishing at both: the other broker imports each
// message through the site's exchange for its plain subscriber, and must
// leave it to the work queue for its members of the exported group.
func TestExportOverlapTwoBrokers(t *testing.T) {
	h := sharedNodes(t)
	const root = "ovl2"
	share, other := overlapShares(root)
	n := h.Node("montreal")
	wq := bridge.WorkQueueConfig{TTLPerMember: 30 * time.Second, RetuneInterval: 100 * time.Millisecond}
	brokers := map[string]*broker.Broker{}
	pubs := map[string]*mqtttest.Recorder{}
	for _, id := range []string{"ovl2a", "ovl2b"} {
		b := startOverlapBroker(t, n, "montreal", id, []string{root + "/#"}, []string{share}, wq)
		brokers[id] = b
	}
	c := newOverlapCounter()
	for id, b := range brokers {
		connectOverlapClient(t, b.MQTTAddr(), id+"-sub", root+"/#", 0, c)
		connectOverlapClient(t, b.MQTTAddr(), id+"-w", share, 5*time.Millisecond, c)
		connectOverlapClient(t, b.MQTTAddr(), id+"-o", other, 0, c)
		pubs[id] = mqtttest.ConnectRecorder(t, b.MQTTAddr(), id+"-pub")
	}
	for id, pub := range pubs {
		probeUntilReceived(t, pub, root+"/probe", c, "ovl2a-sub", "ovl2b-sub", "ovl2a-o", "ovl2b-o")
		probeUntilReceived(t, pub, root+"/probe", c, id+"-w")
	}

	var sent []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id, pub := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []string
			for i := range 60 {
				payload := fmt.Sprintf("run-%s-%d", id, i)
				if err := pub.Send(&paho.Publish{Topic: fmt.Sprintf("%s/data/%d", root, i%5), QoS: 1, Payload: []byte(payload)}); err != nil {
					t.Errorf("publishing at %s: %v", id, err)
					return
				}
				mine = append(mine, payload)
			}
			mu.Lock()
			sent = append(sent, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	require.Len(t, sent, 120)
	waitExactlyOnce(t, c, sent, []overlapReceiver{
		{name: "plain subscriber at a", clients: []string{"ovl2a-sub"}},
		{name: "plain subscriber at b", clients: []string{"ovl2b-sub"}},
		{name: "exported group", clients: []string{"ovl2a-w", "ovl2b-w"}, viaWorkQueue: true},
		{name: "group not exported at a", clients: []string{"ovl2a-o"}},
		{name: "group not exported at b", clients: []string{"ovl2b-o"}},
	})
}

// TestExportOverlapAcrossSites exports the tree at berlin, tunis and
// montreal and the group at berlin and tunis, whose work queues overflow
// into each other; a device publishes at berlin faster than berlin's one
// member works. Each plain subscriber and each site's members of the
// group that is not exported get each message once; the exported group
// gets each message once in all, at berlin or, overflowing, at tunis.
func TestExportOverlapAcrossSites(t *testing.T) {
	h := federatedNodes(t)
	const root = "ovl3"
	share, other := overlapShares(root)
	group := root + "w"
	wq := bridge.WorkQueueConfig{MaxLengthPerMember: 10, TTLPerMember: 200 * time.Millisecond, RetuneInterval: 100 * time.Millisecond}
	brokers := map[string]*broker.Broker{}
	for _, name := range testSites {
		var groups []string
		if name != "montreal" {
			groups = []string{share}
		}
		brokers[name] = startOverlapBroker(t, h.Node(name), name, "ovl3", []string{root + "/#"}, groups, wq)
	}
	// What the controller would send: each group site's intake federates
	// from the other's dead-letter exchange.
	for _, name := range wqSites {
		l, err := h.Link(h.Node(name), h.Node(otherSite(name)))
		require.NoError(t, err)
		body, err := json.Marshal(map[string]any{bridge.WorkQueueName(group): []map[string]string{{"uri": l.AMQPURL()}}})
		require.NoError(t, err)
		publishAMQP(t, h.Node(name).AMQPURL(), bridge.ConfigQueueName(name), body)
	}
	c := newOverlapCounter()
	members := map[string][]time.Duration{"berlin": {50 * time.Millisecond}, "tunis": {10 * time.Millisecond, 10 * time.Millisecond}}
	var workers, plain []string
	for _, name := range testSites {
		connectOverlapClient(t, brokers[name].MQTTAddr(), "ovl3-sub-"+name, root+"/#", 0, c)
		connectOverlapClient(t, brokers[name].MQTTAddr(), "ovl3-o-"+name, other, 0, c)
		plain = append(plain, "ovl3-sub-"+name, "ovl3-o-"+name)
		for i, svc := range members[name] {
			id := fmt.Sprintf("ovl3-w-%s-%d", name, i)
			connectOverlapClient(t, brokers[name].MQTTAddr(), id, share, svc, c)
			workers = append(workers, id)
		}
	}
	waitFederation(t, h, bridge.ExchangeName(root+"/#"))
	require.Eventually(t, func() bool {
		for _, name := range wqSites {
			if brokers[name].Bridge().WorkQueueStats()[group].MaxLength <= 1 ||
				federatedBindings(h.Node(otherSite(name)), bridge.DeadLetterExchangeName(group)) == 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "work queue %s not ready", group)
	pub := mqtttest.ConnectRecorder(t, brokers["berlin"].MQTTAddr(), "ovl3-pub")
	probeUntilReceived(t, pub, root+"/probe", c, plain...)
	probeUntilReceived(t, pub, root+"/probe", c, "ovl3-w-berlin-0")

	sent := publishRun(t, pub, root, "berlin", 80, 25*time.Millisecond)
	receivers := []overlapReceiver{{name: "exported group", clients: workers, viaWorkQueue: true}}
	for _, name := range testSites {
		receivers = append(receivers,
			overlapReceiver{name: "plain subscriber at " + name, clients: []string{"ovl3-sub-" + name}},
			overlapReceiver{name: "group not exported at " + name, clients: []string{"ovl3-o-" + name}})
	}
	waitExactlyOnce(t, c, sent, receivers)
	bySite := map[string]int{}
	for _, name := range wqSites {
		for _, w := range workers {
			if strings.HasPrefix(w, "ovl3-w-"+name+"-") {
				for _, n := range c.deliveries(w) {
					bySite[name] += n
				}
			}
		}
	}
	st := map[string]bridge.WorkQueueStats{}
	for _, name := range wqSites {
		st[name] = brokers[name].Bridge().WorkQueueStats()[group]
	}
	t.Logf("exported group processed by site: %v; berlin %+v; tunis %+v", bySite, st["berlin"], st["tunis"])
	// Nothing is published at tunis: what its members processed came
	// through its intake as berlin's overflow.
	require.Zero(t, st["tunis"].Local, "tunis took messages from its own work queue")
	require.GreaterOrEqual(t, st["tunis"].FromSite["berlin"], uint64(bySite["tunis"]), "tunis processed more than it took of berlin's overflow")
}
