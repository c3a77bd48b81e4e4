package bridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/internal/mqtttest"
	"github.com/luffymq/luffymq/internal/rabbitharness"
)

// wqSites are the two sites of the work-queue tests.
var wqSites = []string{"berlin", "tunis"}

// tally counts processed messages by sequence number and message ID.
type tally struct {
	mu     sync.Mutex
	bySeq  map[int]int
	byID   map[string]int
	bySite map[string]int
	// firstStart and firstSite are when and where each sequence number
	// was first started.
	firstStart map[int]time.Time
	firstSite  map[int]string
}

func newTally() *tally {
	return &tally{bySeq: map[int]int{}, byID: map[string]int{}, bySite: map[string]int{}, firstStart: map[int]time.Time{}, firstSite: map[int]string{}}
}

// started records that a worker at site began seq at time at.
func (t *tally) started(site string, seq int, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.firstStart[seq]; !ok {
		t.firstStart[seq], t.firstSite[seq] = at, site
	}
}

func (t *tally) record(site string, seq int, id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.bySeq[seq]++
	t.byID[id]++
	t.bySite[site]++
}

// counts returns distinct sequence numbers, duplicate deliveries, distinct
// message IDs and the per-site counts.
func (t *tally) counts() (distinct, dups, ids int, bySite map[string]int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	bySite = map[string]int{}
	for s, n := range t.bySite {
		bySite[s] = n
	}
	for _, n := range t.bySeq {
		distinct++
		dups += n - 1
	}
	return distinct, dups, len(t.byID), bySite
}

// worker is an MQTT v5 member of a shared group that processes one
// message at a time for a fixed service time and acknowledges (PUBACK) it
// afterwards.
type worker struct {
	conn   net.Conn
	killed atomic.Bool
	busy   atomic.Bool // working on a message it has not acknowledged
}

// startWorker connects worker id to addr, a member of share that records
// each message it processed in tl under label. paho sends its manual
// acknowledgements every acksInterval (0: paho's default, 50 ms).
func startWorker(t *testing.T, addr, id, share, label string, service, acksInterval time.Duration, tl *tally) *worker {
	t.Helper()
	w := &worker{}
	_, w.conn = mqtttest.Dial(t, addr, id, paho.ClientConfig{
		EnableManualAcknowledgment: true,
		SendAcksInterval:           acksInterval,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				w.busy.Store(true)
				defer w.busy.Store(false)
				seq, _ := strconv.Atoi(string(pr.Packet.Payload))
				tl.started(label, seq, time.Now())
				time.Sleep(service) // the work itself
				if w.killed.Load() {
					return true, nil // crashed before finishing: no record, no PUBACK
				}
				msgID := ""
				if pr.Packet.Properties != nil {
					msgID = pr.Packet.Properties.User.Get(bridge.MessageIDUserProperty)
				}
				tl.record(label, seq, msgID)
				_ = pr.Client.Ack(pr.Packet)
				return true, nil
			},
		},
	}, paho.SubscribeOptions{Topic: share, QoS: 1})
	t.Cleanup(w.kill)
	return w
}

// kill ends the worker's connection abruptly, as a crash would.
func (w *worker) kill() {
	w.killed.Store(true)
	_ = w.conn.Close()
}

// wqSetup is a work-queue scenario.
type wqSetup struct {
	group    string
	workers  map[string][]time.Duration // service time of each worker, by site
	messages int
	rate     int // messages per second, published at berlin
	// during runs once after some messages were processed.
	during func(t *testing.T, ws map[string][]*worker)
	// ttlPerMember sets WorkQueueConfig.TTLPerMember (200 ms when 0);
	// ttlOverflowOnly sets TTLOverflowOnly.
	ttlPerMember    time.Duration
	ttlOverflowOnly bool
	// maxLengthPerMember sets WorkQueueConfig.MaxLengthPerMember (10
	// when 0).
	maxLengthPerMember int
}

