package scoring_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/scoring"
)

var adaptive = scoring.Config{Strategy: "adaptive"}

// busy is a report of a member with a known service time that cannot start
// anything new for backlog.
func busy(service, backlog time.Duration) scoring.Load {
	return scoring.Load{ProcessingTime: service, Backlog: backlog, HasBacklog: true}
}

func TestAdaptivePicksEarliestPredictedStart(t *testing.T) {
	f := newFixture(t, adaptive, "a", "b", "c")
	f.report("a", busy(ms(10), ms(30)))
	f.report("b", busy(ms(10), ms(5)))
	f.report("c", busy(ms(10), ms(20)))
	// b starts at 5, then 15 (+10); c at 20; b at 25 ... a first at 30.
	require.Equal(t, []string{"b", "b", "c", "b", "a"}, f.selN(5, 0))
	require.Equal(t, ms(35), f.wait("b")) // 5 + 3·10
	require.Equal(t, ms(30), f.wait("c"))
	require.Equal(t, ms(40), f.wait("a"))
}

// TestAdaptiveNewcomer: a member that never reported a processing time is
// assumed to need the group's median service time, and holds at most
// NewcomerCap messages while others are available.
func TestAdaptiveNewcomer(t *testing.T) {
	tests := []struct {
		cap  int
		want []string
	}{
		// The known members can start only at 100 ms; the newcomer n at 0,
		// then 20, 40 (median 20 ms each) until it is capped.
		{1, []string{"n", "a", "b"}},
		{2, []string{"n", "n", "a"}},
		{3, []string{"n", "n", "n"}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("cap %d", tt.cap), func(t *testing.T) {
			f := newFixture(t, scoring.Config{Strategy: "adaptive", NewcomerCap: tt.cap}, "a", "b", "c", "n")
			f.report("a", busy(ms(10), ms(100)))
			f.report("b", busy(ms(20), ms(100)))
			f.report("c", busy(ms(60), ms(100)))
			require.Zero(t, f.wait("n"))
			require.Equal(t, tt.want, f.selN(3, 0))
			require.Zero(t, f.member("n").ServiceEstimate)
		})
	}
	t.Run("median prior", func(t *testing.T) {
		f := newFixture(t, adaptive, "a", "b", "c", "n")
		f.report("a", busy(ms(10), ms(100)))
		f.report("b", busy(ms(20), ms(100)))
		f.report("c", busy(ms(60), ms(100)))
		require.Equal(t, "n", f.sel())
		// Median of 10, 20, 60 (not the mean, 30).
		require.Equal(t, ms(20), f.wait("n"))
		require.Equal(t, "n", f.sel())
		require.Equal(t, ms(40), f.wait("n"))
		// 10 ms later it still holds two messages (one half done): capped,
		// though it would start sooner than anyone.
		f.advance(ms(10))
		require.Equal(t, ms(30), f.wait("n"))
		require.NotEqual(t, "n", f.sel())
		// Once the first is due to have finished it holds one: uncapped.
		f.advance(ms(10))
		require.Equal(t, "n", f.sel())
	})
	t.Run("first measurement ends the newcomer phase", func(t *testing.T) {
		f := newFixture(t, adaptive, "a", "n")
		f.report("a", busy(ms(20), ms(100)))
		require.Equal(t, []string{"n", "n", "a"}, f.selN(3, 0))
		f.advance(ms(5))
		f.report("n", scoring.Load{ProcessingTime: ms(5)})
		require.Equal(t, ms(5), f.member("n").ServiceEstimate)
		require.Equal(t, []string{"n", "n", "n", "n"}, f.selN(4, 0))
	})
}

// TestAdaptiveOverdueNewcomer: LuffyMQ's SDK reports right after its first
// processed message, so a newcomer silent for longer than the service time
// it was assumed to need is slower than that.
func TestAdaptiveOverdueNewcomer(t *testing.T) {
	f := newFixture(t, adaptive, "a", "n")
	f.report("a", busy(ms(25), ms(50)))
	require.Equal(t, "n", f.sel()) // at 0; assumed 25 ms (a's)
	waits := []struct {
		at   time.Duration
		want time.Duration
	}{
		{0, ms(25)},
		{ms(20), ms(5)},
		{ms(25), 0},      // due now
		{ms(30), ms(30)}, // 5 ms overdue: guessed halfway through a 60 ms message
		{ms(40), ms(40)},
	}
	var now time.Duration
	for _, w := range waits {
		f.advance(w.at - now)
		now = w.at
		require.Equal(t, w.want, f.wait("n"), "at %v", w.at)
	}
	// a can start at 50, n is guessed at 80: a.
	require.Equal(t, "a", f.sel())
	// Its report ends the guess.
	f.report("n", scoring.Load{ProcessingTime: ms(40)})
	require.Zero(t, f.wait("n"))
	require.Equal(t, "n", f.sel())
}

func TestAdaptiveNewcomerAcknowledgementsEndTheGuess(t *testing.T) {
	f := newFixture(t, adaptive, "a", "n")
	f.report("a", busy(ms(25), ms(50)))
	require.Equal(t, "n", f.sel())
	f.e.InFlightStarted("n")
	f.advance(ms(40))
	require.Equal(t, ms(40), f.wait("n")) // overdue
	f.e.InFlightAcknowledged("n")         // it finished: nothing left
	require.Zero(t, f.wait("n"))
	require.Equal(t, "n", f.sel())
}

func TestAdaptiveZeroProcessingTimeKeepsEstimate(t *testing.T) {
	f := newFixture(t, adaptive, "a")
	f.report("a", scoring.Load{ProcessingTime: ms(30)})
	f.report("a", scoring.Load{ProcessingTime: 0, Pending: 2})
	m := f.member("a")
	require.Equal(t, ms(30), m.ServiceEstimate)
	require.Equal(t, ms(15), m.ProcessingTime, "the thesis's t_p does count the zero")
	// Backlog uses the kept estimate: 2·30 + 30/2 for the running one.
	require.Equal(t, ms(75), m.PredictedWait)
	require.Equal(t, 2, m.ReportedPending)
}

