package wqroute

import (
	"math"
	"testing"
	"time"

	"github.com/luffymq/luffymq/scoring"
)

const ms = time.Millisecond

var t0 = time.Unix(1_000_000, 0)

// stateAt is site's state sent at sent with members of the given waits,
// each 100 ms a message.
func stateAt(site string, sent time.Time, intake int, waits ...time.Duration) State {
	st := State{Site: site, Broker: site + "-1", Sent: sent.UnixNano(), Intake: intake}
	for _, w := range waits {
		st.Members = append(st.Members, MemberState{Wait: w, Service: 100 * ms})
	}
	return st
}

func TestRouteNearestIdleWins(t *testing.T) {
	r := NewRouter(Config{})
	r.Observe(stateAt("near", t0, 0, 0), t0.Add(20*ms))
	r.Observe(stateAt("far", t0, 0, 0), t0.Add(120*ms))
	c := r.Route(t0.Add(120*ms), 300*ms, time.Hour)
	if c.Site != "near" || c.Start != 20*ms || !c.Fresh || !c.Due.Equal(t0.Add(140*ms)) {
		t.Fatalf("Route = %+v, want near at 20ms, due there one delay after now", c)
	}
}

func TestRouteFarIdleBeatsNearBusy(t *testing.T) {
	r := NewRouter(Config{})
	// The near site's only member is busy for 400 ms more when the state
	// is taken; the far one is idle.
	r.Observe(stateAt("near", t0, 0, 400*ms), t0.Add(20*ms))
	r.Observe(stateAt("far", t0, 0, 0), t0.Add(120*ms))
	c := r.Route(t0.Add(120*ms), time.Second, time.Hour)
	if c.Site != "far" || c.Start != 120*ms {
		t.Fatalf("Route = %+v, want far at 120ms", c)
	}
}

func TestRouteLocalWhenSooner(t *testing.T) {
	r := NewRouter(Config{})
	r.Observe(stateAt("near", t0, 0, 0), t0.Add(20*ms))
	if c := r.Route(t0.Add(20*ms), 19*ms, time.Hour); c.Site != "" || !c.Fresh {
		t.Fatalf("Route = %+v, want local (fresh)", c)
	}
	// A tie stays local too.
	if c := r.Route(t0.Add(20*ms), 20*ms, time.Hour); c.Site != "" {
		t.Fatalf("Route on a tie = %+v, want local", c)
	}
}

// Each message sent to a site waits behind those sent there before it
// and not yet taken: one idle member of 100 ms at 20 ms takes the first
// at 20 ms, the second at 120 ms; with a local wait of 100 ms the second
// stays.
func TestRouteCountsWhatItSentUntilTaken(t *testing.T) {
	r := NewRouter(Config{Site: "here"})
	r.Observe(stateAt("near", t0, 0, 0), t0.Add(20*ms))
	now := t0.Add(20 * ms)
	if c := r.Route(now, 100*ms, time.Hour); c.Site != "near" {
		t.Fatalf("first Route = %+v, want near", c)
	}
	if c := r.Route(now, 100*ms, time.Hour); c.Site != "" || c.Start != 100*ms {
		t.Fatalf("second Route = %+v, want local", c)
	}
	// A later state that has not taken it yet (the link is slow, or
	// cut) still counts it ahead, even with an empty intake.
	r.Observe(stateAt("near", now.Add(40*ms), 0, 0), now.Add(60*ms))
	if n := r.find("near").outstanding(); n != 1 {
		t.Fatalf("outstanding before the site took it = %d, want 1", n)
	}
	// Once a state shows it taken, it no longer counts.
	st := stateAt("near", now.Add(80*ms), 0, 80*ms)
	st.Taken = map[string]uint64{"here": 1, "elsewhere": 7}
	r.Observe(st, now.Add(100*ms))
	if n := r.find("near").outstanding(); n != 0 {
		t.Fatalf("outstanding after the site took it = %d, want 0", n)
	}
	// A restarted broker counts from zero again: what it took before
	// stays taken, and a message it had not taken still counts.
	r.Route(now.Add(100*ms), time.Second, time.Hour)
	st = stateAt("near", now.Add(120*ms), 0, 0)
	st.Boot = "again"
	r.Observe(st, now.Add(140*ms))
	if n := r.find("near").outstanding(); n != 1 {
		t.Fatalf("outstanding after a restart = %d, want 1", n)
	}
	st = stateAt("near", now.Add(160*ms), 0, 0)
	st.Boot, st.Taken = "again", map[string]uint64{"here": 1}
	r.Observe(st, now.Add(180*ms))
	if n := r.find("near").outstanding(); n != 0 {
		t.Fatalf("outstanding once the restarted broker took it = %d, want 0", n)
	}
}