// wqResult is what a scenario measured.
type wqResult struct {
	sent, distinct, dups, ids int
	bySite                    map[string]int
	stats                     map[string]bridge.WorkQueueStats
	// parked and leftToBridge sum the brokers' selection-hook re-dispatch
	// counters: a departed member's work-queue messages are the bridge's
	// to requeue, never parked by the selection hook.
	parked, leftToBridge uint64
	// spilled are the waits (publish to first start) of the messages
	// first started away from berlin, where they are published.
	spilled []time.Duration
}

func runWorkQueue(t *testing.T, h *rabbitharness.Harness, s wqSetup) wqResult {
	t.Helper()
	resetNodes(t, h)
	share := "$share/" + s.group + "/jobs/" + s.group + "/#"
	ttl := s.ttlPerMember
	if ttl == 0 {
		ttl = 200 * time.Millisecond
	}
	maxLength := s.maxLengthPerMember
	if maxLength == 0 {
		maxLength = 10
	}
	brokers := startWQSites(t, h, wqSites, share, bridge.WorkQueueConfig{
		MaxLengthPerMember: maxLength,
		TTLPerMember:       ttl,
		TTLOverflowOnly:    s.ttlOverflowOnly,
		RetuneInterval:     100 * time.Millisecond,
		Route:              bridge.RouteRing, // these cases are the TTL, eq. 2.13's weights and the hash ring
	})
	tl := newTally()
	ws := map[string][]*worker{}
	for site, services := range s.workers {
		for i, svc := range services {
			ws[site] = append(ws[site], startWorker(t, brokers[site].MQTTAddr(), fmt.Sprintf("%s-%s-%d", s.group, site, i), share, site, svc, 0, tl))
		}
	}
	// Ready when every site retuned with its members online and each
	// site's dead-letter exchange has a federated binding to the other.
	require.Eventually(t, func() bool {
		for _, name := range wqSites {
			st := brokers[name].Bridge().WorkQueueStats()[s.group]
			if len(s.workers[name]) > 0 && st.MaxLength <= 1 {
				return false
			}
			if len(s.workers[name]) > 0 && federatedBindings(h.Node(otherSite(name)), bridge.DeadLetterExchangeName(s.group)) == 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "work queue %s not ready", s.group)

	pub := mqtttest.ConnectRecorder(t, brokers["berlin"].MQTTAddr(), "pub-"+s.group)
	tick := time.NewTicker(time.Second / time.Duration(s.rate))
	defer tick.Stop()
	duringDone := s.during == nil
	sent := make([]time.Time, s.messages)
	for i := 0; i < s.messages; i++ {
		<-tick.C
		sent[i] = time.Now()
		pub.MustSend(t, &paho.Publish{Topic: "jobs/" + s.group + "/" + strconv.Itoa(i%7), QoS: 1, Payload: []byte(strconv.Itoa(i))})
		if !duringDone {
			if d, _, _, _ := tl.counts(); d >= s.messages/4 {
				s.during(t, ws)
				duringDone = true
			}
		}
	}
	require.Eventually(t, func() bool {
		d, _, _, _ := tl.counts()
		return d == s.messages
	}, 60*time.Second, 50*time.Millisecond, "not every message was processed: %v", stringer(func() string {
		d, dups, _, by := tl.counts()
		missing := []int{}
		tl.mu.Lock()
		for i := 0; i < s.messages; i++ {
			if tl.bySeq[i] == 0 {
				missing = append(missing, i)
			}
		}
		tl.mu.Unlock()
		exported, _ := brokers["berlin"].Bridge().Counts()
		return fmt.Sprintf("distinct %d/%d missing %v dups %d by site %v exported %v berlin %+v tunis %+v queues: %s", d, s.messages, missing, dups, by, exported,
			brokers["berlin"].Bridge().WorkQueueStats()[s.group], brokers["tunis"].Bridge().WorkQueueStats()[s.group], nonEmptyQueues(h))
	}))
	// Let late duplicates, if any, arrive: every taken message settled.
	require.Eventually(t, func() bool {
		for _, name := range wqSites {
			st := brokers[name].Bridge().WorkQueueStats()[s.group]
			if st.Local+st.OwnOverflow+st.FromOtherSites != st.Completed+st.Requeued+st.Duplicates {
				return false
			}
		}
		return true
	}, 10*time.Second, 50*time.Millisecond)
	// The same figures reach Prometheus.
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(brokers["tunis"].Bridge().Collector()))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, mf := range mfs {
		seen[mf.GetName()] = true
		if mf.GetName() == "luffymq_bridge_wq_messages_received_total" {
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["queue"] == bridge.WorkQueueName(s.group) && labels["source"] == "other_site" {
					require.Equal(t, float64(brokers["tunis"].Bridge().WorkQueueStats()[s.group].FromOtherSites), m.GetCounter().GetValue())
				}
			}
		}
	}
	for _, name := range []string{"wq_messages_received_total", "wq_messages_settled_total", "wq_overflow_received_total", "wq_overflow_at_publish_total", "wq_empty_gets_total", "wq_ttl_seconds", "wq_max_length", "wq_weight", "wq_messages_in_queue", "agent_actions_total"} {
		require.True(t, seen["luffymq_bridge_"+name], "metric %s missing", name)
	}
	r := wqResult{sent: s.messages, stats: map[string]bridge.WorkQueueStats{}}
	r.distinct, r.dups, r.ids, r.bySite = tl.counts()
	tl.mu.Lock()
	for seq, site := range tl.firstSite {
		if site != "berlin" && seq >= 0 && seq < len(sent) {
			r.spilled = append(r.spilled, tl.firstStart[seq].Sub(sent[seq]))
		}
	}
	tl.mu.Unlock()
	slices.Sort(r.spilled)
	for _, name := range wqSites {
		r.stats[name] = brokers[name].Bridge().WorkQueueStats()[s.group]
		r.parked += brokers[name].Selection().Redispatch.Parked.Load()
		r.leftToBridge += brokers[name].Selection().Redispatch.LeftToOwner.Load()
	}
	t.Logf("%s: sent %d, processed distinct %d (by site %v), duplicates %d, distinct message IDs %d; berlin %+v; tunis %+v",
		s.group, r.sent, r.distinct, r.bySite, r.dups, r.ids, r.stats["berlin"], r.stats["tunis"])
	return r
}

