// Package wqroute chooses, for each work-queue message published at a
// site, the site whose members would start it soonest, delay included: the
// local members, or another site whose published group state (members'
// predicted waits and service times, the overflow queued ahead, the time
// it was sent) is fresh. It is pure: no I/O, the clock is passed in, and
// the per-message choice allocates nothing.
package wqroute

import (
	"math"
	"time"

	"github.com/luffymq/luffymq/scoring"
)

// maxSimulatedMembers bounds the members whose free times PredictStart
// keeps on the stack; a larger group is predicted as a fluid.
const maxSimulatedMembers = 32

// PredictStart estimates how long a message queued now behind ahead
// others would wait before one of members starts it: each message ahead
// goes to the online member that frees first, which is then busy one
// service time longer. The members' predicted waits were read elapsed
// ago. It stops as soon as the wait exceeds limit (the answer is then
// some wait above limit).
//
// A member without a service estimate (it has finished nothing yet, or
// its acknowledgements do not mark finished work) can still take one
// message when it is idle: nothing in flight, no predicted wait, and not
// known to acknowledge on receipt (an idle look proves nothing then).
// What it does after that is unknown, so it takes no second one. ok is
// false when the members cannot start the message in any way this can
// predict: no member online, or every slot spent before the message's
// turn.
func PredictStart(members []scoring.MemberSnapshot, elapsed time.Duration, ahead int, limit time.Duration) (wait time.Duration, ok bool) {
	var free, service [maxSimulatedMembers]time.Duration
	n, timed := 0, 0
	var rate float64 // messages per nanosecond of the timed members, for the fluid model
	var sumStart float64
	for _, m := range members {
		if !m.Online {
			continue
		}
		f := max(m.PredictedWait-elapsed, 0)
		svc := m.ServiceEstimate
		if svc <= 0 {
			if !idleUntimed(m, f) {
				continue
			}
			svc = untimed
		} else {
			timed++
			rate += 1 / float64(svc)
			sumStart += float64(f) / float64(svc)
		}
		if n < maxSimulatedMembers {
			free[n], service[n] = f, svc
		}
		n++
	}
	if n == 0 {
		return 0, false
	}
	if n > maxSimulatedMembers {
		// The untimed members take one message each, at once; then the
		// time by which the timed members, each from its free time, have
		// started the rest between them. Members free later than that
		// take none, which this overestimates slightly.
		if ahead -= n - timed; ahead < 0 {
			return 0, true
		}
		if timed == 0 {
			return 0, false
		}
		return max(time.Duration(math.Round((float64(ahead)+sumStart)/rate)), 0), true
	}
	next := func() int { return earliest(free[:n]) }
	for ; ahead > 0; ahead-- {
		i := next()
		if free[i] >= untimed {
			return 0, false
		}
		if free[i] > limit {
			return free[i], true
		}
		free[i] += service[i]
	}
	if i := next(); free[i] < untimed {
		return free[i], true
	}
	return 0, false
}

// untimed stands for the service time of a member without an estimate:
// once it has taken its one message, it is never free again within any
// prediction.
const untimed = time.Duration(math.MaxInt64 / 4)

// idleUntimed reports whether m, which has no service estimate, can take
// one message: it is idle (free at once, nothing in flight) and its
// acknowledgements are not known to come on receipt.
func idleUntimed(m scoring.MemberSnapshot, free time.Duration) bool {
	return free == 0 && m.InFlight == 0 && m.AcksAreFinishes
}

// maxTrackedSends is how many of its latest sends to a site a Router
// remembers the time of (predictStartAfter's known arrivals).
const maxTrackedSends = 32

// predictStartAfter is PredictStart for a message that reaches the site
// elapsed after the members' waits were read, behind extra messages
// queued there at that reading and then behind messages whose arrivals
// are known: arrivals[j] is when the j-th reaches the site relative to
// the message's own arrival (negative: before it), in order. A member
// whose wait ran out before a message arrived starts it on arrival, not
// at the message's own arrival as PredictStart must assume: a message
// sent 80 ms earlier to an idle site is 80 ms into its service already.
// idleTakers are the site's own publishes expected meanwhile, spread
// evenly over the elapsed time: each takes a member only if one is free
// when it arrives (otherwise it queues behind the intake, where the
// message is not). Groups beyond maxSimulatedMembers are left to
// PredictStart.
func predictStartAfter(members []scoring.MemberSnapshot, elapsed time.Duration, extra int, arrivals []time.Duration, idleTakers int, limit time.Duration) (time.Duration, bool) {
	var free, service [maxSimulatedMembers]time.Duration
	n := 0
	for _, m := range members {
		if !m.Online {
			continue
		}
		if n == maxSimulatedMembers {
			return PredictStart(members, elapsed, extra+len(arrivals), limit)
		}
		f := m.PredictedWait - elapsed // negative: free since then
		svc := m.ServiceEstimate
		if svc <= 0 {
			if !idleUntimed(m, max(f, 0)) {
				continue
			}
			svc = untimed
		}
		free[n], service[n] = f, svc
		n++
	}
	if n == 0 {
		return 0, false
	}
	next := func() int { return earliest(free[:n]) }
	place := func(arrival time.Duration) (time.Duration, bool) {
		i := next()
		if free[i] >= untimed {
			return 0, false
		}
		start := max(free[i], arrival)
		free[i] = untimed // a member without an estimate takes one, never a second
		if service[i] < untimed {
			free[i] = start + service[i]
		}
		return start, true
	}
	for range extra {
		start, ok := place(-elapsed)
		if !ok {
			return 0, false
		}
		if start > limit {
			return start, true
		}
	}
	taker := 0
	takerArrival := func() time.Duration {
		return -elapsed * time.Duration(idleTakers-taker) / time.Duration(idleTakers+1)
	}
	takeIfIdle := func(at time.Duration) {
		if i := next(); free[i] <= at {
			free[i] = untimed
			if service[i] < untimed {
				free[i] = at + service[i]
			}
		}
	}
	for _, a := range arrivals {
		for ; taker < idleTakers && takerArrival() <= a; taker++ {
			takeIfIdle(takerArrival())
		}
		start, ok := place(a)
		if !ok {
			return 0, false
		}
		if start > limit {
			return start, true
		}
	}
	for ; taker < idleTakers; taker++ {
		takeIfIdle(takerArrival())
	}
	if i := next(); free[i] < untimed {
		return max(free[i], 0), true
	}
	return 0, false
}

// earliest returns the index of the least of free (the member that frees
// first).
func earliest(free []time.Duration) int {
	best := 0
	for i := 1; i < len(free); i++ {
		if free[i] < free[best] {
			best = i
		}
	}
	return best
}