// A router that starts while a site's broker has already taken messages
// of its site (from an earlier run of the router) counts only what it
// sends itself.
func TestRouteIgnoresWhatWasTakenBeforeItStarted(t *testing.T) {
	r := NewRouter(Config{Site: "here"})
	st := stateAt("near", t0, 0, 0)
	st.Taken = map[string]uint64{"here": 500}
	r.Observe(st, t0.Add(20*ms))
	if c := r.Route(t0.Add(20*ms), time.Second, time.Hour); c.Site != "near" {
		t.Fatalf("Route = %+v, want near", c)
	}
	if n := r.find("near").outstanding(); n != 1 {
		t.Fatalf("outstanding = %d, want 1", n)
	}
}

// A message the local members would start only after its TTL would leave
// through the hash ring: it goes to the best other site instead, even one
// slower than the local members.
func TestRouteLeavesWhenPastTheLocalLimit(t *testing.T) {
	r := NewRouter(Config{})
	r.Observe(stateAt("far", t0, 0, 0), t0.Add(60*ms))
	r.Observe(stateAt("farther", t0, 0, 0), t0.Add(120*ms))
	if c := r.Route(t0.Add(120*ms), 30*ms, time.Hour); c.Site != "" {
		t.Fatalf("Route within the limit = %+v, want local", c)
	}
	if c := r.Route(t0.Add(120*ms), 30*ms, 25*ms); c.Site != "far" || c.Start != 60*ms {
		t.Fatalf("Route past the limit = %+v, want far at 60ms", c)
	}
}

func TestRouteIntakeCountsAhead(t *testing.T) {
	r := NewRouter(Config{})
	r.Observe(stateAt("near", t0, 3, 0), t0.Add(20*ms))
	c := r.Route(t0.Add(20*ms), time.Second, time.Hour)
	// Three ahead on one 100 ms member, idle when the state was sent: it
	// starts them from then (t0), the third ending at t0 + 300 ms, which
	// is 280 ms from now.
	if c.Site != "near" || c.Start != 280*ms {
		t.Fatalf("Route = %+v, want near at 280ms", c)
	}
}

func TestRouteStaleAndUnpredictableAreIgnored(t *testing.T) {
	r := NewRouter(Config{StaleAfter: time.Second})
	r.Observe(stateAt("near", t0, 0, 0), t0.Add(20*ms))
	if n := r.FreshSites(t0.Add(1000 * ms)); n != 1 {
		t.Fatalf("FreshSites before the state is stale = %d, want 1", n)
	}
	if c := r.Route(t0.Add(1100*ms), time.Second, time.Hour); c.Site != "" || c.Fresh {
		t.Fatalf("Route with a stale state = %+v, want no fresh state", c)
	}
	// Members without a service time that acknowledge on receipt, or
	// are busy with a message of unknown length, cannot be predicted.
	r.Observe(State{Site: "receipt", Sent: t0.Add(time.Second).UnixNano(), Members: []MemberState{{AcksOnReceipt: true}}}, t0.Add(1100*ms))
	r.Observe(State{Site: "busy", Sent: t0.Add(time.Second).UnixNano(), Members: []MemberState{{InFlight: 1}}}, t0.Add(1100*ms))
	if c := r.Route(t0.Add(1100*ms), time.Second, time.Hour); c.Site != "" || c.Fresh {
		t.Fatalf("Route with unpredictable sites = %+v, want no fresh state", c)
	}
	if n := r.FreshSites(t0.Add(1100 * ms)); n != 0 {
		t.Fatalf("FreshSites = %d, want 0", n)
	}
}