// startWQSites starts a broker exporting share at each of sites, with
// work-queue configuration wqc, and sends each site's agent the
// controller's configuration message: the group's intake (and route
// exchange) federate from every other site.
func startWQSites(t *testing.T, h *rabbitharness.Harness, sites []string, share string, wqc bridge.WorkQueueConfig) map[string]*broker.Broker {
	t.Helper()
	group := strings.Split(share, "/")[1]
	brokers := map[string]*broker.Broker{}
	for _, name := range sites {
		brokers[name] = startWQBroker(t, h, name, "", share, wqc)
	}
	for _, name := range sites {
		var ups []map[string]string
		for _, other := range sites {
			if other != name {
				l, err := h.Link(h.Node(name), h.Node(other))
				require.NoError(t, err)
				ups = append(ups, map[string]string{"uri": l.AMQPURL()})
			}
		}
		body, err := json.Marshal(map[string]any{bridge.WorkQueueName(group): ups})
		require.NoError(t, err)
		publishAMQP(t, h.Node(name).AMQPURL(), bridge.ConfigQueueName(name), body)
	}
	return brokers
}

// startWQBroker starts a broker of site exporting share (brokerID: its
// default when empty), stopped when the test ends.
func startWQBroker(t *testing.T, h *rabbitharness.Harness, site, brokerID, share string, wqc bridge.WorkQueueConfig) *broker.Broker {
	t.Helper()
	b, err := broker.New(broker.Config{
		MQTTListen:        "127.0.0.1:0",
		ReportInterval:    time.Second,
		Logger:            testLogger(t),
		AMQPURL:           h.Node(site).AMQPURL(),
		AMQPManagementURL: h.Node(site).ManagementURL(),
		Site:              site,
		BrokerID:          brokerID,
		ExportGroups:      []string{share},
		WorkQueue:         wqc,
	})
	require.NoError(t, err)
	require.NoError(t, b.Start())
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func otherSite(name string) string {
	if name == wqSites[0] {
		return wqSites[1]
	}
	return wqSites[0]
}

// federatedBindings counts the bindings of exchange x on n whose
// destination is a federation link's exchange.
func federatedBindings(n *rabbitharness.Node, x string) int {
	rh, err := rabbithole.NewClient(n.ManagementURL(), rabbitharness.User, rabbitharness.Password)
	if err != nil {
		return 0
	}
	bs, err := rh.ListExchangeBindingsWithSource("/", x)
	if err != nil {
		return 0
	}
	count := 0
	for _, b := range bs {
		if b.DestinationType == "exchange" && strings.HasPrefix(b.Destination, "federation:") {
			count++
		}
	}
	return count
}

func publishAMQP(t *testing.T, url, queue string, body []byte) {
	t.Helper()
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.PublishWithContext(context.Background(), "", queue, false, false, amqp.Publishing{ContentType: "application/json", Body: body}))
}

