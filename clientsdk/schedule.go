package clientsdk

import "time"

// minJumpReportGap is the shortest time between a report and a report sent
// because the pending count jumped.
const minJumpReportGap = 100 * time.Millisecond

// minIdleReportGap is the shortest time between a report and a report sent
// because the client went idle. An idle report follows at least one
// message received since the previous report, so a client sends at most
// one per message and at most 100 a second.
const minIdleReportGap = 10 * time.Millisecond

// reportReason says why a report is sent.
type reportReason int

const (
	reasonNone reportReason = iota
	// reasonConnected: first report on a new connection, sent at once when
	// the SDK already knows its processing time (a reconnection).
	reasonConnected
	// reasonFirstMeasurement: a handler finished and no report on this
	// connection carried a processing time yet.
	reasonFirstMeasurement
	// reasonWarmup: early on a connection, the number of messages
	// measured since the last report reached the number already reported,
	// so each warm-up report doubles what the broker's estimate rests on.
	reasonWarmup
	// reasonPendingJump: the pending count changed sharply.
	reasonPendingJump
	// reasonIdle: nothing is pending or running any more, while the
	// broker, from the last report and what it sent since, counts work
	// still to do.
	reasonIdle
	// reasonPeriodic: the report interval elapsed.
	reasonPeriodic
)

func (r reportReason) String() string {
	switch r {
	case reasonConnected:
		return "connected"
	case reasonFirstMeasurement:
		return "first-measurement"
	case reasonWarmup:
		return "warm-up"
	case reasonPendingJump:
		return "pending-jump"
	case reasonIdle:
		return "idle"
	case reasonPeriodic:
		return "periodic"
	}
	return "none"
}

// loadSignal is the part of the Subscriber's state that decides when to
// report.
type loadSignal struct {
	pending             int
	inProgress          int    // handlers running now
	received            uint64 // messages received on this connection
	finishedSinceReport int    // handlers finished since the last report
	meanKnown           bool   // a processing time has ever been measured
}

// warmupLimit is how many measured messages the warm-up reports cover
// (after 1, 2, 4, … 32 messages); the periodic reports take over then.
const warmupLimit = 32

// reportSchedule decides when the next load report is due on one
// connection. It holds no clock: every call gets the time.
//
// Between two reports the broker predicts a member's backlog from its
// processing-time estimate alone, so an estimate resting on one message
// (the first-measurement report) can mislead it for a whole interval. The
// warm-up reports refine it quickly: each is sent once as many messages
// have been measured since the previous report as all reports before it
// covered.
type reportSchedule struct {
	interval    time.Duration
	connectedAt time.Time
	lastReport  time.Time // zero before the first report on this connection
	lastPending int       // pending count in the last report
	lastBusy    bool      // the last report counted pending or running messages
	receivedAt  uint64    // messages received on the connection at the last report
	ptReported  bool      // a report on this connection carried a processing time
	measured    int       // messages the reports on this connection covered
}

func newReportSchedule(now time.Time, interval time.Duration) *reportSchedule {
	return &reportSchedule{interval: interval, connectedAt: now}
}

// next returns why a report is due at now, or reasonNone and the time at
// which the schedule must be consulted again (later signals may bring it
// forward).
func (s *reportSchedule) next(now time.Time, l loadSignal) (reportReason, time.Time) {
	if !s.ptReported && l.finishedSinceReport > 0 {
		return reasonFirstMeasurement, now
	}
	if s.lastReport.IsZero() && l.meanKnown {
		return reasonConnected, now
	}
	if s.ptReported && s.measured < warmupLimit && l.finishedSinceReport >= s.measured {
		return reasonWarmup, now
	}
	base := s.lastReport
	if base.IsZero() {
		base = s.connectedAt
	}
	periodic := base.Add(s.interval)
	if !now.Before(periodic) {
		return reasonPeriodic, now
	}
	if idle := l.pending == 0 && l.inProgress == 0; idle && l.meanKnown && !s.lastReport.IsZero() && (s.lastBusy || l.received > s.receivedAt) {
		// The broker thinks it is still busy: it is told at once (within
		// minIdleReportGap of the last report) that it is free.
		at := s.lastReport.Add(minIdleReportGap)
		if !now.Before(at) {
			return reasonIdle, now
		}
		if at.Before(periodic) {
			return reasonNone, at
		}
	}
	if pendingJumped(s.lastPending, l.pending) {
		at := now
		if !s.lastReport.IsZero() {
			if earliest := s.lastReport.Add(minJumpReportGap); earliest.After(at) {
				at = earliest
			}
		}
		if !now.Before(at) {
			return reasonPendingJump, now
		}
		if at.Before(periodic) {
			return reasonNone, at
		}
	}
	return reasonNone, periodic
}

// sent records a report sent at now, with pending messages, inProgress
// running, received messages received on the connection so far, and a
// processing time measured over processed messages (0: none).
func (s *reportSchedule) sent(now time.Time, pending, inProgress int, received uint64, processed int) {
	s.lastReport = now
	s.lastPending = pending
	s.lastBusy = pending > 0 || inProgress > 0
	s.receivedAt = received
	if processed > 0 {
		s.ptReported = true
		s.measured += processed
	}
}

// pendingJumped says whether the pending count moved from last to now by at
// least max(2, half of last): enough for the broker's picture to be wrong.
func pendingJumped(last, now int) bool {
	d := now - last
	if d < 0 {
		d = -d
	}
	threshold := max(2, (last+1)/2)
	return d >= threshold
}
