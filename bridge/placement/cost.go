package placement

import "math"

// Evaluation is the value of a plan under the thesis's objective (eq. 2.1)
// and bandwidth constraint (eq. 2.5).
type Evaluation struct {
	// Cost is eq. 2.1 in milliseconds: the sum over exchanges of the mean
	// propagation delay from publisher to interested consumer through the
	// synchronisation site, plus λ·h_i over the exchange's number of
	// (publication, consumer) pairs (see fillObjective in input.go for how
	// the pairs are estimated from per-instance counts).
	Cost float64
	// MeanLatency is the delay part of Cost: the sum over exchanges of the
	// mean delay in milliseconds.
	MeanLatency float64
	// Moves counts exchanges whose synchronisation site differs from the
	// previous plan's.
	Moves int
	// Overload is by how much the plan exceeds eq. 2.5, in bytes per
	// second: the sum over sites and directions of the estimated overlay
	// throughput above the bandwidth (less the sites' work-queue
	// overflow, Site.WorkQueueInbound/Outbound). 0 means the plan is
	// feasible.
	Overload float64
	// InboundLoad and OutboundLoad are each site's estimated overlay
	// throughput under the plan (eq. 2.11 summed over all exchanges), in
	// bytes per second.
	InboundLoad, OutboundLoad map[string]float64
}

// Feasible reports whether the plan respects every site's inbound and
// outbound bandwidth.
func (e Evaluation) Feasible() bool { return e.Overload == 0 }

// Better reports whether e is strictly preferable to o: less overload
// first (a feasible plan beats every infeasible one), then lower cost.
// The exact search minimises this order.
func (e Evaluation) Better(o Evaluation) bool {
	return evaluationLess(e.Overload, e.Cost, o.Overload, o.Cost)
}

// relativeTolerance absorbs floating-point rounding when comparing sums
// computed in different orders.
const relativeTolerance = 1e-9

// fits reports whether load stays within bandwidth (eq. 2.5; +Inf is
// unlimited).
func fits(load, bandwidth float64) bool { return load <= bandwidth*(1+relativeTolerance) }

func overloadOf(load, bandwidth float64) float64 {
	if fits(load, bandwidth) {
		return 0
	}
	return load - bandwidth
}

func nearlyEqual(a, b float64) bool {
	if a == b {
		return true
	}
	if math.IsInf(a, 0) || math.IsInf(b, 0) {
		return false
	}
	return math.Abs(a-b) <= relativeTolerance*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

func evaluationLess(overloadA, costA, overloadB, costB float64) bool {
	if !nearlyEqual(overloadA, overloadB) {
		return overloadA < overloadB
	}
	return costA < costB && !nearlyEqual(costA, costB)
}

// Evaluate returns the cost, feasibility and per-site load of plan p for
// in. Every exchange of in must be assigned a site holding one of its
// instances.
func Evaluate(in Input, p Plan) (Evaluation, error) {
	m, err := build(in)
	if err != nil {
		return Evaluation{}, err
	}
	choice, err := m.positions(p)
	if err != nil {
		return Evaluation{}, err
	}
	return m.evaluate(choice), nil
}

// positions converts a plan into per-exchange node positions.
func (m *model) positions(p Plan) ([]int, error) {
	choice := make([]int, len(m.exchanges))
	for i, x := range m.exchanges {
		site, ok := p[x.name]
		if !ok {
			return nil, invalid("plan has no site for exchange %q", x.name)
		}
		choice[i] = -1
		for pos, j := range x.nodes {
			if m.siteNames[j] == site {
				choice[i] = pos
			}
		}
		if choice[i] < 0 {
			return nil, invalid("plan puts exchange %q at %q, which holds no instance of it", x.name, site)
		}
	}
	return choice, nil
}

// plan converts per-exchange node positions into a Plan.
func (m *model) plan(choice []int) Plan {
	p := make(Plan, len(choice))
	for i, x := range m.exchanges {
		p[x.name] = m.siteNames[x.nodes[choice[i]]]
	}
	return p
}

// loads returns every site's estimated overlay throughput with each
// exchange synchronised at choice: the synchronisation traffic at the
// chosen node and the non-synchronisation estimate elsewhere.
func (m *model) loads(choice []int) (in, out []float64) {
	in, out = make([]float64, len(m.siteNames)), make([]float64, len(m.siteNames))
	for i, x := range m.exchanges {
		for pos, j := range x.nodes {
			if pos == choice[i] {
				in[j] += x.syncIn
				out[j] += x.syncOut
			} else {
				in[j] += x.nonSyncIn[pos]
				out[j] += x.nonSyncOut[pos]
			}
		}
	}
	return in, out
}

func (m *model) evaluate(choice []int) Evaluation {
	e := Evaluation{InboundLoad: map[string]float64{}, OutboundLoad: map[string]float64{}}
	for i, x := range m.exchanges {
		e.Cost += x.objective[choice[i]]
		e.MeanLatency += x.meanLatencyMs[choice[i]]
		if x.previous >= 0 && choice[i] != x.previous {
			e.Moves++
		}
	}
	in, out := m.loads(choice)
	for j, name := range m.siteNames {
		e.InboundLoad[name], e.OutboundLoad[name] = in[j], out[j]
		e.Overload += overloadOf(in[j], m.bwIn[j]) + overloadOf(out[j], m.bwOut[j])
	}
	return e
}