// TestAdaptiveStaleMembersLeaveThePrior: a member silent for longer than
// StaleAfter no longer counts in the median a newcomer is assumed to need.
func TestAdaptiveStaleMembersLeaveThePrior(t *testing.T) {
	tests := []struct {
		name      string
		joinAt    time.Duration
		wantStale bool
		wantPrior time.Duration
	}{
		// Median of 10 and 100 is the upper one, 100.
		{"fresh", ms(300), false, ms(100)},
		{"stale", ms(300) + 1, true, ms(10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, scoring.Config{Strategy: "adaptive", ReportInterval: ms(100)}, "slow", "fast")
			require.Equal(t, ms(300), f.e.Config().StaleAfter, "default: 3 report intervals")
			f.report("slow", busy(ms(100), time.Hour))
			f.report("fast", busy(ms(10), time.Hour))
			f.advance(ms(300))
			f.report("fast", busy(ms(10), time.Hour))
			f.advance(tt.joinAt - ms(300))
			f.add("n")
			require.Equal(t, tt.wantStale, f.member("slow").Stale)
			require.Equal(t, tt.joinAt, f.member("slow").LastReportAge)
			require.False(t, f.member("fast").Stale)
			require.False(t, f.member("n").Stale, "never reported: not stale")
			require.Equal(t, "n", f.sel())
			require.Equal(t, tt.wantPrior, f.wait("n"))
		})
	}
	t.Run("a report makes it fresh again", func(t *testing.T) {
		f := newFixture(t, scoring.Config{Strategy: "adaptive", StaleAfter: ms(50)}, "a")
		f.report("a", scoring.Load{ProcessingTime: ms(10)})
		f.advance(ms(51))
		require.True(t, f.member("a").Stale)
		f.report("a", scoring.Load{})
		require.False(t, f.member("a").Stale)
	})
}

func TestAdaptiveQoSInFlight(t *testing.T) {
	f := newFixture(t, adaptive, "a", "b")
	f.report("a", scoring.Load{ProcessingTime: ms(10)})
	f.report("b", scoring.Load{ProcessingTime: ms(10)})
	for i := 0; i < 4; i++ {
		f.e.InFlightStarted("a")
	}
	// Four unacknowledged at one worker: three queued behind the running one.
	require.Equal(t, 4, f.member("a").InFlight)
	require.Equal(t, ms(30), f.wait("a"))
	require.Equal(t, "b", f.sel())

	// Acknowledgement after processing: the next one starts now, the
	// prediction re-anchors to the three left. The completion also
	// teaches the service time: 12 ms since it was sent.
	f.advance(ms(12))
	f.e.InFlightAcknowledged("a")
	require.Equal(t, 3, f.member("a").InFlight)
	require.Equal(t, ms(12), f.member("a").ServiceEstimate)
	require.Equal(t, uint64(1), f.member("a").Completions)
	require.Equal(t, ms(36), f.wait("a"))
	// Three more at the same instant: one burst of acks, four messages
	// finished in 12 ms, 3 ms each.
	for i := 0; i < 3; i++ {
		f.e.InFlightAcknowledged("a")
	}
	require.Equal(t, ms(3), f.member("a").ServiceEstimate)
	require.Zero(t, f.member("a").InFlight)
	require.Zero(t, f.wait("a"))
	f.e.InFlightAcknowledged("a") // nothing in flight: ignored
	require.Zero(t, f.member("a").InFlight)

	f.e.InFlightStarted("a")
	f.e.InFlightStarted("a")
	f.e.InFlightDropped("a")
	require.Equal(t, 1, f.member("a").InFlight)
	f.e.SetInFlight("a", 7)
	require.Equal(t, 7, f.member("a").InFlight)
	require.Equal(t, ms(18), f.wait("a")) // six queued at 3 ms
	f.e.SetInFlight("a", -1)              // ignored
	require.Equal(t, 7, f.member("a").InFlight)
}

// TestAdaptiveReceiptAcks: a client that reports more pending than it has
// unacknowledged acknowledges on receipt, so its acks say nothing about
// when it is free.
func TestAdaptiveReceiptAcks(t *testing.T) {
	f := newFixture(t, adaptive, "a")
	f.report("a", scoring.Load{ProcessingTime: ms(10)})
	f.e.InFlightStarted("a")
	f.e.InFlightStarted("a")
	f.report("a", scoring.Load{ProcessingTime: ms(10), Pending: 5, InProgress: 1})
	require.Equal(t, ms(55), f.wait("a")) // 5·10 + 10/2
	f.advance(ms(5))
	f.e.InFlightAcknowledged("a")
	require.Equal(t, 1, f.member("a").InFlight)
	require.Equal(t, ms(50), f.wait("a"), "not re-anchored")
}

func TestAdaptiveReportBacklog(t *testing.T) {
	tests := []struct {
		name string
		load scoring.Load
		sent int // messages selected for it before the report
		want time.Duration
	}{
		{"idle", scoring.Load{}, 0, 0},
		{"running one", scoring.Load{InProgress: 1}, 0, ms(5)},
		{"queue", scoring.Load{Pending: 10, InProgress: 1}, 0, ms(105)},
		{"backlogMs honoured", scoring.Load{Pending: 10, InProgress: 1, Backlog: ms(7), HasBacklog: true}, 0, ms(7)},
		{"backlogMs zero honoured", scoring.Load{Pending: 10, HasBacklog: true}, 0, 0},
		{"received: none on the wire", scoring.Load{Received: 3, HasReceived: true}, 3, 0},
		{"received: two on the wire", scoring.Load{Received: 1, HasReceived: true}, 3, ms(20)},
		{"received: all on the wire", scoring.Load{Received: 0, HasReceived: true}, 3, ms(30)},
		{"received: more than sent", scoring.Load{Received: 5, HasReceived: true}, 3, 0},
		// Only the thesis's keys: the broker's own model says a message
		// is still running (all three were sent at once); at most one
		// service time of it is counted.
		{"received absent", scoring.Load{Received: 0}, 3, ms(10)},
		{"received with backlogMs", scoring.Load{Received: 2, HasReceived: true, Backlog: ms(7), HasBacklog: true}, 3, ms(17)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, adaptive, "a")
			f.report("a", scoring.Load{ProcessingTime: ms(10)})
			for i := 0; i < tt.sent; i++ {
				require.Equal(t, "a", f.sel())
			}
			l := tt.load
			l.ProcessingTime = ms(10)
			f.report("a", l)
			require.Equal(t, tt.want, f.wait("a"))
		})
	}
}

