package scoring

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSampleRemembersRunnerUp: in a sampled group, the second-best member
// of one selection joins the next sample. 1 000 members: after a first
// selection every member but the remembered runner-up turns busy, and the
// next selection must find it (a random sample of 16 would miss it
// 98 times in 100).
func TestSampleRemembersRunnerUp(t *testing.T) {
	clock := NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	e, err := NewEngine(Config{Strategy: "adaptive", Clock: clock, Seed: 9})
	require.NoError(t, err)
	const group = "$share/g/t"
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprintf("m%04d", i)
		e.Connect(ids[i])
		e.Join(group, ids[i])
		e.Report(ids[i], Load{ProcessingTime: 10 * time.Millisecond})
	}
	for range 5 {
		clock.Advance(time.Millisecond)
		first, ok := e.SelectMember(group, Message{})
		require.True(t, ok)
		g := e.groups[group]
		g.mu.Lock()
		runnerUp := g.runnerUpMember
		g.mu.Unlock()
		require.NotNil(t, runnerUp, "a sampled selection remembers its runner-up")
		require.NotEqual(t, first, runnerUp.id)
		for _, id := range ids {
			if id != runnerUp.id {
				e.Report(id, Load{ProcessingTime: 10 * time.Millisecond, Backlog: time.Second, HasBacklog: true})
			}
		}
		next, ok := e.SelectMember(group, Message{})
		require.True(t, ok)
		require.Equal(t, runnerUp.id, next, "the only idle member, remembered from the last sample")
		for _, id := range ids {
			e.Report(id, Load{ProcessingTime: 10 * time.Millisecond}) // all idle again
		}
	}
}
