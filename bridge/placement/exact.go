package placement

import "math"

// MaxExactSites and MaxExactExchanges bound the instances Optimum accepts:
// at most 6^6 = 46 656 plans.
const (
	MaxExactSites     = 6
	MaxExactExchanges = 6
)

// Optimum returns a plan minimising Evaluation.Better's order — the least
// bandwidth overload (zero whenever some plan is feasible), then the least
// eq. 2.1 cost — by exhaustive search with branch and bound, for instances
// of at most MaxExactSites sites and MaxExactExchanges exchanges. Ties go
// to the first plan in enumeration order (exchanges in input order, sites
// in instance order). It uses the same load estimates as the heuristic and
// Evaluate.
func Optimum(in Input) (Plan, Evaluation, error) {
	if len(in.Sites) > MaxExactSites || len(in.Exchanges) > MaxExactExchanges {
		return nil, Evaluation{}, invalid("exact search is limited to %d sites and %d exchanges, got %d and %d",
			MaxExactSites, MaxExactExchanges, len(in.Sites), len(in.Exchanges))
	}
	m, err := build(in)
	if err != nil {
		return nil, Evaluation{}, err
	}
	choice := m.optimum()
	return m.plan(choice), m.evaluate(choice), nil
}

// exactSearch is the state of one exhaustive search.
type exactSearch struct {
	m               *model
	loadIn, loadOut []float64
	current, best   []int
	bestOverload    float64
	bestCost        float64
	// lowerBound[i] is the least cost exchanges i.. can add.
	lowerBound []float64
}

func (m *model) optimum() []int {
	n := len(m.exchanges)
	s := &exactSearch{
		m:            m,
		current:      make([]int, n),
		best:         make([]int, n),
		bestOverload: math.Inf(1),
		bestCost:     math.Inf(1),
		lowerBound:   make([]float64, n+1),
	}
	s.loadIn, s.loadOut = m.initialLoads()
	for i := n - 1; i >= 0; i-- {
		s.lowerBound[i] = s.lowerBound[i+1] + minOf(m.exchanges[i].objective)
	}
	s.search(0, 0)
	return s.best
}

func minOf(v []float64) float64 {
	least := math.Inf(1)
	for _, x := range v {
		least = math.Min(least, x)
	}
	return least
}

func (s *exactSearch) search(i int, cost float64) {
	if s.bestOverload == 0 && cost+s.lowerBound[i] >= s.bestCost {
		return // no completion can be strictly better
	}
	if i == len(s.m.exchanges) {
		overload := 0.0
		for j := range s.loadIn {
			overload += overloadOf(s.loadIn[j], s.m.bwIn[j]) + overloadOf(s.loadOut[j], s.m.bwOut[j])
		}
		if evaluationLess(overload, cost, s.bestOverload, s.bestCost) {
			s.bestOverload, s.bestCost = overload, cost
			copy(s.best, s.current)
		}
		return
	}
	x := &s.m.exchanges[i]
	for pos, j := range x.nodes {
		s.loadIn[j] += x.syncIn - x.nonSyncIn[pos]
		s.loadOut[j] += x.syncOut - x.nonSyncOut[pos]
		s.current[i] = pos
		s.search(i+1, cost+x.objective[pos])
		s.loadIn[j] -= x.syncIn - x.nonSyncIn[pos]
		s.loadOut[j] -= x.syncOut - x.nonSyncOut[pos]
	}
}
