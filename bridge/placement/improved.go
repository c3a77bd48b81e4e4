package placement

import (
	"cmp"
	"slices"
)

// ReasonLocalSearch: the local-search pass of Improved moved the exchange
// from the site the greedy pass chose, lowering the plan's overload or
// cost.
const ReasonLocalSearch Reason = "local-search"

// Improved is a documented improvement over algorithm 2.1, kept apart from
// Heuristic, which stays as the thesis specifies. It differs in two ways:
//
//  1. Cost-aware greedy: exchanges are still placed busiest first, but each
//     exchange walks its sites by its own term of the objective (eq. 2.1:
//     the mean publisher → synchronisation site → consumer delay plus the
//     reconfiguration penalty) instead of by weighted closeness
//     centrality, which ignores where the traffic goes and subtracts λ in
//     different units. The first site within bandwidth wins; if none is,
//     the site whose choice adds the least overload wins (instead of the
//     least total throughput).
//  2. Local search: starting from both this greedy plan and the thesis
//     heuristic's plan, it moves one exchange, then two exchanges jointly,
//     to other sites while that makes the plan strictly better in
//     Evaluation.Better's order (less overload, then lower cost), until no
//     such move is left; the better of the two results is returned.
//
// It is deterministic and, for J exchanges on at most m sites, each pass
// costs O(J²·m³).
func Improved(in Input) (Result, error) {
	m, err := build(in)
	if err != nil {
		return Result{}, err
	}
	greedy, decisions := m.costGreedy(in.Previous)
	thesis, _ := m.thesisHeuristic(in.Previous)
	fromGreedy, fromThesis := m.localSearch(greedy), m.localSearch(thesis)
	best := fromGreedy
	if m.evaluate(fromThesis).Better(m.evaluate(fromGreedy)) {
		best = fromThesis
	}
	byName := make(map[string]int, len(m.exchanges))
	for i, x := range m.exchanges {
		byName[x.name] = i
	}
	for k := range decisions {
		i := byName[decisions[k].Exchange]
		if site := m.siteNames[m.exchanges[i].nodes[best[i]]]; site != decisions[k].Site {
			decisions[k].Site, decisions[k].Reason = site, ReasonLocalSearch
		}
	}
	return Result{Plan: m.plan(best), Decisions: decisions}, nil
}

// costGreedy is step 1 of Improved.
func (m *model) costGreedy(previous Plan) ([]int, []Decision) {
	loadIn, loadOut := m.initialLoads()
	order := m.busiestFirst()
	choice := make([]int, len(m.exchanges))
	decisions := make([]Decision, 0, len(order))
	for _, i := range order {
		x := &m.exchanges[i]
		walk := m.scoredNodes(x)
		slices.SortStableFunc(walk, func(a, b scoredNode) int {
			if c := cmp.Compare(x.objective[a.position], x.objective[b.position]); c != 0 {
				return c
			}
			return cmp.Compare(a.candidate.Site, b.candidate.Site)
		})
		d := Decision{Exchange: x.name, Traffic: x.total, Reason: ReasonLeastLoaded}
		if x.previous >= 0 {
			d.Previous = previous[x.name]
		}
		chosen, leastAdded := -1, 0.0
		for rank, c := range walk {
			j := x.nodes[c.position]
			in, out := loadIn[j]-x.nonSyncIn[c.position]+x.syncIn, loadOut[j]-x.nonSyncOut[c.position]+x.syncOut
			c.candidate.Fits = fits(in, m.bwIn[j]) && fits(out, m.bwOut[j])
			d.Candidates = append(d.Candidates, c.candidate)
			if d.Reason == ReasonLeastLoaded && c.candidate.Fits {
				chosen = c.position
				d.Reason = ReasonBestScore
				if rank > 0 {
					d.Reason = ReasonBandwidth
				}
			}
			if d.Reason == ReasonLeastLoaded {
				added := overloadOf(in, m.bwIn[j]) - overloadOf(loadIn[j], m.bwIn[j]) +
					overloadOf(out, m.bwOut[j]) - overloadOf(loadOut[j], m.bwOut[j])
				if chosen < 0 || added < leastAdded && !nearlyEqual(added, leastAdded) {
					chosen, leastAdded = c.position, added
				}
			}
		}
		j := x.nodes[chosen]
		loadIn[j] += x.syncIn - x.nonSyncIn[chosen]
		loadOut[j] += x.syncOut - x.nonSyncOut[chosen]
		choice[i] = chosen
		d.Site = m.siteNames[j]
		decisions = append(decisions, d)
	}
	return choice, decisions
}

// busiestFirst orders exchange indices by P(E_i) descending, ties by name.
func (m *model) busiestFirst() []int {
	order := make([]int, len(m.exchanges))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		if c := cmp.Compare(m.exchanges[b].total, m.exchanges[a].total); c != 0 {
			return c
		}
		return cmp.Compare(m.exchanges[a].name, m.exchanges[b].name)
	})
	return order
}

// searchState is a plan with its loads, overload and cost kept up to date
// under moves.
type searchState struct {
	m               *model
	choice          []int
	loadIn, loadOut []float64
	cost            float64
}

func (s *searchState) move(i, pos int) {
	x := &s.m.exchanges[i]
	old, j, k := s.choice[i], x.nodes[s.choice[i]], x.nodes[pos]
	s.loadIn[j] += x.nonSyncIn[old] - x.syncIn
	s.loadOut[j] += x.nonSyncOut[old] - x.syncOut
	s.loadIn[k] += x.syncIn - x.nonSyncIn[pos]
	s.loadOut[k] += x.syncOut - x.nonSyncOut[pos]
	s.cost += x.objective[pos] - x.objective[old]
	s.choice[i] = pos
}

func (s *searchState) overload() float64 {
	var total float64
	for j := range s.loadIn {
		total += overloadOf(s.loadIn[j], s.m.bwIn[j]) + overloadOf(s.loadOut[j], s.m.bwOut[j])
	}
	return total
}

// localSearch is step 2 of Improved: it returns start improved until no
// single or paired move makes it strictly better.
func (m *model) localSearch(start []int) []int {
	s := &searchState{m: m, choice: slices.Clone(start)}
	s.loadIn, s.loadOut = m.loads(s.choice)
	for i, x := range m.exchanges {
		s.cost += x.objective[s.choice[i]]
	}
	currentOverload := s.overload()
	for improved := true; improved; {
		improved = false
		for i, x := range m.exchanges {
			for pos := range x.nodes {
				if pos == s.choice[i] {
					continue
				}
				before, cost := s.choice[i], s.cost
				s.move(i, pos)
				if o := s.overload(); evaluationLess(o, s.cost, currentOverload, cost) {
					currentOverload, improved = o, true
					continue
				}
				s.move(i, before)
			}
		}
		if improved {
			continue
		}
		for a := range m.exchanges {
			for b := a + 1; b < len(m.exchanges); b++ {
				for pa := range m.exchanges[a].nodes {
					for pb := range m.exchanges[b].nodes {
						if pa == s.choice[a] || pb == s.choice[b] {
							continue // single moves were tried above
						}
						beforeA, beforeB, cost := s.choice[a], s.choice[b], s.cost
						s.move(a, pa)
						s.move(b, pb)
						if o := s.overload(); evaluationLess(o, s.cost, currentOverload, cost) {
							currentOverload, improved = o, true
							continue
						}
						s.move(b, beforeB)
						s.move(a, beforeA)
					}
				}
			}
		}
	}
	return s.choice
}
