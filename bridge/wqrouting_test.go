package bridge_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/internal/mqtttest"
	"github.com/luffymq/luffymq/internal/rabbitharness"
	"github.com/luffymq/luffymq/internal/testenv"
)

// routeSites are the sites of the routing tests, on the shared nodes:
// Tunis publishes; Berlin is 22 ms from it, Montréal 60 ms (CityDelay).
var routeSites = []string{"tunis", "berlin", "montreal"}

// routeSetup is a three-site routing scenario: Tunis publishes messages
// at rate; each site's workers (plain paho members that acknowledge after
// processing) have the given service times; local, if set, publishes at
// that site at localRate meanwhile.
type routeSetup struct {
	group     string
	route     string
	workers   map[string][]time.Duration
	messages  int
	rate      int
	local     string
	localRate int
	// siblingWorkers, if set, are members of a second broker at Tunis
	// (broker ID "tunis-2"; the publisher stays on the first).
	siblingWorkers []time.Duration
	// receiptAckers counts, by site, mosquitto_sub members (QoS 1, which
	// acknowledge each message on receipt) beside the workers.
	receiptAckers map[string]int
	// during runs in its own goroutine once publishing starts; the
	// final count waits for it.
	during func(t *testing.T, run *routeRun)
}

// routeRun is a routing scenario under way, as its during hook sees it.
type routeRun struct {
	h       *rabbitharness.Harness
	brokers map[string]*broker.Broker
	share   string
	wqc     bridge.WorkQueueConfig
	tl      *tally
	// published is closed once Tunis published its last message.
	published chan struct{}
}

// Sequence numbers of the routing tests' messages: Tunis's are 0…, the
// local site's from localSeq, the warm-up ones from warmupSeq.
const (
	localSeq  = 10_000
	warmupSeq = 20_000
)

// routeResult is what a routing scenario measured.
type routeResult struct {
	tl   *tally
	sent []time.Time
	// spilledTo counts, by site, Tunis's messages first started there.
	spilledTo map[string]int
	tunis     bridge.WorkQueueStats
	brokers   map[string]*broker.Broker
}

