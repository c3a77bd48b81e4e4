package scoring_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/scoring"
)

// holdEngine returns an adaptive engine with late binding (5 ms lead) and
// a group g of members a and b, both reporting 20 ms per message, idle.
func holdEngine(t *testing.T, lead time.Duration) (*scoring.Engine, *scoring.ManualClock) {
	t.Helper()
	clock := scoring.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e, err := scoring.NewEngine(scoring.Config{Strategy: "adaptive", Clock: clock, HoldLead: lead})
	require.NoError(t, err)
	for _, id := range []string{"a", "b"} {
		e.Connect(id)
		e.Join("g", id)
		require.True(t, e.Report(id, scoring.Load{ProcessingTime: 20 * time.Millisecond, Processed: 1, Workers: 1, HasReceived: true}))
	}
	return e, clock
}

func TestAdviseHold(t *testing.T) {
	e, _ := holdEngine(t, 5*time.Millisecond)
	require.False(t, e.AdviseHold("g").Hold, "idle members: hand the message over")
	require.False(t, e.AdviseHold("unknown").Hold)

	// Each member gets one message: both busy for 20 ms.
	_, ok := e.SelectMember("g", scoring.Message{})
	require.True(t, ok)
	require.False(t, e.AdviseHold("g").Hold, "one member is still idle")
	_, ok = e.SelectMember("g", scoring.Message{})
	require.True(t, ok)
	advice := e.AdviseHold("g")
	require.True(t, advice.Hold, "every member busy for 20 ms, more than the 5 ms lead")
	require.Equal(t, 15*time.Millisecond, advice.RecheckAfter, "ask again 5 ms before the first is free")
}

func TestAdviseHoldTimeAndReports(t *testing.T) {
	e, clock := holdEngine(t, 5*time.Millisecond)
	e.SelectMember("g", scoring.Message{})
	e.SelectMember("g", scoring.Message{})
	require.True(t, e.AdviseHold("g").Hold)

	clock.Advance(15 * time.Millisecond)
	require.False(t, e.AdviseHold("g").Hold, "within the lead of the first member's predicted start")

	// A report that a member is idle ends the hold at once.
	e2, _ := holdEngine(t, 5*time.Millisecond)
	e2.SelectMember("g", scoring.Message{})
	e2.SelectMember("g", scoring.Message{})
	require.True(t, e2.AdviseHold("g").Hold)
	require.True(t, e2.Report("a", scoring.Load{ProcessingTime: 20 * time.Millisecond, Processed: 1, Workers: 1, HasReceived: true, Received: 1}))
	require.False(t, e2.AdviseHold("g").Hold, "a reported idle")
}

func TestAdviseHoldOffCases(t *testing.T) {
	t.Run("off by default", func(t *testing.T) {
		e, _ := holdEngine(t, 0)
		e.SelectMember("g", scoring.Message{})
		e.SelectMember("g", scoring.Message{})
		require.False(t, e.AdviseHold("g").Hold)
	})
	t.Run("not adaptive", func(t *testing.T) {
		e, err := scoring.NewEngine(scoring.Config{Strategy: "thesis", HoldLead: time.Millisecond})
		require.NoError(t, err)
		e.Connect("a")
		e.Join("g", "a")
		require.False(t, e.AdviseHold("g").Hold)
	})
	t.Run("newcomer without an estimate", func(t *testing.T) {
		clock := scoring.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		e, err := scoring.NewEngine(scoring.Config{Clock: clock, HoldLead: time.Millisecond})
		require.NoError(t, err)
		e.Connect("a")
		e.Join("g", "a")
		e.SelectMember("g", scoring.Message{})
		require.False(t, e.AdviseHold("g").Hold, "handing it messages is how its speed is learnt")
	})
	t.Run("estimate learnt from acknowledgements", func(t *testing.T) {
		clock := scoring.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		e, err := scoring.NewEngine(scoring.Config{Clock: clock, HoldLead: time.Millisecond})
		require.NoError(t, err)
		e.Connect("a")
		e.Join("g", "a")
		for i := 0; i < 3; i++ {
			e.SelectMember("g", scoring.Message{})
			e.InFlightStarted("a")
			clock.Advance(20 * time.Millisecond)
			e.InFlightAcknowledged("a")
		}
		e.SelectMember("g", scoring.Message{})
		e.InFlightStarted("a")
		e.SelectMember("g", scoring.Message{})
		e.InFlightStarted("a")
		require.False(t, e.AdviseHold("g").Hold, "batched acks would make it look slow")
	})
}

func TestAdviseHoldDoesNotAllocate(t *testing.T) {
	e, _ := holdEngine(t, 5*time.Millisecond)
	e.SelectMember("g", scoring.Message{})
	e.SelectMember("g", scoring.Message{})
	allocs := testing.AllocsPerRun(1000, func() { e.AdviseHold("g") })
	require.Zero(t, allocs)
}

func BenchmarkAdviseHold(b *testing.B) {
	clock := scoring.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e, _ := scoring.NewEngine(scoring.Config{Clock: clock, HoldLead: 5 * time.Millisecond})
	for _, id := range []string{"a", "b", "c"} {
		e.Connect(id)
		e.Join("g", id)
		e.Report(id, scoring.Load{ProcessingTime: 20 * time.Millisecond, Processed: 1, Workers: 1, HasReceived: true})
		e.SelectMember("g", scoring.Message{})
	}
	b.ReportAllocs()
	for b.Loop() {
		e.AdviseHold("g")
	}
}

func TestSelectMemberOrHold(t *testing.T) {
	e, _ := holdEngine(t, 5*time.Millisecond)
	for i := 0; i < 2; i++ {
		id, advice, ok := e.SelectMemberOrHold("g", scoring.Message{})
		require.True(t, ok)
		require.False(t, advice.Hold)
		require.NotEmpty(t, id)
	}
	id, advice, ok := e.SelectMemberOrHold("g", scoring.Message{})
	require.True(t, ok)
	require.True(t, advice.Hold)
	require.Empty(t, id)
	var selections uint64
	for _, m := range e.Snapshot()[0].Members {
		selections += m.Selections
	}
	require.Equal(t, uint64(2), selections, "a held message books nothing")
	_, _, ok = e.SelectMemberOrHold("nobody", scoring.Message{})
	require.False(t, ok)
	allocs := testing.AllocsPerRun(1000, func() { e.SelectMemberOrHold("g", scoring.Message{}) })
	require.Zero(t, allocs)
}
