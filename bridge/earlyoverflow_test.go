package bridge

import (
	"testing"
	"time"

	"github.com/luffymq/luffymq/bridge/wqroute"
	"github.com/luffymq/luffymq/scoring"
)

func member(wait, service time.Duration) scoring.MemberSnapshot {
	return scoring.MemberSnapshot{Online: true, PredictedWait: wait, ServiceEstimate: service}
}

func TestOverflowViewDecide(t *testing.T) {
	ms := time.Millisecond
	now := time.Unix(1000, 0)
	var v overflowView
	// Before the consume loop has read the members nothing overflows, and
	// what stays is counted as ready.
	if v.decide(now, nil).overflow {
		t.Fatal("overflowed without members")
	}
	// One member free in 20 ms, 100 ms a message, TTL 150 ms: with one
	// message ready ahead (the one above) the new one would start at
	// 120 ms and stays; the next would start at 220 ms and leaves.
	v.setMembers([]scoring.MemberSnapshot{member(20*ms, 100*ms)}, 150*ms, now)
	if v.decide(now, nil).overflow {
		t.Fatal("a publish that starts within the TTL overflowed")
	}
	if !v.decide(now, nil).overflow {
		t.Fatal("a publish that would wait past the TTL stayed")
	}
	if v.readyWork != 2 {
		t.Fatalf("readyWork = %d, want 2 (the publishes that stayed)", v.readyWork)
	}
	// A basic.get tells what is really ready; -1 leaves a count as it is.
	v.setReady(0, -1)
	if v.readyWork != 0 || v.readyIntake != 0 {
		t.Fatalf("ready = %d, %d", v.readyWork, v.readyIntake)
	}
	v.setReady(-1, 3) // three other sites' messages are served first
	if !v.decide(now, nil).overflow {
		t.Fatal("stayed behind three intake messages")
	}
	if n := v.takeOverflowed(); n != 2 {
		t.Fatalf("takeOverflowed = %d, want 2", n)
	}
	if n := v.takeOverflowed(); n != 0 {
		t.Fatalf("takeOverflowed again = %d, want 0", n)
	}
}

func TestIntakeWeightMatters(t *testing.T) {
	tests := []struct {
		old, w int
		want   bool
	}{
		{100, 100, false},
		{0, 1, true},    // starts taking overflow
		{6000, 0, true}, // stops
		{6000, 1, true}, // saturated
		{1, 6000, true}, // room again
		{6000, 4000, false},
		{6000, 3000, true},
		{3000, 5999, false},
		{3000, 6000, true},
	}
	for _, tt := range tests {
		if got := intakeWeightMatters(tt.old, tt.w); got != tt.want {
			t.Errorf("intakeWeightMatters(%d, %d) = %v, want %v", tt.old, tt.w, got, tt.want)
		}
	}
}

// BenchmarkOverflowDecide is the per-publish cost of overflow at publish
// for an exported group of 8 busy members with a backlog: it must not
// allocate.
func BenchmarkOverflowDecide(b *testing.B) {
	members := make([]scoring.MemberSnapshot, 8)
	for i := range members {
		members[i] = member(time.Duration(i)*10*time.Millisecond, 100*time.Millisecond)
	}
	var v overflowView
	now := time.Now()
	v.setMembers(members, 200*time.Millisecond, now)
	b.ReportAllocs()
	for b.Loop() {
		v.setReady(10, 2)
		v.decide(now, nil)
	}
}

// BenchmarkOverflowDecideRouted is the same routed by the other sites'
// states (--wq-route nearest), with a sibling broker of 8 members and
// three other sites of 8: it must not allocate either.
func BenchmarkOverflowDecideRouted(b *testing.B) {
	ms := time.Millisecond
	now := time.Now()
	members := make([]scoring.MemberSnapshot, 8)
	waits := make([]wqroute.MemberState, 8)
	for i := range members {
		members[i] = member(time.Duration(i)*10*ms, 100*ms)
		waits[i] = wqroute.MemberState{Wait: time.Duration(i) * 15 * ms, Service: 100 * ms}
	}
	r := wqroute.NewRouter(wqroute.Config{Site: "here", Broker: "h1", StaleAfter: time.Minute})
	for i, site := range []string{"here", "a", "b", "c"} {
		r.Observe(wqroute.State{Site: site, Broker: "x", Sent: now.UnixNano(), Members: waits}, now.Add(time.Duration(i*20)*ms))
	}
	var v overflowView
	v.setMembers(members, 200*ms, now)
	b.ReportAllocs()
	for b.Loop() {
		v.setReady(10, 2)
		v.decide(now.Add(100*ms), r)
		r.Unbook("a")
		r.Unbook("b")
		r.Unbook("c")
	}
}