func runRouting(t *testing.T, h *rabbitharness.Harness, s routeSetup) routeResult {
	t.Helper()
	resetNodes(t, h)
	share := "$share/" + s.group + "/jobs/" + s.group + "/#"
	wqc := bridge.WorkQueueConfig{
		MaxLengthPerMember: 3000,
		TTLPerMember:       500 * time.Millisecond,
		RetuneInterval:     100 * time.Millisecond,
		Route:              s.route,
		// luffymq's --federation-max-hops default: the route exchange's
		// own links must still take one hop only.
		Federation: bridge.FederationConfig{MaxHops: 2},
	}
	brokers := startWQSites(t, h, routeSites, share, wqc)
	tl := newTally()
	members := 0
	for site, services := range s.workers {
		for i, svc := range services {
			startWorker(t, brokers[site].MQTTAddr(), fmt.Sprintf("%s-%s-%d", s.group, site, i), share, site, svc, 5*time.Millisecond, tl)
			members++
		}
	}
	for site, n := range s.receiptAckers {
		for i := range n {
			startMosquittoSub(t, brokers[site].MQTTAddr(), fmt.Sprintf("%s-%s-mosq-%d", s.group, site, i), share, site, tl)
		}
	}
	var sibling *broker.Broker // counted with the other brokers' members below
	if s.siblingWorkers != nil {
		sibling = startWQBroker(t, h, "tunis", "tunis-2", share, wqc)
		for i, svc := range s.siblingWorkers {
			startWorker(t, sibling.MQTTAddr(), fmt.Sprintf("%s-tunis2-%d", s.group, i), share, "tunis", svc, 5*time.Millisecond, tl)
			members++
		}
	}
	for _, n := range s.receiptAckers {
		members += n // their acks teach a service time too
	}
	learnedAt := []*broker.Broker{brokers["tunis"], brokers["berlin"], brokers["montreal"]}
	if sibling != nil {
		learnedAt = append(learnedAt, sibling)
	}
	pubs := map[string]*mqtttest.Recorder{}
	for _, name := range routeSites {
		pubs[name] = mqtttest.ConnectRecorder(t, brokers[name].MQTTAddr(), "pub-"+s.group+"-"+name)
	}
	send := func(site string, seq int) {
		pubs[site].MustSend(t, &paho.Publish{Topic: "jobs/" + s.group + "/" + site, QoS: 1, Payload: []byte(strconv.Itoa(seq))})
	}
	// Ready when both overflow paths are federated both ways.
	require.Eventually(t, func() bool {
		for _, name := range routeSites {
			if federatedBindings(h.Node(name), bridge.DeadLetterExchangeName(s.group)) < 2 ||
				federatedBindings(h.Node(name), bridge.RouteExchangeName(s.group)) < 2 {
				return false
			}
		}
		return true
	}, 90*time.Second, 100*time.Millisecond, "work queue %s not federated", s.group) // setup only: slow when nodes are busy
	// Warm-up: every member finishes messages of its own site until the
	// brokers have a service time for each (they acknowledge after
	// processing), so that every site's state can be predicted.
	warm := warmupSeq
	require.Eventually(t, func() bool {
		learned := 0
		for _, b := range learnedAt {
			for _, g := range b.Engine().Snapshot() {
				for _, m := range g.Members {
					if g.Filter == share && m.Online && m.ServiceEstimate > 0 {
						learned++
					}
				}
			}
		}
		if learned == members {
			return true
		}
		for _, name := range routeSites {
			send(name, warm)
			warm++
		}
		return false
	}, 30*time.Second, 300*time.Millisecond, "the members' service times were not learned")
	// With --wq-route nearest no state need be fresh yet: Tunis asks for
	// the other sites' states once its own members fall behind, as a
	// site does after a quiet spell.
	// Let the warm-up drain.
	require.Eventually(t, func() bool {
		d, _, _, _ := tl.counts()
		return d == warm-warmupSeq
	}, 30*time.Second, 50*time.Millisecond, "warm-up messages not processed")

	sent := make([]time.Time, s.messages)
	done := make(chan struct{})
	run := &routeRun{h: h, brokers: brokers, share: share, wqc: wqc, tl: tl, published: make(chan struct{})}
	if s.during != nil {
		go func() {
			defer close(done)
			s.during(t, run)
		}()
	} else {
		close(done)
	}
	if s.local != "" {
		stop := make(chan struct{})
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			tick := time.NewTicker(time.Second / time.Duration(s.localRate))
			defer tick.Stop()
			for seq := localSeq; ; seq++ {
				select {
				case <-stop:
					return
				case <-tick.C:
					send(s.local, seq)
				}
			}
		}()
		defer func() {
			close(stop)
			<-stopped
		}()
	}
	tick := time.NewTicker(time.Second / time.Duration(s.rate))
	for i := range sent {
		<-tick.C
		tl.mu.Lock()
		sent[i] = time.Now()
		tl.mu.Unlock()
		send("tunis", i)
	}
	tick.Stop()
	close(run.published)
	<-done
	require.Eventually(t, func() bool {
		tl.mu.Lock()
		defer tl.mu.Unlock()
		for i := range sent {
			if tl.bySeq[i] == 0 {
				return false
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "not every message of tunis was processed: %v", stringer(func() string {
		d, dups, _, by := tl.counts()
		return fmt.Sprintf("distinct %d dups %d by site %v tunis %+v queues: %s", d, dups, by, brokers["tunis"].Bridge().WorkQueueStats()[s.group], nonEmptyQueues(h))
	}))
	r := routeResult{tl: tl, sent: sent, spilledTo: map[string]int{}, tunis: brokers["tunis"].Bridge().WorkQueueStats()[s.group], brokers: brokers}
	tl.mu.Lock()
	for i := range sent {
		r.spilledTo[tl.firstSite[i]]++
	}
	tl.mu.Unlock()
	t.Logf("%s (%s): tunis's messages by site where they started %v; tunis %+v", s.group, s.route, r.spilledTo, r.tunis)
	return r
}

// checkExactlyOnce fails unless every message was processed and carried
// one message ID: members deduplicating by ID process each exactly once.
func checkExactlyOnce(t *testing.T, r routeResult) {
	t.Helper()
	distinct, _, ids, _ := r.tl.counts()
	require.Equal(t, distinct, ids, "a message was processed under two message IDs, or two messages under one")
}

// publishedBetween counts Tunis's messages published in [from, to) and
// those of them first started at site.
func publishedBetween(r routeResult, from, to time.Time, site string) (n, at int) {
	r.tl.mu.Lock()
	defer r.tl.mu.Unlock()
	for i, sent := range r.sent {
		if sent.Before(from) || !sent.Before(to) {
			continue
		}
		n++
		if r.tl.firstSite[i] == site {
			at++
		}
	}
	return n, at
}

func TestWorkQueueRouting(t *testing.T) {
	h := sharedNodes(t)
	ms := time.Millisecond
	t.Run("overflow goes to the near idle site, not the far one", func(t *testing.T) {
		// Tunis's member does 100 ms a message and 20 arrive a second:
		// about half must leave. Berlin (22 ms) and Montréal (60 ms) are
		// idle with room for all of it; Berlin starts it sooner.
		r := runRouting(t, h, routeSetup{group: "rnear", route: bridge.RouteNearest, messages: 80, rate: 20,
			workers: map[string][]time.Duration{"tunis": {100 * ms}, "berlin": {20 * ms, 20 * ms}, "montreal": {20 * ms, 20 * ms}}})
		checkExactlyOnce(t, r)
		require.Greater(t, r.spilledTo["berlin"], 20, "too little went to berlin")
		require.Less(t, 4*r.spilledTo["montreal"], r.spilledTo["berlin"], "the far site got more than a fifth of the near one's")
		require.Positive(t, r.tunis.RoutedTo["berlin"])
		// States come on demand: Tunis asked, Berlin answered; once every
		// site keeps up, none asks and no state crosses the WAN.
		require.Positive(t, r.tunis.WantsSent)
		require.Positive(t, r.brokers["berlin"].Bridge().WorkQueueStats()["rnear"].StatesTo["tunis"])
		// The same counts reach Prometheus, by site and by reason.
		berlinStates := r.brokers["berlin"].Bridge().WorkQueueStats()["rnear"]
		sent := map[string]float64{}
		reg := prometheus.NewPedanticRegistry()
		require.NoError(t, reg.Register(r.brokers["berlin"].Bridge().Collector()))
		require.NoError(t, reg.Register(r.brokers["tunis"].Bridge().Collector()))
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["queue"] != bridge.WorkQueueName("rnear") {
					continue
				}
				switch mf.GetName() {
				case "luffymq_bridge_wq_states_sent_total":
					if labels["site"] == "berlin" && labels["to"] == "tunis" {
						sent["to tunis"] = m.GetCounter().GetValue()
					}
				case "luffymq_bridge_wq_states_sent_by_reason_total":
					if labels["site"] == "berlin" {
						sent["by reason"] += m.GetCounter().GetValue()
					}
				case "luffymq_bridge_wq_state_requests_sent_total":
					if labels["site"] == "tunis" {
						sent["requests"] = m.GetCounter().GetValue()
					}
				}
			}
		}
		require.GreaterOrEqual(t, sent["to tunis"], float64(berlinStates.StatesTo["tunis"]), "luffymq_bridge_wq_states_sent_total{to=tunis}: %v", sent)
		require.GreaterOrEqual(t, sent["by reason"], sent["to tunis"], "the states by reason count fewer than those to tunis: %v", sent)
		require.Positive(t, sent["requests"], "luffymq_bridge_wq_state_requests_sent_total at tunis: %v", sent)
		statesSent := func() (n uint64, wanted []string) {
			for site, b := range r.brokers {
				w := b.Bridge().WorkQueueStats()["rnear"]
				for _, k := range w.StatesTo {
					n += k
				}
				if w.StatesWanted {
					wanted = append(wanted, site)
				}
			}
			return n, wanted
		}
		var before, after uint64
		var wanted []string
		require.Eventually(t, func() bool {
			before, _ = statesSent()
			time.Sleep(time.Second)
			after, wanted = statesSent()
			return after == before && len(wanted) == 0
		}, 15*time.Second, 10*ms, "states still cross the WAN once every site keeps up: %v", stringer(func() string {
			return fmt.Sprintf("%d states in the last second, asked for by %v", after-before, wanted)
		}))
	})
	t.Run("a near busy site loses to a far idle one", func(t *testing.T) {
		// Berlin's one member takes 2 s a message and Berlin publishes one
		// a second itself (what it cannot start soon goes elsewhere): the
		// member is always busy, for a second on average. Montréal's are
		// idle.
		r := runRouting(t, h, routeSetup{group: "rbusy", route: bridge.RouteNearest, messages: 80, rate: 20, local: "berlin", localRate: 1,
			workers: map[string][]time.Duration{"tunis": {100 * ms}, "berlin": {2 * time.Second}, "montreal": {20 * ms, 20 * ms}}})
		checkExactlyOnce(t, r)
		require.Greater(t, r.spilledTo["montreal"], 20, "too little went to montreal")
		require.Less(t, 10*r.spilledTo["berlin"], r.spilledTo["montreal"], "the busy near site got more than a tenth of the idle far one's")
	})
	t.Run("a message waits at home past the TTL when the others are slower", func(t *testing.T) {
		// The thesis's 1x scale in miniature: service long against the
		// delays. Tunis publishes 40 messages at once; its member takes
		// 100 ms a message, Berlin's and Montréal's 1 s. Tunis's member
		// starts the k-th in about k × 100 ms, past eq. 2.12's TTL from
		// the sixth or so, yet sooner than the others but for about one
		// message a second each: about 8 should leave. Sending each one
		// past the TTL to the best other site (the old rule) sent 30 or
		// more there, to wait seconds behind each other.
		r := runRouting(t, h, routeSetup{group: "rhold", route: bridge.RouteNearest, messages: 40, rate: 100,
			workers: map[string][]time.Duration{"tunis": {100 * ms}, "berlin": {time.Second}, "montreal": {time.Second}}})
		checkExactlyOnce(t, r)
		away := r.spilledTo["berlin"] + r.spilledTo["montreal"]
		require.Positive(t, away, "no message went to the idle sites")
		require.LessOrEqual(t, away, 14, "%d of tunis's 40 messages left for sites whose members take 1 s", away)
	})
	t.Run("a sibling broker's idle members keep the site's messages at home", func(t *testing.T) {
		// As in the first case, but a second broker at Tunis has two idle
		// 20 ms members: the site can start everything at once, and
		// Tunis's broker must see it (the sibling's states) instead of
		// sending half of it to Berlin as its own busy member would have
		// it.
		r := runRouting(t, h, routeSetup{group: "rsibling", route: bridge.RouteNearest, messages: 80, rate: 20,
			workers:        map[string][]time.Duration{"tunis": {100 * ms}, "berlin": {20 * ms, 20 * ms}, "montreal": {20 * ms, 20 * ms}},
			siblingWorkers: []time.Duration{20 * ms, 20 * ms}})
		checkExactlyOnce(t, r)
		away := r.spilledTo["berlin"] + r.spilledTo["montreal"]
		require.LessOrEqual(t, away, 8, "%d of tunis's 80 messages left the site though a sibling broker's members were idle", away)
	})
	t.Run("mosquitto_sub members are predicted from their acks and lose nothing", func(t *testing.T) {
		// As in the first case, but Berlin's members are mosquitto_sub
		// processes (QoS 1, no load reports): each acknowledges a message
		// as it prints it, which for mosquitto_sub is the whole work. The
		// broker learns a service time from those acks, as for any
		// member that acknowledges after processing, so Berlin's state
		// shows idle members 22 ms away and Tunis routes its overflow
		// there, each message processed once. (A client that acks on
		// receipt and works afterwards looks the same without reports:
		// docs/sites.md.)
		r := runRouting(t, h, routeSetup{group: "rmosq", route: bridge.RouteNearest, messages: 80, rate: 20,
			workers:       map[string][]time.Duration{"tunis": {100 * ms}, "montreal": {20 * ms, 20 * ms}},
			receiptAckers: map[string]int{"berlin": 2}})
		checkExactlyOnce(t, r)
		require.Greater(t, r.tunis.RoutedTo["berlin"], uint64(20), "too little routed to berlin's idle mosquitto_sub members")
		require.Less(t, 4*r.spilledTo["montreal"], r.spilledTo["berlin"], "the far site got more than a fifth of the near one's")
	})
	t.Run("a cut link sends new messages elsewhere and loses nothing", func(t *testing.T) {
		// As in the first case, but both links between Tunis and Berlin
		// are cut 1 s into publishing, with messages on their way to
		// Berlin, and restored 5 s later. Berlin's state goes stale after
		// 1.5 s (and what Tunis sent it is not taken meanwhile); what
		// Tunis publishes from then on must start elsewhere, before the
		// links return. What was held for Berlin in Tunis's link queue
		// is taken back 3 s after Berlin's last state (the cut lasts
		// longer) and processed elsewhere; what was already on its way
		// arrives once the links return.
		var cutAt, restoredAt time.Time
		r := runRouting(t, h, routeSetup{group: "rcut", route: bridge.RouteNearest, messages: 140, rate: 20,
			workers: map[string][]time.Duration{"tunis": {100 * ms}, "berlin": {20 * ms, 20 * ms}, "montreal": {20 * ms, 20 * ms}},
			during: func(t *testing.T, run *routeRun) {
				h := run.h
				time.Sleep(time.Second) // let messages be booked to Berlin
				links := make([]*rabbitharness.Link, 0, 2)
				for _, pair := range [][2]string{{"tunis", "berlin"}, {"berlin", "tunis"}} {
					l, err := h.Link(h.Node(pair[0]), h.Node(pair[1]))
					if err != nil {
						t.Error(err)
						return
					}
					links = append(links, l)
				}
				cutAt = time.Now()
				for _, l := range links {
					l.Cut()
				}
				time.Sleep(5 * time.Second) // the outage itself
				restoredAt = time.Now()
				for _, l := range links {
					if err := l.Restore(); err != nil {
						t.Error(err)
					}
				}
			}})
		checkExactlyOnce(t, r)
		_, dups, _, _ := r.tl.counts()
		t.Logf("duplicate deliveries (same message ID, deduplicated by members): %d; taken back from the link queue towards berlin: %d", dups, r.tunis.Reclaimed["berlin"])
		late, atBerlin := publishedBetween(r, cutAt.Add(2*time.Second), restoredAt, "berlin")
		// Routing sends none there; a message kept at Tunis that
		// outlives its TTL still leaves through the hash ring, which may
		// pick Berlin (with the ring alone, 23 of 54 went there).
		require.Positive(t, late)
		require.Less(t, 10*atBerlin, late, "%d of the %d messages published while berlin's state was stale and its links cut went to berlin", atBerlin, late)
	})
}