// An idle member that has finished nothing yet (a site that was quiet)
// takes one message: the site is a candidate for as many messages as it
// has such members idle, until a state shows them taken.
func TestRouteIdleNewcomersTakeOneEach(t *testing.T) {
	r := NewRouter(Config{Site: "here"})
	r.Observe(State{Site: "quiet", Broker: "q1", Sent: t0.UnixNano(), Members: []MemberState{{}, {}}}, t0.Add(30*ms))
	now := t0.Add(30 * ms)
	for i := range 2 {
		if c := r.Route(now, time.Second, time.Hour); c.Site != "quiet" || c.Start != 30*ms {
			t.Fatalf("Route %d = %+v, want quiet at 30ms", i, c)
		}
	}
	if c := r.Route(now, time.Second, time.Hour); c.Site != "" || c.Fresh {
		t.Fatalf("third Route = %+v, want no prediction (both newcomers booked)", c)
	}
	// Its next state: one took a message and is busy, the other idle.
	r.Observe(State{Site: "quiet", Broker: "q1", Sent: t0.Add(100 * ms).UnixNano(), Intake: 1, Members: []MemberState{{InFlight: 1}, {}},
		Taken: map[string]uint64{"here": 1}}, t0.Add(130*ms))
	if c := r.Route(t0.Add(130*ms), time.Second, time.Hour); c.Site != "" || c.Fresh {
		t.Fatalf("Route behind the intake = %+v, want no prediction (the idle newcomer takes the one ahead)", c)
	}
}

// Several brokers at one site: the site is predicted with the members of
// all of them whose states are fresh, and what they took is summed.
func TestRouteSumsTheBrokersOfASite(t *testing.T) {
	r := NewRouter(Config{Site: "here", StaleAfter: time.Second})
	busy := State{Site: "two", Broker: "b1", Sent: t0.UnixNano(), Members: []MemberState{{Wait: 500 * ms, Service: 100 * ms}}}
	idle := State{Site: "two", Broker: "b2", Sent: t0.Add(50 * ms).UnixNano(), Members: []MemberState{{Service: 100 * ms}}}
	r.Observe(busy, t0.Add(20*ms))
	r.Observe(idle, t0.Add(70*ms))
	now := t0.Add(70 * ms)
	// b2's idle member starts the first at 20 ms (the delay), the second
	// at 120 ms; b1's, free at 500 − 50 ms, only later.
	if c := r.Route(now, time.Second, time.Hour); c.Site != "two" || c.Start != 20*ms {
		t.Fatalf("first Route = %+v, want two at 20ms", c)
	}
	if c := r.Route(now, time.Second, time.Hour); c.Site != "two" || c.Start != 120*ms {
		t.Fatalf("second Route = %+v, want two at 120ms", c)
	}
	// Each broker counts what it took; the site's outstanding is what
	// neither took.
	busy.Sent, busy.Taken = t0.Add(100*ms).UnixNano(), map[string]uint64{"here": 1}
	r.Observe(busy, t0.Add(120*ms))
	if n := r.find("two").outstanding(); n != 1 {
		t.Fatalf("outstanding = %d, want 1", n)
	}
	idle.Sent, idle.Taken = t0.Add(110*ms).UnixNano(), map[string]uint64{"here": 1}
	r.Observe(idle, t0.Add(130*ms))
	if n := r.find("two").outstanding(); n != 0 {
		t.Fatalf("outstanding = %d, want 0", n)
	}
	// Once b2 falls silent its member no longer counts: b1's busy one
	// alone is left (free 500 ms after its state at 100 ms).
	later := t0.Add(1125 * ms) // b2's state (130 ms) is stale, b1's (120 ms) is not
	vs := r.Views(later, nil)
	if len(vs) != 1 || vs[0].Members != 1 {
		t.Fatalf("Views after b2 went silent = %+v, want one member", vs)
	}
}

