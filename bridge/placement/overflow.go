package placement

import (
	"errors"
	"math/bits"
	"time"
)

// OverflowCandidate is a site that can take a work queue's overflow.
type OverflowCandidate struct {
	// Site is the site's name.
	Site string
	// Spare is how many more messages the site's queue can take now:
	// MaxLength − MessagesInQueue (eq. 2.13 before its floor of 1, eq.
	// 2.14), as of the last retune. Zero or less means the site has no room
	// (it may be overflowing itself).
	Spare int
	// Sent is how many overflow messages the choosing site has sent to this
	// site since Spare was measured; only the delay-aware rule reads it.
	Sent int
}

// ErrNoOverflowCandidate is returned when there is no site to choose.
var ErrNoOverflowCandidate = errors.New("placement: no overflow candidate")

// WeightedOverflowDestination is the thesis's weight-only rule (§2.3.2,
// eq. 2.13): the consistent-hash dead-letter exchange sends a message to
// each site with probability proportional to its binding weight
// max(Spare, 1), whatever the distance. key stands for the hash of the
// message's routing key or ID, uniform over uint64: the site is the one
// whose share of [0, Σ weights) holds key × Σ weights / 2^64.
func WeightedOverflowDestination(candidates []OverflowCandidate, key uint64) (string, error) {
	if len(candidates) == 0 {
		return "", ErrNoOverflowCandidate
	}
	var total uint64
	for _, c := range candidates {
		total += uint64(max(c.Spare, 1))
	}
	point, _ := bits.Mul64(key, total)
	for _, c := range candidates {
		w := uint64(max(c.Spare, 1))
		if point < w {
			return c.Site, nil
		}
		point -= w
	}
	return candidates[len(candidates)-1].Site, nil // unreachable: point < total
}

// NearestOverflowDestination is the delay-aware rule: it sends the message
// to the nearest site (by delays from origin) that still has room for it,
// so overflow crosses the shortest link that can absorb it. Room is shared
// fairly with the other overflowing sites, which the choosing site cannot
// see sending: a site's room for this origin is Spare / k − Sent, k being
// the number of candidates without spare room (at least 1, the origin
// itself). Ties on delay go to more room, then to the name. When no site
// has room left, the message follows WeightedOverflowDestination with key,
// which spreads what cannot be absorbed in proportion to spare room. The
// origin itself, listed with room, is nearest of all. A candidate with no
// known delay from origin is only considered in that fallback.
func NearestOverflowDestination(origin string, candidates []OverflowCandidate, delays Delays, key uint64) (string, error) {
	if len(candidates) == 0 {
		return "", ErrNoOverflowCandidate
	}
	overflowing := 0
	for _, c := range candidates {
		if c.Spare <= 0 {
			overflowing++
		}
	}
	overflowing = max(overflowing, 1)
	best, bestRoom := -1, 0
	var bestDelay time.Duration
	for i, c := range candidates {
		room := c.Spare/overflowing - c.Sent
		if c.Spare <= 0 || room <= 0 {
			continue
		}
		d, ok := delays.Between(origin, c.Site)
		if !ok {
			continue
		}
		if best < 0 || d < bestDelay ||
			d == bestDelay && (room > bestRoom || room == bestRoom && c.Site < candidates[best].Site) {
			best, bestDelay, bestRoom = i, d, room
		}
	}
	if best < 0 {
		return WeightedOverflowDestination(candidates, key)
	}
	return candidates[best].Site, nil
}
