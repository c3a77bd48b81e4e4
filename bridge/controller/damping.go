package controller

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/luffymq/luffymq/bridge/placement"
)

// Damping keeps a plan from following every short phase of traffic. Two
// mechanisms, each simple to reason about, and both on by default:
//
//   - Rate smoothing (--rate-half-life h, in periods): placement sees an
//     exponentially weighted moving average of each instance's rates, not
//     the last period's. A round covering dt seconds gives the new
//     measurement the weight α = 1 − 2^(−dt/(h·period)), so traffic that
//     changed k periods ago and stayed weighs 1 − 2^(−k/h) (h = 1: ½, ¾,
//     ⅞, …). While two patterns alternate every period, the smoothed
//     shares swing by only α/(2−α) of the raw swing (⅓ for h = 1).
//   - Hysteresis (--move-margin M): an exchange leaves its current
//     synchronisation site only if its term of eq. 2.1 at the new site
//     (which already carries λ's share) is below (1 − M) times its term at
//     the current one, or if keeping it would overload the sites' bandwidth
//     more than moving does. Otherwise the move is held (reason "held").
//
// Either alone is weak: smoothing leaves a residual swing (⅓ for h = 1)
// that still flips the plan when the raw swing is large, and a margin
// alone lets a pattern that alternates strongly enough cross it every
// round. Together, an alternation every period moves nothing unless its
// smoothed swing changes the cost by more than M; a lasting change moves
// the site as soon as the smoothed traffic makes the new site M cheaper.
// When every site's total traffic stays the same, each site's smoothed
// cost is the mix (1 − w_k)·C_before + w_k·C_after with w_k = 1 − 2^(−k/h),
// so the move happens at the first k for which the mix at the new site is
// below (1 − M) times the mix at the old one (TestDampingAdaptsToLastingChange
// works one case through: k = 2 for h = 1, M = 10 %).
//
// Defaults: h = 1 period, M = 10 % (the tolerance issue 8 accepts between
// placement and the exact optimum: a plan held by the margin is at most
// that far from the one placement would choose on the smoothed rates).
// 0 turns either off; Config's zero values leave both off.
const (
	DefaultRateHalfLife = 1.0
	DefaultMoveMargin   = 0.10
)

// reasonHeld is the decision reason of an exchange whose move the
// hysteresis refused.
const reasonHeld placement.Reason = "held"

// HeldMove is a move the hysteresis refused in the last round.
type HeldMove struct {
	Exchange string `json:"exchange"`
	// Site is the synchronisation site kept, Candidate the one placement
	// chose.
	Site      string `json:"site"`
	Candidate string `json:"candidate"`
	// CostMs and CandidateCostMs are the exchange's term of eq. 2.1 at
	// Site and at Candidate (λ's share included).
	CostMs          float64 `json:"cost_ms"`
	CandidateCostMs float64 `json:"candidate_cost_ms"`
	// Rounds counts the consecutive rounds the exchange's move was held.
	Rounds int `json:"rounds"`
}

// damper holds the damping state. It is only used by one round at a time
// (Controller.roundMu).
type damper struct {
	halfLife float64 // in periods; 0: no smoothing
	period   float64 // seconds
	margin   float64 // fraction; 0: no hysteresis
	// smoothed is each site's smoothed rates per exchange.
	smoothed map[string]map[string]InstanceRates
	// heldRounds counts, per exchange, the consecutive rounds its move was
	// held.
	heldRounds map[string]int
}

func newDamper(halfLife, periodSeconds, margin float64) *damper {
	return &damper{halfLife: halfLife, period: periodSeconds, margin: margin,
		smoothed: map[string]map[string]InstanceRates{}, heldRounds: map[string]int{}}
}

