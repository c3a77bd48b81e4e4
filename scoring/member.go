package scoring

import (
	"sync"
	"time"
)

// reportWindow is how many reported processing times are averaged, as in
// the thesis (table 3): it damps outliers.
const reportWindow = 5

// Load is one load report from a member, already decoded. It mirrors the
// report wire format without depending on it.
type Load struct {
	// Pending is the number of messages received but not yet taken for
	// processing (the thesis's m_q).
	Pending int
	// ProcessingTime is the mean processing time of the messages finished
	// since the previous report; 0 means none finished.
	ProcessingTime time.Duration
	// Workers is the member's handler concurrency; 0 means unknown (1).
	Workers int
	// InProgress is the number of messages being processed now.
	InProgress int
	// Backlog, when HasBacklog, is the member's own estimate of the time
	// until it could start a newly received message.
	Backlog    time.Duration
	HasBacklog bool
	// Processed is how many messages ProcessingTime averages; 0 counts
	// as 1. The adaptive estimate weighs reports by it.
	Processed int
	// Received, when HasReceived, counts the messages the member received
	// on this connection, so messages still on the wire can be counted.
	Received    uint64
	HasReceived bool
	// WrittenAgo is how long before its arrival the report was written, as
	// far as the broker can tell (the connection's one-way delay); sends
	// within that time are taken as not in a report without Received.
	WrittenAgo time.Duration
}

// durationWindow keeps the last reportWindow values, each with a weight,
// and their weighted mean.
type durationWindow struct {
	values  [reportWindow]time.Duration
	weights [reportWindow]int
	count   int
	next    int
	// avg is mean's value, computed when a value is pushed or replaced:
	// selections read it for every candidate.
	avg time.Duration
}

// push adds d with weight 1.
func (w *durationWindow) push(d time.Duration) { w.pushWeighted(d, 1) }

// pushWeighted adds d counting weight times (at least once).
func (w *durationWindow) pushWeighted(d time.Duration, weight int) {
	w.values[w.next] = d
	w.weights[w.next] = max(weight, 1)
	w.next = (w.next + 1) % reportWindow
	if w.count < reportWindow {
		w.count++
	}
	w.avg = w.weightedMean()
}

// replaceLast replaces the most recently pushed value, keeping its weight.
func (w *durationWindow) replaceLast(d time.Duration) {
	if w.count == 0 {
		w.push(d)
		return
	}
	w.values[(w.next+reportWindow-1)%reportWindow] = d
	w.avg = w.weightedMean()
}

// mean is the weighted mean of the values (0 while there are none).
func (w *durationWindow) mean() time.Duration { return w.avg }

func (w *durationWindow) weightedMean() time.Duration {
	if w.count == 0 {
		return 0
	}
	var sum float64
	var total int
	for i := 0; i < w.count; i++ {
		sum += float64(w.values[i]) * float64(w.weights[i])
		total += w.weights[i]
	}
	return time.Duration(sum / float64(total))
}

// Bounds on reported values: a report can describe a member, never buy it
// unlimited work.
const (
	// MaxWorkers bounds a reported handler concurrency.
	MaxWorkers = 256
	// MinProcessingTime and MaxProcessingTime bound a reported non-zero
	// processing time.
	MinProcessingTime = time.Microsecond
	MaxProcessingTime = time.Hour
	// maxPending bounds a reported queue length.
	maxPending = 1 << 20
)

// bounded returns l with every value clamped to what a member can credibly
// report.
func (l Load) bounded() Load {
	l.Pending = min(max(l.Pending, 0), maxPending)
	l.InProgress = min(max(l.InProgress, 0), MaxWorkers)
	l.Workers = min(max(l.Workers, 0), MaxWorkers)
	l.Processed = max(l.Processed, 0)
	if l.ProcessingTime < 0 {
		l.ProcessingTime = 0
	}
	if l.ProcessingTime > 0 {
		l.ProcessingTime = min(max(l.ProcessingTime, MinProcessingTime), MaxProcessingTime)
	}
	l.Backlog = min(max(l.Backlog, 0), MaxProcessingTime)
	l.WrittenAgo = min(max(l.WrittenAgo, 0), time.Minute)
	return l
}

// ackBurstGap is how close acknowledgements must come to count as one
// burst: a client flushing its acks writes them back to back.
const ackBurstGap = time.Millisecond

// sendLogSize is how many send times of unacknowledged QoS≥1 deliveries a
// member keeps; older ones are known only to have been queued.
const sendLogSize = 32

// sendLog is a FIFO of the send times of a member's unacknowledged QoS≥1
// deliveries, fixed in size: no allocation per message.
type sendLog struct {
	times  [sendLogSize]time.Duration
	pushed uint64
	popped uint64
}

