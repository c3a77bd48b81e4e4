package scoring_test

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/scoring"
)

// This file is a deterministic discrete-event simulation of the scenarios
// of scenarios.md §A (thesis-1 and thesis-2; step, join and poisson too),
// driven through the Engine with a ManualClock:
//
//   - the members connect at t = 0 (unless said); one publisher sends a
//     message every 10 ms for 15 s from t = 300 ms (so a client reporting
//     only on its 1 s timer leaves the broker blind for the first 700 ms, as
//     in the doc);
//   - every member puts what it receives in a FIFO and one worker takes the
//     messages out; service is drift-free: a message that was waiting starts
//     exactly when the previous one ended;
//   - members report like the SDK (see reportsSDK); the SDK's own t_p, used
//     in backlogMs, is the mean since its last report (or the last one);
//   - broker↔member transfers take `wire` one way (0 unless said);
//   - latency = dequeue time − publish time, as in the thesis;
//   - the run drains: it ends when every sent message has been dequeued.
//
// Events at the same instant run in this order: a worker finishing (and
// taking its next message), a message arriving at a member, a report or an
// acknowledgement arriving at the broker, report timers, the publish.

const (
	simGroup        = "$share/g/sensors"
	simPublishEvery = 10 * time.Millisecond
	simMessages     = 1500 // 15 s
	simPublishStart = 300 * time.Millisecond
	simReportEvery  = time.Second
	simMinGap       = 100 * time.Millisecond // rate limit of pending-change reports
	simMinIdleGap   = 10 * time.Millisecond  // rate limit of going-idle reports
	simWarmupLimit  = 32                     // the SDK's warm-up reports cover this many messages
)

// simReporting says when a simulated member reports.
type simReporting int

const (
	// reportsSDK: like LuffyMQ's SDK (clientsdk's reportSchedule): right
	// after the first processed message, then whenever the messages
	// finished since the last report reach those already reported (after
	// 1, 2, 4, … 32: warm-up), every 1 s, on a pending jump of ≥ max(2,
	// 50 %) (at most every 100 ms), and on going idle after receiving
	// work since its last report (at most every 10 ms); a report due
	// sooner than its gap allows is sent when the gap has passed. Each
	// says how many messages its processing time is the mean of.
	reportsSDK simReporting = iota
	// reportsTimer: only on the 1 s timer.
	reportsTimer
	// reportsThesisKeys: only the thesis's two keys (msgsInQueue and
	// processingTimePerMsg), every 1 s and right after the first
	// processed message, like a plain client written from the paper.
	reportsThesisKeys
	// reportsThesisTimer: the thesis's two keys on the 1 s timer only
	// (the thesis's own Java client).
	reportsThesisTimer
	// reportsNone: no reports at all (a plain client at QoS 1 that
	// acknowledges after processing: the broker learns from its acks).
	reportsNone
)

type simScenario struct {
	name     string
	services []time.Duration
	// Optional: how many messages (default simMessages), the gap before
	// each (default simPublishEvery), when each member connects (default
	// 0), and one member's service time changing at stepAt.
	messages    int
	gap         func(r *rand.Rand) time.Duration
	joinAt      []time.Duration
	stepAt      time.Duration
	stepMember  int
	stepService time.Duration
	// expService draws each message's work from an exponential
	// distribution: its service time at a member is the member's mean
	// times an Exp(1) factor drawn at publish (the same for every
	// strategy and the oracle of a scenario).
	expService bool
}

func (sc simScenario) count() int {
	if sc.messages > 0 {
		return sc.messages
	}
	return simMessages
}

var (
	simThesis1 = simScenario{name: "thesis-1", services: []time.Duration{25 * time.Millisecond, 25 * time.Millisecond, 25 * time.Millisecond}}
	simThesis2 = simScenario{name: "thesis-2", services: []time.Duration{25 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond}}
)

// simConfig is one simulated run.
type simConfig struct {
	scenario  simScenario
	strategy  string // an engine strategy, or one of the oracles: "oracle", "informed-oracle", "ack-informed-oracle", "report-informed-oracle"
	reporting simReporting
	qos1      bool          // QoS 1, acknowledged after processing
	wire      time.Duration // one-way broker↔member delay
	ackFlush  time.Duration // acks are sent in bursts this often (paho.golang: 50 ms); 0: at once
	// ackAfterRead writes acks as Python paho 1.6 does: after the next
	// read, so an ack waits while the member goes straight on to another
	// message and leaves with that one's (pairs), and leaves at once when
	// the member goes idle.
	ackAfterRead bool
	// jitter adds a uniformly random [0, jitter) to every transfer, keeping
	// each direction of each member's connection in order (TCP).
	jitter time.Duration
	// holdLead turns on the engine's late binding (Config.HoldLead).
	holdLead time.Duration
	// sampleSize is the adaptive strategy's Config.SampleSize (0: the
	// default).
	sampleSize int
	// fromReceipt makes members report as processing time the time from
	// a message's receipt to its end, its wait in the member's own queue
	// included: a client that times its messages from arrival.
	fromReceipt bool
	// seed varies the run's random draws (publish gaps, work, jitter); 0
	// is the draws every test was written with.
	seed uint64
}

func (c simConfig) variant() string {
	v := [...]string{"sdk", "1s-only", "thesis-keys", "thesis-timer", "no-reports"}[c.reporting]
	if c.qos1 {
		v += "+qos1"
	}
	if c.wire > 0 {
		v += fmt.Sprintf("+wire%v", c.wire)
	}
	if c.ackFlush > 0 {
		v += fmt.Sprintf("+acks/%v", c.ackFlush)
	}
	if c.ackAfterRead {
		v += "+acks-after-read"
	}
	if c.jitter > 0 {
		v += fmt.Sprintf("+jitter%v", c.jitter)
	}
	if c.holdLead > 0 {
		v += fmt.Sprintf("+hold%v", c.holdLead)
	}
	if c.sampleSize > 0 {
		v += fmt.Sprintf("+sample%d", c.sampleSize)
	}
	if c.fromReceipt {
		v += "+timed-from-receipt"
	}
	return v
}

