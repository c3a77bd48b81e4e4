package wqroute

import (
	"math"
	"testing"
	"time"
)

func TestLocalCost(t *testing.T) {
	ms := time.Millisecond
	// Few publishes, or nothing known of the service: the plain wait.
	for _, c := range []struct {
		wait, service time.Duration
		rate          float64
	}{{10 * ms, time.Second, 0}, {10 * ms, 0, 2}, {0, time.Second, 2}} {
		if got := LocalCost(c.wait, c.service, c.rate); got != c.wait {
			t.Errorf("LocalCost(%v, %v, %v) = %v, want the wait", c.wait, c.service, c.rate, got)
		}
	}
	// Twice what the members can do (λS = 2): 10 ms at home costs
	// (e^0.02 − 1)/2 · e^2 ≈ 74.6 ms.
	if got := LocalCost(10*ms, time.Second, 2); got < 74*ms || got > 75*ms {
		t.Errorf("LocalCost(10ms, 1s, 2/s) = %v, want about 74.6ms", got)
	}
	// A quiet site (λS = 0.01) costs about the wait itself.
	if got := LocalCost(50*ms, time.Second, 0.01); got < 50*ms || got > 51*ms {
		t.Errorf("LocalCost(50ms, 1s, 0.01/s) = %v, want about 50.5ms", got)
	}
	// It grows with the wait and with the rate, and is never below the
	// wait.
	prev := time.Duration(0)
	for w := ms; w <= time.Second; w += 7 * ms {
		got := LocalCost(w, 300*ms, 3)
		if got < w || got < prev {
			t.Fatalf("LocalCost(%v, 300ms, 3/s) = %v after %v: want at least the wait and increasing", w, got, prev)
		}
		prev = got
	}
	if a, b := LocalCost(20*ms, 300*ms, 1), LocalCost(20*ms, 300*ms, 4); a >= b {
		t.Errorf("LocalCost at 1/s = %v, at 4/s = %v: want more at the higher rate", a, b)
	}
	// Far beyond any start: bounded.
	if got := LocalCost(time.Second, time.Minute, 50); got != maxLocalCost {
		t.Errorf("LocalCost(1s, 1m, 50/s) = %v, want %v", got, maxLocalCost)
	}
}

// The closed form is the break-even of the two choices it weighs:
// keeping the message home costs (1 − e^{−λw})/λ − s·e^{−λ(w+S)} against
// sending it to a site that starts it after s; at s = LocalCost that is 0.
func TestLocalCostIsTheBreakEven(t *testing.T) {
	for _, c := range []struct {
		wait, service time.Duration
		rate          float64
	}{{10 * time.Millisecond, time.Second, 2}, {40 * time.Millisecond, 333 * time.Millisecond, 6}, {5 * time.Millisecond, 100 * time.Millisecond, 20}, {200 * time.Millisecond, time.Second, 0.3}} {
		s := LocalCost(c.wait, c.service, c.rate).Seconds()
		w, S, l := c.wait.Seconds(), c.service.Seconds(), c.rate
		if diff := -math.Expm1(-l*w)/l - s*math.Exp(-l*(w+S)); math.Abs(diff) > 1e-6 {
			t.Errorf("%+v: keeping home minus sending away at s = %.6f s is %g, want 0", c, s, diff)
		}
	}
}

func TestPublishRate(t *testing.T) {
	now := time.Unix(1000, 0)
	var r PublishRate
	if got := r.PerSecond(now); got != 0 {
		t.Fatalf("rate before any publish = %v, want 0", got)
	}
	// Ten a second for ten seconds (five time constants): about 10/s.
	for i := range 100 {
		r.Add(now.Add(time.Duration(i) * 100 * time.Millisecond))
	}
	end := now.Add(10 * time.Second)
	if got := r.PerSecond(end); got < 9.5 || got > 10.5 {
		t.Fatalf("rate after 10/s for 10 s = %v, want about 10", got)
	}
	// Silence for five time constants: under 1 % of it.
	if got := r.PerSecond(end.Add(10 * time.Second)); got > 0.1 {
		t.Fatalf("rate after 10 s of silence = %v, want about 0", got)
	}
	// A clock that steps back does not raise the count.
	before := r.PerSecond(end.Add(10 * time.Second))
	if got := r.PerSecond(end); got != before {
		t.Fatalf("rate read at an earlier time = %v, want %v", got, before)
	}
}

func BenchmarkLocalCost(b *testing.B) {
	var r PublishRate
	now := time.Unix(1000, 0)
	b.ReportAllocs()
	var sink time.Duration
	for i := range b.N {
		now = now.Add(50 * time.Millisecond)
		r.Add(now)
		sink += LocalCost(time.Duration(i%50)*time.Millisecond, 333*time.Millisecond, r.PerSecond(now)/3)
	}
	_ = sink
}

// RouteWeighed compares localCost only with sites that would start the
// message on arrival: one where it would queue is compared with the local
// wait itself.
func TestRouteWeighedOnlyForSitesWithRoom(t *testing.T) {
	ms := time.Millisecond
	now := time.Unix(1000, 0)
	r := NewRouter(Config{Site: "here", StaleAfter: 10 * time.Second})
	// near, 50 ms away: its one member busy for 300 ms more when it sent
	// its state. A message sent now would start there 250 ms from now.
	r.Observe(State{Site: "near", Sent: now.Add(-50 * ms).UnixNano(), Members: []MemberState{{Wait: 300 * ms, Service: time.Second}}}, now)
	if c := r.RouteWeighed(now, 20*ms, 500*ms, time.Minute); c.Site != "" || !c.Fresh || c.Start != 20*ms {
		t.Fatalf("a site where it would queue, 250 ms against 20 ms at home (weighed 500 ms): %+v, want home", c)
	}
	// Its member idle: 50 ms there, on arrival, against 20 ms at home
	// weighed 500 ms: there.
	r.Observe(State{Site: "near", Sent: now.UnixNano(), Members: []MemberState{{Service: time.Second}}}, now.Add(50*ms))
	c := r.RouteWeighed(now.Add(50*ms), 20*ms, 500*ms, time.Minute)
	if c.Site != "near" || c.Start != 50*ms {
		t.Fatalf("a site with a member free on arrival, 50 ms against 20 ms weighed 500 ms: %+v, want near", c)
	}
	// The next would wait a second behind it there: home.
	if c := r.RouteWeighed(now.Add(50*ms), 20*ms, 500*ms, time.Minute); c.Site != "" || !c.Fresh {
		t.Fatalf("behind the one booked there: %+v, want home", c)
	}
	// Unweighed (Route), the idle site does not beat 20 ms at home.
	r.Observe(State{Site: "near", Sent: now.Add(100 * ms).UnixNano(), Members: []MemberState{{Service: time.Second}}, Taken: map[string]uint64{"here": 1}}, now.Add(150*ms))
	if c := r.Route(now.Add(150*ms), 20*ms, time.Minute); c.Site != "" || !c.Fresh {
		t.Fatalf("Route, 50 ms there against 20 ms at home: %+v, want home", c)
	}
}