func TestIntakePollInterval(t *testing.T) {
	if got := intakePollInterval(time.Second); got != 10*time.Millisecond {
		t.Errorf("right after intake traffic: %v, want 10ms", got)
	}
	if got := intakePollInterval(time.Minute); got != 50*time.Millisecond {
		t.Errorf("after a quiet minute: %v, want 50ms", got)
	}
}

// With the other sites' states, a publish goes to the site that starts
// it soonest, delay included, even when the local wait is under the TTL;
// with no fresh state the TTL rule holds.
func TestOverflowViewDecideRoutes(t *testing.T) {
	ms := time.Millisecond
	now := time.Now()
	// A few publishes an hour: the local wait is compared as it is
	// (wqroute.LocalCost; TestOverflowViewDecideWeighsTheRate).
	v := overflowView{rate: wqroute.PublishRate{Window: time.Hour}}
	// One local member busy for 80 ms more, TTL 200 ms.
	v.setMembers([]scoring.MemberSnapshot{member(80*ms, 100*ms)}, 200*ms, now)
	r := wqroute.NewRouter(wqroute.Config{Site: "here", StaleAfter: time.Second})
	if d := v.decide(now, r); d.site != "" || d.overflow {
		t.Fatalf("no state yet: %+v, want local", d)
	}
	// An idle site 20 ms away starts the next one at 20 ms, before the
	// local member's 180 ms (one message now ready ahead of it).
	st := wqroute.State{Site: "near", Sent: now.UnixNano(), Members: []wqroute.MemberState{{Service: 100 * ms}}}
	r.Observe(st, now.Add(20*ms))
	if d := v.decide(now.Add(20*ms), r); d.site != "near" {
		t.Fatalf("idle site 20 ms away: %+v, want near", d)
	}
	// The next would wait behind the one booked there (120 ms), behind
	// the local 160 ms: near again; then local at 160 < near at 220.
	if d := v.decide(now.Add(20*ms), r); d.site != "near" {
		t.Fatalf("second: %+v, want near", d)
	}
	if d := v.decide(now.Add(20*ms), r); d.site != "" || d.overflow {
		t.Fatalf("third: %+v, want local", d)
	}
	if n := v.takeOverflowed(); n != 2 {
		t.Fatalf("takeOverflowed = %d, want 2 (the routed publishes)", n)
	}
	// The next would wait 260 ms here, past the TTL; near starts it at
	// 220 ms: near.
	if d := v.decide(now.Add(20*ms), r); d.site != "near" || d.local != 260*ms || d.start != 220*ms {
		t.Fatalf("past the TTL, sooner at near: %+v, want near", d)
	}
	// The next would wait 260 ms here too, and 320 ms at near: it stays
	// here (wq.<g>'s TTL is heldTTL when routing by state), where the old
	// rule sent everything past the TTL to the best other site.
	if d := v.decide(now.Add(20*ms), r); d.site != "" || d.overflow || d.local != 260*ms {
		t.Fatalf("past the TTL, sooner here: %+v, want held here", d)
	}
	// near's next state, sent 20 ms later: it took all three and is idle. The
	// last message held here would start in 220 ms: dispatch sends it
	// there (20 ms); the one before it (120 ms here, 120 ms there) stays.
	st.Sent, st.Taken = now.Add(40*ms).UnixNano(), map[string]uint64{"here": 3}
	r.Observe(st, now.Add(60*ms))
	if d := v.dispatch(now.Add(60*ms), r); d.site != "near" || !d.ok || d.local != 220*ms || d.start != 20*ms {
		t.Fatalf("dispatch to an idle site: %+v, want near, weighed 220ms here against 20ms there", d)
	}
	if site := v.dispatch(now.Add(60*ms), r).site; site != "" {
		t.Fatalf("dispatch on a tie: %q, want none", site)
	}
	// Nothing ready here: nothing to dispatch, whatever near's state.
	r.Unbook("near")
	v.undispatch()
	if site := v.dispatch(now.Add(60*ms), r).site; site != "" {
		t.Fatalf("dispatch from an empty queue: %q, want none", site)
	}
	// State is published with the waits as of now.
	if got, _, _ := v.state("here", "b1", "boot", now.Add(30*ms)); got.Members[0].Wait != 50*ms || got.Site != "here" {
		t.Fatalf("state = %+v, want the member's wait 50ms", got)
	}
}