func (l *sendLog) push(t time.Duration) {
	l.times[l.pushed%sendLogSize] = t
	l.pushed++
}

// pop removes the oldest entry; known is false when it was overwritten (or
// the log is empty).
func (l *sendLog) pop() (t time.Duration, known bool) {
	if l.popped == l.pushed {
		return 0, false
	}
	i := l.popped
	l.popped++
	if l.pushed-i > sendLogSize {
		return 0, false
	}
	return l.times[i%sendLogSize], true
}

// oldest returns the oldest entry still held, if any.
func (l *sendLog) oldest() (t time.Duration, known bool) {
	if l.popped == l.pushed || l.pushed-l.popped > sendLogSize {
		return 0, false
	}
	return l.times[l.popped%sendLogSize], true
}

// sentBy counts the entries sent at or before t; entries overwritten
// (older than any kept) count as sent before it.
func (l *sendLog) sentBy(t time.Duration) int {
	n := 0
	if held := l.pushed - l.popped; held > sendLogSize {
		n = int(held - sendLogSize)
	}
	for i := l.pushed - uint64(min(l.pushed-l.popped, sendLogSize)); i < l.pushed && l.times[i%sendLogSize] <= t; i++ {
		n++
	}
	return n
}

func (l *sendLog) clear() { *l = sendLog{} }

// recentSends keeps the times of the last few messages selected for a
// member, QoS 0 included, to tell which were sent after a report was
// written.
type recentSends struct {
	times [8]time.Duration
	n     uint64
}

func (r *recentSends) push(t time.Duration) {
	r.times[r.n%uint64(len(r.times))] = t
	r.n++
}

// after counts the recorded sends later than t.
func (r *recentSends) after(t time.Duration) int {
	count := 0
	for i := uint64(0); i < min(r.n, uint64(len(r.times))); i++ {
		if r.times[(r.n-1-i)%uint64(len(r.times))] > t {
			count++
		} else {
			break
		}
	}
	return count
}

// member is the load state of one client, shared by every group it is in.
// Times are durations since the engine's epoch. online and groups change
// only under the engine's write lock; everything else is guarded by mu.
type member struct {
	mu     sync.Mutex
	id     string
	online bool
	groups []*group

	// Thesis state (algorithms.md §1.3, table 3).
	reportedPending int            // m_q
	thesisWindow    durationWindow // reported t_p values, zeros included
	lastReport      time.Duration  // t_r
	lastSend        time.Duration  // t_s
	sentSinceReport int            // m_s
	reports         uint64

	// Adaptive state.
	serviceWindow durationWindow // non-zero reported processing times
	workers       int
	freeAt        time.Duration // predicted time it can start a new message
	receiveMax    int           // its Receive Maximum; 0: no limit
	sentTotal     uint64        // messages selected for it on this connection
	recent        recentSends

	// QoS≥1 deliveries and what their acknowledgements teach.
	inflight        int    // deliveries not yet acknowledged
	qosDeliveries   uint64 // deliveries ever started
	sends           sendLog
	acksAreFinishes bool           // its acknowledgements mark finished processing
	completions     uint64         // acknowledgements taken as finished messages
	lastCompletion  time.Duration  // when the last one came (or the session start)
	ackWindow       durationWindow // service times learnt from completions
	// Many clients send acknowledgements in bursts (paho.golang flushes
	// manual acks every 50 ms): acks within ackBurstGap of each other are
	// one burst, whose k completions share the time since burstFrom.
	burstFrom  time.Duration
	burstCount int
	// burstFreeAt is freeAt as the model had it before the first ack of
	// the latest burst, moved on by what was sent since.
	burstFreeAt time.Duration
	ackLag      time.Duration // how late acks come: the longest gap between bursts lately
	// ackGrid tells acks flushed by a timer from acks sent when work
	// ends (acksOnTimer).
	ackGrid ackGrid
	// flushWins learns the service time, and how variable it is, from
	// the windows between bursts: what a timer's acks can time. The
	// latest window began at windowFrom (the burst before, or the send
	// that found the member idle) with windowHeld messages, of which
	// windowAcks are acknowledged so far.
	flushWins  flushWindows
	windowFrom time.Duration
	windowHeld int
	windowAcks int
	// ackVariability holds the service times single acknowledgements
	// showed: how variable the member's work is (serviceVariability).
	ackVariability Variability
	// reportVariability holds the processing times its reports gave,
	// each the mean of Processed messages.
	reportVariability Variability
	// runningSince is when the message it runs started at the latest, as
	// far as its reports and the sends tell: the report that said one was
	// running with some finished, or the first send after a report of
	// going idle (-1: unknown, or none running).
	runningSince time.Duration
	// overdueMeasured is whether what that message ran already counts
	// among the service measurements (applyReport).
	overdueMeasured bool
	// reportedRunning is the messages its last report said were running
	// (the SDK's in_progress; 0 when a report does not say).
	reportedRunning int
	// reportsIdle is whether it has sent a report saying, explicitly,
	// that nothing is pending or running (LuffyMQ's SDK: it reports going
	// idle at once). Its silence then means it still holds work.
	reportsIdle bool

	// Until its first measurement: the messages sent to it not known to be
	// finished, and when the oldest of them started (as far as is known).
	unconfirmed      int
	unconfirmedSince time.Duration

	// selectedIn and selectedAt are the group it was last selected in and
	// its index there, where it is noted when it frees up (noteFreed).
	selectedIn *group
	selectedAt int32
}

