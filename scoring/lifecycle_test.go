package scoring_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/scoring"
)

func TestNewEngine(t *testing.T) {
	e, err := scoring.NewEngine(scoring.Config{})
	require.NoError(t, err)
	require.Equal(t, "adaptive", e.StrategyName())
	cfg := e.Config()
	require.Equal(t, scoring.DefaultReportInterval, cfg.ReportInterval)
	require.Equal(t, 3*scoring.DefaultReportInterval, cfg.StaleAfter)
	require.Equal(t, scoring.DefaultNewcomerCap, cfg.NewcomerCap)
	require.Equal(t, scoring.DefaultSampleSize, cfg.SampleSize)
	require.NotNil(t, cfg.Clock)
	require.NotZero(t, cfg.Seed)

	e, err = scoring.NewEngine(scoring.Config{Strategy: "thesis", ReportInterval: 2 * time.Second, SampleSize: 1000})
	require.NoError(t, err)
	require.Equal(t, "thesis", e.StrategyName())
	require.Equal(t, 6*time.Second, e.Config().StaleAfter)
	require.Equal(t, 16, e.Config().SampleSize, "bounded")

	_, err = scoring.NewEngine(scoring.Config{Strategy: "fastest"})
	require.True(t, errors.Is(err, scoring.ErrUnknownStrategy))
	require.ErrorContains(t, err, `"fastest"`)
	require.ErrorContains(t, err, "round-robin")
}

func TestStrategies(t *testing.T) {
	want := []string{"adaptive", "thesis", "round-robin", "random", "sticky", "jsq", "power-of-two", "hash-clientid", "hash-topic"}
	require.ElementsMatch(t, want, scoring.Strategies())
	for _, name := range want {
		s, err := scoring.StrategyByName(name)
		require.NoError(t, err)
		require.Equal(t, name, s.Name())
	}
	_, err := scoring.StrategyByName("")
	require.ErrorIs(t, err, scoring.ErrUnknownStrategy)
}

func TestManualClock(t *testing.T) {
	c := scoring.NewManualClock(testEpoch)
	require.Equal(t, testEpoch, c.Now())
	c.Advance(1500 * time.Millisecond)
	require.Equal(t, testEpoch.Add(1500*time.Millisecond), c.Now())
	var _ scoring.Clock = scoring.SystemClock{}
	require.WithinDuration(t, time.Now(), scoring.SystemClock{}.Now(), time.Minute)
}

func TestUnknownClientsAndGroups(t *testing.T) {
	f := newFixture(t, adaptive, "a")
	_, ok := f.e.SelectMember("$share/other/t", scoring.Message{})
	require.False(t, ok)
	require.False(t, f.e.Report("nobody", scoring.Load{}))
	// None of these may panic or create state.
	f.e.Leave(testGroup, "nobody")
	f.e.Leave("$share/other/t", "a")
	f.e.Disconnect("nobody", true)
	f.e.Disconnect("nobody", false)
	f.e.InFlightStarted("nobody")
	f.e.InFlightAcknowledged("nobody")
	f.e.InFlightDropped("nobody")
	f.e.SetInFlight("nobody", 3)
	require.Len(t, f.e.Snapshot(), 1)
	require.Len(t, f.group().Members, 1)
}

// TestDepartedMemberIsNeverSelected: for every strategy, a member that left
// the group or whose session expired is never chosen again, and the group
// goes away with its last member.
func TestDepartedMemberIsNeverSelected(t *testing.T) {
	removals := []struct {
		name   string
		remove func(e *scoring.Engine, id string)
	}{
		{"leave", func(e *scoring.Engine, id string) { e.Leave(testGroup, id) }},
		{"session expired", func(e *scoring.Engine, id string) { e.Disconnect(id, true) }},
	}
	for _, strategy := range scoring.Strategies() {
		for _, rm := range removals {
			t.Run(strategy+"/"+rm.name, func(t *testing.T) {
				f := newFixture(t, scoring.Config{Strategy: strategy}, "a", "b", "c")
				for _, id := range []string{"a", "b", "c"} {
					f.report(id, scoring.Load{ProcessingTime: ms(1)})
				}
				before := countOf(f.selN(300, ms(1)))
				rm.remove(f.e, "b")
				for i := 0; i < 300; i++ {
					f.advance(ms(1))
					id, ok := f.e.SelectMember(testGroup, scoring.Message{PublisherID: "p" + string(rune('a'+i%26)), Topic: "t" + string(rune('a'+i%7))})
					require.True(t, ok)
					require.NotEqual(t, "b", id)
				}
				for _, m := range f.group().Members {
					require.NotEqual(t, "b", m.ClientID)
				}
				require.Positive(t, before["a"]+before["c"])

				rm.remove(f.e, "a")
				rm.remove(f.e, "c")
				_, ok := f.e.SelectMember(testGroup, scoring.Message{})
				require.False(t, ok)
				require.Empty(t, f.e.Snapshot(), "empty group deleted")
			})
		}
	}
}

