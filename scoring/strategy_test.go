package scoring_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/scoring"
)

func TestRoundRobinOrder(t *testing.T) {
	tests := []struct {
		name    string
		members []string
		n       int
		want    []string
	}{
		{"one member", []string{"a"}, 3, []string{"a", "a", "a"}},
		{"two members", []string{"a", "b"}, 5, []string{"a", "b", "a", "b", "a"}},
		{"three members", []string{"a", "b", "c"}, 7, []string{"a", "b", "c", "a", "b", "c", "a"}},
		{"five members", []string{"a", "b", "c", "d", "e"}, 6, []string{"a", "b", "c", "d", "e", "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, scoring.Config{Strategy: "round-robin"}, tt.members...)
			// Reports and the time between selections must not matter.
			f.report(tt.members[0], scoring.Load{Pending: 100, ProcessingTime: time.Second})
			require.Equal(t, tt.want, f.selN(tt.n, 0))
		})
	}
}

func TestRoundRobinSkipsDepartedMember(t *testing.T) {
	f := newFixture(t, scoring.Config{Strategy: "round-robin"}, "a", "b", "c")
	require.Equal(t, []string{"a", "b"}, f.selN(2, time.Millisecond))
	f.e.Leave(testGroup, "b")
	got := f.selN(6, time.Millisecond)
	require.NotContains(t, got, "b")
	for i := 1; i < len(got); i++ {
		require.NotEqual(t, got[i-1], got[i], "round robin over a and c must alternate: %v", got)
	}
}

// chiSquare is Pearson's statistic of counts against a uniform spread.
func chiSquare(counts map[string]int, members []string, total int) float64 {
	expected := float64(total) / float64(len(members))
	var chi float64
	for _, m := range members {
		d := float64(counts[m]) - expected
		chi += d * d / expected
	}
	return chi
}

func TestRandomSpreads(t *testing.T) {
	tests := []struct {
		members  int
		critical float64 // χ² critical value at p = 0.001 for members−1 degrees of freedom
	}{
		{2, 10.83},
		{3, 13.82},
		{5, 18.47},
		{10, 27.88},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d members", tt.members), func(t *testing.T) {
			var members []string
			for i := 0; i < tt.members; i++ {
				members = append(members, fmt.Sprintf("m%02d", i))
			}
			f := newFixture(t, scoring.Config{Strategy: "random", Seed: 42}, members...)
			const total = 20000
			got := f.selN(total, 0)
			counts := countOf(got)
			require.Len(t, counts, tt.members, "every member is chosen")
			require.Less(t, chiSquare(counts, members, total), tt.critical, "counts %v", counts)

			// Not a disguised round robin: the same member twice in a row
			// happens about total/members times.
			repeats := 0
			for i := 1; i < len(got); i++ {
				if got[i] == got[i-1] {
					repeats++
				}
			}
			require.InDelta(t, float64(total)/float64(tt.members), float64(repeats), 0.1*float64(total)/float64(tt.members))
		})
	}
}

func TestRandomIsSeeded(t *testing.T) {
	run := func(seed uint64) []string {
		f := newFixture(t, scoring.Config{Strategy: "random", Seed: seed}, "a", "b", "c", "d")
		return f.selN(64, 0)
	}
	require.Equal(t, run(7), run(7), "same seed, same choices")
	require.NotEqual(t, run(7), run(8), "another seed, other choices")
}

func TestStickyStaysUntilMemberGoes(t *testing.T) {
	tests := []struct {
		name   string
		remove func(e *scoring.Engine, id string)
		back   func(e *scoring.Engine, id string)
	}{
		{"leave", func(e *scoring.Engine, id string) { e.Leave(testGroup, id) },
			func(e *scoring.Engine, id string) { e.Join(testGroup, id) }},
		{"offline", func(e *scoring.Engine, id string) { e.Disconnect(id, false) },
			func(e *scoring.Engine, id string) { e.Connect(id) }},
		{"session expired", func(e *scoring.Engine, id string) { e.Disconnect(id, true) },
			func(e *scoring.Engine, id string) { e.Connect(id); e.Join(testGroup, id) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, scoring.Config{Strategy: "sticky"}, "a", "b", "c")
			first := f.sel()
			for _, id := range f.selN(50, time.Millisecond) {
				require.Equal(t, first, id)
			}
			// Load does not move it.
			f.report(first, scoring.Load{Pending: 1000, ProcessingTime: time.Second})
			require.Equal(t, first, f.sel())

			tt.remove(f.e, first)
			second := f.sel()
			require.NotEqual(t, first, second)
			for _, id := range f.selN(50, time.Millisecond) {
				require.Equal(t, second, id)
			}

			// The first member's return does not take the group back.
			tt.back(f.e, first)
			for _, id := range f.selN(20, time.Millisecond) {
				require.Equal(t, second, id)
			}
		})
	}
}