func TestAdaptiveWorkers(t *testing.T) {
	f := newFixture(t, adaptive, "a")
	f.report("a", scoring.Load{Workers: 4, ProcessingTime: ms(100), Pending: 8})
	m := f.member("a")
	require.Equal(t, 4, m.Workers)
	require.Equal(t, ms(25), m.ServiceEstimate)
	require.Equal(t, ms(212.5), m.PredictedWait) // 8·25 + 25/2

	// A second later (the eight could not have finished in less: the
	// throughput bound would cap the report), with Workers 0, which keeps 4.
	f.advance(time.Second)
	f.report("a", scoring.Load{ProcessingTime: ms(100)})
	require.Equal(t, 4, f.member("a").Workers)
	for i := 0; i < 6; i++ {
		f.e.InFlightStarted("a")
	}
	require.Equal(t, ms(50), f.wait("a")) // 6 in flight, 4 running: 2·25

	// Four workers at 100 ms outrun one at 40 ms: a gets 4 of the first 6.
	g := newFixture(t, adaptive, "a", "b")
	g.report("a", scoring.Load{Workers: 4, ProcessingTime: ms(100)})
	g.report("b", scoring.Load{ProcessingTime: ms(40)})
	require.Equal(t, []string{"a", "b", "a", "b", "a", "a"}, g.selN(6, 0))
}

func TestAdaptiveTiesGoToLongestIdle(t *testing.T) {
	tests := []struct {
		first, second string
	}{
		{"a", "b"},
		{"b", "a"},
	}
	for _, tt := range tests {
		t.Run(tt.first+" idle longer", func(t *testing.T) {
			f := newFixture(t, adaptive, "a", "b")
			f.report(tt.first, scoring.Load{ProcessingTime: ms(10)})
			f.advance(ms(5))
			f.report(tt.second, scoring.Load{ProcessingTime: ms(10)})
			f.advance(ms(20)) // both idle: same predicted start, now
			require.Equal(t, tt.first, f.sel())
			require.Equal(t, tt.second, f.sel())
		})
	}
	t.Run("burst with nothing known is spread", func(t *testing.T) {
		f := newFixture(t, adaptive, "a", "b", "c")
		require.Equal(t, []string{"a", "b", "c", "a", "b", "c"}, f.selN(6, 0))
	})
	t.Run("nothing known is round robin", func(t *testing.T) {
		f := newFixture(t, adaptive, "a", "b", "c")
		require.Equal(t, []string{"a", "b", "c", "a", "b", "c"}, f.selN(6, ms(10)))
	})
}

// TestAdaptiveSamplesLargeGroups: up to 16 members every one is compared;
// above, a sample is, so an always-idle member does not get everything.
func TestAdaptiveSamplesLargeGroups(t *testing.T) {
	tests := []struct {
		members int
		sampled bool
	}{
		{16, false},
		{17, true},
		{50, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d members", tt.members), func(t *testing.T) {
			f := newFixture(t, adaptive)
			for i := 0; i < tt.members-1; i++ {
				id := fmt.Sprintf("busy%02d", i)
				f.add(id)
				f.report(id, busy(ms(10), time.Hour))
			}
			f.add("idle")
			const n = 200
			got := 0
			for i := 0; i < n; i++ {
				f.report("idle", scoring.Load{ProcessingTime: ms(10)}) // idle again
				if f.sel() == "idle" {
					got++
				}
			}
			if !tt.sampled {
				require.Equal(t, n, got)
				return
			}
			require.Less(t, got, n)
			require.Greater(t, got, 0)
		})
	}
}

func TestAdaptiveLargeGroupsReachEveryMember(t *testing.T) {
	tests := []struct {
		members int
		known   bool
	}{
		{9, false},
		{20, false},
		{100, false},
		{20, true},
		{100, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d members, known %v", tt.members, tt.known), func(t *testing.T) {
			f := newFixture(t, adaptive)
			for i := 0; i < tt.members; i++ {
				id := fmt.Sprintf("m%03d", i)
				f.add(id)
				if tt.known {
					f.report(id, scoring.Load{ProcessingTime: ms(1)})
				}
			}
			// Arrivals slower than any member's service: everyone is idle.
			counts := countOf(f.selN(10*tt.members, ms(2)))
			require.Len(t, counts, tt.members, "every member is reached")
		})
	}
}

// TestAdaptivePriorFollowsChanges: the newcomer's assumed service time (the
// group's median) follows reports, membership and staleness at once.
func TestAdaptivePriorFollowsChanges(t *testing.T) {
	f := newFixture(t, scoring.Config{Strategy: "adaptive", StaleAfter: time.Hour}, "a", "b", "c", "n")
	f.report("a", busy(ms(5), time.Hour))
	f.report("b", busy(ms(5), time.Hour))
	f.report("c", busy(ms(60), time.Hour))
	require.Equal(t, "n", f.sel()) // booked as busy until 5 ms
	require.Equal(t, ms(5), f.wait("n"))

	steps := []struct {
		name   string
		change func()
		want   time.Duration
	}{
		{"b reports 95: estimates 5, 50, 60", func() { f.report("b", busy(ms(95), time.Hour)) }, ms(50)},
		{"a leaves: 50, 60 (upper median)", func() { f.e.Leave(testGroup, "a") }, ms(60)},
		{"a joins again: 5, 50, 60", func() { f.e.Join(testGroup, "a") }, ms(50)},
		{"b's session restarts: 5, 60", func() { f.e.Connect("b") }, ms(60)},
		{"c goes offline: 5", func() { f.e.Disconnect("c", false) }, ms(5)},
		{"c is back with a fresh session: 5", func() { f.e.Connect("c") }, ms(5)},
		{"c reports 7: 5, 7", func() { f.report("c", busy(ms(7), time.Hour)) }, ms(7)},
	}
	for _, st := range steps {
		st.change()
		require.Equal(t, st.want, f.wait("n"), st.name)
	}

	t.Run("staleness", func(t *testing.T) {
		f := newFixture(t, scoring.Config{Strategy: "adaptive", StaleAfter: ms(300)}, "a", "b", "c", "n")
		f.report("a", busy(ms(10), time.Hour))
		f.report("b", busy(ms(20), time.Hour))
		f.report("c", busy(ms(100), time.Hour))
		f.advance(ms(300))
		f.report("a", busy(ms(10), time.Hour))
		f.report("c", busy(ms(100), time.Hour))
		require.Equal(t, "n", f.sel())
		require.Equal(t, ms(20), f.wait("n")) // median of 10, 20, 100
		f.advance(1)                          // b turns stale: 10, 100
		require.Equal(t, ms(100)-1, f.wait("n"))
	})
}

