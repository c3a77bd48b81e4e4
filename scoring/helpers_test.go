package scoring_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/scoring"
)

const testGroup = "$share/g/t"

var testEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fixture is an engine on a ManualClock with members joined to testGroup.
type fixture struct {
	t     *testing.T
	clock *scoring.ManualClock
	e     *scoring.Engine
}

// newFixture connects members (in order) and joins them to testGroup.
func newFixture(t *testing.T, cfg scoring.Config, members ...string) *fixture {
	t.Helper()
	clock := scoring.NewManualClock(testEpoch)
	cfg.Clock = clock
	e, err := scoring.NewEngine(cfg)
	require.NoError(t, err)
	f := &fixture{t: t, clock: clock, e: e}
	for _, id := range members {
		f.add(id)
	}
	return f
}

func (f *fixture) add(id string) {
	f.e.Connect(id)
	f.e.Join(testGroup, id)
}

func (f *fixture) advance(d time.Duration) { f.clock.Advance(d) }

// learnFromAcks has each of ids take n messages one at a time, each
// acknowledged service after it was sent.
func (f *fixture) learnFromAcks(n int, service time.Duration, ids ...string) {
	for range n {
		for _, id := range ids {
			f.e.InFlightStarted(id)
		}
		f.advance(service)
		for _, id := range ids {
			f.e.InFlightAcknowledged(id)
		}
	}
}

func (f *fixture) sel() string {
	f.t.Helper()
	id, ok := f.e.SelectMember(testGroup, scoring.Message{PublisherID: "pub", Topic: "t"})
	require.True(f.t, ok)
	return id
}

// selN selects n times, advancing the clock by step before each selection.
func (f *fixture) selN(n int, step time.Duration) []string {
	f.t.Helper()
	out := make([]string, n)
	for i := range out {
		f.advance(step)
		out[i] = f.sel()
	}
	return out
}

func (f *fixture) report(id string, l scoring.Load) {
	f.t.Helper()
	require.True(f.t, f.e.Report(id, l), "report from %s", id)
}

// group returns the snapshot of testGroup.
func (f *fixture) group() scoring.GroupSnapshot {
	f.t.Helper()
	for _, g := range f.e.Snapshot() {
		if g.Filter == testGroup {
			return g
		}
	}
	require.FailNow(f.t, "no group "+testGroup)
	return scoring.GroupSnapshot{}
}

// member returns the snapshot of id in testGroup.
func (f *fixture) member(id string) scoring.MemberSnapshot {
	f.t.Helper()
	for _, m := range f.group().Members {
		if m.ClientID == id {
			return m
		}
	}
	require.FailNow(f.t, "no member "+id)
	return scoring.MemberSnapshot{}
}

// wait is id's predicted wait before it could start a message handed now.
func (f *fixture) wait(id string) time.Duration {
	f.t.Helper()
	return f.member(id).PredictedWait
}

func countOf(ids []string) map[string]int {
	c := map[string]int{}
	for _, id := range ids {
		c[id]++
	}
	return c
}

func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }
