package bridge

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/luffymq/luffymq/bridge/wqroute"
	"github.com/luffymq/luffymq/scoring"
)

// Overflow at publish.
//
// The thesis's rule leaves every local publish in wq.<g> until its TTL
// expires: at a site that receives more than its members can do, the
// queue is always about one TTL long, so every message waits about the
// TTL — those processed locally as well as those that then overflow, which
// add the network on top. Overflow at publish predicts, when the publish
// arrives, how long it would wait in wq.<g> before a local member starts
// it; when that is longer than the TTL it would get, the message goes to
// the dead-letter exchange at once, as it would after waiting the TTL out,
// and the queue stays short. The TTL and the dead-letter exchange keep
// doing their work when the prediction is wrong.

// overflowView is what one work group's overflow-at-publish decision
// reads: the consume loop's latest view of the local members and the
// estimated number of messages ready in the site's queues (wq.<g> and the
// intake queue, both served before a new publish).
type overflowView struct {
	mu      sync.Mutex
	members []scoring.MemberSnapshot // as the consume loop last read them
	seen    time.Time                // when
	ttl     time.Duration            // eq. 2.12's TTL for those members
	// readyWork and readyIntake are the ready counts RabbitMQ gave with
	// the last basic.get (or the retune's reading) of each queue;
	// readyWork also counts the publishes to wq.<g> since.
	readyWork, readyIntake int
	// overflowed counts the publishes sent to the dead-letter exchange
	// since the retune last asked (takeOverflowed).
	overflowed int
	// taken counts the messages the consume loop took from RabbitMQ;
	// takenSeen, that count when members was read. One taken since is
	// on its way to a member that members still shows free (ahead).
	taken, takenSeen uint64
	// idle is how many members were idle at idleRose's last call.
	idle int
	// published is when decide last saw a local publish; rate, the rate
	// of local publishes; sustainedRate, the same over a longer time
	// (sustainedRateWindow), which says whether the publishes come often
	// enough to use a stream of the other sites' states (demandInputs).
	published     time.Time
	rate          wqroute.PublishRate
	sustainedRate wqroute.PublishRate
	// routedFrom counts, by origin, the messages other sites routed here
	// by their states that were taken from the intake.
	routedFrom map[string]uint64
	// recentTakes holds the last messages other sites routed here that
	// were taken from the intake, nextTake the index of the next one: a
	// state's Taken counts those taken by the time of members, and the
	// takes' times say when each started (takesFrom).
	recentTakes [maxRecentTakes]routedTake
	nextTake    uint64
	// site is scratch space for the members of the whole site: these
	// and, with a router, the other brokers' of this site (siteMembers).
	site []scoring.MemberSnapshot
}

// idleRose reports whether more of the members are idle (no predicted
// wait, nothing in flight) than at its last call: called when the queues
// had nothing left to take, so that they stay idle.
func (v *overflowView) idleRose() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	idle := 0
	for _, m := range v.members {
		if m.Online && m.PredictedWait == 0 && m.InFlight == 0 {
			idle++
		}
	}
	rose := idle > v.idle
	v.idle = idle
	return rose
}

// maxRecentTakes bounds the routed takes an overflowView remembers: more
// than a group takes from one site between two of its states.
const maxRecentTakes = 32

// routedTake is one message another site routed here, taken from the
// intake.
type routedTake struct {
	origin string
	// at is when it was taken; due, when its origin's router expected it
	// here (zero if the message does not say).
	at, due time.Time
}

// tookRouted records a message origin routed here, taken from the intake
// at at (before it is delivered: the members read next include it), which
// origin's router expected here at due.
func (v *overflowView) tookRouted(origin string, at, due time.Time) {
	v.mu.Lock()
	if v.routedFrom == nil {
		v.routedFrom = map[string]uint64{}
	}
	v.routedFrom[origin]++
	v.recentTakes[v.nextTake%maxRecentTakes] = routedTake{origin: origin, at: at, due: due}
	v.nextTake++
	v.mu.Unlock()
}

// takesFrom appends to dst the times (Unix nanoseconds, oldest first) at
// which origin's router expected the remembered messages it routed here
// that were taken after since (the members' reading of the last state
// origin got: it counted those taken by then) and by the time the members
// were last read (when they were taken, for a message that does not say):
// its router counts each started then, if a member was free.
func (v *overflowView) takesFrom(origin string, since time.Time, dst []int64) []int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	start := len(dst)
	for k := v.nextTake - min(v.nextTake, maxRecentTakes); k < v.nextTake; k++ {
		t := v.recentTakes[k%maxRecentTakes]
		if t.origin == origin && t.at.After(since) && !t.at.After(v.seen) {
			if t.due.IsZero() {
				dst = append(dst, t.at.UnixNano())
			} else {
				dst = append(dst, t.due.UnixNano())
			}
		}
	}
	slices.Sort(dst[start:])
	return dst
}