// smooth folds a site's new rates into its moving average and returns the
// average. An exchange seen at the site for the first time starts from its
// measurement; one no longer there is forgotten. Backlogs are not averaged.
func (d *damper) smooth(site string, r siteRates) siteRates {
	if d.halfLife <= 0 {
		return r
	}
	alpha := 1.0
	if r.periodSeconds > 0 {
		alpha = 1 - math.Exp2(-r.periodSeconds/(d.halfLife*d.period))
	}
	prev := d.smoothed[site]
	next := make(map[string]InstanceRates, len(r.exchanges))
	out := r
	out.exchanges = make(map[string]InstanceRates, len(r.exchanges))
	for x, cur := range r.exchanges {
		if p, ok := prev[x]; ok {
			mix := func(old, v float64) float64 { return old + alpha*(v-old) }
			cur.LocalPublished = mix(p.LocalPublished, cur.LocalPublished)
			cur.LocalConsumed = mix(p.LocalConsumed, cur.LocalConsumed)
			cur.OverlayIn = mix(p.OverlayIn, cur.OverlayIn)
			cur.OverlayOut = mix(p.OverlayOut, cur.OverlayOut)
		}
		next[x] = cur
		out.exchanges[x] = cur
	}
	d.smoothed[site] = next
	return out
}

// hold applies the hysteresis to placement's result: every move whose
// gain is within the margin, and whose undoing does not add overload, is
// undone. Moves are looked at in the order of the decisions (busiest
// exchange first), each against the plan with the earlier ones settled.
func (d *damper) hold(in placement.Input, res placement.Result) (placement.Result, []HeldMove) {
	if d.margin <= 0 {
		clear(d.heldRounds)
		return res, nil
	}
	plan := make(placement.Plan, len(res.Plan))
	for k, v := range res.Plan {
		plan[k] = v
	}
	decisions := append([]placement.Decision(nil), res.Decisions...)
	var held []HeldMove
	seen := map[string]bool{}
	for i, dec := range decisions {
		if !dec.Moved() {
			continue
		}
		keepCost, moveCost, ok := candidateCosts(dec)
		if !ok || moveCost < (1-d.margin)*keepCost {
			continue
		}
		keep := make(placement.Plan, len(plan))
		for k, v := range plan {
			keep[k] = v
		}
		keep[dec.Exchange] = dec.Previous
		ek, err1 := placement.Evaluate(in, keep)
		em, err2 := placement.Evaluate(in, plan)
		if err1 != nil || err2 != nil || ek.Overload > em.Overload*(1+1e-9)+1e-9 {
			continue // keeping would overload the sites more: the move stands
		}
		plan = keep
		decisions[i].Site, decisions[i].Reason = dec.Previous, reasonHeld
		d.heldRounds[dec.Exchange]++
		seen[dec.Exchange] = true
		held = append(held, HeldMove{Exchange: dec.Exchange, Site: dec.Previous, Candidate: dec.Site,
			CostMs: keepCost, CandidateCostMs: moveCost, Rounds: d.heldRounds[dec.Exchange]})
	}
	for x := range d.heldRounds {
		if !seen[x] {
			delete(d.heldRounds, x)
		}
	}
	res.Plan, res.Decisions = plan, decisions
	return res, held
}

// candidateCosts returns the exchange's term of eq. 2.1 at its previous
// and at its chosen site.
func candidateCosts(dec placement.Decision) (keep, move float64, ok bool) {
	var haveKeep, haveMove bool
	for _, c := range dec.Candidates {
		if c.Site == dec.Previous {
			keep, haveKeep = c.Cost, true
		}
		if c.Site == dec.Site {
			move, haveMove = c.Cost, true
		}
	}
	return keep, move, haveKeep && haveMove && !math.IsNaN(keep) && !math.IsNaN(move)
}

// fractionFlag is a flag.Value for a fraction in [0, 1), written as 0.1
// or 10%.
type fractionFlag struct{ v *float64 }

func (f fractionFlag) String() string {
	if f.v == nil {
		return ""
	}
	return strconv.FormatFloat(*f.v*100, 'g', -1, 64) + "%"
}

func (f fractionFlag) Set(s string) error {
	s = strings.TrimSpace(s)
	scale := 1.0
	if t, ok := strings.CutSuffix(s, "%"); ok {
		s, scale = strings.TrimSpace(t), 100
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return fmt.Errorf("want a fraction such as 0.1 or 10%%")
	}
	*f.v = v / scale
	return nil
}