func TestWorkQueues(t *testing.T) {
	h := sharedNodes(t)
	ms := time.Millisecond
	tests := []struct {
		name  string
		setup wqSetup
		check func(t *testing.T, r wqResult)
	}{
		{
			// Berlin's one worker takes 100 ms a message and 30 msg/s
			// arrive: the excess must leave for Tunis.
			name:  "overflow spills to the site with spare capacity",
			setup: wqSetup{group: "spill", workers: map[string][]time.Duration{"berlin": {100 * ms}, "tunis": {20 * ms, 20 * ms}}, messages: 60, rate: 30},
			check: func(t *testing.T, r wqResult) {
				require.Positive(t, r.bySite["tunis"], "nothing spilled")
				require.Positive(t, r.stats["tunis"].FromOtherSites)
				require.Equal(t, r.stats["tunis"].FromOtherSites, r.stats["tunis"].FromSite["berlin"])
				require.Positive(t, r.bySite["berlin"])
			},
		},
		{
			// Berlin's one worker takes 200 ms a message, 20 msg/s arrive
			// and a message may wait 1–2 s (the TTL; the max length is
			// out of reach) before it overflows:
			// what Berlin would not start within the TTL leaves for Tunis
			// when it is published, not after waiting the TTL out.
			name: "a publish the site would not start within the TTL leaves at once",
			setup: wqSetup{group: "atpub", workers: map[string][]time.Duration{"berlin": {200 * ms}, "tunis": {20 * ms, 20 * ms}}, messages: 40, rate: 20,
				ttlPerMember: 2 * time.Second, maxLengthPerMember: 3000},
			check: func(t *testing.T, r wqResult) {
				require.Positive(t, r.stats["berlin"].OverflowAtPublish)
				require.NotEmpty(t, r.spilled, "nothing spilled")
				require.Less(t, r.spilled[len(r.spilled)/2], 500*ms, "spilled messages waited: %v", r.spilled)
			},
		},
		{
			// The same with the thesis's rule: what spills waits its TTL.
			name: "with TTLOverflowOnly a publish waits out its TTL",
			setup: wqSetup{group: "ttlonly", workers: map[string][]time.Duration{"berlin": {200 * ms}, "tunis": {20 * ms, 20 * ms}}, messages: 40, rate: 20,
				ttlPerMember: 2 * time.Second, maxLengthPerMember: 3000, ttlOverflowOnly: true},
			check: func(t *testing.T, r wqResult) {
				require.Zero(t, r.stats["berlin"].OverflowAtPublish)
				require.NotEmpty(t, r.spilled, "nothing spilled")
				require.GreaterOrEqual(t, r.spilled[len(r.spilled)/2], 500*ms, "spilled messages waited: %v", r.spilled)
			},
		},
		{
			// Two 10 ms workers absorb 20 msg/s: nothing leaves Berlin.
			name:  "enough local capacity keeps every message local",
			setup: wqSetup{group: "local", workers: map[string][]time.Duration{"berlin": {10 * ms, 10 * ms}, "tunis": {10 * ms}}, messages: 40, rate: 20},
			check: func(t *testing.T, r wqResult) {
				require.Equal(t, r.sent, r.bySite["berlin"])
				require.Zero(t, r.bySite["tunis"])
				require.Zero(t, r.stats["tunis"].FromOtherSites)
				require.Zero(t, r.stats["berlin"].OwnOverflow)
				require.Empty(t, r.stats["tunis"].FromSite)
			},
		},
		{
			// A QoS 1 worker dies holding a message: it is redelivered.
			name: "a killed worker loses nothing",
			setup: wqSetup{group: "kill", workers: map[string][]time.Duration{"berlin": {50 * ms, 50 * ms, 50 * ms}, "tunis": {20 * ms}}, messages: 60, rate: 30,
				during: func(t *testing.T, ws map[string][]*worker) {
					var victim *worker
					require.Eventually(t, func() bool {
						for _, w := range ws["berlin"] {
							if w.busy.Load() {
								victim = w
								return true
							}
						}
						return false
					}, 10*time.Second, time.Millisecond, "no berlin worker busy")
					victim.kill()
				}},
			check: func(t *testing.T, r wqResult) {
				require.Positive(t, r.stats["berlin"].Requeued+r.stats["tunis"].Requeued, "the killed worker's message was not requeued")
				require.Positive(t, r.leftToBridge, "the selection hook should leave the killed worker's message to the bridge")
			},
		},
		{
			// Every AMQP connection of both nodes is closed mid-run, as
			// a missed heartbeat or a node's restart does: the brokers'
			// own and the federation links between the sites. Overflow
			// is in flight at publish, in wq.spill's TTL and across the
			// links; all of it is processed, once per message ID.
			name: "closed AMQP connections lose nothing",
			setup: wqSetup{group: "drop", workers: map[string][]time.Duration{"berlin": {100 * ms}, "tunis": {20 * ms, 20 * ms}}, messages: 90, rate: 30,
				during: func(t *testing.T, _ map[string][]*worker) {
					for _, site := range wqSites {
						closeConnections(t, h.Node(site))
					}
				}},
			check: func(t *testing.T, r wqResult) {
				require.Positive(t, r.stats["tunis"].FromOtherSites, "nothing spilled")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runWorkQueue(t, h, tt.setup)
			require.Equal(t, r.sent, r.distinct, "lost messages")
			// At-least-once: a duplicate would carry the same message ID,
			// so a member deduplicating by ID processes each exactly once.
			require.Equal(t, r.sent, r.ids, "message IDs are not one per message")
			require.Zero(t, r.parked, "work-queue messages parked by the selection hook's re-dispatch")
			tt.check(t, r)
		})
	}
}

