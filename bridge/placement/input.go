package placement

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"time"
)

// Site is one edge site that can host synchronisation instances.
type Site struct {
	// Name identifies the site (the controller's site name).
	Name string
	// InboundBandwidth is B_o^in(n), the overlay bandwidth the site may
	// receive, in bytes per second (the unit of Instance counts times
	// Exchange.MeanMessageSize). 0 means unlimited.
	InboundBandwidth float64
	// OutboundBandwidth is B_o^out(n), the overlay bandwidth the site may
	// send, in bytes per second. 0 means unlimited.
	OutboundBandwidth float64
	// WorkQueueInbound and WorkQueueOutbound are the work-queue overflow
	// (§2.3) the site receives from and sends to other sites over the same
	// overlay, in bytes per second. Pub/sub traffic gets what they leave of
	// the bandwidth (none when they take it all): a site whose links carry
	// much overflow is a worse synchronisation site. 0 when unknown.
	WorkQueueInbound  float64
	WorkQueueOutbound float64
}

// Instance is what one site's instance of a global exchange carried during
// the last measurement period (thesis table 2.2), in messages per second.
type Instance struct {
	// Site is the site holding this instance.
	Site string
	// LocalPublished is P^in_ij: messages local clients published into the
	// exchange at this site.
	LocalPublished float64
	// LocalConsumed is P^out_ij: messages the exchange delivered to local
	// consumers at this site.
	LocalConsumed float64
	// OverlayIn is T^in_ij: messages this instance received over the
	// overlay (federation links) from other sites.
	OverlayIn float64
	// OverlayOut is T^out_ij: messages this instance sent over the overlay
	// to other sites.
	OverlayOut float64
}

// Exchange is one global exchange E_i and its instances N_i.
type Exchange struct {
	// Name is the exchange name (pubsub*), the key of a Plan.
	Name string
	// MeanMessageSize is D(E_i), the mean size in bytes of the messages
	// sent to the exchange.
	MeanMessageSize float64
	// Instances lists the sites holding an instance (N_i) with their
	// traffic; each site appears at most once.
	Instances []Instance
}

// Plan maps each global exchange name to the name of its synchronisation
// site (the thesis's S_t).
type Plan map[string]string

// Delays is the inter-site one-way propagation delay matrix d(a, b):
// Delays[a][b]. One direction suffices for a pair with symmetric delays:
// Between falls back to Delays[b][a].
type Delays map[string]map[string]time.Duration

// Between returns d(a, b): 0 for a == b, Delays[a][b], or else
// Delays[b][a]; ok is false when neither is given.
func (d Delays) Between(a, b string) (delay time.Duration, ok bool) {
	if a == b {
		return 0, true
	}
	if v, found := d[a][b]; found {
		return v, true
	}
	v, found := d[b][a]
	return v, found
}

// Input holds everything algorithm 2.1 reads for one reconfiguration.
type Input struct {
	// Sites is the set of nodes N with their overlay bandwidth.
	Sites []Site
	// Exchanges is the set of global exchanges E.
	Exchanges []Exchange
	// Delays holds d(n_k, n_j) for every pair of sites.
	Delays Delays
	// Previous is the previous synchronisation plan S_{t-1}; nil or missing
	// entries mean the exchange had no synchronisation site yet.
	Previous Plan
	// Lambda is λ, the reconfiguration penalty: subtracted from the score
	// of every site but the previous synchronisation site (algorithm 2.1,
	// lines 12–16) and added to the objective of an exchange whose
	// synchronisation site changes (eq. 2.1, 2.3).
	Lambda float64
	// Seed makes the "randomly chosen other node" of §2.5.2 (whose estimate
	// the previous synchronisation site borrows) reproducible.
	Seed uint64
}

// ErrInvalidInput wraps every validation error of an Input.
var ErrInvalidInput = errors.New("placement: invalid input")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidInput, fmt.Sprintf(format, args...))
}

// model is an Input validated and indexed for the algorithms: sites and
// instances by position, delays in milliseconds, estimates in bytes per
// second.
type model struct {
	siteNames []string
	bwIn      []float64 // +Inf when unlimited; less the work-queue overflow
	bwOut     []float64
	delayMs   [][]float64
	exchanges []exchangeModel
	lambda    float64
}