// At a site publishing more than its members can do, a message does not
// wait for a local member when another site would start it without
// queueing: the next publish takes that member when it frees.
func TestOverflowViewDecideWeighsTheRate(t *testing.T) {
	ms := time.Millisecond
	now := time.Unix(1000, 0)
	r := wqroute.NewRouter(wqroute.Config{Site: "here", StaleAfter: 10 * time.Second})
	// near is 50 ms away with three idle members of 1 s.
	idle := wqroute.MemberState{Service: time.Second}
	r.Observe(wqroute.State{Site: "near", Sent: now.UnixNano(), Members: []wqroute.MemberState{idle, idle, idle}}, now.Add(50*ms))
	// Three local members of 1 s, the first free in 20 ms.
	local := []scoring.MemberSnapshot{member(20*ms, time.Second), member(400*ms, time.Second), member(700*ms, time.Second)}
	quiet := overflowView{rate: wqroute.PublishRate{Window: time.Hour}}
	quiet.setMembers(local, time.Second, now.Add(50*ms))
	if d := quiet.decide(now.Add(50*ms), r); d.site != "" || d.local != 20*ms {
		t.Fatalf("a publish now and then: %+v, want it kept for the local member free in 20 ms", d)
	}
	// Six a second for the last two seconds, twice what the members do.
	var busy overflowView
	busy.setMembers(local, time.Second, now.Add(50*ms))
	for i := range 12 {
		busy.rate.Add(now.Add(-2*time.Second + time.Duration(i)*166*ms))
	}
	d := busy.decide(now.Add(50*ms), r)
	if d.site != "near" || d.local != 20*ms || d.start != 50*ms {
		t.Fatalf("six publishes a second: %+v, want near (50 ms) rather than 20 ms at home", d)
	}
}

// wq.<g>'s TTL is lengthened to heldTTL only for members that can be
// predicted: a member that acknowledges on receipt has no service time,
// and its site keeps the thesis's TTL.
func TestAllTimed(t *testing.T) {
	ms := time.Millisecond
	if !allTimed([]scoring.MemberSnapshot{member(0, 100*ms), member(50*ms, 80*ms), {Online: false}}) {
		t.Fatal("members with service times: not all timed")
	}
	if allTimed([]scoring.MemberSnapshot{member(0, 100*ms), member(0, 0)}) {
		t.Fatal("a member without a service time: all timed")
	}
	if allTimed(nil) {
		t.Fatal("no member: all timed")
	}
}

// The other brokers of the site serve the same queues: a publish that
// this broker's busy member would start late stays when a sibling's
// member is idle, instead of going to another site.
func TestOverflowViewDecideCountsSiblings(t *testing.T) {
	ms := time.Millisecond
	now := time.Now()
	var v overflowView
	v.setMembers([]scoring.MemberSnapshot{member(300*ms, 100*ms)}, 200*ms, now)
	r := wqroute.NewRouter(wqroute.Config{Site: "here", Broker: "h1", StaleAfter: time.Second})
	r.Observe(wqroute.State{Site: "near", Broker: "n1", Sent: now.UnixNano(), Members: []wqroute.MemberState{{Service: 100 * ms}}}, now.Add(20*ms))
	if d := v.decide(now.Add(20*ms), r); d.site != "near" {
		t.Fatalf("busy here, idle at near: %+v, want near", d)
	}
	r.Observe(wqroute.State{Site: "here", Broker: "h2", Sent: now.Add(20 * ms).UnixNano(), Members: []wqroute.MemberState{{Service: 100 * ms}}}, now.Add(20*ms))
	if d := v.decide(now.Add(20*ms), r); d.site != "" || d.overflow || d.local != 0 {
		t.Fatalf("a sibling's member idle: %+v, want local at 0", d)
	}
}