func newMember(id string, now time.Duration) *member {
	m := &member{id: id}
	m.reset(now)
	return m
}

// reset puts the member in the session-start state of the thesis:
// m_q = m_s = t_p = 0, t_r = t_s = now.
func (m *member) reset(now time.Duration) {
	m.online = true
	m.reportedPending = 0
	m.thesisWindow = durationWindow{}
	m.lastReport = now
	m.lastSend = now
	m.sentSinceReport = 0
	m.reports = 0
	m.serviceWindow = durationWindow{}
	m.workers = 1
	m.freeAt = now
	m.receiveMax = 0
	m.sentTotal = 0
	m.recent = recentSends{}
	m.inflight = 0
	m.qosDeliveries = 0
	m.sends.clear()
	m.acksAreFinishes = true
	m.completions = 0
	m.lastCompletion = now
	m.ackWindow = durationWindow{}
	m.ackVariability = Variability{}
	m.reportVariability, m.reportsIdle = Variability{}, false
	m.reportedRunning = 0
	m.runningSince, m.overdueMeasured = -1, false
	m.burstFrom, m.burstCount, m.ackLag, m.ackGrid = now, 0, 0, ackGrid{}
	m.burstFreeAt = now
	m.flushWins, m.windowFrom, m.windowHeld, m.windowAcks = flushWindows{}, now, 0, 0
	m.unconfirmed = 0
	m.unconfirmedSince = now
}

// thesisProcessingTime is the thesis's t_p: the mean of the last reported
// processing times, zeros included.
func (m *member) thesisProcessingTime() time.Duration { return m.thesisWindow.mean() }

// learnsFromAcks reports whether the member's acknowledgements have taught
// the engine its service time.
func (m *member) learnsFromAcks() bool { return m.acksAreFinishes && m.ackWindow.count > 0 }

// service is the adaptive estimate of the time the member needs per message,
// with its workers in parallel; 0 while nothing is known. Completions seen
// by the broker are evidence and win over what the member reports.
func (m *member) service() time.Duration {
	if m.timerVariability() > 0 {
		// A timer's acks do not time single messages; the windows
		// between its bursts do (flushWindows).
		return m.flushWins.mean()
	}
	if m.learnsFromAcks() {
		if m.serviceVariability() > variableService {
			// Five samples of variable work are too few: the longer
			// moving average is steadier.
			return m.ackVariability.Mean()
		}
		return m.ackWindow.mean()
	}
	s := m.serviceWindow.mean()
	if m.workers > 1 {
		s /= time.Duration(m.workers)
	}
	return s
}

func (m *member) hasService() bool { return m.serviceWindow.count > 0 || m.learnsFromAcks() }

// serviceOr returns the member's service estimate, or prior if it has none.
func (m *member) serviceOr(prior time.Duration) time.Duration {
	if m.hasService() {
		return m.service()
	}
	return prior
}

// unproven reports whether the member must still show that it finishes
// work: it receives QoS≥1 messages, its acknowledgements mark finished
// work, and none has come yet. Whatever it reports, it holds at most
// Config.NewcomerCap messages while other members are available.
func (m *member) unproven() bool {
	return m.qosDeliveries > 0 && m.acksAreFinishes && m.completions == 0
}

// noteIfFree tells the group it was last selected in that it has a free
// worker, when its acknowledgements or its last report show one: no
// delivery it must still finish beyond its workers, or a report of going
// idle with nothing sent since. m's lock is held.
func (m *member) noteIfFree() {
	if m.selectedIn == nil {
		return
	}
	free := false
	switch {
	case m.acksAreFinishes && m.qosDeliveries > 0:
		// Acks a timer flushed say only that work ended some time ago.
		free = m.inflight < m.workers && !m.acksOnTimer()
	case m.reportsIdle:
		// A member that reports going idle at once (the SDK), not one
		// that reports on a timer only.
		free = !m.reportedBusy() && m.sentSinceReport == 0
	}
	if free {
		m.selectedIn.noteFreed(m.selectedAt)
	}
}

// maxOverdueGuess bounds the wait guessed for an overdue member.
const maxOverdueGuess = 24 * time.Hour