// exchangeModel is one exchange of a model; per-node slices are aligned
// with nodes.
type exchangeModel struct {
	name  string
	nodes []int // site indices of N_i
	// previous is the position in nodes of S_{t-1}(E_i), -1 if none.
	previous int
	// localTraffic is P_ij = P^in_ij + P^out_ij (eq. 2.7).
	localTraffic []float64
	// total is P(E_i) (eq. 2.6).
	total float64
	// nonSyncIn and nonSyncOut are the initial estimates F^in_ij, F^out_ij
	// (eq. 2.10; the previous synchronisation site borrows another node's).
	nonSyncIn, nonSyncOut []float64
	// syncIn and syncOut are the synchronisation traffic T_is × D(E_i).
	syncIn, syncOut float64
	// objective is the exchange's term of eq. 2.1 per candidate node.
	objective []float64
	// meanLatencyMs is the mean latency part of objective, per node.
	meanLatencyMs []float64
}

func finiteNonNegative(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) && v >= 0 }

// build validates in and derives the model shared by the heuristic, the
// cost function and the exact search, so that all three see the same
// estimates.
func build(in Input) (*model, error) {
	if len(in.Sites) == 0 {
		return nil, invalid("no sites")
	}
	if !finiteNonNegative(in.Lambda) {
		return nil, invalid("lambda %v is not a finite non-negative number", in.Lambda)
	}
	m := &model{lambda: in.Lambda}
	index := make(map[string]int, len(in.Sites))
	for i, s := range in.Sites {
		if s.Name == "" {
			return nil, invalid("site %d has no name", i)
		}
		if _, dup := index[s.Name]; dup {
			return nil, invalid("site %q listed twice", s.Name)
		}
		if !finiteNonNegative(s.InboundBandwidth) || !finiteNonNegative(s.OutboundBandwidth) {
			return nil, invalid("site %q: bandwidth must be finite and non-negative", s.Name)
		}
		if !finiteNonNegative(s.WorkQueueInbound) || !finiteNonNegative(s.WorkQueueOutbound) {
			return nil, invalid("site %q: work-queue traffic must be finite and non-negative", s.Name)
		}
		index[s.Name] = i
		m.siteNames = append(m.siteNames, s.Name)
		m.bwIn = append(m.bwIn, max(unlimitedIfZero(s.InboundBandwidth)-s.WorkQueueInbound, 0))
		m.bwOut = append(m.bwOut, max(unlimitedIfZero(s.OutboundBandwidth)-s.WorkQueueOutbound, 0))
	}
	m.delayMs = make([][]float64, len(in.Sites))
	for a, sa := range in.Sites {
		m.delayMs[a] = make([]float64, len(in.Sites))
		for b, sb := range in.Sites {
			d, ok := in.Delays.Between(sa.Name, sb.Name)
			if !ok {
				return nil, invalid("no delay between %q and %q", sa.Name, sb.Name)
			}
			if d < 0 {
				return nil, invalid("negative delay between %q and %q", sa.Name, sb.Name)
			}
			m.delayMs[a][b] = float64(d) / float64(time.Millisecond)
		}
	}
	seen := make(map[string]bool, len(in.Exchanges))
	for _, e := range in.Exchanges {
		if e.Name == "" {
			return nil, invalid("an exchange has no name")
		}
		if seen[e.Name] {
			return nil, invalid("exchange %q listed twice", e.Name)
		}
		seen[e.Name] = true
		x, err := m.buildExchange(e, index, in.Previous[e.Name], in.Seed)
		if err != nil {
			return nil, err
		}
		m.exchanges = append(m.exchanges, x)
	}
	return m, nil
}

func unlimitedIfZero(bw float64) float64 {
	if bw == 0 {
		return math.Inf(1)
	}
	return bw
}