// What staying home costs is weighed with the whole site: a broker
// whose one 100 ms member takes 20 publishes a second would send a
// message that waits 10 ms to an idle site 30 ms away (λS = 2 per
// member), but with a sibling's two 20 ms members the site's load is a
// third of that per member, and the message stays. The sibling's own
// publishes count too: when it publishes as many again, it goes.
func TestOverflowViewLocalCostWeighsTheSite(t *testing.T) {
	ms := time.Millisecond
	now := time.Unix(1000, 0)
	newView := func() *overflowView {
		v := &overflowView{}
		v.setMembers([]scoring.MemberSnapshot{member(10*ms, 100*ms)}, time.Second, now)
		for i := range 40 { // 20 a second for the last two seconds
			v.rate.Add(now.Add(-2*time.Second + time.Duration(i)*50*ms))
		}
		return v
	}
	idle := wqroute.MemberState{Service: 100 * ms}
	near := wqroute.State{Site: "near", Broker: "n1", Sent: now.UnixNano(), Members: []wqroute.MemberState{idle, idle}}
	alone := wqroute.NewRouter(wqroute.Config{Site: "here", Broker: "h1", StaleAfter: time.Second})
	alone.Observe(near, now.Add(30*ms))
	if d := newView().decide(now, alone); d.site != "near" || d.local != 10*ms {
		t.Fatalf("alone: %+v, want near: 10 ms here weighs more than 30 ms there at λS = 2", d)
	}

	sibling := func(publishes float64) *wqroute.Router {
		r := wqroute.NewRouter(wqroute.Config{Site: "here", Broker: "h1", StaleAfter: time.Second})
		r.Observe(near, now.Add(30*ms))
		busy := wqroute.MemberState{Wait: 10 * ms, Service: 20 * ms}
		r.Observe(wqroute.State{Site: "here", Broker: "h2", Sent: now.UnixNano(), Members: []wqroute.MemberState{busy, busy}, Publishes: publishes}, now)
		return r
	}
	d := newView().decide(now, sibling(0))
	if d.site != "" || d.local != 10*ms || d.cost >= 30*ms {
		t.Fatalf("with a quiet sibling's two 20 ms members: %+v, want it kept (cost under 30 ms)", d)
	}
	if d := newView().decide(now, sibling(80)); d.site != "near" {
		t.Fatalf("with a sibling publishing 80 a second: %+v, want near", d)
	}
}

// Local members that cannot be predicted (busy, no service time yet)
// would keep a publish at most the TTL: a site that starts it sooner
// gets it; one that would start it later does not.
func TestOverflowViewDecideUnpredictableLocal(t *testing.T) {
	ms := time.Millisecond
	now := time.Now()
	var v overflowView
	busyNewcomer := scoring.MemberSnapshot{Online: true, InFlight: 1, AcksAreFinishes: true}
	v.setMembers([]scoring.MemberSnapshot{busyNewcomer}, 200*ms, now)
	r := wqroute.NewRouter(wqroute.Config{Site: "here", StaleAfter: time.Second})
	r.Observe(wqroute.State{Site: "far", Sent: now.UnixNano(), Members: []wqroute.MemberState{{Service: 100 * ms}}}, now.Add(250*ms))
	if d := v.decide(now.Add(250*ms), r); d.site != "" || d.overflow {
		t.Fatalf("far starts it after the TTL: %+v, want held here", d)
	}
	r.Observe(wqroute.State{Site: "near", Sent: now.UnixNano(), Members: []wqroute.MemberState{{Service: 100 * ms}}}, now.Add(30*ms))
	if d := v.decide(now.Add(250*ms), r); d.site != "near" || d.local != 200*ms {
		t.Fatalf("near starts it within the TTL: %+v, want near", d)
	}
}