// overdueWait is the wait guessed for a member whose current message has
// run for elapsed, longer than expected, with n messages held in all:
// halfway through it, and each of the others taking as long again,
// (2n − 1)·elapsed, bounded.
func overdueWait(elapsed time.Duration, n int) time.Duration {
	k := time.Duration(2*max(n, 1) - 1)
	if elapsed >= maxOverdueGuess/k {
		return maxOverdueGuess
	}
	return k * elapsed
}

// predictedStart is when the member could start a message handed to it now,
// given the service time svc it is assumed to need per message; a member
// heard from within silentAfter is expected to report (Config.StaleAfter).
func (m *member) predictedStart(now, svc, silentAfter time.Duration) time.Duration {
	start := now
	if m.freeAt > start {
		start = m.freeAt
	}
	// Unacknowledged QoS≥1 deliveries beyond what its workers hold are
	// queued at it: a floor on its backlog whatever the model says. A
	// member that acknowledges in bursts may have finished, since its last
	// burst, as many as that time allows: they are not counted, in the
	// share its work's variability leaves (all when every message takes
	// as long; none when the work is memoryless, since a running message
	// is then no nearer its end for having run).
	cv2 := m.serviceVariability()
	timerCV2 := m.timerVariability()
	queued := m.inflight - m.workers
	if m.ackLag > 0 && m.acksAreFinishes && svc > 0 {
		queued -= int((1 - cv2) * float64(now-m.lastCompletion) / float64(svc))
	}
	if timerCV2 > 0 && m.inflight > 0 && svc > 0 {
		// Variable work acknowledged on a timer: what is left of the
		// messages it holds is what a count of completions since the
		// last moment known to finish nothing leaves (timerBacklog).
		queued = 0
		if floor := now + m.timerBacklog(now, svc, timerCV2); floor > start {
			start = floor
		}
	}
	if queued > 0 {
		if floor := now + time.Duration(queued)*svc; floor > start {
			start = floor
		}
	}
	if cv2 > 0 && queued >= 0 && m.inflight >= m.workers && svc > 0 {
		// Variable work: what is left of the running message is, on
		// average, more than its service time less what it ran.
		since := m.lastCompletion
		if sent, ok := m.sends.oldest(); ok && sent > since {
			since = sent
		}
		left := ExpectedRemaining(svc, now-since, cv2)
		if floor := now + time.Duration(queued)*svc + left; floor > start {
			start = floor
		}
	}
	if cv2 := m.reportVariability.SquaredCV(); m.reportsIdle && m.qosDeliveries == 0 && cv2 > 0 && svc > 0 {
		// Variable work, known from reports: a message ends at its mean
		// no more than any other moment, so the messages the member holds
		// (reported, plus sent since) count each a service time however
		// long ago they were sent, in the share cv² of the estimate.
		held := m.heldByReport() + m.reportedRunning // pending leaves out what runs
		held = (held + m.workers - 1) / m.workers
		counted := now + time.Duration(held)*svc
		if blend := start + time.Duration(cv2*float64(counted-start)); blend > start {
			start = blend
		}
	}
	// Acknowledgements that mark finished work are evidence: the oldest
	// unacknowledged message has run since the last completion (or since
	// it was sent, if later). Running well past svc, the member is slower
	// than thought, or stalled, whatever it reports.
	if m.acksAreFinishes && m.inflight > 0 && svc > 0 {
		since := m.lastCompletion
		if sent, ok := m.sends.oldest(); ok && sent > since {
			since = sent
		}
		// A member with an estimate of its own is given slack for
		// jitter; a newcomer's assumed svc is only the group's median.
		limit := svc
		if m.hasService() {
			limit = 2*svc + time.Millisecond
			if timerCV2 > 0 {
				// Variable work often runs past twice its mean
				// (exponential work 13.5 % of the time, six times
				// 0.25 %).
				limit += time.Duration(4 * timerCV2 * float64(svc))
			}
		}
		limit += m.ackLag // acks that come in bursts come late
		if elapsed := now - since; elapsed > limit {
			held := (m.inflight + m.workers - 1) / m.workers // per worker
			if overdue := now + overdueWait(elapsed, held); overdue > start {
				start = overdue
			}
		}
	}
	if !m.hasService() && m.unconfirmed > 0 {
		// Without a measured service time the model under-counts what was
		// sent before any prior existed: the last message sent is still
		// running.
		busy := m.lastSend + svc
		// LuffyMQ's SDK reports as soon as it has finished its first
		// message. A reporting member still silent after its oldest
		// unfinished message ran longer than the assumed svc is slower
		// than that. One that does not report at all is left to the prior.
		elapsed := now - m.unconfirmedSince
		if svc > 0 && elapsed > svc && now-m.lastReport <= silentAfter {
			if overdue := now + overdueWait(elapsed, m.unconfirmed); overdue > busy {
				busy = overdue
			}
		}
		if busy > start {
			start = busy
		}
	}
	return start
}