func (m *model) buildExchange(e Exchange, index map[string]int, previousSite string, seed uint64) (exchangeModel, error) {
	if len(e.Instances) == 0 {
		return exchangeModel{}, invalid("exchange %q has no instance", e.Name)
	}
	if !finiteNonNegative(e.MeanMessageSize) {
		return exchangeModel{}, invalid("exchange %q: mean message size must be finite and non-negative", e.Name)
	}
	n := len(e.Instances)
	x := exchangeModel{
		name:          e.Name,
		previous:      -1,
		nodes:         make([]int, n),
		localTraffic:  make([]float64, n),
		nonSyncIn:     make([]float64, n),
		nonSyncOut:    make([]float64, n),
		objective:     make([]float64, n),
		meanLatencyMs: make([]float64, n),
	}
	published, consumed := make([]float64, n), make([]float64, n)
	var totalPublished, totalConsumed float64
	for p, inst := range e.Instances {
		site, ok := index[inst.Site]
		if !ok {
			return x, invalid("exchange %q: instance at unknown site %q", e.Name, inst.Site)
		}
		for _, earlier := range x.nodes[:p] {
			if earlier == site {
				return x, invalid("exchange %q: site %q listed twice", e.Name, inst.Site)
			}
		}
		for _, v := range []float64{inst.LocalPublished, inst.LocalConsumed, inst.OverlayIn, inst.OverlayOut} {
			if !finiteNonNegative(v) {
				return x, invalid("exchange %q at %q: counts must be finite and non-negative", e.Name, inst.Site)
			}
		}
		x.nodes[p] = site
		if inst.Site == previousSite {
			x.previous = p
		}
		published[p], consumed[p] = inst.LocalPublished, inst.LocalConsumed
		totalPublished += inst.LocalPublished
		totalConsumed += inst.LocalConsumed
		x.localTraffic[p] = inst.LocalPublished + inst.LocalConsumed
		x.total += x.localTraffic[p]
		// Eq. 2.10: F_ij = T_ij × D(E_i).
		x.nonSyncIn[p] = inst.OverlayIn * e.MeanMessageSize
		x.nonSyncOut[p] = inst.OverlayOut * e.MeanMessageSize
	}
	if x.previous >= 0 {
		// §2.5.2: the previous synchronisation site's overlay traffic is all
		// synchronisation traffic (T_is × D(E_i)); as a candidate it starts
		// from the estimate of another node chosen at random.
		x.syncIn, x.syncOut = x.nonSyncIn[x.previous], x.nonSyncOut[x.previous]
		if n > 1 {
			h := fnv.New64a()
			h.Write([]byte(e.Name))
			rng := rand.New(rand.NewPCG(seed, h.Sum64()))
			other := rng.IntN(n - 1)
			if other >= x.previous {
				other++
			}
			x.nonSyncIn[x.previous], x.nonSyncOut[x.previous] = x.nonSyncIn[other], x.nonSyncOut[other]
		} else {
			x.nonSyncIn[0], x.nonSyncOut[0] = 0, 0
		}
	} else if n > 1 {
		// No previous synchronisation site (first placement): the thesis has
		// no observed T_is. A hub receives every publication of the exchange
		// and, at worst, sends each to every other instance.
		x.syncIn = totalPublished * e.MeanMessageSize
		x.syncOut = totalPublished * float64(n-1) * e.MeanMessageSize
	}
	m.fillObjective(&x, published, consumed, totalPublished, totalConsumed)
	return x, nil
}

// fillObjective computes the exchange's term of eq. 2.1 for every
// candidate node j:
//
//	(l_ij + λ·h_i) / |pairs|,
//	l_ij = Σ_{publication p, interested consumer c} d(src(p), n_j) + d(n_j, node(c))   (eq. 2.2)
//
// Per-instance counts do not say which publication each delivery carried,
// so the origin of a delivery is taken to follow the publications: a
// message delivered at node k was published at node s with probability
// P^in_is / Σ P^in. The number of (publication, interested consumer) pairs
// (|P_i|·|C_i| in eq. 2.1 when every consumer wants every publication) is
// then the number of deliveries Σ_k P^out_ik, and the mean latency is
//
//	Σ_s (P^in_is/ΣP^in)·d(n_s, n_j) + Σ_k (P^out_ik/ΣP^out)·d(n_j, n_k).
//
// h_i is 1 when n_j is not the previous synchronisation site (eq. 2.3) and
// the exchange had one; an exchange with no delivery contributes λ·h_i.
func (m *model) fillObjective(x *exchangeModel, published, consumed []float64, totalPublished, totalConsumed float64) {
	for p, j := range x.nodes {
		var latency float64
		for q, k := range x.nodes {
			if totalPublished > 0 {
				latency += published[q] / totalPublished * m.delayMs[k][j]
			}
			if totalConsumed > 0 {
				latency += consumed[q] / totalConsumed * m.delayMs[j][k]
			}
		}
		if totalConsumed == 0 {
			latency = 0
		}
		penalty := 0.0
		if x.previous >= 0 && p != x.previous {
			penalty = m.lambda
		}
		x.meanLatencyMs[p] = latency
		if totalConsumed > 0 {
			x.objective[p] = latency + penalty/totalConsumed
		} else {
			x.objective[p] = penalty
		}
	}
}