type simMember struct {
	id      string
	service time.Duration
	joined  bool
	// latest arrival time scheduled in each direction (transfers stay in
	// order, as on one TCP connection)
	lastToMember, lastToBroker time.Duration

	fifo      []int // ids of received messages not yet dequeued
	busy      bool
	busyUntil time.Duration
	received  uint64
	onWire    int // sent by the broker, not yet arrived

	// reporter state
	doneSince        int           // messages finished since the last report
	doneSinceSum     time.Duration // their processing time
	doneTotal        int
	measured         int           // messages the reports' processing times covered
	lastTp           time.Duration // the last reported processing time
	reported         bool
	lastReportAt     time.Duration
	lastReportedQ    int
	lastReportedBusy bool
	receivedAtReport uint64
	reportDueAt      time.Duration // when a deferred report is reconsidered
	// periodicAt is when the SDK's periodic report is due: an interval
	// after its last report of any kind (clientsdk's reportSchedule).
	periodicAt time.Duration

	latencies []time.Duration // per dequeued message, in dequeue order
	// lastService is how long the message it ran last took.
	lastService time.Duration
	// running is the id of the message it runs (or ran last).
	running int

	unsentAcks int // finished, acknowledgement not flushed yet

	// What a broker knows of a QoS 1 member from its acknowledgements
	// (ackInformedOracle): deliveries not acknowledged yet, and since
	// when it has held some without a pause, as far as the acks tell.
	seenInflight int
	busySince    time.Duration
	lastFlushAt  time.Duration // when it last flushed its acks (ackFlush > 0)

	// What a broker knows of a member from thesis-format reports
	// (reportInformedOracle): the pending count its last report gave and
	// when it was written, and when the broker sent it messages.
	seenPending   int
	seenWrittenAt time.Duration
	// and the processing times its reports gave: their sum over the
	// messages each covered, and how many those were.
	seenDoneSum time.Duration
	seenDone    int
	sendTimes   []time.Duration
}

// tp is the member's own current processing time estimate, as the SDK
// keeps it: the mean since the last report, or the last such mean.
func (m *simMember) tp() time.Duration {
	if m.doneSince > 0 {
		return m.doneSinceSum / time.Duration(m.doneSince)
	}
	return m.lastTp
}

type simEventKind int

// Order of kinds at the same instant.
const (
	evDone simEventKind = iota
	evJoin
	evArrive
	evReport
	evAck
	evAckFlush
	evTimer
	evReportDue
	evRecheck
	evPublish
)

type simEvent struct {
	at     time.Duration
	kind   simEventKind
	member int
	msg    int // evArrive: message id; evReport: the messages its processing time covers
	load   scoring.Load
	seq    int
}

type simQueue []simEvent