func TestLeaveKeepsOtherGroups(t *testing.T) {
	f := newFixture(t, scoring.Config{Strategy: "round-robin"}, "a", "b")
	f.e.Join("$share/h/t", "a")
	f.e.Leave(testGroup, "a")
	id, ok := f.e.SelectMember("$share/h/t", scoring.Message{})
	require.True(t, ok)
	require.Equal(t, "a", id)
	require.True(t, f.e.Report("a", scoring.Load{}), "still has a session")
	require.Equal(t, []string{"b", "b"}, f.selN(2, ms(1)))
	// Rejoining works and does not duplicate.
	f.e.Join(testGroup, "a")
	f.e.Join(testGroup, "a")
	require.Len(t, f.group().Members, 2)
	require.ElementsMatch(t, []string{"a", "b"}, f.selN(2, ms(1)))
}

func TestDisconnectExpiredRemovesEverywhere(t *testing.T) {
	f := newFixture(t, adaptive, "a", "b")
	f.e.Join("$share/solo/t", "a")
	f.e.Disconnect("a", true)
	require.False(t, f.e.Report("a", scoring.Load{}), "state removed")
	snaps := f.e.Snapshot()
	require.Len(t, snaps, 1, "a's solo group is gone")
	require.Equal(t, testGroup, snaps[0].Filter)
	require.Len(t, snaps[0].Members, 1)
	require.Equal(t, "b", snaps[0].Members[0].ClientID)
}

// TestOfflineMembers: for every strategy, a member whose session survives a
// disconnect is chosen only when no member is online.
func TestOfflineMembers(t *testing.T) {
	for _, strategy := range scoring.Strategies() {
		t.Run(strategy, func(t *testing.T) {
			f := newFixture(t, scoring.Config{Strategy: strategy}, "a", "b", "c")
			f.e.Disconnect("b", false)
			require.False(t, f.member("b").Online)
			for _, id := range f.selN(200, ms(1)) {
				require.NotEqual(t, "b", id)
			}
			f.e.Disconnect("a", false)
			f.e.Disconnect("c", false)
			// Nobody online: their sessions queue the messages, in turn.
			counts := countOf(f.selN(300, ms(1)))
			require.Equal(t, map[string]int{"a": 100, "b": 100, "c": 100}, counts)
			for _, m := range f.group().Members {
				require.False(t, m.Online)
			}
			// One back online takes everything.
			f.e.Connect("c")
			for _, id := range f.selN(50, ms(1)) {
				require.Equal(t, "c", id)
			}
		})
	}
}

// TestResumedSession: a reconnecting member is online again in its groups
// with fresh load state; its selection count survives.
func TestResumedSession(t *testing.T) {
	f := newFixture(t, scoring.Config{Strategy: "round-robin"}, "a", "b")
	require.Equal(t, []string{"a", "b", "a", "b"}, f.selN(4, ms(1)))
	f.report("a", scoring.Load{Pending: 3, ProcessingTime: ms(10), Workers: 2})
	f.e.InFlightStarted("a")
	f.e.Disconnect("a", false)
	require.True(t, f.e.Report("a", scoring.Load{Pending: 4, ProcessingTime: ms(10)}), "the session survives")
	require.Equal(t, []string{"b", "b"}, f.selN(2, ms(1)))

	a := f.member("a")
	require.False(t, a.Online)
	require.Equal(t, uint64(2), a.Selections)
	require.Equal(t, uint64(4), f.member("b").Selections)
	// Offline members are listed after the online ones.
	g := f.group()
	require.Equal(t, "b", g.Members[0].ClientID)
	require.Equal(t, "a", g.Members[1].ClientID)

	f.advance(ms(100))
	f.e.Connect("a")
	a = f.member("a")
	require.True(t, a.Online)
	require.Equal(t, uint64(2), a.Selections)
	require.Zero(t, a.Reports)
	require.Zero(t, a.ReportedPending)
	require.Zero(t, a.ProcessingTime)
	require.Zero(t, a.ServiceEstimate)
	require.Zero(t, a.InFlight)
	require.Equal(t, 1, a.Workers)
	require.Zero(t, a.LastReportAge)
	require.Zero(t, a.PredictedWait)

	got := countOf(f.selN(10, ms(1)))
	require.Equal(t, 5, got["a"])
	require.Equal(t, uint64(7), f.member("a").Selections)
	require.Equal(t, uint64(9), f.member("b").Selections)

	// Offline again, then expired: gone.
	f.e.Disconnect("a", false)
	f.e.Disconnect("a", true)
	require.Len(t, f.group().Members, 1)
}