func TestHashStrategies(t *testing.T) {
	members := []string{"a", "b", "c", "d"}
	tests := []struct {
		strategy string
		msg      func(key, other string) scoring.Message
	}{
		{"hash-clientid", func(key, other string) scoring.Message {
			return scoring.Message{PublisherID: key, Topic: other}
		}},
		{"hash-topic", func(key, other string) scoring.Message {
			return scoring.Message{PublisherID: other, Topic: key}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.strategy, func(t *testing.T) {
			f := newFixture(t, scoring.Config{Strategy: tt.strategy}, members...)
			sel := func(m scoring.Message) string {
				id, ok := f.e.SelectMember(testGroup, m)
				require.True(t, ok)
				return id
			}
			const keys = 1000
			first := map[string]string{}
			counts := map[string]int{}
			for i := 0; i < keys; i++ {
				key := fmt.Sprintf("key-%d", i)
				first[key] = sel(tt.msg(key, "x"))
				counts[first[key]]++
			}
			// Spread across keys: each member about a quarter.
			require.Len(t, counts, len(members))
			for id, c := range counts {
				require.InDelta(t, keys/len(members), c, 75, "member %s: %v", id, counts)
			}
			// Stable per key, whatever the other field, the time and the load.
			f.report("a", scoring.Load{Pending: 500, ProcessingTime: time.Second})
			for round := 0; round < 3; round++ {
				f.advance(time.Second)
				for i := 0; i < keys; i++ {
					key := fmt.Sprintf("key-%d", i)
					require.Equal(t, first[key], sel(tt.msg(key, fmt.Sprint("other-", round, i))), "key %s", key)
				}
			}
		})
	}
}

func TestShortestQueueStrategy(t *testing.T) {
	t.Run("QoS 1: fewest unacknowledged", func(t *testing.T) {
		f := newFixture(t, scoring.Config{Strategy: "jsq"}, "a", "b", "c")
		for id, n := range map[string]int{"a": 3, "b": 1, "c": 2} {
			for range n {
				f.e.InFlightStarted(id)
			}
		}
		require.Equal(t, "b", f.sel())
		f.e.InFlightStarted("b") // b now holds 2, as c does
		f.e.InFlightAcknowledged("a")
		f.e.InFlightAcknowledged("a") // a holds 1
		require.Equal(t, "a", f.sel())
	})
	t.Run("QoS 0: reported queue plus sent since", func(t *testing.T) {
		f := newFixture(t, scoring.Config{Strategy: "jsq"}, "a", "b", "c")
		f.report("a", scoring.Load{Pending: 5})
		f.report("b", scoring.Load{Pending: 0})
		f.report("c", scoring.Load{Pending: 2})
		// b takes messages until its count reaches c's; then they alternate.
		require.Equal(t, []string{"b", "b"}, f.selN(2, time.Millisecond))
		got := f.selN(4, time.Millisecond)
		require.ElementsMatch(t, []string{"b", "b", "c", "c"}, got, "b and c share once equal: %v", got)
		require.NotContains(t, append(got, f.selN(3, time.Millisecond)...), "a", "a's queue of 5 is still the longest")
	})
	t.Run("equal members take turns", func(t *testing.T) {
		f := newFixture(t, scoring.Config{Strategy: "jsq"}, "a", "b", "c")
		got := f.selN(6, time.Millisecond)
		require.Equal(t, map[string]int{"a": 2, "b": 2, "c": 2}, countOf(got))
	})
}

func TestPowerOfTwoStrategy(t *testing.T) {
	t.Run("the longer of the two never wins", func(t *testing.T) {
		f := newFixture(t, scoring.Config{Strategy: "power-of-two", Seed: 7}, "a", "b")
		for range 4 {
			f.e.InFlightStarted("a")
		}
		for range 3 {
			require.Equal(t, "b", f.sel()) // b: 0, then 1, 2, 3 in flight once delivered
			f.e.InFlightStarted("b")
		}
	})
	t.Run("the busiest member of many is never chosen", func(t *testing.T) {
		members := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}
		f := newFixture(t, scoring.Config{Strategy: "power-of-two", Seed: 3}, members...)
		for range 100 {
			f.e.InFlightStarted("a")
		}
		counts := map[string]int{}
		for _, id := range f.selN(500, time.Millisecond) {
			counts[id]++
			if id != "a" {
				f.e.InFlightStarted(id)
				f.e.InFlightAcknowledged(id)
			}
		}
		require.Zero(t, counts["a"], "%v", counts)
		require.Len(t, counts, len(members)-1, "every other member gets some: %v", counts)
	})
	t.Run("one member", func(t *testing.T) {
		f := newFixture(t, scoring.Config{Strategy: "power-of-two"}, "a")
		require.Equal(t, "a", f.sel())
	})
}
