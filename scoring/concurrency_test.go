package scoring_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/scoring"
)

// TestConcurrentUse hammers one engine from many goroutines at once; run it
// with -race. Members of the stable group never leave (they only go offline
// and come back), so every selection in it must be counted exactly once.
func TestConcurrentUse(t *testing.T) {
	for _, strategy := range scoring.Strategies() {
		t.Run(strategy, func(t *testing.T) {
			t.Parallel()
			clock := scoring.NewManualClock(testEpoch)
			e, err := scoring.NewEngine(scoring.Config{Strategy: strategy, Clock: clock, ReportInterval: ms(10)})
			require.NoError(t, err)
			const stable, churn = "$share/stable/t", "$share/churn/t"
			stableIDs := make([]string, 12) // more than 8: adaptive samples
			isStable := map[string]bool{}
			for i := range stableIDs {
				stableIDs[i] = fmt.Sprintf("s%02d", i)
				isStable[stableIDs[i]] = true
				e.Connect(stableIDs[i])
				e.Join(stable, stableIDs[i])
			}

			const rounds = 1500
			var selected atomic.Int64
			var wg sync.WaitGroup
			run := func(seed uint64, body func(r *rand.Rand, i int)) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(seed, 99))
					for i := 0; i < rounds; i++ {
						body(r, i)
					}
				}()
			}
			run(1, func(_ *rand.Rand, _ int) { clock.Advance(100 * time.Microsecond) })
			for s := uint64(0); s < 4; s++ {
				run(10+s, func(r *rand.Rand, i int) {
					msg := scoring.Message{PublisherID: fmt.Sprint("p", r.IntN(50)), Topic: fmt.Sprint("t", r.IntN(20))}
					id, ok := e.SelectMember(stable, msg)
					if assert.True(t, ok) && assert.True(t, isStable[id], "selected %q", id) {
						selected.Add(1)
					}
					if id, ok := e.SelectMember(churn, msg); ok {
						assert.NotEmpty(t, id)
					}
				})
			}
			for s := uint64(0); s < 2; s++ {
				run(20+s, func(r *rand.Rand, _ int) {
					id := stableIDs[r.IntN(len(stableIDs))]
					e.Report(id, scoring.Load{
						Pending: r.IntN(10), ProcessingTime: time.Duration(r.IntN(5000)) * time.Microsecond,
						Workers: r.IntN(3), InProgress: r.IntN(2), Backlog: ms(float64(r.IntN(20))), HasBacklog: r.IntN(2) == 0,
						Received: uint64(r.IntN(100)), HasReceived: r.IntN(2) == 0,
					})
					switch r.IntN(5) {
					case 0:
						e.InFlightStarted(id)
					case 1:
						e.InFlightAcknowledged(id)
					case 2:
						e.InFlightDropped(id)
					case 3:
						e.SetInFlight(id, r.IntN(4))
					}
				})
			}
			// Stable members go offline and come back.
			run(30, func(r *rand.Rand, _ int) {
				id := stableIDs[r.IntN(len(stableIDs))]
				e.Disconnect(id, false)
				e.Connect(id)
			})
			// Others join, leave, expire and come back.
			for s := uint64(0); s < 2; s++ {
				run(40+s, func(r *rand.Rand, _ int) {
					id := fmt.Sprint("c", r.IntN(15))
					switch r.IntN(5) {
					case 0:
						e.Connect(id)
						e.Join(churn, id)
					case 1:
						e.Leave(churn, id)
					case 2:
						e.Disconnect(id, r.IntN(2) == 0)
					case 3:
						e.Report(id, scoring.Load{ProcessingTime: ms(1)})
					case 4:
						e.Join(churn, id)
					}
				})
			}
			run(50, func(_ *rand.Rand, i int) {
				if i%10 != 0 {
					return
				}
				for _, g := range e.Snapshot() {
					seen := map[string]bool{}
					for _, m := range g.Members {
						assert.False(t, seen[m.ClientID], "%s listed twice in %s", m.ClientID, g.Filter)
						seen[m.ClientID] = true
					}
				}
			})
			wg.Wait()

			var counted uint64
			var members int
			for _, g := range e.Snapshot() {
				if g.Filter != stable {
					continue
				}
				for _, m := range g.Members {
					counted += m.Selections
					members++
				}
			}
			require.Equal(t, len(stableIDs), members)
			require.Equal(t, uint64(selected.Load()), counted, "every selection counted once")
			require.Equal(t, int64(4*rounds), selected.Load())
		})
	}
}
