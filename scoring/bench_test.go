package scoring_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/scoring"
)

var benchSizes = []int{3, 100, 1000}

// benchEngine returns an engine whose group testGroup has size members; two
// in three reported a processing time (1–5 ms), the others are newcomers.
// msgs vary the publisher and the topic for the hash strategies.
func benchEngine(tb testing.TB, strategy string, size int) (*scoring.Engine, *scoring.ManualClock, []scoring.Message) {
	tb.Helper()
	clock := scoring.NewManualClock(testEpoch)
	e, msgs := benchEngineOn(tb, strategy, size, clock)
	return e, clock, msgs
}

// benchEngineOn is benchEngine on the given clock (nil: the system's).
func benchEngineOn(tb testing.TB, strategy string, size int, clock scoring.Clock) (*scoring.Engine, []scoring.Message) {
	tb.Helper()
	e, err := scoring.NewEngine(scoring.Config{Strategy: strategy, Clock: clock})
	require.NoError(tb, err)
	for i := 0; i < size; i++ {
		id := fmt.Sprintf("member-%04d", i)
		e.Connect(id)
		e.Join(testGroup, id)
		if i%3 != 2 {
			e.Report(id, scoring.Load{Pending: i % 4, ProcessingTime: time.Duration(1+i%5) * time.Millisecond})
		}
	}
	msgs := make([]scoring.Message, 256)
	for i := range msgs {
		msgs[i] = scoring.Message{PublisherID: fmt.Sprintf("sensor-%d", i), Topic: fmt.Sprintf("site/%d/temp", i%17)}
	}
	return e, msgs
}

// benchSelections times selections in testGroup, 10 µs apart on clock,
// cycling through msgs.
func benchSelections(b *testing.B, e *scoring.Engine, clock *scoring.ManualClock, msgs []scoring.Message) {
	b.Helper()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		clock.Advance(10 * time.Microsecond)
		if _, ok := e.SelectMember(testGroup, msgs[i%len(msgs)]); !ok {
			b.Fatal("no member selected")
		}
		i++
	}
}

func BenchmarkSelectMember(b *testing.B) {
	for _, strategy := range scoring.Strategies() {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("%s/%d", strategy, size), func(b *testing.B) {
				e, clock, msgs := benchEngine(b, strategy, size)
				benchSelections(b, e, clock, msgs)
			})
		}
	}
}

// BenchmarkSelectMemberQoS1 is one QoS 1 delivery's whole bookkeeping in
// the adaptive strategy: the selection, the delivery started, and the
// acknowledgement of the delivery made size/2 selections before (members
// that acknowledge after processing, which note the group when they free
// up).
func BenchmarkSelectMemberQoS1(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("adaptive/%d", size), func(b *testing.B) {
			e, clock, msgs := benchEngine(b, "adaptive", size)
			outstanding := make([]string, max(size/2, 1))
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				clock.Advance(10 * time.Microsecond)
				id, ok := e.SelectMember(testGroup, msgs[i%len(msgs)])
				if !ok {
					b.Fatal("no member selected")
				}
				e.InFlightStarted(id)
				slot := i % len(outstanding)
				if old := outstanding[slot]; old != "" {
					e.InFlightAcknowledged(old)
				}
				outstanding[slot] = id
				i++
			}
		})
	}
}

// TestSelectMemberDoesNotAllocate measures every selection on its own:
// testing.AllocsPerRun divides by the number of runs with integer division,
// so an allocation on one selection in many would hide in an average.
func TestSelectMemberDoesNotAllocate(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation may allocate")
	}
	for _, strategy := range scoring.Strategies() {
		for _, size := range benchSizes {
			t.Run(fmt.Sprintf("%s/%d", strategy, size), func(t *testing.T) {
				ids := make([]string, size)
				for i := range ids {
					ids[i] = fmt.Sprintf("member-%04d", i)
				}
				requireSelectionsDoNotAllocate(t, 300, func() (*scoring.Engine, *scoring.ManualClock, []scoring.Message, func(int)) {
					e, clock, msgs := benchEngine(t, strategy, size)
					return e, clock, msgs, func(i int) {
						if i%10 == 0 { // keep the load state moving, newcomers included
							e.Report(ids[(i*7)%size], scoring.Load{Pending: i % 3, ProcessingTime: time.Duration(i%2) * time.Millisecond})
							e.InFlightStarted(ids[i%size])
						}
						if i%10 == 5 && i > 10 { // acknowledgements note freed members
							e.InFlightAcknowledged(ids[(i-15)%size])
						}
					}
				})
			})
		}
	}
	t.Run("all offline", func(t *testing.T) {
		requireSelectionsDoNotAllocate(t, 300, func() (*scoring.Engine, *scoring.ManualClock, []scoring.Message, func(int)) {
			e, clock, msgs := benchEngine(t, "adaptive", 3)
			for i := 0; i < 3; i++ {
				e.Disconnect(fmt.Sprintf("member-%04d", i), false)
			}
			return e, clock, msgs, func(int) {}
		})
	})
}

