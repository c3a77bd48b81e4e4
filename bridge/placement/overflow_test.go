package placement

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestWeightedOverflowDestinationSplitsByWeight(t *testing.T) {
	candidates := []OverflowCandidate{{Site: "a", Spare: 30}, {Site: "b", Spare: 10}, {Site: "c", Spare: 0}, {Site: "d", Spare: -5}}
	// Weights max(Spare, 1): 30, 10, 1, 1 (eq. 2.13). Keys spread evenly
	// over uint64 hit each site exactly in proportion.
	const perUnit = 1000
	total := uint64(42 * perUnit)
	counts := map[string]int{}
	for k := range total {
		key, _ := bits.Div64(k, total-1, total) // ⌈k·2^64 / total⌉
		site, err := WeightedOverflowDestination(candidates, key)
		if err != nil {
			t.Fatal(err)
		}
		counts[site]++
	}
	want := map[string]int{"a": 30 * perUnit, "b": 10 * perUnit, "c": perUnit, "d": perUnit}
	for site, n := range want {
		if counts[site] != n {
			t.Errorf("%s got %d messages, want %d (all: %v)", site, counts[site], n, counts)
		}
	}
	if _, err := WeightedOverflowDestination(nil, 1); !errors.Is(err, ErrNoOverflowCandidate) {
		t.Errorf("no candidates: got %v", err)
	}
}

func TestNearestOverflowDestination(t *testing.T) {
	delays := Delays{
		"berlin": {"tunis": 25 * time.Millisecond, "tokyo": 120 * time.Millisecond, "montreal": 45 * time.Millisecond},
		"tunis":  {"tokyo": 110 * time.Millisecond, "montreal": 55 * time.Millisecond},
		"tokyo":  {"montreal": 80 * time.Millisecond},
	}
	pick := func(origin string, candidates ...OverflowCandidate) string {
		t.Helper()
		site, err := NearestOverflowDestination(origin, candidates, delays, 0)
		if err != nil {
			t.Fatal(err)
		}
		return site
	}
	// The nearest site with room wins even when a far one has more room.
	if got := pick("berlin", OverflowCandidate{Site: "tokyo", Spare: 500}, OverflowCandidate{Site: "tunis", Spare: 3}, OverflowCandidate{Site: "montreal", Spare: 50}); got != "tunis" {
		t.Errorf("got %s, want tunis", got)
	}
	// A site without room is skipped, however near.
	if got := pick("berlin", OverflowCandidate{Site: "tokyo", Spare: 500}, OverflowCandidate{Site: "tunis", Spare: 0}, OverflowCandidate{Site: "montreal", Spare: 50}); got != "montreal" {
		t.Errorf("got %s, want montreal", got)
	}
	// The origin itself, with room, is nearest (delay 0).
	if got := pick("berlin", OverflowCandidate{Site: "berlin", Spare: 1}, OverflowCandidate{Site: "tunis", Spare: 100}); got != "berlin" {
		t.Errorf("got %s, want berlin", got)
	}
	// Same delay (symmetric lookup both ways): more room wins.
	same := Delays{"x": {"a": 10 * time.Millisecond}, "b": {"x": 10 * time.Millisecond}}
	if got, _ := NearestOverflowDestination("x", []OverflowCandidate{{Site: "a", Spare: 5}, {Site: "b", Spare: 9}}, same, 0); got != "b" {
		t.Errorf("tie on delay: got %s, want b (more room)", got)
	}
	// No room anywhere: the thesis's weighted rule decides.
	none := []OverflowCandidate{{Site: "tokyo", Spare: 0}, {Site: "tunis", Spare: -2}}
	for _, key := range []uint64{0, math.MaxUint64 / 3, math.MaxUint64} {
		got, _ := NearestOverflowDestination("berlin", none, delays, key)
		want, _ := WeightedOverflowDestination(none, key)
		if got != want {
			t.Errorf("fallback with key %d: got %s, want %s", key, got, want)
		}
	}
}