func TestOverflowViewDemandInputs(t *testing.T) {
	ms := time.Millisecond
	now := time.Unix(1000, 0)
	r := wqroute.NewRouter(wqroute.Config{Site: "tunis", Broker: "tunis-1"})
	var v overflowView
	lease := 1500 * ms
	// Members busy with other sites' messages, but no local publish: no
	// message of this site to route.
	v.setMembers([]scoring.MemberSnapshot{member(80*ms, 100*ms)}, 150*ms, now)
	if start, held, sustained := v.demandInputs(now, r, 3*time.Second, lease); start != 0 || held != 0 || sustained {
		t.Fatalf("demandInputs without a local publish = %v, %d, %v; want 0, 0, false", start, held, sustained)
	}
	// One publish is not a stream: it is held (and asks for the states
	// itself when none is fresh), but it does not make a start to route.
	v.decide(now, r)
	if start, held, sustained := v.demandInputs(now.Add(10*ms), r, 3*time.Second, lease); start != 0 || held != 1 || sustained {
		t.Fatalf("demandInputs after one publish = %v, %d, %v; want 0, 1 held, not sustained", start, held, sustained)
	}
	// Ten publishes a second are: a stream of states over a lease is used.
	for i := 1; i < 10; i++ {
		v.decide(now.Add(time.Duration(i)*100*ms), r)
	}
	later := now.Add(time.Second)
	v.setMembers([]scoring.MemberSnapshot{member(80*ms, 100*ms)}, 150*ms, later)
	v.setReady(1, 0)
	start, held, sustained := v.demandInputs(later.Add(10*ms), r, 3*time.Second, lease)
	if held != 1 || start != 170*ms || !sustained {
		t.Fatalf("demandInputs after ten publishes in a second = %v, %d, %v; want 170ms (70 ms left, then the held one), 1, sustained", start, held, sustained)
	}
	v.setReady(0, 0)
	if start, _, _ := v.demandInputs(later.Add(3*time.Second+ms), r, 3*time.Second, lease); start != 0 {
		t.Fatalf("demandInputs 3 s after the last local publish = %v, want 0", start)
	}
}

// A publish that finds no other site's state fresh, at a broker that has
// heard of other sites, waits in wq.<g> and asks for the states, when its
// wait is longer than the nearest site is away; it no longer leaves by the
// hash ring to a site drawn by weight. So does one that would outlive
// eq. 2.12's TTL when members cannot be predicted (wq.<g> then keeps that
// TTL, which bounds the hold) or no site is known yet (a broker's first
// overflow): before, it left by the ring at once, which could bring it
// back to this site's own intake.
func TestOverflowViewDecideAsksForStatesWhenNoneIsFresh(t *testing.T) {
	ms := time.Millisecond
	now := time.Unix(1000, 0)
	r := wqroute.NewRouter(wqroute.Config{Site: "berlin", Broker: "berlin-1", StaleAfter: 1500 * ms})
	r.Observe(wqroute.State{Site: "tunis", Broker: "tunis-1", Sent: now.UnixNano(), Members: []wqroute.MemberState{{Service: time.Second}}}, now.Add(22*ms))
	later := now.Add(5 * time.Second) // tunis's state is stale
	var v overflowView
	v.setMembers([]scoring.MemberSnapshot{member(900*ms, time.Second)}, 500*ms, later)
	d := v.decide(later, r)
	if !d.askStates || d.overflow || d.site != "" {
		t.Fatalf("decide with a stale state and 900 ms to wait = %+v; want held, asking for states", d)
	}
	if _, held, _ := v.demandInputs(later, r, 3*time.Second, 1500*ms); held != 1 {
		t.Fatalf("held = %d after the publish, want 1", held)
	}
	// A wait shorter than the nearest delay asks nothing.
	var quick overflowView
	quick.setMembers([]scoring.MemberSnapshot{member(10*ms, time.Second)}, 500*ms, later)
	if d := quick.decide(later, r); d.askStates || d.overflow {
		t.Fatalf("decide with 10 ms to wait (tunis 22 ms away) = %+v; want it kept without asking", d)
	}
	// A member without a service time: held under eq. 2.12's TTL while
	// the states are asked for, when the wait exceeds that TTL; kept
	// without asking when it does not (the TTL would not expire).
	var untimed overflowView
	untimed.setMembers([]scoring.MemberSnapshot{member(900*ms, time.Second), {Online: true, InFlight: 1, AcksAreFinishes: true}}, 500*ms, later)
	if d := untimed.decide(later, r); !d.askStates || d.overflow {
		t.Fatalf("decide with an unpredictable member and 900 ms to wait = %+v; want held under the TTL, asking for states", d)
	}
	var untimedQuick overflowView
	untimedQuick.setMembers([]scoring.MemberSnapshot{member(300*ms, time.Second), {Online: true, InFlight: 1, AcksAreFinishes: true}}, 500*ms, later)
	if d := untimedQuick.decide(later, r); d.askStates || d.overflow {
		t.Fatalf("decide with an unpredictable member and 300 ms to wait (TTL 500 ms) = %+v; want it kept without asking", d)
	}
	// No other site heard of yet: the same, rather than the ring at once.
	fresh := wqroute.NewRouter(wqroute.Config{Site: "berlin", Broker: "berlin-1", StaleAfter: 1500 * ms})
	var first overflowView
	first.setMembers([]scoring.MemberSnapshot{member(900*ms, time.Second)}, 500*ms, later)
	if d := first.decide(later, fresh); !d.askStates || d.overflow || d.site != "" {
		t.Fatalf("decide with no site known and 900 ms to wait = %+v; want held under the TTL, asking for states", d)
	}
	var firstQuick overflowView
	firstQuick.setMembers([]scoring.MemberSnapshot{member(100*ms, time.Second)}, 500*ms, later)
	if d := firstQuick.decide(later, fresh); d.askStates || d.overflow {
		t.Fatalf("decide with no site known and 100 ms to wait = %+v; want it kept without asking", d)
	}
}