// The states of the router's own site's other brokers are local members,
// not another site.
func TestRouteKeepsSiblingsApart(t *testing.T) {
	r := NewRouter(Config{Site: "here", Broker: "h1", StaleAfter: time.Second})
	r.Observe(State{Site: "here", Broker: "h1", Sent: t0.UnixNano(), Members: []MemberState{{Service: ms}}}, t0)
	r.Observe(State{Site: "here", Broker: "h2", Sent: t0.UnixNano(), Members: []MemberState{{Wait: 300 * ms, Service: 100 * ms}}, Publishes: 7}, t0.Add(ms))
	if n := r.FreshSites(t0.Add(ms)); n != 0 {
		t.Fatalf("FreshSites = %d, want 0: siblings are not another site", n)
	}
	got, publishes := r.AppendSiblings(t0.Add(101*ms), nil)
	if len(got) != 1 || got[0].PredictedWait != 200*ms || got[0].ServiceEstimate != 100*ms || publishes != 7 {
		t.Fatalf("AppendSiblings = %+v, %v publishes a second, want h2's member, 200ms to wait, and 7", got, publishes)
	}
	if got, publishes := r.AppendSiblings(t0.Add(1002*ms), nil); len(got) != 0 || publishes != 0 {
		t.Fatalf("AppendSiblings after its state went stale = %+v, %v publishes a second, want none", got, publishes)
	}
}

// The one-way delay is the least (arrival − send) seen: one state held up
// by 200 ms does not make the site look far.
func TestRouteDelayIsTheLeastSeen(t *testing.T) {
	r := NewRouter(Config{})
	r.Observe(stateAt("near", t0, 0, 0), t0.Add(20*ms))
	r.Observe(stateAt("near", t0.Add(100*ms), 0, 0), t0.Add(300*ms))
	if d := r.find("near").delay; d != 20*ms {
		t.Fatalf("delay = %v, want 20ms", d)
	}
	// An older state arriving late changes nothing.
	r.Observe(stateAt("near", t0.Add(50*ms), 5, 0), t0.Add(310*ms))
	if s := r.find("near"); s.intake != 0 {
		t.Fatalf("intake = %d after an older state, want 0", s.intake)
	}
}

// BenchmarkRoute is the per-publish cost with four other sites of eight
// busy members each: it must not allocate.
func BenchmarkRoute(b *testing.B) {
	r := NewRouter(Config{})
	now := t0
	for i, name := range []string{"a", "b", "c", "d"} {
		waits := make([]time.Duration, 8)
		for k := range waits {
			waits[k] = time.Duration(k*10+i) * ms
		}
		st := stateAt(name, now, 2, waits...)
		st.Publishes = 25 // 2.5 to 4.5 expected meanwhile: two predictions a site
		r.Observe(st, now.Add(time.Duration(20*(i+1))*ms))
	}
	now = now.Add(100 * ms)
	b.ReportAllocs()
	for b.Loop() {
		r.Route(now, 150*ms, time.Hour)
	}
}

// Views shows what Route reads: a fresh site with its delay, bookings and
// predicted start, and a stale one as not a candidate.
func TestViewsShowRouterInputs(t *testing.T) {
	r := NewRouter(Config{StaleAfter: time.Second})
	r.Observe(stateAt("near", t0, 1, 0, 50*ms), t0.Add(20*ms))
	r.Observe(stateAt("old", t0.Add(-2*time.Second), 0, 0), t0.Add(-2*time.Second+10*ms))
	if c := r.Route(t0.Add(20*ms), time.Second, time.Hour); c.Site != "near" {
		t.Fatalf("Route = %+v, want near", c)
	}
	vs := r.Views(t0.Add(20*ms), nil)
	if len(vs) != 2 {
		t.Fatalf("Views = %+v, want 2 sites", vs)
	}
	near, old := vs[0], vs[1]
	// One idle member and one busy for 50 ms when the state was taken; a
	// message sent now gets there 40 ms after that, behind one (the
	// intake's and the booked one are counted once, the more of the two),
	// which the idle member takes: the other starts it at 10 ms, plus
	// the 20 ms delay.
	want := SiteView{Site: "near", Age: 0, Delay: 20 * ms, Intake: 1, Outstanding: 1, Members: 2, Idle: 1, Start: 30 * ms, OK: true}
	if near != want {
		t.Fatalf("near = %+v, want %+v", near, want)
	}
	if old.OK || old.Age != 2*time.Second+10*ms {
		t.Fatalf("stale site = %+v, want not a candidate, 2.01s old", old)
	}
}