// startMosquittoSub runs a mosquitto_sub member of share (MQTT v5, QoS 1:
// it acknowledges each message as it arrives) until t ends, and records
// each message it prints in tl under label.
func startMosquittoSub(t *testing.T, addr, id, share, label string, tl *tally) {
	t.Helper()
	bin := testenv.RequireBinary(t, "mosquitto_sub", "mosquitto-clients")
	host, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	// One line a message: the payload (a sequence number), then the user
	// properties, the message ID among them.
	cmd := exec.CommandContext(ctx, bin, "-V", "mqttv5", "-h", host, "-p", port, "-i", id, "-q", "1", "-t", share, "-F", "%p %P")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr := new(testenv.LockedBuffer)
	cmd.Stderr = stderr
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() {
		defer close(done)
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			fields := strings.Fields(lines.Text())
			if len(fields) == 0 {
				continue
			}
			seq, err := strconv.Atoi(fields[0])
			if err != nil {
				continue
			}
			msgID := ""
			for _, f := range fields[1:] {
				if v, ok := strings.CutPrefix(f, bridge.MessageIDUserProperty+":"); ok {
					msgID = v
				}
			}
			now := time.Now()
			tl.started(label, seq, now)
			tl.record(label, seq, msgID)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("mosquitto_sub %s: %s", id, stderr.String())
		}
	})
}