func (q simQueue) Len() int { return len(q) }
func (q simQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	if q[i].kind != q[j].kind {
		return q[i].kind < q[j].kind
	}
	return q[i].seq < q[j].seq
}
func (q simQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)   { *q = append(*q, x.(simEvent)) }
func (q *simQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type simResult struct {
	cfg        simConfig
	published  int
	dequeued   int
	duplicated int
	mean       time.Duration
	p50        time.Duration
	p99        time.Duration
	max        time.Duration
	perMember  []int
	members    []*simMember
	reports    int
}

type simRun struct {
	t         *testing.T
	cfg       simConfig
	engine    *scoring.Engine
	clock     *scoring.ManualClock
	now       time.Duration
	members   []*simMember
	byID      map[string]int
	q         simQueue
	seq       int
	reports   int
	published []time.Duration // publish time per message id
	arrived   []time.Duration // arrival at its member per message id
	work      []float64       // per message id: its service factor (1 unless expService)
	dequeued  []bool
	dups      int
	jitterRNG *rand.Rand
	estimates []time.Duration // reportEstimatingOracle's, reused
	held      []int           // late binding: messages waiting at the broker
	recheckAt time.Duration   // the next evRecheck scheduled
}

// toMember is when something the broker sends to member i now arrives.
func (s *simRun) toMember(i int) time.Duration {
	m := s.members[i]
	at := max(s.now+s.transfer(), m.lastToMember)
	m.lastToMember = at
	return at
}

// toBroker is when something member i sends now reaches the broker.
func (s *simRun) toBroker(i int) time.Duration {
	m := s.members[i]
	at := max(s.now+s.transfer(), m.lastToBroker)
	m.lastToBroker = at
	return at
}

func (s *simRun) transfer() time.Duration {
	d := s.cfg.wire
	if s.cfg.jitter > 0 {
		d += time.Duration(s.jitterRNG.Int64N(int64(s.cfg.jitter)))
	}
	return d
}

func (s *simRun) push(ev simEvent) {
	s.seq++
	ev.seq = s.seq
	heap.Push(&s.q, ev)
}

func (s *simRun) advanceTo(at time.Duration) {
	require.GreaterOrEqual(s.t, at, s.now, "simulation time went backwards")
	s.clock.Advance(at - s.now)
	s.now = at
}

// startNext lets the member's idle worker take its next message.
func (s *simRun) startNext(i int) {
	m := s.members[i]
	if m.busy || len(m.fifo) == 0 {
		return
	}
	id := m.fifo[0]
	m.fifo = m.fifo[1:]
	if s.dequeued[id] {
		s.dups++
	}
	s.dequeued[id] = true
	m.latencies = append(m.latencies, s.now-s.published[id])
	m.busy = true
	sc := s.cfg.scenario
	if sc.stepAt > 0 && s.now >= sc.stepAt && i == sc.stepMember {
		m.service = sc.stepService
	}
	m.lastService = s.serviceOf(m, id)
	m.running = id
	m.busyUntil = s.now + m.lastService
	s.push(simEvent{at: m.busyUntil, kind: evDone, member: i})
}

// serviceOf is how long member m takes to process message id.
func (s *simRun) serviceOf(m *simMember, id int) time.Duration {
	return time.Duration(float64(m.service) * s.work[id])
}

// send hands message msg to the member the strategy (or the oracle) picks.
func (s *simRun) send(msg int) {
	var i int
	switch s.cfg.strategy {
	case "oracle":
		i = s.oracle()
	case "informed-oracle":
		i = s.informedOracle()
	case "ack-informed-oracle":
		i = s.ackInformedOracle()
	case "report-informed-oracle":
		i = s.reportInformedOracle()
	case "report-estimating-oracle":
		i = s.reportEstimatingOracle()
	default:
		id, ok := s.engine.SelectMember(simGroup, scoring.Message{PublisherID: "pub", Topic: "sensors"})
		require.True(s.t, ok)
		var known bool
		i, known = s.byID[id]
		require.True(s.t, known, "selected unknown member %q", id)
	}
	if s.cfg.qos1 {
		s.engine.InFlightStarted(s.members[i].id)
		if m := s.members[i]; m.seenInflight == 0 {
			m.busySince = s.now + s.cfg.wire // idle, as far as the acks tell
		}
		s.members[i].seenInflight++
	}
	s.members[i].onWire++
	s.members[i].sendTimes = append(s.members[i].sendTimes, s.now)
	s.push(simEvent{at: s.toMember(i), kind: evArrive, member: i, msg: msg})
}

// dispatchHeld hands held messages over, oldest first, while the engine
// no longer advises holding them, and schedules the next check.
func (s *simRun) dispatchHeld() {
	for len(s.held) > 0 {
		advice := s.engine.AdviseHold(simGroup)
		if advice.Hold {
			at := s.now + advice.RecheckAfter
			if s.recheckAt <= s.now || at < s.recheckAt {
				s.recheckAt = at
				s.push(simEvent{at: at, kind: evRecheck, member: -1})
			}
			return
		}
		msg := s.held[0]
		s.held = s.held[1:]
		s.send(msg)
	}
}

// report writes a report at the member now; the broker gets it after wire.
func (s *simRun) report(i int) {
	m := s.members[i]
	l := scoring.Load{Pending: len(m.fifo)}
	if m.doneSince > 0 {
		l.ProcessingTime = m.doneSinceSum / time.Duration(m.doneSince)
	}
	thesisKeysOnly := s.cfg.reporting == reportsThesisKeys || s.cfg.reporting == reportsThesisTimer
	if !thesisKeysOnly {
		l.Workers, l.Received, l.HasReceived = 1, m.received, true
		l.Processed = m.doneSince // the SDK says how many its mean covers
	}
	if m.busy && !thesisKeysOnly {
		l.InProgress = 1
	}
	if tp := m.tp(); tp > 0 && !thesisKeysOnly {
		// Backlog = remaining of the current message + pending × t_p.
		var remaining time.Duration
		if m.busy {
			remaining = max(tp-(s.now-(m.busyUntil-m.lastService)), 0)
		}
		l.Backlog = remaining + time.Duration(len(m.fifo))*tp
		l.HasBacklog = true
	}
	if thesisKeysOnly {
		l.WrittenAgo = s.cfg.wire + s.cfg.jitter/2 // the broker measures the one-way delay
	}
	s.reports++
	covered := m.doneSince
	if l.ProcessingTime > 0 {
		m.lastTp = l.ProcessingTime
		m.measured += m.doneSince
	}
	m.doneSince, m.doneSinceSum = 0, 0
	m.reported = true
	m.lastReportAt = s.now
	m.lastReportedQ = len(m.fifo)
	m.lastReportedBusy = m.busy || len(m.fifo) > 0
	m.receivedAtReport = m.received
	if s.cfg.reporting == reportsSDK {
		m.periodicAt = s.now + simReportEvery
		s.push(simEvent{at: m.periodicAt, kind: evTimer, member: i})
	}
	s.push(simEvent{at: s.toBroker(i), kind: evReport, member: i, load: l, msg: covered})
}

// maybeReportOnChange sends the SDK's reports on change: on going idle and
// on a pending jump. One that comes too soon after the last report is
// deferred to the first moment its gap allows, as the SDK's reportSchedule
// does, and is sent then if it is still due.
func (s *simRun) maybeReportOnChange(i int) {
	if s.cfg.reporting != reportsSDK {
		return
	}
	m := s.members[i]
	q := len(m.fifo)
	if q == 0 && !m.busy && m.reported && (m.lastReportedBusy || m.received > m.receivedAtReport) {
		if at := m.lastReportAt + simMinIdleGap; s.now < at {
			s.reportAt(i, at)
			return
		}
		s.report(i) // gone idle while the broker counts work
		return
	}
	diff := q - m.lastReportedQ
	if diff < 0 {
		diff = -diff
	}
	if diff < max(2, (m.lastReportedQ+1)/2) {
		return
	}
	if at := m.lastReportAt + simMinGap; m.reported && s.now < at {
		s.reportAt(i, at)
		return
	}
	s.report(i)
}

// reportAt has member i reconsider a deferred report at at, unless it
// will sooner.
func (s *simRun) reportAt(i int, at time.Duration) {
	m := s.members[i]
	if m.reportDueAt > s.now && m.reportDueAt <= at {
		return
	}
	m.reportDueAt = at
	s.push(simEvent{at: at, kind: evReportDue, member: i})
}

// oracle is the perfect-information earliest start: the member that can
// start a message soonest, knowing every member's exact queue; ties go to
// the one idle longest.
func (s *simRun) oracle() int {
	return s.earliest(func(m *simMember) time.Duration {
		start := s.now + s.cfg.wire
		if m.busy && m.busyUntil > start {
			start = m.busyUntil
		}
		for _, id := range m.fifo {
			start += s.serviceOf(m, id)
		}
		return start + time.Duration(m.onWire)*m.service
	}, trulyIdleSince)
}

// trulyIdleSince is when m last finished a message: the tie-break of the
// oracles that know every member's queue.
func trulyIdleSince(m *simMember) time.Duration { return m.busyUntil }

// lastSentTo is when the broker last sent m a message (-1: never): the
// tie-break of the oracles that know only what a broker can.
func lastSentTo(m *simMember) time.Duration {
	if len(m.sendTimes) == 0 {
		return -1
	}
	return m.sendTimes[len(m.sendTimes)-1]
}

// earliest returns the joined member whose start (as the oracle calling
// it works it out) is soonest; ties go to the one idle longest, as far as
// the oracle knows: since idleSince.
func (s *simRun) earliest(start, idleSince func(m *simMember) time.Duration) int {
	best := -1
	var bestStart, bestIdle time.Duration
	for i, m := range s.members {
		if !m.joined {
			continue
		}
		at := start(m)
		idle := idleSince(m)
		if best < 0 || at < bestStart || (at == bestStart && idle < bestIdle) {
			best, bestStart, bestIdle = i, at, idle
		}
	}
	return best
}

// informedOracle knows what a broker could at best know: every member's
// exact queue (running, received, on the wire) and its true mean service
// time, but not the size of any message. It picks the earliest expected
// start, the expected remaining of the running message included: with
// exponential work that is a whole mean however long it has run; with fixed
// work it is exact. Ties go to the one idle longest.
func (s *simRun) informedOracle() int {
	return s.earliest(s.informedStart, trulyIdleSince)
}

// ackInformedOracle knows what a broker could at best know of QoS 1
// members on memoryless (exponential) work that send no reports: each
// member's true mean service time, how many of its deliveries are not
// acknowledged yet, and since when it has held some without a pause (its
// last acknowledgement, or the send that found it idle). It picks the
// earliest expected start given that knowledge: the messages it finished
// since are a Poisson count of that time over its mean, capped by what it
// holds. With acks flushed on a timer (paho.golang's 50 ms) this is the
// bound of issue 23 for what any broker could do with them; the informed
// oracle, which sees every member's queue at every instant, knows more.
// Ties go to the member sent a message longest ago (a broker does not know
// which of them is idle longest).
func (s *simRun) ackInformedOracle() int {
	require.True(s.t, s.cfg.qos1 && s.cfg.ackFlush > 0 && s.cfg.scenario.expService, "the ack-informed oracle models QoS 1 members that flush their acks on a timer, on exponential work")
	return s.earliest(func(m *simMember) time.Duration {
		start := s.now + s.cfg.wire
		if n := m.seenInflight; n > 0 {
			// The acks of the last flush whose acks must have arrived by
			// now say nothing else finished before it: only what ran
			// since is unknown. (A broker can learn a timer's grid.)
			tick := m.lastFlushAt
			if s.now < tick+s.cfg.wire+s.cfg.jitter {
				tick -= s.cfg.ackFlush
			}
			lambda := float64(max(s.now-max(m.busySince, tick), 0)) / float64(m.service)
			start = max(start, s.now+time.Duration(scoring.PoissonShortfall(n, lambda)*float64(m.service)))
		}
		return start
	}, lastSentTo)
}

// reportInformedOracle knows what a broker could at best know of QoS 0
// members on memoryless (exponential) work that send thesis-format
// reports (their pending count and mean processing time, every second and
// after their first message): each member's true mean service time, the
// pending count of its last report and when it was written, and the
// messages sent to it since. A member that reported messages pending was
// running one besides; one that reported none may have been, but the
// report does not say. What it finished since the report is a Poisson
// count of that time over its mean, capped by what it held. This is the
// bound of issue 23 for what such reports leave any broker, if it knew the
// members' speeds (reportEstimatingOracle learns them). Ties go to the
// member sent a message longest ago.
func (s *simRun) reportInformedOracle() int {
	require.True(s.t, !s.cfg.qos1 && s.cfg.scenario.expService && s.cfg.reporting != reportsSDK && s.cfg.reporting != reportsNone, "the report-informed oracle models QoS 0 thesis-format reporters on exponential work")
	return s.earliest(func(m *simMember) time.Duration { return s.reportInformedStart(m, m.service) }, lastSentTo)
}

// reportInformedStart is the expected start of a message sent to m now, as
// far as m's last thesis-format report and the sends since tell, for a
// mean service time svc (0: unknown, no wait counted).
func (s *simRun) reportInformedStart(m *simMember, svc time.Duration) time.Duration {
	held := m.seenPending
	if held > 0 {
		held++ // and the one it was running
	}
	for k := len(m.sendTimes) - 1; k >= 0 && m.sendTimes[k] > m.seenWrittenAt; k-- {
		held++
	}
	start := s.now + s.cfg.wire
	if held > 0 && svc > 0 {
		lambda := float64(max(s.now-m.seenWrittenAt, 0)) / float64(svc)
		start = max(start, s.now+time.Duration(scoring.PoissonShortfall(held, lambda)*float64(svc)))
	}
	return start
}

// reportEstimatingOracle is reportInformedOracle without the members'
// true means: it estimates each from what their reports said, the mean of
// every processing time reported weighted by the messages it covered (the
// best estimate of a fixed mean), and gives a member without one the
// median of the others'. It is the bound of what thesis-format reports
// every second leave any broker that must learn the members' speeds.
func (s *simRun) reportEstimatingOracle() int {
	require.True(s.t, !s.cfg.qos1 && s.cfg.scenario.expService && s.cfg.reporting != reportsSDK && s.cfg.reporting != reportsNone, "the report-estimating oracle models QoS 0 thesis-format reporters on exponential work")
	known := s.estimates[:0]
	for _, m := range s.members {
		if m.seenDone > 0 {
			known = append(known, m.seenDoneSum/time.Duration(m.seenDone))
		}
	}
	var median time.Duration
	if len(known) > 0 {
		slices.Sort(known)
		median = known[len(known)/2]
	}
	s.estimates = known
	return s.earliest(func(m *simMember) time.Duration {
		svc := median
		if m.seenDone > 0 {
			svc = m.seenDoneSum / time.Duration(m.seenDone)
		}
		return s.reportInformedStart(m, svc)
	}, lastSentTo)
}

// informedStart is the informed oracle's expected start of a message sent
// to member m now.
func (s *simRun) informedStart(m *simMember) time.Duration {
	ahead := time.Duration(len(m.fifo)+m.onWire) * m.service
	start := s.now
	if m.busy && m.busyUntil > s.now {
		if s.cfg.scenario.expService {
			start += m.service
		} else {
			start = m.busyUntil
		}
	}
	return max(start+ahead, s.now+s.cfg.wire)
}

func runSim(t *testing.T, cfg simConfig) simResult {
	t.Helper()
	clock := scoring.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	strategy := cfg.strategy
	if strings.HasSuffix(strategy, "oracle") {
		strategy = "round-robin" // unused: the oracle decides by itself
	}
	engine, err := scoring.NewEngine(scoring.Config{Strategy: strategy, Clock: clock, ReportInterval: simReportEvery, HoldLead: cfg.holdLead, SampleSize: cfg.sampleSize})
	require.NoError(t, err)
	total := cfg.scenario.count()
	s := &simRun{t: t, cfg: cfg, engine: engine, clock: clock, byID: map[string]int{},
		published: make([]time.Duration, 0, total), dequeued: make([]bool, total), arrived: make([]time.Duration, total),
		jitterRNG: rand.New(rand.NewPCG(3, 4+cfg.seed))}
	rng := rand.New(rand.NewPCG(1, 2+cfg.seed))
	workRNG := rand.New(rand.NewPCG(5, 6+cfg.seed))
	for i, svc := range cfg.scenario.services {
		m := &simMember{id: fmt.Sprintf("m%d", i+1), service: svc}
		s.members = append(s.members, m)
		s.byID[m.id] = i
		var at time.Duration
		if i < len(cfg.scenario.joinAt) {
			at = cfg.scenario.joinAt[i]
		}
		s.push(simEvent{at: at, kind: evJoin, member: i})
	}
	s.push(simEvent{at: simPublishStart, kind: evPublish})

	outstanding := func() bool {
		if len(s.published) < total || len(s.held) > 0 {
			return true
		}
		for _, m := range s.members {
			if len(m.fifo) > 0 || m.busy || m.onWire > 0 {
				return true
			}
		}
		return false // acks still unsent do not delay the end
	}
	for outstanding() {
		require.NotEmpty(t, s.q)
		ev := heap.Pop(&s.q).(simEvent)
		s.advanceTo(ev.at)
		m := (*simMember)(nil)
		if ev.member >= 0 && ev.kind != evPublish {
			m = s.members[ev.member]
		}
		switch ev.kind {
		case evJoin:
			m.joined = true
			engine.Connect(m.id)
			engine.Join(simGroup, m.id)
			if cfg.reporting != reportsNone {
				m.periodicAt = s.now + simReportEvery
				s.push(simEvent{at: m.periodicAt, kind: evTimer, member: ev.member})
			}
			if cfg.qos1 && cfg.ackFlush > 0 {
				s.push(simEvent{at: s.now + cfg.ackFlush, kind: evAckFlush, member: ev.member})
			}
		case evDone:
			m.busy = false
			m.doneSince++
			if cfg.fromReceipt {
				m.doneSinceSum += s.now - s.arrived[m.running]
			} else {
				m.doneSinceSum += m.lastService
			}
			m.doneTotal++
			switch {
			case cfg.qos1 && cfg.ackFlush > 0:
				m.unsentAcks++
			case cfg.qos1 && cfg.ackAfterRead:
				m.unsentAcks++
				if m.unsentAcks >= 2 || len(m.fifo) == 0 {
					for ; m.unsentAcks > 0; m.unsentAcks-- {
						s.push(simEvent{at: s.toBroker(ev.member), kind: evAck, member: ev.member})
					}
				}
			case cfg.qos1:
				s.push(simEvent{at: s.toBroker(ev.member), kind: evAck, member: ev.member})
			}
			s.startNext(ev.member)
			switch {
			case (cfg.reporting == reportsSDK || cfg.reporting == reportsThesisKeys) && m.doneTotal == 1:
				s.report(ev.member) // first measurement: report at once
			case cfg.reporting == reportsSDK && m.measured < simWarmupLimit && m.doneSince >= m.measured:
				s.report(ev.member) // warm-up: each report doubles what the estimate rests on
			default:
				s.maybeReportOnChange(ev.member)
			}
		case evArrive:
			m.onWire--
			s.arrived[ev.msg] = s.now
			m.fifo = append(m.fifo, ev.msg)
			m.received++
			s.startNext(ev.member)
			s.maybeReportOnChange(ev.member)
		case evReport:
			require.True(t, engine.Report(m.id, ev.load))
			m.seenPending, m.seenWrittenAt = ev.load.Pending, s.now-s.cfg.wire
			if ev.load.ProcessingTime > 0 && ev.msg > 0 {
				m.seenDoneSum += ev.load.ProcessingTime * time.Duration(ev.msg)
				m.seenDone += ev.msg
			}
		case evAck:
			engine.InFlightAcknowledged(m.id)
			m.seenInflight--
			m.busySince = s.now // still busy if it holds more
		case evAckFlush:
			m.lastFlushAt = s.now
			for ; m.unsentAcks > 0; m.unsentAcks-- {
				s.push(simEvent{at: s.toBroker(ev.member), kind: evAck, member: ev.member})
			}
			s.push(simEvent{at: s.now + cfg.ackFlush, kind: evAckFlush, member: ev.member})
		case evReportDue:
			if ev.at == m.reportDueAt {
				s.maybeReportOnChange(ev.member)
			}
		case evTimer:
			switch cfg.reporting {
			case reportsNone:
			case reportsSDK:
				// The SDK's periodic report comes an interval after its
				// last report, whatever that was sent for (report
				// schedules the next).
				if ev.at == m.periodicAt {
					s.report(ev.member)
				}
			default: // a timer of its own, every interval
				s.report(ev.member)
				s.push(simEvent{at: ev.at + simReportEvery, kind: evTimer, member: ev.member})
			}
		case evPublish:
			msg := len(s.published)
			s.published = append(s.published, s.now)
			factor := 1.0
			if cfg.scenario.expService {
				factor = workRNG.ExpFloat64()
			}
			s.work = append(s.work, factor)
			if cfg.holdLead > 0 {
				s.held = append(s.held, msg)
			} else {
				s.send(msg)
			}
			if len(s.published) < total {
				gap := simPublishEvery
				if cfg.scenario.gap != nil {
					gap = cfg.scenario.gap(rng)
				}
				s.push(simEvent{at: ev.at + gap, kind: evPublish, member: -1})
			}
		case evRecheck:
		}
		if cfg.holdLead > 0 {
			s.dispatchHeld()
		}
	}

	res := simResult{cfg: cfg, published: len(s.published), members: s.members, reports: s.reports, duplicated: s.dups}
	var all []time.Duration
	var sum time.Duration
	for _, m := range s.members {
		res.perMember = append(res.perMember, len(m.latencies))
		res.dequeued += len(m.latencies)
		all = append(all, m.latencies...)
		for _, l := range m.latencies {
			sum += l
		}
	}
	res.dequeued -= s.dups
	if len(all) > 0 {
		sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
		res.mean = sum / time.Duration(len(all))
		res.p50 = all[(len(all)+1)/2-1]
		res.p99 = all[(len(all)*99+99)/100-1]
		res.max = all[len(all)-1]
	}
	return res
}

func (r simResult) String() string {
	counts := make([]string, len(r.perMember))
	for i, c := range r.perMember {
		counts[i] = fmt.Sprint(c)
	}
	return fmt.Sprintf("| %-8s | %-17s | %-11s | %8.2f | %8.2f | %8.2f | %-11s | %4d | %3d |",
		r.cfg.scenario.name, r.cfg.variant(), r.cfg.strategy, toMs(r.mean), toMs(r.p99), toMs(r.max),
		strings.Join(counts, "/"), r.published-r.dequeued, r.duplicated)
}

func toMs(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func meanOf(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

func TestSimulationThesisScenarios(t *testing.T) {
	type key struct {
		scenario, variant, strategy string
	}
	results := map[key]simResult{}
	run := func(cfg simConfig) {
		r := runSim(t, cfg)
		results[key{cfg.scenario.name, cfg.variant(), cfg.strategy}] = r
		t.Log(r.String())
		require.Equal(t, r.cfg.scenario.count(), r.published)
		require.Equal(t, r.published, r.dequeued, "lost messages: %s", r)
		require.Zero(t, r.duplicated, "duplicated messages: %s", r)
	}
	t.Log("drift-free service emulation; latency = dequeue − publish (ms); 1500 messages every 10 ms; oracle = perfect-information earliest start")
	t.Log("| scenario | variant           | strategy    |     mean |      p99 |      max | per member  | lost | dup |")
	for _, sc := range []simScenario{simThesis1, simThesis2} {
		for _, mode := range []simReporting{reportsSDK, reportsTimer} {
			for _, strategy := range []string{"adaptive", "thesis", "round-robin", "oracle"} {
				run(simConfig{scenario: sc, strategy: strategy, reporting: mode})
			}
		}
	}
	for _, v := range []simConfig{{qos1: true}, {wire: time.Millisecond}, {qos1: true, wire: time.Millisecond}} {
		for _, strategy := range []string{"adaptive", "thesis", "oracle"} {
			cfg := v
			cfg.scenario, cfg.strategy, cfg.reporting = simThesis2, strategy, reportsSDK
			run(cfg)
		}
	}

	get := func(scenario, variant, strategy string) simResult {
		r, ok := results[key{scenario, variant, strategy}]
		require.True(t, ok, "no run %s/%s/%s", scenario, variant, strategy)
		return r
	}

	// thesis-2 with SDK reports: adaptive beats the thesis formula and
	// stays below 10 ms; the 50 ms member gets fewer messages than each
	// 25 ms one.
	adaptive2 := get("thesis-2", "sdk", "adaptive")
	require.Less(t, adaptive2.mean, get("thesis-2", "sdk", "thesis").mean)
	require.Less(t, adaptive2.mean, 10*time.Millisecond)
	require.Less(t, adaptive2.perMember[2], adaptive2.perMember[0])
	require.Less(t, adaptive2.perMember[2], adaptive2.perMember[1])
	for _, variant := range []string{"sdk+qos1", "sdk+wire1ms", "sdk+qos1+wire1ms"} {
		require.Less(t, get("thesis-2", variant, "adaptive").mean, 10*time.Millisecond, variant)
		require.Less(t, get("thesis-2", variant, "adaptive").mean, get("thesis-2", variant, "thesis").mean, variant)
	}

	// Round robin gives the 50 ms member a third of 100 msg/s, more than
	// its 20 msg/s: its backlog, hence its latency, grows all run long.
	slow := get("thesis-2", "sdk", "round-robin").members[2].latencies
	n := len(slow)
	require.Equal(t, simMessages/3, n)
	first, middle, last := meanOf(slow[:n/3]), meanOf(slow[n/3:2*n/3]), meanOf(slow[2*n/3:])
	require.Greater(t, middle, first+time.Second)
	require.Greater(t, last, middle+time.Second)

	// thesis-1: round robin is ideal (each member idle again after 30 ms).
	require.Zero(t, get("thesis-1", "sdk", "round-robin").max)

	// The blind start costs: with reports only every 1 s, adaptive loses
	// what it could not know in the first 700 ms.
	require.Greater(t, get("thesis-2", "1s-only", "adaptive").mean, 2*adaptive2.mean)
}

// TestSimulationOtherScenarios runs the other single-site scenarios of
// scenarios.md §A (step, join and poisson are overloaded or bursty, so only
// the facts that cannot depend on tuning are asserted).
func TestSimulationOtherScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("long simulation")
	}
	const msd = time.Millisecond
	scenarios := []simScenario{
		// Issue 10's rates, so that capacity stays above arrivals after
		// the event: step every 12.5 ms (ρ 0.67 → 0.89), join every 30 ms
		// (ρ 0.83 → 0.42).
		{name: "step", services: []time.Duration{25 * msd, 25 * msd, 25 * msd}, messages: 2400,
			gap:    func(*rand.Rand) time.Duration { return 12500 * time.Microsecond },
			stepAt: simPublishStart + 10*time.Second, stepMember: 2, stepService: 100 * msd},
		{name: "join", services: []time.Duration{50 * msd, 50 * msd, 25 * msd}, messages: 1000,
			gap:    func(*rand.Rand) time.Duration { return 30 * msd },
			joinAt: []time.Duration{0, 0, simPublishStart + 10*time.Second}},
		{name: "poisson", services: []time.Duration{20 * msd, 20 * msd, 40 * msd, 40 * msd, 80 * msd}, messages: 3750,
			gap: func(r *rand.Rand) time.Duration { return time.Duration(r.ExpFloat64() * float64(8*msd)) }},
	}
	t.Log("| scenario | variant           | strategy    |     mean |      p99 |      max | per member  | lost | dup |")
	means := map[string]time.Duration{}
	worst := map[string]time.Duration{} // the last member's worst latency
	for _, sc := range scenarios {
		for _, mode := range []simReporting{reportsSDK, reportsTimer} {
			for _, strategy := range []string{"adaptive", "thesis", "round-robin", "oracle"} {
				r := runSim(t, simConfig{scenario: sc, strategy: strategy, reporting: mode})
				t.Log(r.String())
				require.Equal(t, sc.count(), r.published)
				require.Equal(t, r.published, r.dequeued, "lost messages: %s", r)
				require.Zero(t, r.duplicated)
				means[fmt.Sprint(sc.name, "/", r.cfg.variant(), "/", strategy)] = r.mean
				if last := r.members[len(r.members)-1].latencies; len(last) > 0 {
					sorted := append([]time.Duration(nil), last...)
					sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
					worst[fmt.Sprint(sc.name, "/", r.cfg.variant(), "/", strategy)] = sorted[len(sorted)-1]
				}
			}
		}
	}
	require.Less(t, means["poisson/sdk/adaptive"], means["poisson/sdk/thesis"])
	for _, sc := range []string{"step", "poisson"} {
		require.Less(t, means[sc+"/sdk/adaptive"], means[sc+"/sdk/round-robin"], sc)
	}
	// join: the newcomer is fastest, so it never waits: its worst latency
	// stays within the 50 ms goal.
	require.LessOrEqual(t, worst["join/sdk/adaptive"], 50*time.Millisecond)
}

// TestSimulationPlainClients runs thesis-2 with the subscriber kinds that
// are not LuffyMQ's SDK (scenarios.md §A): a plain QoS 1 client that
// acknowledges after processing and never reports, and plain clients that
// send only the thesis's two keys. The goals of issue 10: adaptive within
// 2× the perfect-information oracle and ≤ 8 ms for the first two; the
// timer-only reporter ≤ 97 ms (the information bound is ~88 ms).
func TestSimulationPlainClients(t *testing.T) {
	t.Log("| scenario | variant           | strategy    |     mean |      p99 |      max | per member  | lost | dup |")
	type kind struct {
		reporting simReporting
		qos1      bool
		ackFlush  time.Duration
	}
	kinds := []kind{{reportsNone, true, 0}, {reportsNone, true, 50 * time.Millisecond},
		{reportsThesisKeys, false, 0}, {reportsThesisKeys, true, 0}, {reportsThesisTimer, false, 0}}
	for _, wire := range []time.Duration{0, 200 * time.Microsecond} {
		for _, k := range kinds {
			results := map[string]simResult{}
			for _, strategy := range []string{"adaptive", "thesis", "round-robin", "oracle"} {
				r := runSim(t, simConfig{scenario: simThesis2, strategy: strategy, reporting: k.reporting, qos1: k.qos1, wire: wire, ackFlush: k.ackFlush})
				t.Log(r.String())
				require.Equal(t, r.published, r.dequeued, "lost messages: %s", r)
				require.Zero(t, r.duplicated)
				results[strategy] = r
			}
			adaptive, oracle := results["adaptive"], results["oracle"]
			name := results["adaptive"].cfg.variant()
			if k.reporting == reportsThesisTimer {
				require.LessOrEqual(t, adaptive.mean, 97*time.Millisecond, name)
				continue
			}
			if k.ackFlush > 0 {
				// Acks up to 50 ms late: the first service samples include
				// the flush delay (50 and 80 ms for 25 and 50 ms members),
				// so capacity is lost in the first 300 ms and, at 100 %
				// utilisation, that backlog never drains. Far better than
				// without acks (round robin's 1.7 s), not within the 8 ms
				// goal (11.95 ms; 13.95 ms before overdue guesses needed a
				// service estimate).
				require.LessOrEqual(t, adaptive.mean, 13*time.Millisecond, name)
				require.LessOrEqual(t, adaptive.p99, 30*time.Millisecond, name)
				continue
			}
			require.LessOrEqual(t, adaptive.mean, 8*time.Millisecond, name)
			require.LessOrEqual(t, adaptive.mean, 2*oracle.mean+time.Millisecond, name)
			require.LessOrEqual(t, adaptive.p99, 25*time.Millisecond, name)
		}
	}
}

// TestSimulationLateBinding runs thesis-2 with a realistic connection
// (300 µs one way plus up to 400 µs of jitter, in order) with and without
// late binding (Config.HoldLead). At 100 % utilisation any capacity lost
// while the broker cannot know a member is about to finish stays lost:
// without holding, the slow member's first completion lands just after a
// publish that had to be given to a busy member, and its 10 ms idle
// costs every later message. Held at the broker until shortly before the
// busy member is free, that message goes to the slow member whose report
// arrived meanwhile.
func TestSimulationLateBinding(t *testing.T) {
	t.Log("| scenario | variant           | strategy    |     mean |      p99 |      max | per member  | lost | dup |")
	const wire, jitter, lead = 300 * time.Microsecond, 400 * time.Microsecond, 5 * time.Millisecond
	for _, k := range []struct {
		reporting simReporting
		qos1      bool
		ackFlush  time.Duration
	}{{reportsSDK, false, 0}, {reportsThesisKeys, false, 0}, {reportsThesisTimer, false, 0},
		{reportsNone, true, 0}, {reportsNone, true, 50 * time.Millisecond}} {
		cfg := simConfig{scenario: simThesis2, reporting: k.reporting, qos1: k.qos1, ackFlush: k.ackFlush, wire: wire, jitter: jitter}
		run := func(strategy string, hold time.Duration) simResult {
			c := cfg
			c.strategy, c.holdLead = strategy, hold
			r := runSim(t, c)
			t.Log(r.String())
			require.Equal(t, r.published, r.dequeued, "lost messages: %s", r)
			require.Zero(t, r.duplicated)
			return r
		}
		oracle, without, with := run("oracle", 0), run("adaptive", 0), run("adaptive", lead)
		name := with.cfg.variant()
		switch {
		case k.reporting == reportsSDK || k.reporting == reportsThesisKeys:
			// Report-informed members: late binding reaches the oracle's
			// orbit.
			require.Less(t, with.mean, without.mean, name)
			require.LessOrEqual(t, with.mean, 2*oracle.mean, name)
			require.LessOrEqual(t, with.p99, 25*time.Millisecond, name)
		case k.reporting == reportsThesisTimer:
			require.LessOrEqual(t, with.mean, 97*time.Millisecond, name)
		default:
			// Estimates learnt from acknowledgements: never held (one
			// message at a time would make batched acks look like slow
			// service), so nothing changes.
			require.Equal(t, without.mean, with.mean, name)
		}
	}
}

// simFleet is a fleet of n members whose service times spread
// log-uniformly over 10× (10 to 100 ms, seeded), fed Poisson arrivals at
// utilisation rho: the shape of luffy-bench's fleet scenarios.
func simFleet(n int, rho float64, seed uint64) simScenario {
	r := rand.New(rand.NewPCG(seed, uint64(n)))
	sc := simScenario{name: fmt.Sprintf("fleet-%d", n), messages: 3000}
	capacity := 0.0
	for range n {
		svc := time.Duration(float64(10*time.Millisecond) * math.Pow(10, r.Float64()))
		sc.services = append(sc.services, svc)
		capacity += float64(time.Second) / float64(svc)
	}
	mean := float64(time.Second) / (rho * capacity)
	sc.gap = func(r *rand.Rand) time.Duration { return time.Duration(r.ExpFloat64() * mean) }
	return sc
}

// TestSimulationFleet compares the strategies on fleets of uneven members
// under Poisson arrivals (ρ 0.85), with members that only acknowledge
// (paho.golang's 50 ms ack flush, Python paho's acks after the next read)
// and with thesis-format reporters, against the
// perfect-information oracle. Adaptive must beat join-the-shortest-queue
// and the sampling of 4 members it used before, and lose nothing; its
// ratio to the zero-delay oracle is logged (members that only acknowledge
// are known through 50 ms ack bursts, which no live policy can beat).
func TestSimulationFleet(t *testing.T) {
	t.Log("| scenario | variant           | strategy    |     mean |      p99 |      max | per member  | lost | dup |")
	for _, f := range []struct {
		n    int
		seed uint64
	}{{20, 11}, {50, 9}, {100, 5}} {
		sc := simFleet(f.n, 0.85, f.seed)
		for _, v := range []simConfig{
			{reporting: reportsNone, qos1: true, ackFlush: 50 * time.Millisecond, wire: 100 * time.Microsecond},
			{reporting: reportsNone, qos1: true, ackAfterRead: true, wire: 100 * time.Microsecond},
			{reporting: reportsThesisKeys, wire: 100 * time.Microsecond},
		} {
			means := map[string]time.Duration{}
			for _, strategy := range []string{"adaptive", "adaptive+sample4", "jsq", "power-of-two", "oracle"} {
				cfg := v
				cfg.scenario, cfg.strategy = sc, strategy
				if size, ok := strings.CutPrefix(strategy, "adaptive+sample"); ok {
					cfg.strategy = "adaptive"
					cfg.sampleSize, _ = strconv.Atoi(size)
				}
				r := runSim(t, cfg)
				t.Log(r.String())
				require.Equal(t, r.published, r.dequeued, "lost messages: %s", r)
				means[strategy] = r.mean
			}
			name := sc.name + " " + v.variant()
			require.Less(t, means["adaptive"], means["jsq"], name)
			require.Less(t, means["adaptive"], means["adaptive+sample4"], name)
			t.Logf("%s: adaptive %.2f ms = %.1f× the zero-delay oracle", name, toMs(means["adaptive"]), float64(means["adaptive"])/float64(means["oracle"]))
		}
	}
}

// TestSimulationFleetVariableWork runs uneven fleets whose work is
// exponentially distributed (each message's size drawn at publish), with
// plain QoS 1 members that acknowledge at once (MQTT.js), every 50 ms
// (paho.golang's default) or after their next read (Python paho), and
// with QoS 0 members reporting like the SDK or in the thesis's format,
// over five seeds. Variable
// work hides when a member will be free: adaptive must lose nothing and
// beat join-the-shortest-queue (whose exact queue lengths are what matters
// most when work is memoryless) with plain members and with SDK
// reporters. At 50 members acknowledging after their next read it was
// behind until a member with a delivery unacknowledged lost ties to one
// with none (7.58 against jsq's 6.72 ms, then 5.05; 2026-12-02; 10.4
// before a sampled group compared the members that had just freed up,
// 2026-11-28; 20.3 before acks at work ends were told from a timer's,
// 2026-11-27). SDK reporters were behind jsq at 50 members (37.9
// against 22.6 ms) until the simulated SDK deferred the reports its gaps
// held back, as the SDK does, instead of dropping them, and sent its
// warm-up reports (15.1 against 11.6, then 11.1 against 11.8; 2026-12-02).
// Its ratio to the perfect-information oracle,
// which knows every message's size, is logged, and so is its ratio to the
// informed oracle, which knows every member's exact queue and true mean
// but no message's size: the bound of issue 23 for what a broker could do
// (1.1–1.8× the perfect-information oracle on these fleets, 2026-11-28). It
// must beat join-the-shortest-queue, which knows less. With acks flushed
// every 50 ms, the ack-informed oracle (the members' true means, the
// timer's grid, what is unacknowledged, and a Poisson count of what
// finished since the last flush) is what those acks leave any broker:
// 38.8, 24.2 and 19.3 ms on fleets of 6, 20 and 50 against the informed
// oracle's 28.1, 7.8 and 2.6, that is 1.4×, 3.1× and 7.6×; adaptive,
// which learns the means and the variability from the same acks, 43.0,
// 32.0 and 28.8 ms (48.5, 35.7 and 30.4 before it learnt them from the
// windows between bursts, 2026-12-03).
// Likewise the report-informed oracle for QoS 0 members sending
// thesis-format reports (every second and after their first message):
// 62.8, 52.4 and 45.1 ms, 2.2×, 6.6× and 17× the informed oracle, with
// adaptive at 83.7, 105 and 129 (1.3×, 2.0×, 2.9× that bound).
func TestSimulationFleetVariableWork(t *testing.T) {
	type members struct {
		reporting simReporting
		qos1      bool
		flush     time.Duration
		afterRead bool
	}
	for _, n := range []int{6, 20, 50} {
		for _, kind := range []members{{reportsNone, true, 0, false}, {reportsNone, true, 50 * time.Millisecond, false}, {reportsNone, true, 0, true}, {reportsSDK, false, 0, false}, {reportsThesisKeys, false, 0, false}} {
			flush := kind.flush
			means := map[string]float64{}
			strategies := []string{"adaptive", "jsq", "oracle", "informed-oracle"}
			switch {
			case flush > 0:
				strategies = append(strategies, "ack-informed-oracle")
			case kind.reporting == reportsThesisKeys:
				strategies = append(strategies, "report-informed-oracle", "report-estimating-oracle")
			}
			for _, strategy := range strategies {
				for seed := uint64(31); seed < 36; seed++ {
					sc := simFleet(n, 0.85, seed)
					sc.expService = true
					r := runSim(t, simConfig{scenario: sc, strategy: strategy, reporting: kind.reporting, qos1: kind.qos1, ackFlush: flush, ackAfterRead: kind.afterRead, wire: 300 * time.Microsecond, jitter: 200 * time.Microsecond})
					require.Equal(t, r.published, r.dequeued, "lost messages: %s", r)
					require.Zero(t, r.duplicated)
					means[strategy] += toMs(r.mean) / 5
				}
			}
			name := fmt.Sprintf("fleet-%d exponential work, acks every %v", n, flush)
			switch {
			case kind.reporting == reportsThesisKeys:
				name = fmt.Sprintf("fleet-%d exponential work, thesis-format reports", n)
			case !kind.qos1:
				name = fmt.Sprintf("fleet-%d exponential work, SDK reports", n)
			case kind.afterRead:
				name = fmt.Sprintf("fleet-%d exponential work, acks after the next read", n)
			}
			require.Less(t, means["informed-oracle"], means["jsq"], name)
			t.Logf("%s: adaptive %.2f ms, jsq %.2f, oracle %.2f, informed oracle %.2f (adaptive = %.1f× the oracle, %.1f× the informed oracle)", name, means["adaptive"], means["jsq"], means["oracle"], means["informed-oracle"], means["adaptive"]/means["oracle"], means["adaptive"]/means["informed-oracle"])
			for _, bound := range []string{"ack-informed-oracle", "report-informed-oracle"} {
				// What acks on a timer, or reports every second, leave any
				// broker: it knows more than jsq (the members' means, the
				// timer's grid) and less than the informed oracle (their
				// queues at every instant).
				if b := means[bound]; b > 0 {
					require.Less(t, b, means["jsq"], name)
					require.Greater(t, b, means["informed-oracle"], name)
					t.Logf("%s: %s %.2f ms = %.1f× the informed oracle; adaptive = %.2f× it", name, bound, b, b/means["informed-oracle"], means["adaptive"]/b)
				}
				if b := means["ack-informed-oracle"]; b > 0 {
					// The service times learnt from the windows between
					// bursts (flushWindows) bring adaptive this close to
					// what the acks allow: 1.11×, 1.32× and 1.49× on fleets
					// of 6, 20 and 50 (1.25×, 1.47× and 1.57× before).
					limit := 1.35
					if n > 20 {
						limit = 1.55
					}
					require.Less(t, means["adaptive"], limit*b, name)
				}
			}
			if e := means["report-estimating-oracle"]; e > 0 {
				// Learning the members' speeds from the reports costs the
				// bound above what its true means gave it; adaptive, which
				// learns them too, must come close to what it does.
				require.Greater(t, e, means["report-informed-oracle"], name)
				require.Less(t, means["adaptive"], 1.1*e, name)
				t.Logf("%s: report-estimating-oracle %.2f ms = %.1f× the report-informed oracle; adaptive = %.2f× it", name, e, e/means["report-informed-oracle"], means["adaptive"]/e)
			}
			require.Less(t, means["adaptive"], means["jsq"], name)
		}
	}
}

// TestSimulationReportersTimingFromReceipt runs members that send the
// thesis's two keys but time each message from its arrival, its wait in
// their own queue included, as a client written from the paper may. Their
// reports say their members are slower the more they queue. Capped by
// what they finished between reports (throughputBound), adaptive stays far
// ahead of the thesis score on the same reports, and on the uneven fleets
// close to what it does with members that time only their work. Medians
// of five seeds (2026-12-03, means in ms; before the cap in parentheses):
// thesis-2 20.9 (75.4) against thesis's 67.6 and 4.67 with members timing
// their work; fleet-6 14.9 (24.8) against 23.5 and 13.4; fleet-20 3.60
// (3.62) against 13.9 and 2.89; fleet-20 on exponential work 113 (313)
// against 157 and 90.8.
func TestSimulationReportersTimingFromReceipt(t *testing.T) {
	const wire, jitter = 300 * time.Microsecond, 400 * time.Microsecond
	median := func(sc simScenario, strategy string, fromReceipt bool) float64 {
		var means []float64
		for seed := range uint64(5) {
			r := runSim(t, simConfig{scenario: sc, strategy: strategy, reporting: reportsThesisKeys, wire: wire, jitter: jitter, fromReceipt: fromReceipt, seed: seed})
			require.Equal(t, r.published, r.dequeued, "lost messages: %s", r)
			require.Zero(t, r.duplicated)
			means = append(means, toMs(r.mean))
		}
		slices.Sort(means)
		return means[len(means)/2]
	}
	exp := simFleet(20, 0.85, 1)
	exp.expService, exp.name = true, "fleet-20 exponential work"
	for _, c := range []struct {
		sc simScenario
		// most is the ratio allowed to adaptive with members timing only
		// their work (0: none checked).
		most float64
	}{{simThesis2, 0}, {simFleet(6, 0.85, 1), 1.3}, {simFleet(20, 0.85, 1), 1.5}, {exp, 0}} {
		fromReceipt, measured, thesis := median(c.sc, "adaptive", true), median(c.sc, "adaptive", false), median(c.sc, "thesis", true)
		t.Logf("%-26s adaptive %6.2f ms (members timing their work: %6.2f), thesis %6.2f", c.sc.name, fromReceipt, measured, thesis)
		require.Less(t, fromReceipt, 0.75*thesis, c.sc.name)
		if c.most > 0 {
			require.LessOrEqual(t, fromReceipt, c.most*measured, c.sc.name)
		}
	}
}