// took counts a message the consume loop took from RabbitMQ.
func (v *overflowView) took() {
	v.mu.Lock()
	v.taken++
	v.mu.Unlock()
}

// setMembers records the members the consume loop just read.
func (v *overflowView) setMembers(members []scoring.MemberSnapshot, ttl time.Duration, now time.Time) {
	v.mu.Lock()
	v.members, v.seen, v.ttl = members, now, ttl
	v.takenSeen = v.taken
	v.mu.Unlock()
}

// ahead is how many messages a publish queued now waits behind at the
// site, as far as this broker knows: those ready in wq.<g> and the intake
// (both served first), and those the consume loop took after it last read
// the members, which are being delivered to members it still shows free
// (a routed message taken a moment before a local publish otherwise left
// the publish predicted to start at once, and it waited a whole service
// time). v.mu is held.
func (v *overflowView) ahead() int {
	return v.readyWork + v.readyIntake + int(v.taken-v.takenSeen)
}

// setReady records what a basic.get or a depth reading returned.
func (v *overflowView) setReady(work, intake int) {
	v.mu.Lock()
	if work >= 0 {
		v.readyWork = work
	}
	if intake >= 0 {
		v.readyIntake = intake
	}
	v.mu.Unlock()
}

// maxLocalPrediction bounds how far the local wait is predicted when
// compared with other sites': their starts are rarely seconds away.
const maxLocalPrediction = 10 * time.Second

// heldTTL is wq.<g>'s message TTL when publishes are routed by the other
// sites' states (RouteNearest): a publish that the local members would
// start sooner than any other site stays in wq.<g> however long its
// predicted wait, and leaves it when another site's state shows a member
// that would start it sooner (dispatchHeld), not when eq. 2.12's TTL
// expires into the hash ring. Forcing it out at the TTL sent it to a site
// predicted slower than the local members (luffy-bench sites, 10×: 330–530
// ms against 103 ms locally, for a second after a stall). The TTL stays as
// a bound for mispredicted messages while no other site's state is fresh.
const heldTTL = maxLocalPrediction

// decision is where a local publish goes.
type decision struct {
	// site is the other site it goes to straight away (RouteNearest);
	// due, when the router expects it there (wqroute.Choice.Due).
	site string
	due  time.Time
	// overflow sends it to the dead-letter exchange at once.
	overflow bool
	// askStates says that it stays in wq.<g> while no other site's state
	// is fresh: the states are to be asked for at once, and the first to
	// arrive may dispatch it (dispatchHeld).
	askStates bool
	// local is the local members' predicted wait (ok: predictable), cost
	// what staying home was weighed at (wqroute.LocalCost), and start the
	// chosen site's predicted start, for tracing.
	local, cost, start time.Duration
	ok                 bool
}

// siteLoad is what the site's brokers know of its members and publishes
// at one moment (siteMembers).
type siteLoad struct {
	// members are the online members of this broker and of the other
	// brokers of the site whose states are fresh; elapsed, how long ago
	// their predicted waits were read.
	members []scoring.MemberSnapshot
	elapsed time.Duration
	// siblingPublishes is the other brokers' local publishes a second,
	// as their states said.
	siblingPublishes float64
	// routed is true when other sites' states are known (RouteNearest).
	routed bool
}

// siteMembers returns the members that would start a message queued in
// the site's queues now: this broker's and, with router, the other
// brokers' of this site whose states are fresh (they consume the same
// queues). With siblings, the members are copied into v.site with their
// waits as of now; without (one broker a site), this broker's are
// returned as they are, uncopied. v.mu is held.
func (v *overflowView) siteMembers(now time.Time, router *wqroute.Router) siteLoad {
	load := siteLoad{members: v.members, elapsed: now.Sub(v.seen), routed: router != nil}
	if router == nil {
		return load
	}
	v.site, load.siblingPublishes = router.AppendSiblings(now, v.site[:0])
	if len(v.site) == 0 {
		return load
	}
	for _, m := range v.members {
		m.PredictedWait = max(m.PredictedWait-load.elapsed, 0)
		v.site = append(v.site, m)
	}
	load.members, load.elapsed = v.site, 0
	return load
}