func TestStaleSitesAndUnbookOfReclaimed(t *testing.T) {
	r := NewRouter(Config{Site: "tunis", Broker: "tunis-1", StaleAfter: 1500 * ms})
	r.Observe(stateAt("berlin", t0, 0, 0, 0, 0), t0.Add(20*ms))
	r.Observe(stateAt("montreal", t0, 0, 0), t0.Add(60*ms))
	if got := r.StaleSites(t0.Add(time.Hour), 3*time.Second, nil); len(got) != 0 {
		t.Fatalf("StaleSites with no demand = %v, want none: states are not sent unasked", got)
	}
	r.Demand(t0, 0, 1) // a held message asks for the states
	for range 3 {
		if c := r.Route(t0.Add(100*ms), time.Second, time.Hour); c.Site != "berlin" {
			t.Fatalf("Route = %+v, want berlin", c)
		}
	}
	if n := r.Outstanding("berlin"); n != 3 {
		t.Fatalf("Outstanding(berlin) = %d, want 3", n)
	}
	// Montréal keeps sending states; Berlin falls silent.
	r.Observe(stateAt("montreal", t0.Add(3*time.Second), 0, 0), t0.Add(3*time.Second+60*ms))
	now := t0.Add(3100 * ms)
	if got := r.StaleSites(now, 3*time.Second, nil); len(got) != 1 || got[0] != "berlin" {
		t.Fatalf("StaleSites(3s) = %v, want [berlin]", got)
	}
	if got := r.StaleSites(now, 4*time.Second, nil); len(got) != 0 {
		t.Fatalf("StaleSites(4s) = %v, want none", got)
	}
	// Two of the three are taken back from the link queue towards Berlin:
	// the third is in Berlin's intake and stays booked until Berlin
	// counts it taken.
	r.Unbook("berlin")
	r.Unbook("berlin")
	if n := r.Outstanding("berlin"); n != 1 {
		t.Fatalf("Outstanding(berlin) after two Unbooks = %d, want 1", n)
	}
	st := stateAt("berlin", t0.Add(10*time.Second), 0, 0)
	st.Taken = map[string]uint64{"tunis": 1}
	r.Observe(st, t0.Add(10*time.Second+20*ms))
	if n := r.Outstanding("berlin"); n != 0 {
		t.Fatalf("Outstanding(berlin) once Berlin took the last one = %d, want 0", n)
	}
	if got := r.StaleSites(t0.Add(10*time.Second+100*ms), 3*time.Second, nil); len(got) != 1 || got[0] != "montreal" {
		t.Fatalf("StaleSites = %v, want [montreal]", got)
	}
	if n := r.Outstanding("nowhere"); n != 0 {
		t.Fatalf("Outstanding of an unknown site = %d", n)
	}
}

func TestSiblingUnbooksWhatItTookBack(t *testing.T) {
	r := NewRouter(Config{Site: "tunis", Broker: "tunis-1", StaleAfter: 1500 * ms})
	sibling := func(at time.Time, boot string, unbooked map[string]uint64) {
		st := stateAt("tunis", at, 0, 0)
		st.Broker, st.Boot = "tunis-2", boot
		st.Unbooked = map[string]map[string]uint64{"tunis-1": unbooked, "tunis-3": {"berlin": 50}}
		r.Observe(st, at.Add(ms))
	}
	// First heard of with counts from before: recorded, not applied.
	sibling(t0, "a", map[string]uint64{"berlin": 7})
	r.Observe(stateAt("berlin", t0, 0, 0, 0, 0, 0, 0), t0.Add(20*ms))
	for range 4 {
		if c := r.Route(t0.Add(100*ms), time.Second, time.Hour); c.Site != "berlin" {
			t.Fatalf("Route = %+v, want berlin", c)
		}
	}
	sibling(t0.Add(200*ms), "a", map[string]uint64{"berlin": 7})
	if n := r.Outstanding("berlin"); n != 4 {
		t.Fatalf("Outstanding(berlin) = %d, want 4", n)
	}
	// The sibling took back three of this broker's (and many of another
	// broker's, not this one's to unbook).
	sibling(t0.Add(300*ms), "a", map[string]uint64{"berlin": 10})
	if n := r.Outstanding("berlin"); n != 1 {
		t.Fatalf("Outstanding(berlin) = %d, want 1", n)
	}
	// An older state changes nothing; a restarted sibling counts from 0.
	sibling(t0.Add(250*ms), "a", map[string]uint64{"berlin": 12})
	sibling(t0.Add(400*ms), "b", map[string]uint64{"berlin": 5})
	if n := r.Outstanding("berlin"); n != 0 {
		t.Fatalf("Outstanding(berlin) = %d, want 0 (never below)", n)
	}
	// Unbooks at a site never heard of are ignored.
	sibling(t0.Add(500*ms), "b", map[string]uint64{"berlin": 5, "nowhere": 3})
}