// applyReport folds a load report (already bounded) into both the thesis
// and the adaptive state.
func (m *member) applyReport(now time.Duration, l Load, prior time.Duration) {
	if l.Workers > 0 {
		m.workers = l.Workers
	}
	reported := l.ProcessingTime // the thesis keeps it as reported
	if l.Processed == 0 && l.ProcessingTime > 0 {
		// A thesis-format report does not say how many messages its mean
		// covers: what was queued at the last report and sent since, less
		// what is queued now, were finished (or are running).
		l.Processed = max(1, m.reportedPending+m.sentSinceReport-l.Pending)
		// Nor how it timed them. Finished for sure are those, less what
		// may be running (one per worker) or still on the wire: what they
		// allow caps the processing time (throughputBound). A report
		// with the SDK's keys is the SDK's own measure of its handlers.
		finished := l.Processed - m.workers - m.recent.after(now-l.WrittenAgo-wireSlack)
		if bound, ok := m.throughputBound(now, finished); ok && l.ProcessingTime > bound {
			l.ProcessingTime = bound
		}
	}
	// A report of a message running, none finished since the previous
	// report that also said one was running, shows that message has run
	// at least since then (runningSince): evidence the estimate may lack
	// (a first measurement of variable work can be a tenth of the mean).
	ranAtLeast := time.Duration(0)
	switch {
	case l.InProgress == 0:
		m.runningSince, m.overdueMeasured = -1, false
	case l.ProcessingTime == 0 && m.runningSince >= 0:
		ranAtLeast = now - m.runningSince
	default:
		m.runningSince, m.overdueMeasured = now, false // started by now
	}
	// Thesis bookkeeping, exactly as §1.3.
	m.thesisWindow.push(reported)
	m.reportedPending = l.Pending
	m.reportedRunning = l.InProgress
	if l.HasReceived && !m.reportedBusy() {
		m.reportsIdle = true
	}
	m.sentSinceReport = 0
	m.lastReport = now
	m.reports++

	// Adaptive: a zero processing time means "nothing finished", not
	// "instant", so it never overwrites a known estimate.
	if l.ProcessingTime > 0 {
		// A mean over many messages outweighs one over a single message:
		// the first measurement alone is noisy, and between two reports
		// the prediction runs on this estimate alone.
		m.serviceWindow.pushWeighted(l.ProcessingTime, l.Processed)
		m.reportVariability.AddMean(l.ProcessingTime, l.Processed)
		m.unconfirmed = 0 // it has finished what it measured
		m.unconfirmedSince = now
	}
	m.checkAcksAgainstReport(l)
	svc := m.serviceOr(prior)

	// Messages sent but not yet received when the report was written are
	// not in it: counted exactly by the SDK's "received", otherwise from
	// the broker's own send times and the report's age.
	var onTheWire uint64
	if l.HasReceived {
		if m.sentTotal > l.Received {
			onTheWire = m.sentTotal - l.Received
		}
	} else if l.WrittenAgo > 0 {
		onTheWire = uint64(m.recent.after(now - l.WrittenAgo))
	}
	// The broker's own model (fed by what it sent) holds the pending
	// messages, those on the wire and what is left of the running one.
	known := l.Pending + int(onTheWire)
	var backlog time.Duration
	switch {
	case l.HasBacklog:
		backlog = l.Backlog
	case l.InProgress > 0 || l.Pending > 0:
		// Busy: the running message is half done on average, unless the
		// model says better.
		backlog = time.Duration(l.Pending)*svc + m.runningRemaining(now, known, svc, svc/2)
	case l.HasReceived:
		// An SDK report says in progress explicitly: idle.
	default:
		// Only the thesis's two keys, nothing waiting: a message may still
		// be running; the model tells how much of it is left.
		backlog = m.runningRemaining(now, known, svc, 0)
	}
	m.freeAt = now + backlog + time.Duration(onTheWire)*svc
	if svc > 0 && ranAtLeast > reportedOverdueFactor*svc+reportedOverdueSlack {
		// Running far past its estimate: slower than thought, or
		// stalled, whatever its backlog says. It is taken as halfway
		// through, the others it holds as long each (overdueWait), and
		// what it ran counts as a measurement.
		held := (l.Pending + l.InProgress + int(onTheWire) + m.workers - 1) / m.workers
		m.freeAt = max(m.freeAt, now+overdueWait(ranAtLeast, held))
		if m.overdueMeasured { // the same message, longer now
			m.serviceWindow.replaceLast(ranAtLeast)
		} else {
			m.serviceWindow.push(ranAtLeast)
			m.reportVariability.Add(ranAtLeast)
			m.overdueMeasured = true
		}
	}
}