// The state loop is woken when more members are idle than at the last
// look at empty queues, not on every look.
func TestOverflowViewIdleRose(t *testing.T) {
	ms := time.Millisecond
	now := time.Unix(1000, 0)
	var v overflowView
	busy, idle := member(30*ms, 100*ms), member(0, 100*ms)
	steps := []struct {
		members []scoring.MemberSnapshot
		want    bool
	}{
		{[]scoring.MemberSnapshot{busy, busy}, false},
		{[]scoring.MemberSnapshot{idle, busy}, true},
		{[]scoring.MemberSnapshot{idle, busy}, false},
		{[]scoring.MemberSnapshot{busy, busy}, false},
		{[]scoring.MemberSnapshot{idle, busy}, true},
		{[]scoring.MemberSnapshot{idle, idle}, true},
		// In flight (acknowledges after processing, not reported yet):
		// not idle.
		{[]scoring.MemberSnapshot{idle, {Online: true, ServiceEstimate: 100 * ms, InFlight: 1}}, false},
		// Offline members do not count.
		{[]scoring.MemberSnapshot{idle, {Online: false}, idle}, true},
	}
	for i, s := range steps {
		v.setMembers(s.members, time.Second, now)
		if got := v.idleRose(); got != s.want {
			t.Fatalf("step %d: idleRose = %v, want %v", i, got, s.want)
		}
	}
}