func TestDemand(t *testing.T) {
	r := NewRouter(Config{Site: "tunis", Broker: "tunis-1", StaleAfter: 1500 * ms})
	// Nothing known: any wait at home might be beaten elsewhere.
	if r.Demand(t0, 0, 0) {
		t.Fatal("an idle site with nothing held asks for states")
	}
	if r.Wanting() {
		t.Fatal("Wanting with no demand")
	}
	if !r.Demand(t0, ms, 0) || !r.Wanting() {
		t.Fatal("a busy site that knows no delay does not ask for states")
	}
	r.Observe(stateAt("berlin", t0, 0, 0), t0.Add(22*ms))
	r.Observe(stateAt("tokyo", t0, 0, 0), t0.Add(120*ms))
	if r.Demand(t0.Add(time.Second), 22*ms, 0) {
		t.Fatal("asks for states though no site is nearer than the local start (22 ms to Berlin)")
	}
	if !r.Demand(t0.Add(time.Second), 23*ms, 0) {
		t.Fatal("does not ask though Berlin, 22 ms away, may start it sooner than 23 ms")
	}
	if !r.Demand(t0.Add(time.Second), 0, 2) {
		t.Fatal("does not ask while messages are held")
	}
	r.Demand(t0.Add(2*time.Second), 0, 0)
	if c := r.Route(t0.Add(time.Second), time.Second, time.Hour); c.Site != "berlin" {
		t.Fatalf("Route = %+v, want berlin", c)
	}
	if !r.Demand(t0.Add(2*time.Second), 0, 0) {
		t.Fatal("does not ask while a message it routed is not taken")
	}
	// StaleSites counts silence only once the demand has lasted.
	if got := r.StaleSites(t0.Add(4*time.Second), time.Second, nil); len(got) != 2 {
		t.Fatalf("StaleSites after 2 s of demand = %v, want both", got)
	}
	if got := r.StaleSites(t0.Add(2500*ms), time.Second, nil); len(got) != 0 {
		t.Fatalf("StaleSites 0.5 s into the demand = %v, want none", got)
	}
}

func TestLeases(t *testing.T) {
	var l Leases
	if got := l.Holders(t0, nil); len(got) != 0 {
		t.Fatalf("Holders of no lease = %v", got)
	}
	if !l.Grant("tokyo", t0, t0.Add(3*time.Second)) {
		t.Fatal("a first lease is not new")
	}
	if l.Grant("tokyo", t0.Add(time.Second), t0.Add(4*time.Second)) {
		t.Fatal("a renewal counts as new")
	}
	if l.Grant("tokyo", t0.Add(time.Second), t0.Add(2*time.Second)) {
		t.Fatal("a shorter renewal counts as new")
	}
	if !l.Grant("berlin", t0.Add(time.Second), t0.Add(2*time.Second)) {
		t.Fatal("another site's first lease is not new")
	}
	if got := l.Holders(t0.Add(1500*ms), []string{"self"}); len(got) != 3 || got[0] != "self" || got[1] != "berlin" || got[2] != "tokyo" {
		t.Fatalf("Holders = %v, want [self berlin tokyo]", got)
	}
	// The shorter renewal did not cut tokyo's lease; berlin's ran out.
	if got := l.Holders(t0.Add(3500*ms), nil); len(got) != 1 || got[0] != "tokyo" {
		t.Fatalf("Holders at 3.5 s = %v, want [tokyo]", got)
	}
	if !l.Grant("berlin", t0.Add(5*time.Second), t0.Add(6*time.Second)) {
		t.Fatal("a lease asked again after it ran out is not new")
	}
	if got := l.Holders(t0.Add(10*time.Second), nil); len(got) != 0 {
		t.Fatalf("Holders after every lease ran out = %v", got)
	}
}

func BenchmarkDemand(b *testing.B) {
	r := NewRouter(Config{Site: "tunis", Broker: "tunis-1"})
	for _, s := range []string{"berlin", "montreal", "tokyo"} {
		r.Observe(stateAt(s, t0, 0, 0, 0), t0.Add(40*ms))
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		r.Demand(t0.Add(time.Second), time.Duration(i%100)*ms, 0)
	}
}