// throughputBound is the longest mean processing time a member can have
// had, for the adaptive estimate, given the messages it finished since its
// previous report. Counted are only those that started after that report
// (finished: those the report covers, less one per worker that may still
// run or may have been running at the previous report); they all ran on
// its w workers within the time since then, so for k of them in elapsed:
// k·mean ≤ w·elapsed.
//
// A client that times a message from its arrival, its wait in its own
// queue included, reports more than this bound; without it, the broker
// would take every queue such a member builds for slowness and move work
// to members already busier. A client that measures its work reports less,
// unless a long message that started before its previous report raised its
// mean: the bound then leaves out that message's evidence, a cost on
// exponential work (1.05× in the simulator's fleet-20, with thesis-format
// reports) that is small beside what it saves with a client that times
// from arrival (TestSimulationReportersTimingFromReceipt). ok is false
// when too few messages finished for a bound. The time since the previous
// report is measured at the broker, between arrivals: reportGapSlack
// covers their jitter.
func (m *member) throughputBound(now time.Duration, finished int) (bound time.Duration, ok bool) {
	if finished < minFinishedForBound {
		return 0, false
	}
	w := max(m.workers, 1)
	return time.Duration(int64(w) * int64(now-m.lastReport+reportGapSlack) / int64(finished)), true
}

const (
	// minFinishedForBound is how many messages must have finished for a
	// bound.
	minFinishedForBound = 2
	reportGapSlack      = 10 * time.Millisecond
	// wireSlack widens the window of sends taken as still on the wire
	// when a thesis-format report was written.
	wireSlack = 2 * time.Millisecond
)

// A reporter's message is overdue (applyReport) once its reports show it
// running longer than reportedOverdueFactor service estimates plus
// reportedOverdueSlack: the times are the reports' arrivals, which a
// loaded machine or network delays by tens of milliseconds, and a worker
// that paused that long is not slower for it.
const (
	reportedOverdueFactor = 4
	reportedOverdueSlack  = 10 * time.Millisecond
)

// runningRemaining estimates what is left of the message the member is
// running when it holds queued messages besides: what the broker's model
// predicts beyond them, bounded by one service time, or fallback when the
// model predicts no more than the queue.
func (m *member) runningRemaining(now time.Duration, pending int, svc, fallback time.Duration) time.Duration {
	beyond := m.freeAt - now - time.Duration(pending)*svc
	if beyond <= 0 || svc <= 0 {
		return fallback
	}
	return min(beyond, svc)
}

// checkAcksAgainstReport detects a client that acknowledges on receipt but
// queues internally: it reports more pending than it has unacknowledged,
// or its acknowledgements come far faster than the processing time it
// reports. Its acks then say nothing about when it is free.
func (m *member) checkAcksAgainstReport(l Load) {
	if m.qosDeliveries == 0 || !m.acksAreFinishes {
		return
	}
	if l.Pending > m.inflight {
		m.acksAreFinishes = false
		return
	}
	if m.ackWindow.count >= 3 && m.serviceWindow.count > 0 {
		reported := m.serviceWindow.mean() / time.Duration(max(m.workers, 1))
		if m.ackWindow.mean()*3 < reported {
			m.acksAreFinishes = false
		}
	}
}

// recordSend books a message handed to the member at now, which starts at
// start and is assumed to take svc.
func (m *member) recordSend(now, start, svc time.Duration) {
	if m.reportsIdle && !m.reportedBusy() && m.sentSinceReport == 0 {
		// Reported idle, nothing sent since: this one starts on arrival.
		m.runningSince, m.overdueMeasured = now, false
	}
	if m.unconfirmed == 0 {
		m.unconfirmedSince = start
	}
	m.unconfirmed++
	m.freeAt = start + svc
	m.burstFreeAt = max(m.burstFreeAt, start) + svc
	m.lastSend = now
	m.sentSinceReport++
	m.sentTotal++
	m.recent.push(now)
}

// deliveryStarted books a QoS≥1 delivery sent at now.
func (m *member) deliveryStarted(now time.Duration) {
	m.inflight++
	m.qosDeliveries++
	m.sends.push(now)
}

