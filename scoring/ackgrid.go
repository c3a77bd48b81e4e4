package scoring

import (
	"math/bits"
	"time"
)

// ackGrid tells whether a member's acknowledgements come on a timer's
// grid or when its work ends. paho.golang with manual acks writes them
// every 50 ms from a ticker: the gaps between its bursts are multiples of
// that period whatever the work, and an ack shows only that the work ended
// some time since the last flush. Python paho writes its acks after its
// next read: bursts too, but each ending when a message's work did, at
// times that are not on any grid. Only the first kind needs the burst
// rules (a member may have finished more since its last burst than it
// acknowledged; its ack times say nothing of how variable its work is).
// The zero value has seen nothing: until it has, acknowledgements in
// bursts are taken to be a timer's, the most common kind.
type ackGrid struct {
	period  time.Duration // the least gap seen between bursts
	history uint16        // 1 for each of the latest gaps that was a multiple of period
	seen    uint8         // how many gaps history holds (at most 16)
}

// minGridPeriod is the shortest flush period ackGrid considers: shorter
// gaps are one burst split by scheduling, or a member acknowledging in
// time.
const minGridPeriod = 5 * time.Millisecond

// gridTolerance is how far from a multiple of the period a gap may be and
// still be on the grid: network and scheduling jitter.
func gridTolerance(period time.Duration) time.Duration {
	return max(time.Millisecond, period/16)
}

// observe records the gap between the first acknowledgements of two
// consecutive bursts (or single acknowledgements).
func (g *ackGrid) observe(gap time.Duration) {
	if gap < minGridPeriod {
		return
	}
	if g.period == 0 || gap < g.period-gridTolerance(g.period) {
		g.period = gap
	}
	k := (gap + g.period/2) / g.period
	off := gap - k*g.period
	if off < 0 {
		off = -off
	}
	g.history <<= 1
	if off <= gridTolerance(g.period) {
		g.history |= 1
	}
	if g.seen < 16 {
		g.seen++
	}
}

// offGrid reports whether, of the last 8 to 16 gaps, fewer than three in
// four were on the grid: the acknowledgements are not a timer's. Until 8
// gaps are seen it says no.
func (g *ackGrid) offGrid() bool {
	if g.seen < 8 {
		return false
	}
	mask := uint16(1)<<g.seen - 1
	if g.seen == 16 {
		mask = ^uint16(0)
	}
	return 4*bits.OnesCount16(g.history&mask) < 3*int(g.seen)
}