// Messages routed to a site start there on arrival, one delay after they
// were sent: one sent 80 ms ago to an idle member is 30 ms into its
// service when the next one is routed, not about to start.
func TestRouteKnowsWhenItsMessagesArrive(t *testing.T) {
	r := NewRouter(Config{Site: "here"})
	r.Observe(stateAt("near", t0, 0, 0, 0, 0), t0.Add(50*ms)) // three idle 100 ms members, 50 ms away
	for _, at := range []time.Duration{50 * ms, 90 * ms, 130 * ms} {
		if c := r.Route(t0.Add(at), time.Second, time.Hour); c.Site != "near" || c.Start != 50*ms {
			t.Fatalf("Route at %v = %+v, want near at 50ms (an idle member)", at, c)
		}
	}
	// The three arrive at t0+100, +140 and +180 and start at once; the
	// next, sent at t0+130, arrives at t0+180 behind them and starts when
	// the first ends, at t0+200: 70 ms from now.
	if c := r.Route(t0.Add(130*ms), time.Second, time.Hour); c.Site != "near" || c.Start != 70*ms {
		t.Fatalf("fourth Route = %+v, want near at 70ms", c)
	}
}

func TestPredictStartAfterMatchesPredictStartWithoutArrivals(t *testing.T) {
	members := []scoring.MemberSnapshot{
		{Online: true, PredictedWait: 30 * ms, ServiceEstimate: 100 * ms},
		{Online: true, PredictedWait: 0, ServiceEstimate: 50 * ms},
		{Online: true, AcksAreFinishes: true}, // idle, untimed: one message
		{Online: false, ServiceEstimate: 10 * ms},
	}
	for ahead := range 8 {
		want, wantOK := PredictStart(members, 0, ahead, time.Hour)
		got, ok := predictStartAfter(members, 0, ahead, nil, 0, time.Hour)
		if got != want || ok != wantOK {
			t.Fatalf("ahead %d: predictStartAfter = %v, %v; PredictStart = %v, %v", ahead, got, ok, want, wantOK)
		}
	}
}

// With no state since, the Router stops expecting what it sends to start
// on arrival: a site that stopped taking messages (its broker gone) would
// keep them all queued.
func TestRouteCreditsArrivalsOnlyShortlyAfterAState(t *testing.T) {
	r := NewRouter(Config{Site: "here", StaleAfter: time.Second}) // credit: 100 ms after a state
	r.Observe(stateAt("near", t0, 0, 0), t0.Add(50*ms))           // one idle 100 ms member, 50 ms away
	r.Route(t0.Add(400*ms), time.Hour, time.Hour)                 // sent 350 ms after the state: no credit
	// Sent at t0+400, it would have started at t0+450 and ended at
	// t0+550; uncredited, it counts as starting when the next arrives.
	if c := r.Route(t0.Add(600*ms), time.Hour, time.Hour); c.Site != "near" || c.Start != 150*ms {
		t.Fatalf("Route = %+v, want near at 150ms (50 ms away, then 100 ms behind the uncredited one)", c)
	}
}

// A site's own publishes that arrive while a routed message is on its way
// take the members idle when they come, not those still busy.
func TestPredictStartAfterIdleTakers(t *testing.T) {
	idle := []scoring.MemberSnapshot{{Online: true, ServiceEstimate: time.Second}}
	// Read 100 ms before the message arrives: one publish expected
	// meanwhile comes at −50 ms and takes the idle member for 1 s.
	if got, ok := predictStartAfter(idle, 100*ms, 0, nil, 1, time.Hour); !ok || got != 950*ms {
		t.Fatalf("idle member, one local publish first: %v, %v; want 950ms", got, ok)
	}
	// A member busy until 100 ms after the message arrives is not idle
	// when the local publish comes: it queues, and the message starts
	// first.
	busy := []scoring.MemberSnapshot{{Online: true, PredictedWait: 200 * ms, ServiceEstimate: time.Second}}
	if got, ok := predictStartAfter(busy, 100*ms, 0, nil, 1, time.Hour); !ok || got != 100*ms {
		t.Fatalf("busy member: %v, %v; want 100ms", got, ok)
	}
	// Two idle members: the publish takes one, the message the other.
	two := append(idle, idle[0])
	if got, ok := predictStartAfter(two, 100*ms, 0, nil, 1, time.Hour); !ok || got != 0 {
		t.Fatalf("two idle members: %v, %v; want 0", got, ok)
	}
}

