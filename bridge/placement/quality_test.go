package placement

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// qualityInstances is how many random instances the quality test draws per
// configuration.
const qualityInstances = 1000

// quality summarises how close a placement method comes to the exact
// optimum over random instances.
//
// An instance's ratio is the method's eq. 2.1 cost over the optimum's when
// some plan is feasible (+Inf if the method's plan is not feasible then),
// and the method's bandwidth overload over the least possible when no plan
// is feasible (the optimum minimises overload first, like
// Evaluation.Better; equal overloads compare costs).
type quality struct {
	ratios []float64 // sorted
	// feasibleRatios and noFeasibleRatios split ratios by whether some plan
	// was feasible.
	feasibleRatios, noFeasibleRatios []float64
	// infeasibleMiss counts instances where a feasible plan exists but the
	// method's is not.
	infeasibleMiss int
}

// shareWithin is the share of ratios at most limit.
func shareWithin(ratios []float64, limit float64) float64 {
	n := 0
	for _, r := range ratios {
		if r <= limit*(1+relativeTolerance) {
			n++
		}
	}
	return float64(n) / float64(max(len(ratios), 1))
}

func (q quality) quantile(p float64) float64 {
	return q.ratios[int(math.Ceil(p*float64(len(q.ratios))))-1]
}

func (q quality) String() string {
	subset := func(ratios []float64) string {
		if len(ratios) == 0 {
			return "none"
		}
		return fmt.Sprintf("%5.1f%% of %d", 100*shareWithin(ratios, 1.1), len(ratios))
	}
	return fmt.Sprintf("within 10%%: %5.1f%% of %d (feasible: %s, no feasible plan: %s), optimal %5.1f%%, median %.4f, p95 %.4f, worst %.4f, infeasible though a feasible plan exists: %d",
		100*shareWithin(q.ratios, 1.1), len(q.ratios), subset(q.feasibleRatios), subset(q.noFeasibleRatios),
		100*shareWithin(q.ratios, 1), q.quantile(0.5), q.quantile(0.95), q.ratios[len(q.ratios)-1], q.infeasibleMiss)
}

// placer is a placement method under test.
type placer func(Input) (Plan, error)

func thesisPlacer(in Input) (Plan, error) {
	r, err := Heuristic(in)
	return r.Plan, err
}

func improvedPlacer(in Input) (Plan, error) {
	r, err := Improved(in)
	return r.Plan, err
}

func measureQuality(t testing.TB, shape instanceShape, seed uint64, method placer) quality {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	var q quality
	for range qualityInstances {
		in := randomInstance(rng, shape)
		_, best, err := Optimum(in)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := method(in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Evaluate(in, plan)
		if err != nil {
			t.Fatal(err)
		}
		if got.Better(best) {
			t.Fatalf("a method beat the exact optimum: %+v vs %+v for %+v", got, best, in)
		}
		q.ratios = append(q.ratios, ratio(got, best, &q))
	}
	slices.Sort(q.ratios)
	return q
}

func ratio(got, best Evaluation, q *quality) float64 {
	divide := func(a, b float64) float64 {
		if nearlyEqual(a, b) {
			return 1
		}
		if b == 0 {
			return math.Inf(1)
		}
		return a / b
	}
	var r float64
	switch {
	case !best.Feasible():
		r = divide(got.Overload, best.Overload)
		if nearlyEqual(got.Overload, best.Overload) {
			r = divide(got.Cost, best.Cost)
		}
		q.noFeasibleRatios = append(q.noFeasibleRatios, r)
		return r
	case !got.Feasible():
		q.infeasibleMiss++
		r = math.Inf(1)
	default:
		r = divide(got.Cost, best.Cost)
	}
	q.feasibleRatios = append(q.feasibleRatios, r)
	return r
}

// qualityConfigurations are the random instance families measured.
var qualityConfigurations = []struct {
	name  string
	shape instanceShape
}{
	{"lambda=0", defaultShape},
	{"lambda~centrality", func() instanceShape { s := defaultShape; s.lambdaScale = 1; return s }()},
	{"unconstrained", func() instanceShape { s := defaultShape; s.unlimitedShare = 1; return s }()},
}

var placementMethods = []struct {
	name   string
	method placer
}{{"thesis", thesisPlacer}, {"improved", improvedPlacer}}

// TestPlacementQuality measures both methods against the exact optimum on
// 1 000 random instances per configuration (go test -v prints the
// numbers) and asserts issue 8's goal — within 10 % of the optimum on at
// least 95 % of instances — for Improved. The thesis heuristic does not
// reach it (see doc.go); its numbers are reported, not asserted.
func TestPlacementQuality(t *testing.T) {
	for _, c := range qualityConfigurations {
		for _, m := range placementMethods {
			q := measureQuality(t, c.shape, 1, m.method)
			t.Logf("%-18s %-8s %s", c.name, m.name, q)
			if m.name == "improved" {
				if share := shareWithin(q.ratios, 1.1); share < 0.95 {
					t.Errorf("%s: Improved within 10%% of the optimum on %.1f%% of instances, goal 95%%", c.name, 100*share)
				}
			}
		}
	}
}

// BenchmarkPlacementQuality times each method per instance on the quality
// test's instances and reports its quality as metrics:
//
//	go test -run '^$' -bench PlacementQuality -benchmem ./bridge/placement/
func BenchmarkPlacementQuality(b *testing.B) {
	for _, c := range qualityConfigurations {
		for _, m := range placementMethods {
			b.Run(c.name+"/"+m.name, func(b *testing.B) {
				q := measureQuality(b, c.shape, 1, m.method)
				rng := rand.New(rand.NewPCG(1, 0x9e3779b97f4a7c15))
				instances := make([]Input, 100)
				for i := range instances {
					instances[i] = randomInstance(rng, c.shape)
				}
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					if _, err := m.method(instances[i%len(instances)]); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(100*shareWithin(q.ratios, 1.1), "%within10%")
				b.ReportMetric(q.quantile(0.5), "median-ratio")
				b.ReportMetric(q.quantile(0.95), "p95-ratio")
			})
		}
	}
}
