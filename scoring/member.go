package scoring

import "time"

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
}

// durationWindow keeps the last reportWindow values, each with a weight,
// and their weighted mean.
type durationWindow struct {
	values  [reportWindow]time.Duration
	weights [reportWindow]int
	count   int
	next    int
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
}

func (w *durationWindow) mean() time.Duration {
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

// member is the load state of one client, shared by every group it is in.
// Times are durations since the engine's epoch. All fields are guarded by
// the engine's lock.
type member struct {
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
	serviceWindow   durationWindow // non-zero reported processing times
	workers         int
	freeAt          time.Duration // predicted time it can start a new message
	inflight        int           // QoS≥1 deliveries not yet acknowledged
	receiveMax      int           // its Receive Maximum; 0: no limit
	qosDeliveries   uint64        // QoS≥1 deliveries ever started
	sentTotal       uint64        // messages selected for it on this connection
	acksAreFinishes bool          // its acknowledgements mark finished processing

	// Until its first measurement: the messages sent to it not known to be
	// finished, and when the oldest of them started (as far as is known).
	unconfirmed      int
	unconfirmedSince time.Duration
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
	m.inflight = 0
	m.receiveMax = 0
	m.qosDeliveries = 0
	m.sentTotal = 0
	m.acksAreFinishes = true
	m.unconfirmed = 0
	m.unconfirmedSince = now
}

// thesisProcessingTime is the thesis's t_p: the mean of the last reported
// processing times, zeros included.
func (m *member) thesisProcessingTime() time.Duration { return m.thesisWindow.mean() }

// service is the adaptive estimate of the time the member needs per message,
// with its workers in parallel; 0 when it has never reported a processing
// time.
func (m *member) service() time.Duration {
	s := m.serviceWindow.mean()
	if m.workers > 1 {
		s /= time.Duration(m.workers)
	}
	return s
}

func (m *member) hasService() bool { return m.serviceWindow.count > 0 }

// serviceOr returns the member's service estimate, or prior if it has none.
func (m *member) serviceOr(prior time.Duration) time.Duration {
	if m.hasService() {
		return m.service()
	}
	return prior
}

// maxOverdueGuess bounds the wait guessed for an overdue newcomer.
const maxOverdueGuess = 24 * time.Hour

// predictedStart is when the member could start a message handed to it now,
// given the service time svc it is assumed to need per message; a member
// heard from within silentAfter is expected to report (Config.StaleAfter).
func (m *member) predictedStart(now, svc, silentAfter time.Duration) time.Duration {
	start := now
	if m.freeAt > start {
		start = m.freeAt
	}
	// Unacknowledged QoS≥1 deliveries beyond what its workers hold are
	// queued at it: a floor on its backlog whatever the model says.
	if queued := m.inflight - m.workers; queued > 0 {
		if floor := now + time.Duration(queued)*svc; floor > start {
			start = floor
		}
	}
	if !m.hasService() && m.unconfirmed > 0 {
		// Without a measured service time the model under-counts what was
		// sent before any prior existed: the last message sent is still
		// running.
		busy := m.lastSend + svc
		// LuffyMQ's SDK reports as soon as it has finished its first
		// message (QoS≥1 acknowledgements say so too). A reporting member
		// still silent after its oldest unfinished message ran longer than
		// the assumed svc is slower than that: guess it is halfway through
		// that message, and that each of the others takes as long. One that
		// does not report at all is left to the prior.
		elapsed := now - m.unconfirmedSince
		if svc > 0 && elapsed > svc && now-m.lastReport <= silentAfter {
			// Started at unconfirmedSince, n messages of 2·elapsed each:
			// (2n − 1)·elapsed from now, bounded.
			wait := maxOverdueGuess
			if n := time.Duration(2*m.unconfirmed - 1); elapsed < maxOverdueGuess/n {
				wait = n * elapsed
			}
			if overdue := now + wait; overdue > busy {
				busy = overdue
			}
		}
		if busy > start {
			start = busy
		}
	}
	return start
}

// applyReport folds a load report into both the thesis and the adaptive
// state.
func (m *member) applyReport(now time.Duration, l Load, prior time.Duration) {
	// Thesis bookkeeping, exactly as §1.3.
	m.thesisWindow.push(l.ProcessingTime)
	m.reportedPending = l.Pending
	m.sentSinceReport = 0
	m.lastReport = now
	m.reports++

	// Adaptive: a zero processing time means "nothing finished", not
	// "instant", so it never overwrites a known estimate.
	if l.Workers > 0 {
		m.workers = l.Workers
	}
	if l.ProcessingTime > 0 {
		// A mean over many messages outweighs one over a single message:
		// the first measurement alone is noisy, and between two reports
		// the prediction runs on this estimate alone.
		m.serviceWindow.pushWeighted(l.ProcessingTime, l.Processed)
	}
	svc := m.serviceOr(prior)

	// Messages sent but not yet received when the report was written
	// are not in it.
	var onTheWire uint64
	if l.HasReceived && m.sentTotal > l.Received {
		onTheWire = m.sentTotal - l.Received
	}
	var backlog time.Duration
	if l.HasBacklog {
		backlog = l.Backlog
	} else {
		backlog = time.Duration(l.Pending) * svc
		if l.Pending > 0 || l.InProgress > 0 {
			backlog += svc / 2 // the running message, half done on average
		}
	}
	m.freeAt = now + backlog + time.Duration(onTheWire)*svc

	// A client that acknowledges on receipt but queues internally reports
	// more pending than it has unacknowledged: its acks say nothing about
	// when it is free.
	if m.qosDeliveries > 0 && l.Pending > m.inflight {
		m.acksAreFinishes = false
	}
}

// recordSend books a message handed to the member at now, which starts at
// start and is assumed to take svc.
func (m *member) recordSend(now, start, svc time.Duration) {
	if m.unconfirmed == 0 {
		m.unconfirmedSince = start
	}
	m.unconfirmed++
	m.freeAt = start + svc
	m.lastSend = now
	m.sentSinceReport++
	m.sentTotal++
}

// acknowledged books a QoS≥1 acknowledgement that marks a finished message
// at now: the next unconfirmed message, if any, starts now.
func (m *member) acknowledged(now time.Duration) {
	if m.unconfirmed > 0 {
		m.unconfirmed--
	}
	m.unconfirmedSince = now
}

// assumedInFlight is how many messages the member is assumed to hold: its
// unacknowledged deliveries when it receives QoS≥1, otherwise the messages
// its predicted backlog (start − now) amounts to at svc each, rounded up.
func (m *member) assumedInFlight(now, start, svc time.Duration) int {
	if m.qosDeliveries > 0 {
		return m.inflight
	}
	if svc <= 0 || start <= now {
		return 0
	}
	return int((start - now + svc - 1) / svc)
}

// atReceiveMaximum reports whether the member holds as many unacknowledged
// deliveries as its Receive Maximum allows.
func (m *member) atReceiveMaximum() bool {
	return m.receiveMax > 0 && m.inflight >= m.receiveMax
}