// The publishes a site's state reports are expected over the time from
// its state until a message arrives, and the start is interpolated between
// the whole numbers around that count.
func TestRouteCountsTheSitesOwnPublishes(t *testing.T) {
	r := NewRouter(Config{Site: "here", StaleAfter: time.Second})
	st := State{Site: "busy", Broker: "b1", Sent: t0.UnixNano(), Members: []MemberState{{Service: time.Second}}, Publishes: 2}
	r.Observe(st, t0.Add(50*ms))
	// From the state (t0) until a message sent now arrives (t0+100 ms):
	// 0.2 publishes expected. With none the member starts it on arrival
	// (50 ms); with one, 950 ms later: 50 + 0.2 × 950 = 240 ms.
	vs := r.Views(t0.Add(50*ms), nil)
	if len(vs) != 1 || !vs[0].OK || vs[0].Start != 240*ms {
		t.Fatalf("Views = %+v, want busy at 240ms", vs)
	}
	// The same site without publishes of its own: 50 ms.
	st.Publishes, st.Sent = 0, t0.Add(ms).UnixNano()
	r.Observe(st, t0.Add(51*ms))
	if vs := r.Views(t0.Add(51*ms), nil); vs[0].Start != 50*ms {
		t.Fatalf("Views without local publishes = %+v, want 50ms", vs)
	}
}

// What third sites route to a site races the Router's messages for its
// idle members as the site's own publishes do: the rate comes from the
// growth of the site's counts of what it took from them, and a site
// whose two idle members a third site keeps taking is no longer worth a
// message that starts at home 100 ms from now.
func TestRouteCountsWhatThirdSitesRouteThere(t *testing.T) {
	state := func(sent time.Time, third uint64) State {
		return State{Site: "far", Broker: "f1", Boot: "b", Sent: sent.UnixNano(), Taken: map[string]uint64{"here": 3, "third": third},
			Members: []MemberState{{Service: time.Second}, {Service: time.Second}}}
	}
	quiet := NewRouter(Config{Site: "here", StaleAfter: 3 * time.Second})
	busy := NewRouter(Config{Site: "here", StaleAfter: 3 * time.Second})
	for _, r := range []*Router{quiet, busy} {
		r.Observe(state(t0, 0), t0.Add(50*ms))
	}
	now := t0.Add(1050 * ms)
	quiet.Observe(state(t0.Add(time.Second), 0), now)
	busy.Observe(state(t0.Add(time.Second), 30), now) // 30 taken from "third" in that second
	if c := quiet.Route(now, 100*ms, time.Hour); c.Site != "far" || c.Start != 50*ms {
		t.Fatalf("without a third site's messages: Route = %+v, want far at 50ms", c)
	}
	// 30 counted at now, over the rate's 2 s time constant: 15 a second,
	// 1.5 expected from the state until the message arrives (2 × 50 ms).
	// One takes a member; with two, both are taken, and the message waits
	// for the first to free, 1 s after it came (at −66.7 ms of the
	// message's arrival): half of that, 50 ms away.
	want := 50*ms + (time.Second-200*ms/3)/2
	vs := busy.Views(now, nil)
	if len(vs) != 1 || !vs[0].OK || vs[0].Start != want {
		t.Fatalf("Views = %+v, want far at %v", vs, want)
	}
	if c := busy.Route(now, 100*ms, time.Hour); c.Site != "" {
		t.Fatalf("with a third site's messages racing: Route = %+v, want the local site (100ms < %v)", c, want)
	}
	// A restarted broker counts from zero; what it took since counts as new.
	st := state(t0.Add(1100*ms), 2)
	st.Boot = "b2"
	before := busy.find("far").racing.PerSecond(now.Add(50 * ms))
	busy.Observe(st, now.Add(50*ms))
	if after := busy.find("far").racing.PerSecond(now.Add(50 * ms)); math.Abs(after-before-1) > 1e-9 {
		t.Fatalf("after a restart the rate rose by %v, want 1 (2 taken since the boot)", after-before)
	}
}
