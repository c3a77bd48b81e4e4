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
// some wait above limit). ok is false when an online member has no
// service estimate yet (the broker has not seen it finish anything), or
// no member is online: nothing can be predicted.
func PredictStart(members []scoring.MemberSnapshot, elapsed time.Duration, ahead int, limit time.Duration) (wait time.Duration, ok bool) {
	var free, service [maxSimulatedMembers]time.Duration
	n := 0
	var rate float64 // messages per nanosecond, for the fluid model
	var sumStart float64
	for _, m := range members {
		if !m.Online {
			continue
		}
		if m.ServiceEstimate <= 0 {
			return 0, false
		}
		f := max(m.PredictedWait-elapsed, 0)
		if n < maxSimulatedMembers {
			free[n], service[n] = f, m.ServiceEstimate
		}
		n++
		rate += 1 / float64(m.ServiceEstimate)
		sumStart += float64(f) / float64(m.ServiceEstimate)
	}
	if n == 0 {
		return 0, false
	}
	if n > maxSimulatedMembers {
		// The time by which the members, each from its free time, have
		// started ahead messages between them; members free later than
		// that take none, which this overestimates slightly.
		return max(time.Duration(math.Round((float64(ahead)+sumStart)/rate)), 0), true
	}
	next := func() int {
		best := 0
		for i := 1; i < n; i++ {
			if free[i] < free[best] {
				best = i
			}
		}
		return best
	}
	for ; ahead > 0; ahead-- {
		i := next()
		if free[i] > limit {
			return free[i], true
		}
		free[i] += service[i]
	}
	return free[next()], true
}