// localStart predicts how long a message queued now behind ahead others
// would wait before a member of the site starts it, up to limit. When
// other sites are routed to, members the prediction cannot cover (they
// have not finished anything, and are busy or acknowledge on receipt)
// leave the message to the TTL: it would wait at most the TTL here before
// it overflows, which is what other sites are compared with. ok is false
// when nothing can be said. v.mu is held.
func (v *overflowView) localStart(load siteLoad, ahead int, limit time.Duration) (time.Duration, bool) {
	wait, ok := wqroute.PredictStart(load.members, load.elapsed, ahead, limit)
	if !ok && load.routed {
		return v.ttl, true
	}
	return wait, ok
}

// decide says where a publish arriving now goes. With router (the other
// sites' states, RouteNearest) and a fresh state from some site, it goes
// to whichever site, this one included, would start it soonest; this
// site's members are predicted with those of its other brokers. Otherwise
// it goes to the dead-letter exchange at once when the local members
// would not start it within the TTL. When it stays, it is counted as ready
// in wq.<g>. Members without a service estimate (they acknowledge on
// receipt, or have finished nothing yet) are predicted only while idle,
// for one message each (wqroute.PredictStart); beyond that the publish
// stays, and the TTL decides, as in the thesis.
func (v *overflowView) decide(now time.Time, router *wqroute.Router) decision {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.published = now
	v.rate.Add(now)
	v.sustainedRate.Window = sustainedRateWindow
	v.sustainedRate.Add(now)
	if v.members != nil {
		limit := v.ttl
		if router != nil {
			limit = max(limit, maxLocalPrediction)
		}
		load := v.siteMembers(now, router)
		wait, ok := v.localStart(load, v.ahead(), limit)
		if ok && router != nil {
			cost := v.localCost(now, load, wait, max(v.ttl, heldTTL))
			if c := router.RouteWeighed(now, wait, cost, max(v.ttl, heldTTL)); c.Fresh {
				if c.Site != "" {
					v.overflowed++
					return decision{site: c.Site, due: c.Due, local: wait, cost: cost, start: c.Start, ok: true}
				}
				v.readyWork++
				return decision{local: wait, cost: cost, start: wait, ok: true}
			}
			// No other site's state is fresh: this broker is not
			// asking for them (its publishes are too rare for a
			// stream of states to pay, demandInputs), or they
			// stopped coming. A message that would wait here longer
			// than the nearest site is away waits in wq.<g>, whose TTL
			// is then heldTTL, while the states are asked for at once;
			// each that arrives dispatches it if its site would start
			// it sooner. Before, it left by the hash ring to a site
			// drawn by weight, busy or not. So does one that would
			// outlive eq. 2.12's TTL here when no site is known yet (a
			// broker's first overflow after it started) or its
			// members are not all timed: the queue's TTL bounds the
			// hold (eq. 2.12's while members are untimed, heldTTL once
			// all are), a state arriving within it dispatches the
			// message, and otherwise it expires into the ring, as it
			// would have left at once. Sent at once, the ring brought some
			// of them back to this site's own intake (its weight is
			// this site's spare capacity), where they waited for the
			// members they had left (500-545 ms at the thesis's scale).
			least, known := router.LeastDelay()
			if (known && wait > least && allTimed(v.members)) || wait > v.ttl {
				v.readyWork++
				return decision{askStates: true, local: wait, cost: cost, start: wait, ok: true}
			}
		}
		if ok && wait > v.ttl {
			v.overflowed++
			return decision{overflow: true, local: wait, ok: true}
		}
	}
	v.readyWork++
	return decision{}
}

// localCost is what keeping a message home that would wait wait costs
// (wqroute.LocalCost), up to limit: the other sites' starts are compared
// with it. The rate per member is the site's publishes (this broker's
// and its siblings') per online member of the site; the service time,
// those members' mean. v.mu is held.
func (v *overflowView) localCost(now time.Time, load siteLoad, wait, limit time.Duration) time.Duration {
	var sum time.Duration
	online, timed := 0, 0
	for _, m := range load.members {
		if !m.Online {
			continue
		}
		online++
		if m.ServiceEstimate > 0 {
			sum += m.ServiceEstimate
			timed++
		}
	}
	if online == 0 || timed == 0 || wait > limit {
		return wait
	}
	publishes := v.rate.PerSecond(now) + load.siblingPublishes
	return min(wqroute.LocalCost(wait, sum/time.Duration(timed), publishes/float64(online)), limit)
}

