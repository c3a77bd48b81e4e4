package wqroute

import (
	"maps"
	"slices"
	"time"
)

// States a router can work out for itself.
//
// A router that holds a site's state predicts the site from it until the
// next one: each member's wait runs down with time, and each message the
// router sent there and the site took goes to the member that frees
// first, one service time long (site.start). A state that says no more
// than that costs a WAN message and tells the router nothing; a broker
// whose members work through one busy site's messages as predicted would
// otherwise send that site a state for every message it takes.

// maxExtrapolatedMembers bounds the members Extrapolates compares; a
// larger group always sends its states.
const maxExtrapolatedMembers = 32

// Extrapolates reports whether the router of site holder, holding last,
// would predict cur within tolerance: the same broker and boot, the same
// online members, nothing more in the intake and nothing taken back for a
// sibling, no message taken from another origin than holder since last
// (holder does not know of those), and the members' waits in cur, in
// order, within tolerance of last's run down by the time between them,
// after placing on them each message taken from holder since last.
//
// Each such message starts when holder's router expected it at the site
// (it counts it started on arrival, Choice.Due) or when the member that
// frees first is free, whichever is later: takes holds those times (Unix
// nanoseconds, in order) for the messages taken from holder since last
// was sent. A member that started a message later than its router
// expected by more than tolerance, or earlier, is thus told. A take whose
// time is missing from takes is placed at cur's send time, which a member
// that took it earlier does not match. A member without a service time cannot
// be predicted past its wait: it must have taken none of them. It
// allocates nothing for groups of up to maxExtrapolatedMembers.
func Extrapolates(last, cur State, holder string, takes []int64, tolerance time.Duration) bool {
	n := len(cur.Members)
	if cur.Site != last.Site || cur.Broker != last.Broker || cur.Boot != last.Boot || n != len(last.Members) ||
		n > maxExtrapolatedMembers || cur.Intake > last.Intake || cur.Sent < last.Sent || !unbookedEqual(last.Unbooked, cur.Unbooked) {
		return false
	}
	for origin, taken := range cur.Taken {
		if origin != holder && taken != last.Taken[origin] {
			return false
		}
	}
	holderTakes := cur.Taken[holder] - min(last.Taken[holder], cur.Taken[holder])
	elapsed := time.Duration(cur.Sent - last.Sent)
	// Waits relative to cur's send time: negative, free since.
	var want, got [maxExtrapolatedMembers]time.Duration
	for i, m := range last.Members {
		want[i] = m.Wait - elapsed
	}
	for k := range holderTakes {
		takenAt := time.Duration(0) // at cur's send time, unless known
		if k < uint64(len(takes)) {
			takenAt = time.Duration(takes[k] - cur.Sent)
		}
		i := earliest(want[:n])
		svc := last.Members[i].Service
		if svc <= 0 {
			return false
		}
		want[i] = max(want[i], takenAt) + svc
	}
	for i, m := range cur.Members {
		want[i], got[i] = max(want[i], 0), m.Wait
	}
	slices.Sort(want[:n])
	slices.Sort(got[:n])
	for i := range n {
		if d := got[i] - want[i]; d > tolerance || d < -tolerance {
			return false
		}
	}
	return true
}

// unbookedEqual reports whether two State.Unbooked are the same counts.
func unbookedEqual(a, b map[string]map[string]uint64) bool {
	return maps.EqualFunc(a, b, func(x, y map[string]uint64) bool { return maps.Equal(x, y) })
}

// ExtrapolationTolerance is how far a member's wait may stray from what a
// router predicts before the broker tells it: a quarter of the shortest
// service time among members (an error of that much moves a message's
// start by as much), and at most interval, the broker's state interval
// (a router hears no sooner of anything else).
func ExtrapolationTolerance(members []MemberState, interval time.Duration) time.Duration {
	tol := interval
	for _, m := range members {
		if m.Service > 0 {
			tol = min(tol, m.Service/4)
		}
	}
	return tol
}