// overflowOutcome is what happened to one overflow message.
type overflowOutcome struct {
	linkMs, waitMs float64
	movedOffSite   bool
}

// overflowSummary is the outcome of one rule over many messages.
type overflowSummary struct {
	messages    int
	meanLinkMs  float64 // one-way origin → destination
	meanWaitMs  float64 // queueing at the destination beyond its spare room
	meanExtraMs float64 // link + wait
	p95ExtraMs  float64
	offSite     float64 // share moved to another site
}

func (s overflowSummary) String() string {
	return fmt.Sprintf("%6d messages: mean extra delay %6.1f ms (link %5.1f ms + waiting %6.1f ms), p95 %7.1f ms, off-site %5.1f%%",
		s.messages, s.meanExtraMs, s.meanLinkMs, s.meanWaitMs, s.p95ExtraMs, 100*s.offSite)
}

func summarise(outcomes []overflowOutcome) overflowSummary {
	s := overflowSummary{messages: len(outcomes)}
	if s.messages == 0 {
		return s
	}
	extras := make([]float64, 0, len(outcomes))
	for _, o := range outcomes {
		s.meanLinkMs += o.linkMs
		s.meanWaitMs += o.waitMs
		if o.movedOffSite {
			s.offSite++
		}
		extras = append(extras, o.linkMs+o.waitMs)
	}
	n := float64(s.messages)
	s.meanLinkMs /= n
	s.meanWaitMs /= n
	s.offSite /= n
	s.meanExtraMs = s.meanLinkMs + s.meanWaitMs
	slices.Sort(extras)
	s.p95ExtraMs = extras[int(math.Ceil(0.95*n))-1]
	return s
}

// overflowRegime separates episodes where the sites with room can absorb
// all the overflow from those where they cannot.
type overflowRegime int

const (
	absorbable overflowRegime = iota // Σ overflow ≤ Σ spare room
	saturated                        // some overflow must wait whatever the rule
)

func (r overflowRegime) String() string {
	return [...]string{"absorbable", "saturated"}[r]
}

// overflowRule is one way of choosing an overflow destination.
type overflowRule int

const (
	weightOnly overflowRule = iota // the thesis: WeightedOverflowDestination
	nearest                        // NearestOverflowDestination
)