// sustainedRateWindow is the time constant of the publish rate that
// decides whether a broker's publishes keep a stream of the other sites'
// states busy (demandInputs): several leases, so that one burst does not
// make a stream.
const sustainedRateWindow = 10 * time.Second

// demandInputs returns what the router's Demand weighs: how long from
// now the local members would start a message published now (the TTL
// when that cannot be said), and how many messages wait in wq.<g>; and
// whether the local publishes are sustained: at least one a lease on
// average, so that a stream of the other sites' states over a lease is
// used by some publish. A broker that saw no local publish within the
// last recent has nothing to route: its start is 0 whatever its members
// do (they may be busy with other sites' messages). So is one whose
// publishes are not sustained: a stream of states for a rare publish
// costs the WAN a state per change of every other site for the whole
// lease, and such a publish asks for the states itself when it comes,
// waiting in wq.<g> for the first (decide's askStates).
func (v *overflowView) demandInputs(now time.Time, router *wqroute.Router, recent, lease time.Duration) (start time.Duration, held int, sustained bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.published.IsZero() || now.Sub(v.published) > recent {
		return 0, v.readyWork, false
	}
	if v.sustainedRate.PerSecond(now)*lease.Seconds() < 1 {
		return 0, v.readyWork, false
	}
	wait, ok := v.localStart(v.siteMembers(now, router), v.ahead(), max(v.ttl, maxLocalPrediction))
	if !ok {
		wait = v.ttl
	}
	return wait, v.readyWork, true
}

// allTimed reports whether every online member has a service estimate
// (and some are online): only then are the members' starts predicted
// beyond one message each, and a publish held past eq. 2.12's TTL
// (heldTTL) safely.
func allTimed(members []scoring.MemberSnapshot) bool {
	online := false
	for _, m := range members {
		if m.Online {
			if m.ServiceEstimate <= 0 {
				return false
			}
			online = true
		}
	}
	return online
}

// dispatch says where the last message ready in wq.<g> should go now,
// the other sites' states having changed: to the site router chooses for
// it (d.site, booked there, and d.due, when the router expects it there),
// or nowhere (d.site empty), when the local members would start it
// soonest or nothing waits in wq.<g>. d also says what the choice weighed,
// for tracing; ok is false when nothing waits or nothing can be said. A
// site chosen is counted as taking one message from wq.<g>; undispatch
// takes that back when the queue was empty after all.
func (v *overflowView) dispatch(now time.Time, router *wqroute.Router) decision {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.members == nil || v.readyWork == 0 {
		return decision{}
	}
	load := v.siteMembers(now, router)
	wait, ok := v.localStart(load, v.ahead()-1, max(v.ttl, maxLocalPrediction))
	if !ok {
		return decision{}
	}
	cost := v.localCost(now, load, wait, max(v.ttl, heldTTL))
	c := router.RouteWeighed(now, wait, cost, max(v.ttl, heldTTL))
	d := decision{site: c.Site, due: c.Due, local: wait, cost: cost, start: c.Start, ok: true}
	if c.Site != "" {
		v.readyWork--
	}
	return d
}

// undispatch counts back a message dispatch took from wq.<g> that was
// not there.
func (v *overflowView) undispatch() {
	v.mu.Lock()
	v.readyWork = 0
	v.mu.Unlock()
}

// state is the group state this broker publishes for the other sites'
// routers: the members' predicted waits as of now, the other sites'
// messages ready in the intake queue, and how many messages each other
// site routed here were taken by the time the members were read (one
// taken since is not yet in their waits: it counts in the next state,
// with them). It also returns how many messages the consume loop has
// taken so far, and when the members were read: the takes the state
// counts are those by then.
func (v *overflowView) state(site, broker, boot string, now time.Time) (wqroute.State, uint64, time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	taken := maps.Clone(v.routedFrom)
	for k := v.nextTake - min(v.nextTake, maxRecentTakes); k < v.nextTake; k++ {
		if t := v.recentTakes[k%maxRecentTakes]; t.at.After(v.seen) {
			taken[t.origin]--
		}
	}
	st := wqroute.StateOf(site, broker, boot, now, v.readyIntake, v.members, taken)
	st.Publishes = v.rate.PerSecond(now)
	elapsed := now.Sub(v.seen)
	for i := range st.Members {
		st.Members[i].Wait = max(st.Members[i].Wait-elapsed, 0)
	}
	return st, v.taken, v.seen
}

// takeOverflowed returns how many publishes overflowed at publish since
// its last call.
func (v *overflowView) takeOverflowed() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := v.overflowed
	v.overflowed = 0
	return n
}
