package clientsdk

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

func TestPendingJumped(t *testing.T) {
	tests := []struct {
		last, now int
		want      bool
	}{
		{0, 0, false},
		{0, 1, false},
		{0, 2, true},
		{1, 2, false},
		{1, 3, true},
		{4, 5, false},
		{4, 6, true},
		{10, 14, false},
		{10, 15, true},
		{10, 5, true},
		{10, 6, false},
		{100, 149, false},
		{100, 150, true},
		{3, 0, true},
		{2, 1, false},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, pendingJumped(tt.last, tt.now), "last %d now %d", tt.last, tt.now)
	}
}

// clockSchedule drives a reportSchedule with an explicit clock.
type clockSchedule struct {
	t     *testing.T
	s     *reportSchedule
	now   time.Time
	load  loadSignal
	sent  []reportReason
	times []time.Duration // since t0
}

func newClockSchedule(t *testing.T, interval time.Duration) *clockSchedule {
	return &clockSchedule{t: t, s: newReportSchedule(t0, interval), now: t0}
}

// advance moves the clock to at, sending every report due on the way as
// the pinger would (it wakes at the times next asks for).
func (c *clockSchedule) advance(to time.Duration) {
	end := t0.Add(to)
	for {
		reason, at := c.s.next(c.now, c.load)
		if reason != reasonNone {
			c.sent = append(c.sent, reason)
			c.times = append(c.times, c.now.Sub(t0))
			c.s.sent(c.now, c.load.pending, c.load.inProgress, c.load.received, c.load.finishedSinceReport)
			c.load.finishedSinceReport = 0
			continue
		}
		require.True(c.t, at.After(c.now), "next wake %s is not after now %s", at, c.now)
		if at.After(end) {
			c.now = end
			return
		}
		c.now = at
	}
}

func TestScheduleIsPeriodicWithoutSignals(t *testing.T) {
	c := newClockSchedule(t, time.Second)
	c.advance(3500 * time.Millisecond)
	require.Equal(t, []reportReason{reasonPeriodic, reasonPeriodic, reasonPeriodic}, c.sent)
	require.Equal(t, []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}, c.times)
}

func TestScheduleReportsFirstMeasurementAtOnce(t *testing.T) {
	c := newClockSchedule(t, time.Second)
	c.advance(150 * time.Millisecond)
	require.Empty(t, c.sent, "nothing to say before a measurement")

	c.load = loadSignal{finishedSinceReport: 1, meanKnown: true}
	c.advance(150 * time.Millisecond)
	require.Equal(t, []reportReason{reasonFirstMeasurement}, c.sent)
	require.Equal(t, []time.Duration{150 * time.Millisecond}, c.times)

	// Fewer new measurements than already reported wait for the period.
	c.s.measured = warmupLimit // warm-up done (see TestScheduleWarmsUp)
	c.load.finishedSinceReport = 3
	c.advance(1100 * time.Millisecond)
	require.Equal(t, []reportReason{reasonFirstMeasurement}, c.sent)
	c.advance(1150 * time.Millisecond)
	require.Equal(t, []reportReason{reasonFirstMeasurement, reasonPeriodic}, c.sent)
	require.Equal(t, 1150*time.Millisecond, c.times[1], "the period restarts at the last report")
}

// TestScheduleWarmsUp: after the first measurement, a report goes out each
// time the messages measured since the last report reach those already
// reported (after 1, 2, 4, … 32 in all), then only on the period.
func TestScheduleWarmsUp(t *testing.T) {
	c := newClockSchedule(t, time.Second)
	var covered []int
	total := 0
	for step := 0; step < 100; step++ {
		c.now = c.now.Add(25 * time.Millisecond) // one message finishes every 25 ms
		c.load = loadSignal{finishedSinceReport: c.load.finishedSinceReport + 1, meanKnown: true}
		total++
		before := len(c.sent)
		c.advance(c.now.Sub(t0))
		if len(c.sent) > before {
			covered = append(covered, total)
		}
	}
	require.Equal(t, []reportReason{reasonFirstMeasurement, reasonWarmup, reasonWarmup, reasonWarmup,
		reasonWarmup, reasonWarmup, reasonPeriodic}, c.sent)
	require.Equal(t, []int{1, 2, 4, 8, 16, 32, 72}, covered,
		"reports after 1, 2, 4, 8, 16 and 32 messages (at 800 ms), then a second later (40 messages on)")
}

