package placement

import (
	"cmp"
	"math"
	"slices"
)

// Reason says why the heuristic gave an exchange its synchronisation site.
type Reason string

const (
	// ReasonBestScore: the best-scored site fits within its bandwidth.
	ReasonBestScore Reason = "best-score"
	// ReasonBandwidth: better-scored sites would exceed their bandwidth;
	// the chosen site is the best-scored one that fits.
	ReasonBandwidth Reason = "bandwidth"
	// ReasonLeastLoaded: no site fits, so the exchange goes to the site with
	// the least estimated overlay throughput (the constraint is soft).
	ReasonLeastLoaded Reason = "least-loaded"
)

// Candidate is one site considered for an exchange.
type Candidate struct {
	// Site is the candidate site's name.
	Site string
	// Centrality is the weighted closeness centrality C_i(n_j) (eq. 2.9),
	// in messages per second per millisecond of delay; +Inf when the other
	// instances are at zero delay (or there are none) and the site has
	// local traffic.
	Centrality float64
	// Score is Centrality less λ unless the site is the previous
	// synchronisation site (algorithm 2.1, lines 12–16).
	Score float64
	// Cost is the exchange's term of eq. 2.1 with its sync site here, in
	// milliseconds (what Improved walks by; Heuristic only reports it).
	Cost float64
	// Fits reports whether, when the exchange was placed, making this site
	// its synchronisation site kept the site within its inbound and
	// outbound bandwidth (eq. 2.11).
	Fits bool
}

// Decision records how the heuristic placed one exchange.
type Decision struct {
	// Exchange is the exchange's name.
	Exchange string
	// Traffic is P(E_i), the exchange's total local traffic (eq. 2.6), which
	// orders the exchanges.
	Traffic float64
	// Previous is the previous synchronisation site ("" if none).
	Previous string
	// Site is the chosen synchronisation site.
	Site string
	// Reason says why Site was chosen.
	Reason Reason
	// Candidates lists the exchange's sites in the order the method walked
	// them: score descending for Heuristic, cost ascending for Improved.
	Candidates []Candidate
}

// Moved reports whether the decision changes the exchange's
// synchronisation site.
func (d Decision) Moved() bool { return d.Previous != "" && d.Previous != d.Site }

// Result is a plan with the decisions that produced it.
type Result struct {
	// Plan maps every exchange of the input to its synchronisation site.
	Plan Plan
	// Decisions are in the order the exchanges were placed.
	Decisions []Decision
}

// Heuristic runs the thesis's algorithm 2.1 (§2.5) as written:
//
//  1. initialise each instance's estimated overlay throughput F_ij (eq.
//     2.10; the previous synchronisation site borrows the estimate of
//     another instance chosen at random, reproducibly through Input.Seed);
//  2. sort the exchanges by total local traffic P(E_i) (eq. 2.6), busiest
//     first (ties by name);
//  3. for each exchange, score each of its sites by weighted closeness
//     centrality C_i(n_j) = P_ij / Σ_{k≠j} d(n_k, n_j) (eq. 2.9), subtract
//     λ from every site but the previous synchronisation site, walk the
//     sites by score (ties: previous site first, then by name) and keep
//     the first whose estimated inbound and outbound throughput, with this
//     exchange's synchronisation traffic in place of its estimate, stays
//     within its bandwidth (eq. 2.11); if none does, take the site with
//     the least estimated total (inbound + outbound) throughput; then
//     replace the chosen site's estimate by the synchronisation traffic.
//
// A plan is always produced for valid input.
func Heuristic(in Input) (Result, error) {
	m, err := build(in)
	if err != nil {
		return Result{}, err
	}
	choice, decisions := m.thesisHeuristic(in.Previous)
	return Result{Plan: m.plan(choice), Decisions: decisions}, nil
}

// thesisHeuristic returns the chosen node position per exchange and the
// decisions in placement order.
func (m *model) thesisHeuristic(previous Plan) ([]int, []Decision) {
	loadIn, loadOut := m.initialLoads()
	order := m.busiestFirst()
	choice := make([]int, len(m.exchanges))
	decisions := make([]Decision, 0, len(order))
	for _, i := range order {
		x := &m.exchanges[i]
		walk := m.scoredNodes(x)
		d := Decision{Exchange: x.name, Traffic: x.total, Previous: previous[x.name], Reason: ReasonLeastLoaded}
		if x.previous < 0 {
			d.Previous = ""
		}
		chosen := -1
		for rank, c := range walk {
			j := x.nodes[c.position]
			c.candidate.Fits = fits(loadIn[j]-x.nonSyncIn[c.position]+x.syncIn, m.bwIn[j]) &&
				fits(loadOut[j]-x.nonSyncOut[c.position]+x.syncOut, m.bwOut[j])
			d.Candidates = append(d.Candidates, c.candidate)
			if chosen < 0 && c.candidate.Fits {
				chosen = c.position
				d.Reason = ReasonBestScore
				if rank > 0 {
					d.Reason = ReasonBandwidth
				}
			}
		}
		if chosen < 0 {
			// Algorithm 2.1, lines 25–28: the least-loaded site so far.
			least := math.Inf(1)
			for _, c := range walk {
				j := x.nodes[c.position]
				if total := loadIn[j] + loadOut[j]; total < least {
					least, chosen = total, c.position
				}
			}
		}
		j := x.nodes[chosen]
		// Line 29: the chosen site now carries the synchronisation traffic.
		loadIn[j] += x.syncIn - x.nonSyncIn[chosen]
		loadOut[j] += x.syncOut - x.nonSyncOut[chosen]
		choice[i] = chosen
		d.Site = m.siteNames[j]
		decisions = append(decisions, d)
	}
	return choice, decisions
}

// initialLoads sums every instance's non-synchronisation estimate per site
// (algorithm 2.1, lines 1–3).
func (m *model) initialLoads() (in, out []float64) {
	in, out = make([]float64, len(m.siteNames)), make([]float64, len(m.siteNames))
	for _, x := range m.exchanges {
		for pos, j := range x.nodes {
			in[j] += x.nonSyncIn[pos]
			out[j] += x.nonSyncOut[pos]
		}
	}
	return in, out
}

type scoredNode struct {
	position  int
	candidate Candidate
}

// scoredNodes scores the exchange's nodes (eq. 2.9 and the λ penalty) and
// sorts them by score, descending.
func (m *model) scoredNodes(x *exchangeModel) []scoredNode {
	walk := make([]scoredNode, len(x.nodes))
	for p, j := range x.nodes {
		var distance float64
		for _, k := range x.nodes {
			if k != j {
				distance += m.delayMs[k][j]
			}
		}
		centrality := 0.0
		switch {
		case distance > 0:
			centrality = x.localTraffic[p] / distance
		case x.localTraffic[p] > 0:
			centrality = math.Inf(1)
		}
		score := centrality
		if p != x.previous {
			score -= m.lambda
		}
		walk[p] = scoredNode{position: p, candidate: Candidate{Site: m.siteNames[j], Centrality: centrality, Score: score, Cost: x.objective[p]}}
	}
	slices.SortStableFunc(walk, func(a, b scoredNode) int {
		if c := cmp.Compare(b.candidate.Score, a.candidate.Score); c != 0 {
			return c
		}
		if (a.position == x.previous) != (b.position == x.previous) {
			if a.position == x.previous {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.candidate.Site, b.candidate.Site)
	})
	return walk
}