func TestOfflineSelectionsAreCounted(t *testing.T) {
	f := newFixture(t, adaptive, "a", "b")
	require.Len(t, f.selN(2, ms(1)), 2)
	f.e.Disconnect("a", false)
	f.e.Disconnect("b", false)
	f.selN(4, ms(1))
	require.Equal(t, uint64(3), f.member("a").Selections)
	require.Equal(t, uint64(3), f.member("b").Selections)
}

func TestJoinWhileOffline(t *testing.T) {
	f := newFixture(t, scoring.Config{Strategy: "round-robin"}, "a")
	f.e.Join("$share/other/t", "b")
	f.e.Disconnect("b", false)
	f.e.Join(testGroup, "b") // a persisted subscription restored while offline
	require.False(t, f.member("b").Online)
	require.Equal(t, []string{"a", "a"}, f.selN(2, ms(1)))
	f.e.Connect("b")
	require.ElementsMatch(t, []string{"a", "b"}, f.selN(2, ms(1)))
}

func TestSnapshot(t *testing.T) {
	f := newFixture(t, scoring.Config{Strategy: "adaptive", ReportInterval: ms(100)}, "a", "b", "c")
	f.e.Join("$share/a-first/t", "c")
	f.report("a", scoring.Load{Pending: 4, ProcessingTime: ms(20), Workers: 2, InProgress: 1})
	f.report("b", scoring.Load{ProcessingTime: ms(10)})
	f.e.InFlightStarted("b")
	f.e.InFlightStarted("b")
	f.advance(ms(40))
	// a can start at 45, b at 50 (one queued behind one running), c now.
	require.Equal(t, "c", f.sel()) // assumed the median (10 ms)
	f.e.Disconnect("c", false)

	snaps := f.e.Snapshot()
	require.Len(t, snaps, 2)
	require.Equal(t, "$share/a-first/t", snaps[0].Filter, "sorted by filter")
	require.Equal(t, testGroup, snaps[1].Filter)
	g := snaps[1]
	require.Equal(t, "adaptive", g.Strategy)
	require.Equal(t, []scoring.MemberSnapshot{
		{
			ClientID: "a", Online: true, ReportedPending: 4,
			ProcessingTime: ms(20), ServiceEstimate: ms(10), Workers: 2,
			// Reported at 0: 4·10 + 10/2 = 45 ms of work, 40 ms ago.
			PredictedWait: ms(5), Reports: 1, LastReportAge: ms(40),
			AcksAreFinishes: true,
		},
		{
			ClientID: "b", Online: true, ProcessingTime: ms(10), ServiceEstimate: ms(10),
			// Neither delivery acknowledged after 40 ms, four times its
			// reported 10 ms: overdue, guessed halfway through a first
			// message of 80 ms and a second as long: 3·40 ms.
			Workers: 1, InFlight: 2, PredictedWait: ms(120), Reports: 1, LastReportAge: ms(40),
			AcksAreFinishes: true,
		},
		{
			ClientID: "c", Online: false, Selections: 1, Workers: 1,
			PredictedWait: ms(10), LastReportAge: ms(40), AcksAreFinishes: true,
		},
	}, g.Members)
	require.Len(t, snaps[0].Members, 1)
	require.Equal(t, "c", snaps[0].Members[0].ClientID)
	require.Zero(t, snaps[0].Members[0].Selections, "selections are per group")

	f.advance(ms(300))
	for _, m := range f.group().Members {
		require.Equal(t, m.ClientID != "c", m.Stale, "%s", m.ClientID)
	}
}