func TestScheduleReportsPendingJumpRateLimited(t *testing.T) {
	c := newClockSchedule(t, time.Second)
	c.advance(10 * time.Millisecond)
	c.load = loadSignal{finishedSinceReport: 1, meanKnown: true}
	c.advance(10 * time.Millisecond) // first measurement at 10 ms
	require.Equal(t, []reportReason{reasonFirstMeasurement}, c.sent)
	require.Equal(t, []time.Duration{10 * time.Millisecond}, c.times)

	// A jump 30 ms later waits until 100 ms after the last report.
	c.advance(40 * time.Millisecond)
	c.load.pending = 8
	c.advance(109 * time.Millisecond)
	require.Len(t, c.sent, 1)
	c.advance(110 * time.Millisecond)
	require.Equal(t, []reportReason{reasonFirstMeasurement, reasonPendingJump}, c.sent)
	require.Equal(t, 110*time.Millisecond, c.times[1])

	// A small change is no jump; a halving is.
	c.load.pending = 6
	c.advance(300 * time.Millisecond)
	require.Len(t, c.sent, 2)
	c.load.pending = 4
	c.advance(301 * time.Millisecond)
	require.Equal(t, reasonPendingJump, c.sent[2])
	require.Equal(t, 300*time.Millisecond, c.times[2], "last report was long enough ago: at once")
}

func TestScheduleJumpBeforeAnyReportIsImmediate(t *testing.T) {
	c := newClockSchedule(t, time.Second)
	c.load.pending = 5
	c.advance(20 * time.Millisecond)
	require.Equal(t, []reportReason{reasonPendingJump}, c.sent)
	require.Equal(t, []time.Duration{0}, c.times)
}

func TestScheduleReportsAtOnceOnReconnectionWhenSpeedKnown(t *testing.T) {
	c := newClockSchedule(t, time.Second)
	c.load = loadSignal{meanKnown: true}
	c.advance(0)
	require.Equal(t, []reportReason{reasonConnected}, c.sent)

	// A measurement on the new connection is news to this broker too.
	c.advance(50 * time.Millisecond)
	c.load.finishedSinceReport = 1
	c.advance(50 * time.Millisecond)
	require.Equal(t, []reportReason{reasonConnected, reasonFirstMeasurement}, c.sent)
	require.Equal(t, 50*time.Millisecond, c.times[1])
}

func TestScheduleFollowsIntervalChange(t *testing.T) {
	c := newClockSchedule(t, time.Second)
	c.s.interval = 300 * time.Millisecond // as when CONNACK announces it
	c.advance(1000 * time.Millisecond)
	require.Equal(t, []time.Duration{300 * time.Millisecond, 600 * time.Millisecond, 900 * time.Millisecond}, c.times)
}

// TestScheduleReportsGoingIdle: a client that received work since its last
// report and has nothing pending or running any more says so at once (at
// most every minIdleReportGap), so the broker does not wait out its
// predicted service time: with work as variable as an exponential
// distribution's, most messages end far before it. Idle with nothing
// received since an idle report, it stays quiet.
func TestScheduleReportsGoingIdle(t *testing.T) {
	c := newClockSchedule(t, time.Second)
	c.s.lastReport, c.s.ptReported, c.s.measured = t0, true, warmupLimit
	c.load.meanKnown = true

	c.load.received, c.load.inProgress = 1, 1
	c.advance(4 * time.Millisecond)
	require.Empty(t, c.sent, "busy: nothing to say")
	c.load.inProgress = 0
	c.advance(20 * time.Millisecond)
	require.Equal(t, []reportReason{reasonIdle}, c.sent)
	require.Equal(t, []time.Duration{minIdleReportGap}, c.times, "not sooner than minIdleReportGap after the last report")

	c.advance(500 * time.Millisecond)
	require.Len(t, c.sent, 1, "idle, nothing received since: no report")

	c.load.received, c.load.inProgress = 2, 1
	c.advance(501 * time.Millisecond)
	c.load.inProgress = 0
	c.advance(502 * time.Millisecond)
	require.Equal(t, []reportReason{reasonIdle, reasonIdle}, c.sent)
	require.Equal(t, 501*time.Millisecond, c.times[1])

	// Pending work is not idle, even with no handler running.
	c.load.received, c.load.pending = 3, 1
	c.advance(600 * time.Millisecond)
	require.Len(t, c.sent, 2)
}