// TestEventAgent checks that a wq.* queue created by anyone gets its
// overflow topology and policy, removed again with the queue.
func TestEventAgent(t *testing.T) {
	h := sharedNodes(t)
	n := h.Node("montreal")
	startSiteBroker(t, n, broker.Config{})
	rh, err := rabbithole.NewClient(n.ManagementURL(), rabbitharness.User, rabbitharness.Password)
	require.NoError(t, err)
	waitEventAgent(t, rh)

	conn, err := amqp.Dial(n.AMQPURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(bridge.WorkQueueName("evt"), true, false, false, false, nil)
	require.NoError(t, err)
	exists := func() (dlx, in, intake, policy bool) {
		_, e1 := rh.GetExchange("/", bridge.DeadLetterExchangeName("evt"))
		_, e2 := rh.GetExchange("/", bridge.IntakeExchangeName("evt"))
		_, e3 := rh.GetQueue("/", bridge.IntakeQueueName("evt"))
		_, e4 := rh.GetPolicy("/", bridge.WorkQueuePolicyPrefix+bridge.WorkQueueName("evt"))
		_, e5 := rh.GetExchange("/", "wq.evt.ring0")
		return e1 == nil, e2 == nil && e5 == nil, e3 == nil, e4 == nil
	}
	require.Eventually(t, func() bool {
		a, b, c, d := exists()
		return a && b && c && d
	}, 10*time.Second, 50*time.Millisecond, "overflow topology not created")
	p, err := rh.GetPolicy("/", bridge.WorkQueuePolicyPrefix+bridge.WorkQueueName("evt"))
	require.NoError(t, err)
	require.Equal(t, bridge.DeadLetterExchangeName("evt"), p.Definition["dead-letter-exchange"])
	require.Equal(t, "drop-head", p.Definition["overflow"])

	_, err = ch.QueueDelete(bridge.WorkQueueName("evt"), false, false, false)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		a, b, c, d := exists()
		_, e := rh.GetExchange("/", "wq.evt.ring1")
		return !a && !b && !c && !d && e != nil
	}, 10*time.Second, 50*time.Millisecond, "overflow topology not removed")
}