// A state counts the routed messages taken by the time its members were
// read, no later one: a message taken since is in neither the members'
// waits nor the counts until the members are read again. The take times
// a lease holder's extrapolation reads are cut at the same instant.
func TestOverflowViewStateCountsTakesWithTheMembers(t *testing.T) {
	ms := time.Millisecond
	now := time.Unix(2000, 0)
	var v overflowView
	idle := []scoring.MemberSnapshot{{Online: true, ServiceEstimate: time.Second}}
	v.setMembers(idle, time.Second, now)
	// Tunis's router expected it at +5ms; it was taken at +10ms.
	v.tookRouted("tunis", now.Add(10*ms), now.Add(5*ms)) // being delivered
	st, _, _ := v.state("here", "b1", "boot", now.Add(20*ms))
	if st.Taken["tunis"] != 0 || st.Members[0].Wait != 0 {
		t.Fatalf("state before the members are read again: taken %v, wait %v; want 0 and 0", st.Taken, st.Members[0].Wait)
	}
	if got := v.takesFrom("tunis", time.Time{}, nil); len(got) != 0 {
		t.Fatalf("takesFrom before the members are read again = %v, want none", got)
	}
	busy := []scoring.MemberSnapshot{{Online: true, ServiceEstimate: time.Second, PredictedWait: time.Second, InFlight: 1}}
	v.setMembers(busy, time.Second, now.Add(15*ms))
	v.tookRouted("berlin", now.Add(16*ms), time.Time{})
	v.tookRouted("tunis", now.Add(17*ms), now.Add(12*ms)) // after the reading, before the state
	st, _, read := v.state("here", "b1", "boot", now.Add(20*ms))
	if st.Taken["tunis"] != 1 || st.Taken["berlin"] != 0 || st.Members[0].Wait != 995*ms || !read.Equal(now.Add(15*ms)) {
		t.Fatalf("state after: taken %v, wait %v, members read at %v; want tunis 1, berlin 0, 995ms, +15ms", st.Taken, st.Members[0].Wait, read.Sub(now))
	}
	got := v.takesFrom("tunis", time.Time{}, nil)
	if len(got) != 1 || got[0] != now.Add(5*ms).UnixNano() {
		t.Fatalf("takesFrom(tunis) = %v, want the take tunis's router expected at +5ms", got)
	}
	if got := v.takesFrom("tunis", now.Add(10*ms), nil); len(got) != 0 {
		t.Fatalf("takesFrom(tunis) since that take = %v, want none", got)
	}
	// The next state, with the members read again, counts the take made
	// between the last reading and the last state: a holder collects the
	// take times from that reading (not from the state's send time), or
	// that take would have no time.
	v.setMembers(busy, time.Second, now.Add(30*ms))
	if got := v.takesFrom("tunis", read, nil); len(got) != 1 || got[0] != now.Add(12*ms).UnixNano() {
		t.Fatalf("takesFrom(tunis) since the last state's reading = %v, want the take expected at +12ms", got)
	}
	// The ring forgets the oldest takes, not the counts.
	for i := range maxRecentTakes + 5 {
		v.tookRouted("tunis", now.Add(time.Duration(100+i)*ms), time.Time{})
	}
	v.setMembers(busy, time.Second, now.Add(time.Second))
	st, _, _ = v.state("here", "b1", "boot", now.Add(time.Second))
	if berlin := v.takesFrom("berlin", time.Time{}, nil); len(berlin) != 0 {
		t.Fatalf("takesFrom(berlin) after the ring turned = %v, want none", berlin)
	}
	if n := len(v.takesFrom("tunis", time.Time{}, nil)); st.Taken["tunis"] != maxRecentTakes+7 || n != maxRecentTakes {
		t.Fatalf("after %d more takes: taken %d, %d times remembered; want %d and %d", maxRecentTakes+5, st.Taken["tunis"], n, maxRecentTakes+7, maxRecentTakes)
	}
}

// A message the consume loop took after it last read the members is on
// its way to a member those members still show free: a publish arriving
// meanwhile counts it ahead, and is not predicted to start at once. The
// next reading of the members replaces the count.
func TestOverflowViewDecideCountsWhatTheLoopJustTook(t *testing.T) {
	ms := time.Millisecond
	now := time.Unix(1000, 0)
	var v overflowView
	// One member idle, one free in 200 ms, TTL 150 ms.
	v.setMembers([]scoring.MemberSnapshot{member(0, 300*ms), member(200*ms, 300*ms)}, 150*ms, now)
	v.took() // a routed message from the intake, taken for the idle member
	if d := v.decide(now.Add(ms), nil); !d.overflow || d.local != 199*ms {
		t.Fatalf("decide just after a take = %+v; want 199 ms (the idle member is taken), past the TTL", d)
	}
	// Read again: the taken message shows in the members (both busy, the
	// first for 300 ms), and is not counted a second time.
	v.setMembers([]scoring.MemberSnapshot{member(300*ms, 300*ms), member(100*ms, 300*ms)}, 150*ms, now.Add(100*ms))
	if d := v.decide(now.Add(100*ms), nil); d.overflow || v.readyWork != 1 {
		t.Fatalf("decide after the members were read again = %+v (ready %d); want it kept (100 ms), the take counted once", d, v.readyWork)
	}
}