// TestAdaptiveSamplingConsidersEveryMember: in a sampled group every member
// is compared at least once every len(group) selections, so one that would
// win whenever compared never waits longer than that.
func TestAdaptiveSamplingConsidersEveryMember(t *testing.T) {
	const members = 100
	f := newFixture(t, adaptive)
	for i := 0; i < members-1; i++ {
		id := fmt.Sprintf("busy%02d", i)
		f.add(id)
		f.report(id, busy(ms(10), time.Hour))
	}
	f.add("star")
	f.report("star", scoring.Load{ProcessingTime: ms(1)})
	gap, maxGap, hits := 0, 0, 0
	for i := 0; i < 50*members; i++ {
		gap++
		if f.sel() == "star" {
			hits++
			maxGap = max(maxGap, gap)
			gap = 0
			f.report("star", scoring.Load{ProcessingTime: ms(1)}) // idle again
		}
	}
	require.Greater(t, hits, 50)
	require.LessOrEqual(t, maxGap, members)
}

// TestAdaptiveSilentNewcomer: a member that never reports (a plain MQTT
// client) is only guessed overdue while it could still be expected to
// report; after StaleAfter it is fed as if it needed the group's median.
func TestAdaptiveSilentNewcomer(t *testing.T) {
	f := newFixture(t, scoring.Config{Strategy: "adaptive", StaleAfter: ms(300)}, "a", "n")
	f.report("a", busy(ms(25), ms(50)))
	require.Equal(t, "n", f.sel())
	f.advance(ms(30))
	require.Equal(t, ms(30), f.wait("n"), "overdue")
	f.advance(ms(270)) // 300 ms since n connected: still expected to report
	f.report("a", busy(ms(25), time.Hour))
	require.Equal(t, ms(300), f.wait("n"))
	f.advance(1)
	require.Zero(t, f.wait("n"), "silent: back to the prior")
	require.Equal(t, []string{"n", "n"}, f.selN(2, 0))
	require.NotEqual(t, "n", f.sel(), "capped at two")
	require.Equal(t, ms(50), f.wait("n"))
}

// TestServiceEstimateWeighsReportsByProcessedCount: a report averaging many
// messages outweighs the noisy first measurement of a single message.
func TestServiceEstimateWeighsReportsByProcessedCount(t *testing.T) {
	clock := scoring.NewManualClock(time.Unix(0, 0))
	e, err := scoring.NewEngine(scoring.Config{Strategy: "adaptive", Clock: clock})
	require.NoError(t, err)
	e.Connect("w")
	e.Join("$share/g/t", "w")
	e.Report("w", scoring.Load{ProcessingTime: 27 * time.Millisecond, Processed: 1})
	e.Report("w", scoring.Load{ProcessingTime: 25 * time.Millisecond, Processed: 31})
	got := e.Snapshot()[0].Members[0].ServiceEstimate
	require.InDelta(t, float64(25062500*time.Nanosecond), float64(got), float64(time.Microsecond),
		"(27×1 + 25×31) / 32 = 25.0625 ms")

	// Without counts (plain clients) reports weigh the same.
	e.Connect("p")
	e.Join("$share/g/t", "p")
	e.Report("p", scoring.Load{ProcessingTime: 27 * time.Millisecond})
	e.Report("p", scoring.Load{ProcessingTime: 25 * time.Millisecond})
	for _, m := range e.Snapshot()[0].Members {
		if m.ClientID == "p" {
			require.Equal(t, 26*time.Millisecond, m.ServiceEstimate)
		}
	}
}

// TestMemberAtReceiveMaximumIsSkipped: a member holding as many
// unacknowledged deliveries as its Receive Maximum allows is chosen only
// when every member is at its limit.
func TestMemberAtReceiveMaximumIsSkipped(t *testing.T) {
	for _, strategy := range scoring.Strategies() {
		t.Run(strategy, func(t *testing.T) {
			clock := scoring.NewManualClock(time.Unix(0, 0))
			e, err := scoring.NewEngine(scoring.Config{Strategy: strategy, Clock: clock})
			require.NoError(t, err)
			for _, id := range []string{"a", "b"} {
				e.Connect(id)
				e.Join("$share/g/t", id)
				e.SetReceiveMaximum(id, 2)
			}
			e.InFlightStarted("a")
			e.InFlightStarted("a")
			for i := 0; i < 10; i++ {
				clock.Advance(time.Millisecond)
				id, ok := e.SelectMember("$share/g/t", scoring.Message{PublisherID: "p", Topic: "t"})
				require.True(t, ok)
				require.Equal(t, "b", id, "a is at its Receive Maximum")
			}
			e.InFlightStarted("b")
			e.InFlightStarted("b")
			_, ok := e.SelectMember("$share/g/t", scoring.Message{PublisherID: "p", Topic: "t"})
			require.True(t, ok, "with every member at its limit one is still chosen")
		})
	}
}

// qos1Send selects a member and starts its QoS 1 delivery, as the broker
// does for a subscriber at QoS 1.
func (f *fixture) qos1Send() string {
	f.t.Helper()
	id := f.sel()
	f.e.InFlightStarted(id)
	return id
}

