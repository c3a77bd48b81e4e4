package wqroute

import (
	"math"
	"time"
)

// The price of a local member's next free moment.
//
// A message that would wait w at home before a local member frees, when
// another site would start it after s, is not simply kept home when w < s.
// The member it waits for would otherwise take whatever is published next
// at home: if that next publish comes before the member frees, it waits
// less than w (a message sent away now leaves the member to the newer
// one); if it comes while the member is busy again with this message, it
// goes to the other site itself and pays s. For a site whose publishes
// arrive at rate λ per member (Poisson) and whose members take S a
// message, keeping the message home costs, against sending it away,
// about
//
//	(1 − e^{−λw})/λ − s·e^{−λ(w+S)}
//
// which is negative exactly when s < LocalCost(w, S, λ) =
// (e^{λw} − 1)/λ · e^{λS}. For a site with few publishes (λ → 0) that is
// w: the plain comparison. For a site publishing twice what its members
// can do (λS = 2), a message that would wait 10 ms at home costs about
// 74 ms: it goes to a site 50 ms away, and the next publish takes the
// local member when it frees. It assumes the next message sent away
// would start about as soon as this one: other sites have room.

// negligibleLoad is the offered load per member below which LocalCost is
// the wait itself.
const negligibleLoad = 1e-3

// maxLocalCost bounds LocalCost.
const maxLocalCost = time.Hour

// LocalCost is what keeping a message home costs, as a start time to
// compare with another site's: wait is how long it would wait for a local
// member, service the members' time per message, perMember the rate of
// local publishes per online member (per second). It is wait when
// service is unknown (0) or the members' offered load (perMember ·
// service) is under negligibleLoad: the correction would be smaller than
// the clocks' noise, and only move ties.
func LocalCost(wait, service time.Duration, perMember float64) time.Duration {
	if wait <= 0 || service <= 0 || perMember*service.Seconds() < negligibleLoad {
		return wait
	}
	x := perMember * wait.Seconds()
	e := perMember * (wait + service).Seconds()
	if e > 30 {
		return maxLocalCost
	}
	c := math.Expm1(x) / perMember * math.Exp(perMember*service.Seconds())
	if c >= maxLocalCost.Seconds() {
		return maxLocalCost
	}
	return max(time.Duration(c*float64(time.Second)), wait)
}

// PublishRate estimates a rate of events (publishes) per second with an
// exponentially decaying count over a time constant. The zero value is a
// rate of 0 with a 2 s time constant; it is not safe for concurrent use.
type PublishRate struct {
	// Window is the time constant (0: 2 s).
	Window time.Duration
	count  float64
	last   time.Time
}

func (r *PublishRate) window() time.Duration {
	if r.Window <= 0 {
		return 2 * time.Second
	}
	return r.Window
}

// decay ages the count to now.
func (r *PublishRate) decay(now time.Time) {
	if !r.last.IsZero() && now.After(r.last) {
		r.count *= math.Exp(-now.Sub(r.last).Seconds() / r.window().Seconds())
	}
	if now.After(r.last) {
		r.last = now
	}
}

// Add counts one event at now.
func (r *PublishRate) Add(now time.Time) { r.AddN(now, 1) }

// AddN counts n events at now.
func (r *PublishRate) AddN(now time.Time, n float64) {
	r.decay(now)
	r.count += n
}

// PerSecond is the rate at now.
func (r *PublishRate) PerSecond(now time.Time) float64 {
	r.decay(now)
	return r.count / r.window().Seconds()
}