// requireSelectionsDoNotAllocate makes n selections on the engine that
// start builds, each measured on its own and preceded by the returned
// between(i), and fails if any allocated, in a second run of the same
// sequence too. testing.AllocsPerRun counts the whole process's mallocs:
// under make test (-race, the two cores shared with other packages' tests)
// CI once saw one malloc on one selection in 300 (thesis, 1 000 members,
// 2026-12-04) that 500 runs of the test alone did not show again. The
// engine runs on a manual clock from fixed inputs, so an allocation of its
// own comes back when the same sequence runs again; one from elsewhere in
// the process does not.
func requireSelectionsDoNotAllocate(t *testing.T, n int, start func() (*scoring.Engine, *scoring.ManualClock, []scoring.Message, func(int))) {
	t.Helper()
	first := allocatingSelections(t, n, start)
	if len(first) == 0 {
		return
	}
	t.Logf("selections that allocated (selection: mallocs): %v; running the same sequence again", first)
	again := allocatingSelections(t, n, start)
	require.Empty(t, again, "selections that allocated when the same sequence ran again (the first time: %v)", first)
}

// allocatingSelections runs the sequence of requireSelectionsDoNotAllocate
// once and returns the selections that allocated, as "i: mallocs".
func allocatingSelections(t *testing.T, n int, start func() (*scoring.Engine, *scoring.ManualClock, []scoring.Message, func(int))) []string {
	t.Helper()
	e, clock, msgs, between := start()
	var allocating []string
	for i := range n {
		between(i)
		msg := msgs[i%len(msgs)]
		allocs := testing.AllocsPerRun(1, func() {
			clock.Advance(10 * time.Microsecond)
			if _, ok := e.SelectMember(testGroup, msg); !ok {
				t.Fatal("no member selected")
			}
		})
		if allocs != 0 {
			allocating = append(allocating, fmt.Sprintf("%d: %v", i, allocs))
		}
	}
	return allocating
}

// TestQoSFlowBookkeepingDoesNotAllocate: every QoS≥1 delivery to a member
// passes through InFlightStarted and InFlightAcknowledged, and reports come
// every interval: none of them may allocate.
func TestQoSFlowBookkeepingDoesNotAllocate(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation may allocate")
	}
	e, clock, _ := benchEngine(t, "adaptive", 3)
	id := "member-0001"
	allocs := testing.AllocsPerRun(1000, func() {
		e.InFlightStarted(id)
		clock.Advance(time.Millisecond)
		e.InFlightAcknowledged(id)
		e.Report(id, scoring.Load{Pending: 1, ProcessingTime: time.Millisecond})
	})
	require.Zero(t, allocs)
}

// BenchmarkSelectMemberSystemClock is BenchmarkSelectMember's adaptive
// case on the system clock (the broker's), which the engine reads once
// per selection.
func BenchmarkSelectMemberSystemClock(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("adaptive/%d", size), func(b *testing.B) {
			e, msgs := benchEngineOn(b, "adaptive", size, nil)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, ok := e.SelectMember(testGroup, msgs[i%len(msgs)]); !ok {
					b.Fatal("no member selected")
				}
				i++
			}
		})
	}
}

// timerAckedEngine returns an adaptive engine whose group testGroup has
// size members that acknowledge on a 50 ms flush timer, as paho.golang's
// manual acks do, and whose work is memoryless: each flush acknowledges a
// Poisson count (mean 2) of the 4 deliveries each holds, refilled at once.
// Their service times and variability are then learnt from the windows
// between bursts, and selection predicts them by the Poisson shortfall of
// what they hold (timerBacklog).
func timerAckedEngine(tb testing.TB, size int) (*scoring.Engine, *scoring.ManualClock, []scoring.Message) {
	tb.Helper()
	clock := scoring.NewManualClock(testEpoch)
	e, err := scoring.NewEngine(scoring.Config{Strategy: "adaptive", Clock: clock})
	require.NoError(tb, err)
	ids := make([]string, size)
	for i := range ids {
		ids[i] = fmt.Sprintf("member-%04d", i)
		e.Connect(ids[i])
		e.Join(testGroup, ids[i])
		for range 4 {
			e.InFlightStarted(ids[i])
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100 {
		clock.Advance(50 * time.Millisecond)
		for _, id := range ids {
			acks := 0
			for p, u := math.Exp(-2), rng.Float64(); u > p && acks < 3; acks++ {
				u -= p
				p *= 2 / float64(acks+1)
			}
			for range acks {
				e.InFlightAcknowledged(id)
			}
			for range acks {
				e.InFlightStarted(id)
			}
		}
	}
	msgs := make([]scoring.Message, 16)
	for i := range msgs {
		msgs[i] = scoring.Message{PublisherID: fmt.Sprintf("sensor-%d", i), Topic: "site/1/temp"}
	}
	return e, clock, msgs
}

// BenchmarkSelectMemberTimerAckedVariableWork is a selection among
// members known from a flush timer's acks on variable work, whose
// predictions sum a Poisson count per candidate.
func BenchmarkSelectMemberTimerAckedVariableWork(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("adaptive/%d", size), func(b *testing.B) {
			e, clock, msgs := timerAckedEngine(b, size)
			benchSelections(b, e, clock, msgs)
		})
	}
}

// TestSelectMemberTimerAckedDoesNotAllocate: selections among members
// known from a flush timer's acks on variable work allocate nothing.
func TestSelectMemberTimerAckedDoesNotAllocate(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage instrumentation may allocate")
	}
	for _, size := range benchSizes {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			requireSelectionsDoNotAllocate(t, 200, func() (*scoring.Engine, *scoring.ManualClock, []scoring.Message, func(int)) {
				e, clock, msgs := timerAckedEngine(t, size)
				return e, clock, msgs, func(int) {}
			})
		})
	}
}