// TestAdaptiveLearnsServiceFromAcks: a client that acknowledges after
// processing and never reports still teaches the engine its service time,
// from the ack of a message sent to it while idle (ack − send) and from
// the spacing of acks while it had work queued.
func TestAdaptiveLearnsServiceFromAcks(t *testing.T) {
	f := newFixture(t, adaptive, "a")
	require.Equal(t, "a", f.qos1Send())
	f.advance(ms(30))
	f.e.InFlightAcknowledged("a")
	require.Equal(t, ms(30), f.member("a").ServiceEstimate, "idle: ack − send")

	// Three at once: they run back to back, each ack 20 ms after the last.
	f.qos1Send()
	f.qos1Send()
	f.qos1Send()
	for i := 0; i < 3; i++ {
		f.advance(ms(20))
		f.e.InFlightAcknowledged("a")
	}
	// The window holds 30, 20, 20, 20.
	require.Equal(t, ms(22.5), f.member("a").ServiceEstimate)

	// A client that flushes its acks in bursts (paho.golang: every 50 ms):
	// four finished in the 60 ms the burst covers, 15 ms each.
	for i := 0; i < 4; i++ {
		f.qos1Send()
	}
	f.advance(ms(60))
	for i := 0; i < 4; i++ {
		f.e.InFlightAcknowledged("a")
	}
	require.Equal(t, ms((30+20+20+20+15)/5.0), f.member("a").ServiceEstimate)
	require.Equal(t, uint64(8), f.member("a").Completions)
	require.Zero(t, f.member("a").Reports)
}

// newTimerAcker is a fixture whose one member, "a", has acknowledged in
// bursts of two every 50 ms, as a ticker flushes them (paho.golang's
// manual acks): 25 ms per message.
func newTimerAcker(t *testing.T) *fixture {
	f := newFixture(t, adaptive, "a")
	for i := 0; i < 10; i++ {
		f.qos1Send()
		f.qos1Send()
		f.advance(ms(50))
		f.e.InFlightAcknowledged("a")
		f.e.InFlightAcknowledged("a")
	}
	require.Equal(t, ms(25), f.member("a").ServiceEstimate)
	return f
}

// TestAdaptiveBurstAckerMayHaveFinishedSinceItsBurst: a member that
// acknowledges in bursts (paho.golang flushes manual acks every 50 ms)
// holds more unacknowledged messages than it has left to do. Its
// unacknowledged deliveries are a floor on its backlog only for what it
// cannot have finished since its last burst; otherwise the member looks
// busier than it is until its next flush (on an uneven fleet of 20 with
// 50 ms flushes, the simulated mean fell from 6.90 to 5.77 ms).
func TestAdaptiveBurstAckerMayHaveFinishedSinceItsBurst(t *testing.T) {
	f := newTimerAcker(t)
	// Three more at once; 45 ms later, before its next flush, the first is
	// done and the second nearly: a new message would start at 75 ms, 30
	// ms from now, as the model of what was sent says, not after the two
	// it has not acknowledged beyond the running one (50 ms).
	for i := 0; i < 3; i++ {
		f.qos1Send()
	}
	f.advance(ms(45))
	require.Equal(t, 3, f.member("a").InFlight)
	require.Equal(t, ms(30), f.member("a").PredictedWait)
}

// TestAdaptiveTimerBurstBoundsTheModelAsAWhole: the acks a timer flushes
// come in one burst but are read one at a time. Until the last of them,
// what is unacknowledged still counts the burst's later ones; a lower
// bound drawn from the first would push the model later by their work,
// and the rest of the burst would then leave it at its upper bound, as if
// the running message had started at the flush. The burst bounds the
// model as it was before the burst (on 18 simulated uneven fleets of 6 to
// 50 members with acks flushed every 50 ms and fixed work, the geometric
// mean of adaptive's means fell from 5.58 to 5.32 ms).
func TestAdaptiveTimerBurstBoundsTheModelAsAWhole(t *testing.T) {
	f := newTimerAcker(t)
	// Three sent to it idle run from 0 to 25, 50 and 75 ms. The flush
	// whose acks arrive at 60 ms acknowledges the first two; the third has
	// run 10 ms of its 25 and is done at 75: 15 ms from now.
	for i := 0; i < 3; i++ {
		f.qos1Send()
	}
	f.advance(ms(60))
	f.e.InFlightAcknowledged("a")
	f.e.InFlightAcknowledged("a")
	require.Equal(t, 1, f.member("a").InFlight)
	require.Equal(t, ms(15), f.member("a").PredictedWait)
}

// TestAdaptiveVariableWorkIsNotDoneAtItsMean: a member whose
// acknowledgements show work as variable as an exponential distribution's
// is not taken to be free once its running message has run its mean: what
// is left of variable work does not shrink as it runs. One whose work
// always takes as long is (exponential service times on an uneven fleet of
// 20 with plain acks: simulated mean 21.1 -> 14.3 ms, join-the-shortest-queue
// 14.6).
func TestAdaptiveVariableWorkIsNotDoneAtItsMean(t *testing.T) {
	for _, c := range []struct {
		name        string
		services    []time.Duration
		wantAtLeast time.Duration
	}{
		{"constant", []time.Duration{ms(20), ms(20)}, 0},
		{"variable", []time.Duration{ms(2), ms(38), ms(1), ms(39)}, ms(10)},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, adaptive, "a")
			for i := 0; i < 40; i++ {
				f.qos1Send()
				f.advance(c.services[i%len(c.services)])
				f.e.InFlightAcknowledged("a")
				f.advance(ms(5))
			}
			require.InDelta(t, float64(ms(20)), float64(f.member("a").ServiceEstimate), float64(ms(3)))
			f.qos1Send()
			f.advance(ms(30)) // past its mean, not yet overdue
			wait := f.member("a").PredictedWait
			require.GreaterOrEqual(t, wait, c.wantAtLeast)
			if c.wantAtLeast == 0 {
				require.Zero(t, wait)
			}
		})
	}
}