// nonEmptyQueues lists the queues holding messages on every node.
func nonEmptyQueues(h *rabbitharness.Harness) string {
	var b strings.Builder
	for _, n := range h.Nodes() {
		rh, err := rabbithole.NewClient(n.ManagementURL(), rabbitharness.User, rabbitharness.Password)
		if err != nil {
			continue
		}
		qs, err := rh.ListQueues()
		if err != nil {
			fmt.Fprintf(&b, "%s: %v; ", n.Site, err)
			continue
		}
		for _, q := range qs {
			if q.Messages > 0 {
				fmt.Fprintf(&b, "%s: %s ready %d unacked %d; ", n.Site, q.Name, q.MessagesReady, q.MessagesUnacknowledged)
			}
		}
	}
	return b.String()
}

// closeConnections closes every client connection of node n through its
// management API.
func closeConnections(t *testing.T, n *rabbitharness.Node) {
	t.Helper()
	rh, err := rabbithole.NewClient(n.ManagementURL(), rabbitharness.User, rabbitharness.Password)
	require.NoError(t, err)
	// The management API lists a connection once its stats have been
	// emitted (every few seconds), not as soon as it opens.
	var conns []rabbithole.ConnectionInfo
	var listErr error
	require.Eventually(t, func() bool {
		conns, listErr = rh.ListConnections()
		return listErr == nil && len(conns) > 0
	}, 15*time.Second, 200*time.Millisecond, "no connections listed on %s (last error: %v)", n.Site, stringer(func() string { return fmt.Sprint(listErr) }))
	closed := 0
	for _, c := range conns {
		res, err := rh.CloseConnection(c.Name)
		if res != nil {
			res.Body.Close()
		}
		if err != nil {
			// A connection may end between the listing and the close
			// (the federation plugin opens short-lived ones to check its
			// upstreams): RabbitMQ then answers 404, or 500 if it was
			// ending as it was asked. Only one still open is an error.
			var gone rabbithole.ErrorResponse
			if _, gerr := rh.GetConnection(c.Name); errors.As(gerr, &gone) && gone.StatusCode == http.StatusNotFound {
				continue
			}
			require.NoError(t, err, "closing %s on %s", c.Name, n.Site)
		}
		closed++
	}
	t.Logf("closed %d of the %d connections listed on %s (any others had ended)", closed, len(conns), n.Site)
}