// deliveryAcknowledged books an acknowledgement at now and reports whether
// it taught the engine a new service-time sample. When acknowledgements mark
// finished work, the acknowledged message started at the previous
// completion, or when it was sent if the member was idle then; the next
// one starts now.
func (m *member) deliveryAcknowledged(now, prior time.Duration) (learnt bool) {
	sameBurst := false
	if m.inflight == 0 {
		return false
	}
	m.inflight--
	sent, known := m.sends.pop()
	if !m.acksAreFinishes {
		return false
	}
	start := m.lastCompletion
	if known && sent > start {
		start = sent
	}
	// An ack within ackBurstGap of the previous one, for a message that
	// was queued then, belongs to the same burst.
	queuedInBurst := now-m.lastCompletion <= ackBurstGap && (!known || sent < m.lastCompletion)
	m.noteFlushWindow(start, queuedInBurst, known, sent)
	switch {
	case m.burstCount > 0 && queuedInBurst:
		// Another ack of the same burst, for a message that was queued:
		// the burst's completions share the time it covers.
		sameBurst = true
		m.burstCount++
		m.ackWindow.replaceLast((now - m.burstFrom) / time.Duration(m.burstCount))
		learnt = true
	case now-start > 0 && (known || m.completions > 0):
		if m.completions > 0 {
			m.ackGrid.observe(now - m.lastCompletion)
		}
		if gap := now - m.lastCompletion; m.burstCount > 1 && gap > m.ackLag {
			m.ackLag = gap // the member sends acks in bursts this far apart
		} else if m.burstCount > 1 {
			m.ackLag -= m.ackLag / 8 // forget slowly
		}
		m.burstFrom, m.burstCount = start, 1
		m.ackWindow.push(now - start)
		m.ackVariability.Add(now - start)
		learnt = true
	}
	if !sameBurst {
		m.burstFreeAt = m.freeAt
	}
	m.completions++
	m.lastCompletion = now
	if m.unconfirmed > 0 {
		m.unconfirmed--
	}
	m.unconfirmedSince = now
	svc := m.serviceOr(prior)
	queued := m.inflight - (m.workers - 1) // the others may run in parallel
	if queued < 0 {
		queued = 0
	}
	upper := now + time.Duration(queued)*svc
	if m.ackLag == 0 && m.burstCount <= 1 {
		// A timely ack: the next message starts now.
		m.freeAt = upper
		return learnt
	}
	// Acks that come in bursts are late: the running message started at
	// some point since the last burst. The model (what was sent, at svc
	// each) places it best, within what the ack allows.
	lower := now + time.Duration(max(queued-1, 0))*svc
	model := m.freeAt
	if m.acksOnTimer() {
		// A timer's burst is one piece of evidence, read one ack at a
		// time: until its last ack, what is unacknowledged still counts
		// the burst's later ones, and a lower bound drawn from that
		// would push the model later by their work, where the upper
		// bounds that follow then leave it (the running message taken to
		// have started at the flush). Each ack of the burst bounds the
		// model as it was before the burst instead.
		model = m.burstFreeAt
	}
	m.freeAt = min(max(model, lower), upper)
	return learnt
}

// variableService is the squared coefficient of variation above which a
// member's service estimate is the moving average of its acknowledged
// service times rather than the mean of the last reportWindow.
const variableService = 0.25

// serviceVariability is the squared coefficient of variation of the
// member's service times as its acknowledgements show them, within [0, 1]:
// 0 when every message takes as long (what is left of the running one is
// its service time less what it ran), 1 when its work is as variable as an
// exponential distribution's (what is left does not depend on what it
// ran), or more. A member whose acks a timer flushes (acksOnTimer) shows,
// in its ack times, when it flushed rather than how long its work took: 0.
func (m *member) serviceVariability() float64 {
	if m.acksOnTimer() {
		return 0
	}
	return m.ackVariability.SquaredCV()
}

// acksOnTimer reports whether the member's acknowledgements come in bursts
// that a timer flushes (paho.golang's manual acks, every 50 ms): each
// shows that work ended some time since the last flush, not when. Bursts
// whose acks are written when work ends (Python paho's, after its next
// read) are not: they are late, but their times are the work's. Until the
// gaps between bursts tell (ackGrid), bursts are taken to be a timer's.
func (m *member) acksOnTimer() bool { return m.ackLag > 0 && !m.ackGrid.offGrid() }

// deliveryDropped books a delivery abandoned without acknowledgement.
func (m *member) deliveryDropped() {
	if m.inflight > 0 {
		m.inflight--
		m.sends.pop()
	}
}

// resetDeliveries sets the count of unacknowledged deliveries to n, whose
// send times are unknown (a resumed session, a broker-side rollback).
func (m *member) resetDeliveries(now time.Duration, n int) {
	m.inflight = n
	m.sends.clear()
	for i := 0; i < n && i < sendLogSize; i++ {
		m.sends.push(now)
	}
	if n > sendLogSize {
		m.sends.pushed += uint64(n - sendLogSize)
	}
}

// held is how many messages the member is assumed to hold: its
// unacknowledged deliveries when it receives QoS≥1, the messages sent to it
// not known to be finished when no service time is known, otherwise the
// messages its predicted backlog (start − now) amounts to at svc each,
// rounded up.
func (m *member) held(now, start, svc time.Duration) int {
	if m.qosDeliveries > 0 {
		return m.inflight
	}
	if svc <= 0 {
		return m.unconfirmed
	}
	if start <= now {
		return 0
	}
	return int((start - now + svc - 1) / svc)
}