// TestAdaptiveVariableReportedWorkCountsWhatIsHeld: a QoS 0 member that
// reports going idle (LuffyMQ's SDK) and whose reported processing times
// vary as much as an exponential distribution's is predicted busy for the
// messages it holds, a service time each, until it says otherwise: its
// silence means it still has them. With constant reported times the model
// of what was sent decides, as before.
func TestAdaptiveVariableReportedWorkCountsWhatIsHeld(t *testing.T) {
	for _, c := range []struct {
		name     string
		services []time.Duration
	}{
		{"constant", []time.Duration{ms(20), ms(20)}},
		{"variable", []time.Duration{ms(2), ms(38), ms(1), ms(39)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, adaptive, "a")
			for i := 0; i < 40; i++ {
				f.sel()
				f.advance(c.services[i%len(c.services)])
				f.report("a", scoring.Load{ProcessingTime: c.services[i%len(c.services)], Processed: 1, Received: uint64(i + 1), HasReceived: true})
				f.advance(ms(5))
			}
			f.sel()
			f.sel()
			f.advance(ms(45)) // the model of what was sent: both done
			wait := f.member("a").PredictedWait
			if c.name == "constant" {
				require.Zero(t, wait)
				return
			}
			require.Greater(t, wait, ms(20), "two messages held, variable work")
		})
	}
}

// TestAdaptiveVariableReportedWorkCountsTheRunningMessage: the SDK's
// pending count leaves out the message its handler runs (in_progress), and
// on variable work that message still needs a whole service time on
// average: a member that said two are pending and one running is predicted
// busy for three, not two, until it says otherwise.
func TestAdaptiveVariableReportedWorkCountsTheRunningMessage(t *testing.T) {
	f := newFixture(t, adaptive, "a")
	services := []time.Duration{ms(2), ms(38), ms(1), ms(39)}
	for i := 0; i < 40; i++ {
		f.sel()
		f.advance(services[i%len(services)])
		f.report("a", scoring.Load{ProcessingTime: services[i%len(services)], Processed: 1, Received: uint64(i + 1), HasReceived: true})
		f.advance(ms(5))
	}
	for range 3 {
		f.sel()
	}
	f.report("a", scoring.Load{Pending: 2, InProgress: 1, Received: 43, HasReceived: true})
	f.advance(ms(100)) // the model of what was sent: all done
	// Three held at the estimate (about 22 ms) each, in the share cv² of
	// the estimate: 66 ms; counting only the two pending gave 44.
	svc := f.member("a").ServiceEstimate
	wait := f.member("a").PredictedWait
	require.Greater(t, wait, 5*svc/2, "two pending and one running, variable work")
	require.LessOrEqual(t, wait, 3*svc+ms(1))
}

// TestAdaptiveColdStartSpreadsByInFlight: before anything is known about
// anyone, messages go to the member holding the fewest, and a member that
// has never finished anything holds at most NewcomerCap while others are
// free.
func TestAdaptiveColdStartSpreadsByInFlight(t *testing.T) {
	f := newFixture(t, adaptive, "a", "b", "c")
	got := []string{f.qos1Send(), f.qos1Send(), f.qos1Send()}
	require.ElementsMatch(t, []string{"a", "b", "c"}, got)
	// Each holds one; a finishes first and is the only one known.
	f.advance(ms(25))
	f.e.InFlightAcknowledged("a")
	require.Equal(t, ms(25), f.member("a").ServiceEstimate)
	require.Equal(t, "a", f.qos1Send())
	// b and c are assumed to need the median (25 ms) and to hold one
	// each: a, free again at 50, competes with them at 25+25 = 50.
	for i := 0; i < 6; i++ {
		f.qos1Send()
	}
	for _, id := range []string{"b", "c"} {
		require.LessOrEqual(t, f.member(id).InFlight, scoring.DefaultNewcomerCap, id)
	}
}

// TestAdaptiveColdStartWithoutEstimatesGoesRoundTheGroup: while nobody's
// service time is known and no acknowledgement has come (paho.golang sends
// manual acks every 50 ms), no member can be called overdue: the next
// message goes to the one that has held its message longest, the most
// likely to be free, not to the one sent to last.
func TestAdaptiveColdStartWithoutEstimatesGoesRoundTheGroup(t *testing.T) {
	f := newFixture(t, adaptive, "a", "b", "c")
	var got []string
	for i := 0; i < 6; i++ {
		got = append(got, f.qos1Send())
		f.advance(ms(10))
	}
	require.Equal(t, got[:3], got[3:], "the second round follows the first: %v", got)
	require.ElementsMatch(t, []string{"a", "b", "c"}, got[:3])
	for _, id := range []string{"a", "b", "c"} {
		require.Equal(t, 2, f.member(id).InFlight, id)
	}
}

// TestAdaptiveReportCannotBuyWork: whatever a QoS 1 member reports, it
// gets no more work than its acknowledgements justify: one that never
// acknowledges but reports near-zero processing time, or a billion
// workers, holds at most NewcomerCap messages while others are available.
func TestAdaptiveReportCannotBuyWork(t *testing.T) {
	for _, lie := range []scoring.Load{
		{ProcessingTime: time.Microsecond},
		{ProcessingTime: ms(1), Workers: 1_000_000_000},
	} {
		t.Run(fmt.Sprintf("%+v", lie), func(t *testing.T) {
			f := newFixture(t, adaptive, "honest", "liar")
			f.e.InFlightStarted("honest") // one finished message: proven
			f.advance(ms(10))
			f.e.InFlightAcknowledged("honest")
			f.report("liar", lie)
			got := map[string]int{}
			for i := 0; i < 200; i++ { // overload: 1 ms apart
				f.advance(ms(1))
				got[f.qos1Send()]++
				if i%10 == 9 {
					f.e.InFlightAcknowledged("honest")
				}
				f.report("liar", lie)
			}
			require.LessOrEqual(t, got["liar"], scoring.DefaultNewcomerCap, "%v", got)
			require.LessOrEqual(t, f.member("liar").Workers, scoring.MaxWorkers)
		})
	}
}

// TestAdaptiveStalledMemberIsThrottled: a member whose acknowledgements
// stop is predicted ever later, whatever it reports, so the others take
// the traffic.
func TestAdaptiveStalledMemberIsThrottled(t *testing.T) {
	f := newFixture(t, adaptive, "a", "b")
	f.learnFromAcks(4, ms(10), "a", "b")
	f.e.InFlightStarted("a")
	f.e.InFlightStarted("a")
	f.advance(ms(100)) // a stalls with two unacknowledged
	f.report("a", scoring.Load{ProcessingTime: ms(10)})
	require.Greater(t, f.wait("a"), ms(100))
	for i := 0; i < 5; i++ {
		require.Equal(t, "b", f.sel())
		f.advance(ms(10))
		f.e.InFlightAcknowledged("b")
	}
}