// simulateOverflow replays the same random overflow episodes under both
// rules and returns outcomes by regime and rule. Each episode is one
// retune period: 3–8 sites at random points of a 100 ms × 100 ms plane
// (delay = distance + 1 ms); 1–3 of them are overloaded (no spare room, a
// backlog of what they could not absorb) and dead-letter 20–200 messages
// each; the others have 0–300 messages of spare room and drain 10–100
// messages per second. Overflow from the overloaded sites is interleaved
// message by message. The weight-only rule routes by the weights of the
// last retune (consistent-hash bindings do not change between retunes);
// the delay-aware rule sees the same snapshot and what its own site sent
// since (not what other origins sent). A message arriving at a site whose
// room is used up waits behind the excess (and the site's own backlog) at
// the site's drain rate: extra delay = link delay + that wait.
func simulateOverflow(episodes int, seed uint64) [2][2][]overflowOutcome {
	rng := rand.New(rand.NewPCG(seed, 7))
	var out [2][2][]overflowOutcome
	for episode := range episodes {
		n := 3 + rng.IntN(6)
		names := make([]string, n)
		index := make(map[string]int, n)
		xs, ys := make([]float64, n), make([]float64, n)
		delays := Delays{}
		spare, backlog, overflow := make([]int, n), make([]int, n), make([]int, n)
		drainPerSecond := make([]float64, n)
		for j := range n {
			names[j] = fmt.Sprintf("s%d", j)
			index[names[j]] = j
			xs[j], ys[j] = rng.Float64()*100, rng.Float64()*100
			delays[names[j]] = map[string]time.Duration{}
			for k := range j {
				delays[names[j]][names[k]] = time.Duration((1 + math.Hypot(xs[j]-xs[k], ys[j]-ys[k])) * float64(time.Millisecond))
			}
			drainPerSecond[j] = 10 + 90*rng.Float64()
		}
		overloaded := rng.Perm(n)[:1+rng.IntN(min(3, n-1))]
		var totalOverflow, totalSpare int
		for j := range n {
			if slices.Contains(overloaded, j) {
				overflow[j] = 20 + rng.IntN(181)
				backlog[j] = overflow[j]
				totalOverflow += overflow[j]
			} else {
				spare[j] = rng.IntN(301)
				totalSpare += spare[j]
			}
		}
		regime := absorbable
		if totalOverflow > totalSpare {
			regime = saturated
		}
		snapshot := make([]OverflowCandidate, n)
		for j := range n {
			snapshot[j] = OverflowCandidate{Site: names[j], Spare: spare[j]}
		}
		for _, rule := range []overflowRule{weightOnly, nearest} {
			received := make([]int, n)
			sentBy := make([][]int, n)
			for j := range sentBy {
				sentBy[j] = make([]int, n)
			}
			remaining := slices.Clone(overflow)
			// The message hashes, the same for both rules; only the
			// weight-only rule (and the delay-aware rule's fallback) reads
			// them.
			keys := rand.New(rand.NewPCG(seed, uint64(episode)))
			view := make([]OverflowCandidate, n)
			for slices.ContainsFunc(overloaded, func(o int) bool { return remaining[o] > 0 }) {
				for _, o := range overloaded {
					if remaining[o] == 0 {
						continue
					}
					remaining[o]--
					var site string
					if rule == weightOnly {
						site, _ = WeightedOverflowDestination(snapshot, keys.Uint64())
					} else {
						for j := range view {
							view[j] = OverflowCandidate{Site: names[j], Spare: spare[j], Sent: sentBy[o][j]}
						}
						site, _ = NearestOverflowDestination(names[o], view, delays, keys.Uint64())
					}
					d := index[site]
					sentBy[o][d]++
					received[d]++
					link, _ := delays.Between(names[o], site)
					out[regime][rule] = append(out[regime][rule], overflowOutcome{
						linkMs:       float64(link) / float64(time.Millisecond),
						waitMs:       float64(max(0, backlog[d]+received[d]-spare[d])) / drainPerSecond[d] * 1000,
						movedOffSite: d != o,
					})
				}
			}
		}
	}
	return out
}

// TestNearestOverflowBeatsWeightOnly compares the two overflow rules on
// 1 000 simulated retune periods (see simulateOverflow) and requires the
// delay-aware rule to add less delay on average, over all episodes and
// over those where the sites with room can absorb the overflow.
func TestNearestOverflowBeatsWeightOnly(t *testing.T) {
	outcomes := simulateOverflow(1000, 1)
	var all [2][]overflowOutcome
	for regime := range outcomes {
		for rule := range outcomes[regime] {
			all[rule] = append(all[rule], outcomes[regime][rule]...)
		}
		w, n := summarise(outcomes[regime][weightOnly]), summarise(outcomes[regime][nearest])
		t.Logf("%-10s weight-only (thesis): %s", overflowRegime(regime), w)
		t.Logf("%-10s nearest with room:    %s", overflowRegime(regime), n)
		if w.messages != n.messages {
			t.Fatalf("rules saw different traffic: %d vs %d messages", w.messages, n.messages)
		}
		if regime == int(absorbable) && n.meanExtraMs >= w.meanExtraMs {
			t.Errorf("%s: delay-aware rule adds %.1f ms on average, weight-only %.1f ms", overflowRegime(regime), n.meanExtraMs, w.meanExtraMs)
		}
	}
	w, n := summarise(all[weightOnly]), summarise(all[nearest])
	t.Logf("%-10s weight-only (thesis): %s", "all", w)
	t.Logf("%-10s nearest with room:    %s", "all", n)
	if n.meanExtraMs >= w.meanExtraMs {
		t.Errorf("all episodes: delay-aware rule adds %.1f ms on average, weight-only %.1f ms", n.meanExtraMs, w.meanExtraMs)
	}
}