// outstanding is the member's queue as the broker knows it, for the
// classical policies: its unacknowledged deliveries when it receives
// QoS≥1, otherwise its last reported queue plus what was sent to it since
// (m_q + m_s of the thesis). It takes the member's lock.
func (m *member) outstanding() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.qosDeliveries > 0 {
		return m.inflight
	}
	return m.heldByReport()
}

// reportedBusy is whether its last report had a message pending or
// running. m's lock is held.
func (m *member) reportedBusy() bool { return m.reportedPending > 0 || m.reportedRunning > 0 }

// heldByReport is what the member holds as far as its last report and the
// broker's sends tell: the pending count it reported and the messages sent
// to it since. m's lock is held.
func (m *member) heldByReport() int { return m.reportedPending + m.sentSinceReport }

// lockedAtReceiveMaximum reports whether the member holds as many
// unacknowledged deliveries as its Receive Maximum allows; it takes the
// member's lock.
func (m *member) lockedAtReceiveMaximum() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.receiveMax > 0 && m.inflight >= m.receiveMax
}

// noteFlushWindow books an acknowledgement of a message sent at sent
// (when known) whose work began at start at the earliest, in the windows
// flushWins learns from. An ack of the same burst (queuedInBurst) adds to
// the window; any other ends it and begins the next, which starts at start
// with the messages sent until then. m's lock is held; inflight and sends
// already exclude the acknowledged message.
func (m *member) noteFlushWindow(start time.Duration, queuedInBurst, known bool, sent time.Duration) {
	sameBurst := m.windowAcks > 0 && queuedInBurst
	switch {
	case sameBurst && (!known || sent <= m.windowFrom):
		m.windowAcks++
	case sameBurst:
		// Sent after the window began: all it held was done.
	default:
		if m.windowAcks > 0 {
			m.flushWins.add(m.lastCompletion-m.windowFrom, m.ackGrid.period, m.windowHeld, m.windowAcks)
		}
		m.windowFrom, m.windowAcks = start, 1
		m.windowHeld = 1 + m.sends.sentBy(start)
	}
}

// variableTimerWork is the squared coefficient of variation from which
// a member acknowledging on a timer is taken to do variable work
// (timerVariability). Below it the burst rules, made for work of fixed
// length, predict it better. In the simulator (fleets of 6, 20 and 50,
// 50 ms flushes, five seeds) 0.4 gained a little more on exponential work
// (41.7, 31.7, 28.9 ms against 43.0, 32.0, 28.8) but cost uniform work
// within ±50 % up to 3 % (fleet of 6, 14.4 → 14.9 ms), which 0.6 left as
// it was; 0.8 kept less of the gain (44.7, 33.5, 29.2).
const variableTimerWork = 0.6

// timerVariability is the squared coefficient of variation of the work of
// a member whose acknowledgements a timer flushes, as the windows between
// its bursts show it, once it is at least variableTimerWork (0 below
// that, for any other member, or until the windows tell).
func (m *member) timerVariability() float64 {
	if !m.acksAreFinishes || !m.acksOnTimer() || !m.flushWins.known() {
		return 0
	}
	if cv2 := m.flushWins.squaredCV(); cv2 >= variableTimerWork {
		return cv2
	}
	return 0
}

// timerBacklog is how long a member whose acknowledgements a timer
// flushes still needs for the messages it holds, for a mean service time
// svc and work of squared coefficient of variation cv2. Since the last
// moment it is known to have finished nothing more (the latest burst, the
// send that found it idle, or a flush of the timer's grid that brought no
// ack), it finished a count of them that is about Poisson for memoryless
// work, and exactly the time over svc when every message takes as long;
// the expected shortfall of that count is blended between the two by
// cv2. Per worker, for a member with several.
func (m *member) timerBacklog(now, svc time.Duration, cv2 float64) time.Duration {
	since := m.lastCompletion
	if sent, ok := m.sends.oldest(); ok && sent > since {
		since = sent
	}
	if period := m.ackGrid.period; period > 0 {
		// The timer's next flush would have brought an ack by now:
		// nothing had finished before it.
		if k := (now - m.lastCompletion - gridTolerance(period)) / period; k > 0 {
			since = max(since, m.lastCompletion+k*period)
		}
	}
	finished := float64(max(now-since, 0)) / float64(svc)
	n := (m.inflight + m.workers - 1) / m.workers
	left := cv2*poissonShortfall(n, finished) + (1-cv2)*max(float64(n)-finished, 0)
	return time.Duration(left * float64(svc))
}