// TestAdaptiveReporterStillRunningIsOverdue: a QoS 0 member whose first
// measurement of variable work came out at 1 ms (its true mean may be
// fifty times that) is sent a message while idle; 100 ms later it reports
// the message still running and two queued, none finished, with a backlog
// worked out from its 1 ms mean. That message has run 100 ms: the member
// is slower than its estimate, and must not be handed more before a member
// due in 10 ms. Its estimate counts what it ran, once however many reports
// find it still running. A report that shows the message finished ends
// it; a member whose reports never say what runs (thesis keys only) is
// left to its model.
func TestAdaptiveReporterStillRunningIsOverdue(t *testing.T) {
	idle := func(pt time.Duration, received uint64) scoring.Load {
		return scoring.Load{ProcessingTime: pt, Processed: 1, Workers: 1, Received: received, HasReceived: true, HasBacklog: true}
	}
	f := newFixture(t, adaptive, "fast", "b")
	f.report("fast", idle(ms(1), 1))
	f.report("b", idle(ms(10), 1))
	require.Equal(t, "fast", f.sel())
	f.advance(ms(100))
	f.report("fast", scoring.Load{Pending: 2, InProgress: 1, Workers: 1, Received: 4, HasReceived: true, Backlog: ms(2), HasBacklog: true})
	f.report("b", scoring.Load{InProgress: 1, ProcessingTime: ms(10), Processed: 1, Workers: 1, Received: 2, HasReceived: true, Backlog: ms(10), HasBacklog: true})
	require.Greater(t, f.wait("fast"), ms(300), "a message running 100 ms at a member estimated at 1 ms")
	require.Greater(t, f.member("fast").ServiceEstimate, ms(40))
	require.Equal(t, "b", f.sel())
	// Still running 300 ms later: one message, measured once (1 ms and
	// 400 ms, not 1, 100 and 400).
	f.advance(ms(300))
	f.report("fast", scoring.Load{Pending: 2, InProgress: 1, Workers: 1, Received: 4, HasReceived: true, Backlog: ms(2), HasBacklog: true})
	require.InDelta(t, float64(ms(200)), float64(f.member("fast").ServiceEstimate), float64(ms(1)))
	// It finishes: the next report measures it, and the member is due by
	// its backlog again (and the share its variability adds).
	f.advance(ms(10))
	f.report("fast", scoring.Load{InProgress: 1, Pending: 1, ProcessingTime: ms(405), Processed: 1, Workers: 1, Received: 4, HasReceived: true, Backlog: ms(60), HasBacklog: true})
	require.GreaterOrEqual(t, f.wait("fast"), ms(60))
	// No longer overdue: the two it holds (one pending, one running), a
	// service time each on variable work, and no more.
	require.LessOrEqual(t, f.wait("fast"), 2*f.member("fast").ServiceEstimate+ms(1), "no longer overdue")

	// Thesis keys only: no InProgress, so nothing is known to run.
	g := newFixture(t, adaptive, "t")
	g.report("t", scoring.Load{ProcessingTime: ms(1)})
	g.sel()
	g.advance(ms(100))
	g.report("t", scoring.Load{Pending: 2})
	require.Less(t, g.wait("t"), ms(10))
}

// TestAdaptiveUnacknowledgedLosesTheTie: two members predicted free now,
// one of them with a delivery not yet acknowledged (its estimate ran out,
// but with variable work the message may still run), the other with
// none: the second is known to be free and wins, whichever freed up first
// in the model. (Python paho members on exponential work, 100 of them at
// ρ 0.7, waited 2.95 ms on average against join-the-shortest-queue's 0.51
// until this tie-break, 0.45 after.)
func TestAdaptiveUnacknowledgedLosesTheTie(t *testing.T) {
	f := newFixture(t, adaptive, "a", "b")
	f.learnFromAcks(4, ms(10), "a", "b")
	f.e.InFlightStarted("b") // b busy
	require.Equal(t, "a", f.sel())
	f.e.InFlightStarted("a")
	f.advance(ms(15)) // a's 10 ms have run out in the model; b finishes
	f.e.InFlightAcknowledged("b")
	f.advance(ms(3))
	require.Zero(t, f.wait("a"))
	require.Zero(t, f.wait("b"))
	require.Equal(t, "b", f.sel())
}

// TestAdaptiveSilentReporterLosesTheTie: two members that report going
// idle at once (the SDK), both predicted free now; one was sent a message
// after its last report and has not said it finished (with variable work
// it may still run), the other reported idle with nothing sent since: the
// second is known to be free and wins, although the first freed up
// earlier in the model. (SDK reporters on exponential work, 100 of them
// at ρ 0.7 in the simulator, waited 2.47 ms on average against
// join-the-shortest-queue's 0.67 until this tie-break, 0.64 after.)
func TestAdaptiveSilentReporterLosesTheTie(t *testing.T) {
	f := newFixture(t, adaptive, "a", "b")
	idle := scoring.Load{ProcessingTime: ms(10), Processed: 1, Workers: 1, HasReceived: true, HasBacklog: true}
	f.report("a", idle)
	f.report("b", idle)
	first := f.sel()
	other := map[string]string{"a": "b", "b": "a"}[first]
	f.advance(ms(15)) // first's 10 ms have run out in the model, no report
	f.report(other, idle)
	require.Zero(t, f.wait(first))
	require.Zero(t, f.wait(other))
	require.Equal(t, other, f.sel())
}

// TestAdaptiveReceiptAcksDetectedBySpeed: acks far faster than the
// reported processing time are receipts, not completions.
func TestAdaptiveReceiptAcksDetectedBySpeed(t *testing.T) {
	f := newFixture(t, adaptive, "a")
	for i := 0; i < 3; i++ {
		f.e.InFlightStarted("a")
		f.advance(ms(0.1))
		f.e.InFlightAcknowledged("a")
	}
	require.Equal(t, ms(0.1), f.member("a").ServiceEstimate)
	f.report("a", scoring.Load{ProcessingTime: ms(20)})
	require.False(t, f.member("a").AcksAreFinishes)
	require.Equal(t, ms(20), f.member("a").ServiceEstimate)
}

// TestAdaptiveThesisKeysOnly: a report with only the thesis's two keys
// is used with the broker's own send log: what was sent after it was
// written counts as on the wire, and a running message counts for what the
// model says is left of it.
func TestAdaptiveThesisKeysOnly(t *testing.T) {
	f := newFixture(t, adaptive, "a", "b")
	f.report("a", scoring.Load{ProcessingTime: ms(10)})
	f.report("b", busy(ms(10), time.Hour))
	require.Equal(t, "a", f.sel()) // at 0: runs until 10
	f.advance(ms(4))
	require.Equal(t, "a", f.sel()) // at 4: queued, 10..20
	f.advance(ms(1))
	// Written 2 ms ago (before the second send): pending 0, the first
	// message running; the second is on the wire.
	f.report("a", scoring.Load{ProcessingTime: ms(10), WrittenAgo: ms(2)})
	require.Equal(t, ms(15), f.wait("a")) // 5 left of the first + 10
}

// TestEngineKeepsNothingForOtherClients: clients in no shared group cost
// no engine state, whatever they do, and a member that left every group
// is forgotten when it disconnects.
func TestEngineKeepsNothingForOtherClients(t *testing.T) {
	f := newFixture(t, adaptive)
	for i := 0; i < 100; i++ {
		id := fmt.Sprintf("device-%d", i)
		f.e.Connect(id)
		f.e.InFlightStarted(id)
		f.e.InFlightAcknowledged(id)
		require.False(t, f.e.Report(id, scoring.Load{Pending: 1}))
		f.e.Disconnect(id, false)
	}
	members, groups := f.e.Counts()
	require.Zero(t, members)
	require.Zero(t, groups)

	f.add("w")
	require.True(t, f.e.IsMember("w"))
	f.e.Leave(testGroup, "w")
	require.False(t, f.e.IsMember("w"))
	f.e.Disconnect("w", false)
	members, groups = f.e.Counts()
	require.Zero(t, members)
	require.Zero(t, groups)
}

// TestAdaptiveSampledGroupFindsTheMemberThatJustFreedUp: in a group too
// large to compare in full, a member whose acknowledgement has just left it
// idle while every other member is busy gets the next message, though a
// draw of 16 in 100 would miss it five times in six.
func TestAdaptiveSampledGroupFindsTheMemberThatJustFreedUp(t *testing.T) {
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = fmt.Sprintf("m%03d", i)
	}
	f := newFixture(t, adaptive, ids...)
	// Every member learns its service time from acknowledgements.
	for _, id := range ids {
		for range 3 {
			f.e.InFlightStarted(id)
			f.advance(ms(10))
			f.e.InFlightAcknowledged(id)
		}
	}
	inflight := map[string]int{}
	for range 400 {
		f.advance(ms(1) / 10)
		id := f.sel()
		f.e.InFlightStarted(id)
		inflight[id]++
	}
	freed := 0
	for k := range ids {
		// Not in join order, which the sample's round-robin pointer
		// follows.
		id := ids[(k*37+11)%len(ids)]
		if freed == 10 || inflight[id] == 0 {
			continue
		}
		for range inflight[id] {
			f.e.InFlightAcknowledged(id)
		}
		inflight[id] = 0
		for _, m := range f.group().Members {
			if m.ClientID != id {
				require.Positive(t, m.PredictedWait, "%s must be busy for the check to mean anything", m.ClientID)
			}
		}
		require.Equal(t, id, f.sel(), "the member that just freed up")
		f.e.InFlightStarted(id)
		inflight[id]++
		freed++
	}
	require.Equal(t, 10, freed)
}

// TestAdaptiveCapsProcessingTimeByThroughput: a thesis-format reporter
// that times each message from its arrival reports its queue's wait as
// processing time. What it finished between two reports bounds what its
// processing can have taken, and the adaptive estimate keeps to that
// bound; the thesis's t_p keeps what was reported.
func TestAdaptiveCapsProcessingTimeByThroughput(t *testing.T) {
	// between reports sends n messages to the only member, gap apart,
	// between a report of first and one of then.
	between := func(first time.Duration, n int, gap, then time.Duration) scoring.MemberSnapshot {
		f := newFixture(t, adaptive, "w")
		f.report("w", scoring.Load{ProcessingTime: first})
		for range n {
			require.Equal(t, "w", f.sel())
			f.advance(gap)
		}
		f.report("w", scoring.Load{ProcessingTime: then})
		return f.member("w")
	}
	// 40 messages in 1 s: 25 ms each at most; it reports 25 of work and
	// 20 of queueing.
	m := between(ms(25), 40, ms(25), ms(45))
	require.Equal(t, ms(35), m.ProcessingTime, "t_p: the mean of what was reported")
	// 40 sent, nothing pending: at least 39 started after the previous
	// report and finished (one may run): (1 s + 10 ms) / 39. The estimate
	// weighs the reports by the messages they cover: 1 and 40 (44.5 ms
	// uncapped).
	bound := (time.Second + ms(10)) / 39
	require.InDelta(t, float64((ms(25)+40*bound)/41), float64(m.ServiceEstimate), float64(time.Microsecond))

	// A member that reports what it measured is not touched: 20 of 40 ms
	// messages fit the same second.
	require.Equal(t, ms(40), between(ms(40), 20, ms(50), ms(40)).ServiceEstimate)

	// Four sent 15 ms apart and none pending: three of them, at least,
	// ran within the 60 ms, whatever a long message begun before the
	// previous report added to the mean reported.
	bound = (ms(60) + ms(10)) / 3
	require.InDelta(t, float64((ms(40)+4*bound)/5), float64(between(ms(40), 4, ms(15), ms(200)).ServiceEstimate), float64(time.Microsecond))

	// A report that covers too few messages for a bound is not touched.
	require.InDelta(t, float64((ms(40)+2*ms(200))/3), float64(between(ms(40), 2, ms(15), ms(200)).ServiceEstimate), float64(time.Microsecond), "(40×1 + 200×2) / 3, weighed by the messages each covers")
}
