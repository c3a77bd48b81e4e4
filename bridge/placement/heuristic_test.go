package placement

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// triangle is three sites: a and b close together, c far from both.
func triangle() Delays {
	return Delays{
		"a": {"b": 10 * time.Millisecond, "c": 50 * time.Millisecond},
		"b": {"c": 50 * time.Millisecond},
	}
}

func unlimitedSites(names ...string) []Site {
	sites := make([]Site, len(names))
	for i, n := range names {
		sites[i] = Site{Name: n}
	}
	return sites
}

// TestBusiestExchangePlacedFirst: two exchanges both prefer site a, whose
// inbound bandwidth holds only one synchronisation instance. The busier
// one, although listed second, is placed first and gets a; the quieter one
// goes to the best-scored site that still fits.
func TestBusiestExchangePlacedFirst(t *testing.T) {
	const size = 1000 // bytes
	quiet := Exchange{Name: "pubsub.quiet", MeanMessageSize: size, Instances: []Instance{
		{Site: "a", LocalPublished: 10, LocalConsumed: 10},
		{Site: "b", LocalPublished: 5, LocalConsumed: 4},
		{Site: "c", LocalConsumed: 1},
	}}
	busy := Exchange{Name: "pubsub.busy", MeanMessageSize: size, Instances: []Instance{
		{Site: "a", LocalPublished: 100, LocalConsumed: 100},
		{Site: "b", LocalPublished: 50, LocalConsumed: 40},
		{Site: "c", LocalConsumed: 10},
	}}
	// First placement (no previous plan): a hub receives every publication,
	// busy 150 msg/s × 1000 B, quiet 15 msg/s × 1000 B.
	sites := []Site{{Name: "a", InboundBandwidth: 160_000}, {Name: "b"}, {Name: "c"}}
	in := Input{Sites: sites, Exchanges: []Exchange{quiet, busy}, Delays: triangle()}
	r, err := Heuristic(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{r.Decisions[0].Exchange, r.Decisions[1].Exchange}; !slices.Equal(got, []string{"pubsub.busy", "pubsub.quiet"}) {
		t.Fatalf("placement order %v, want busiest first", got)
	}
	if r.Decisions[0].Traffic != 300 || r.Decisions[1].Traffic != 30 {
		t.Errorf("P(E_i) = %v, %v; want 300, 30", r.Decisions[0].Traffic, r.Decisions[1].Traffic)
	}
	want := Plan{"pubsub.busy": "a", "pubsub.quiet": "b"}
	if !mapsEqual(r.Plan, want) {
		t.Fatalf("plan %v, want %v", r.Plan, want)
	}
	if r.Decisions[0].Reason != ReasonBestScore || r.Decisions[1].Reason != ReasonBandwidth {
		t.Errorf("reasons %s, %s; want %s, %s", r.Decisions[0].Reason, r.Decisions[1].Reason, ReasonBestScore, ReasonBandwidth)
	}
	// Eq. 2.9 for busy at a: (100+100) / (d(b,a)+d(c,a)) = 200/60.
	if c := r.Decisions[0].Candidates[0]; c.Site != "a" || math.Abs(c.Centrality-200.0/60) > 1e-12 {
		t.Errorf("best candidate %+v, want a with centrality %v", c, 200.0/60)
	}
	// Alone, the quiet exchange would have had a.
	alone, err := Heuristic(Input{Sites: sites, Exchanges: []Exchange{quiet}, Delays: triangle()})
	if err != nil {
		t.Fatal(err)
	}
	if alone.Plan["pubsub.quiet"] != "a" {
		t.Errorf("quiet alone placed at %s, want a", alone.Plan["pubsub.quiet"])
	}
}

// TestPenaltyKeepsPreviousSite: a scores slightly above the previous
// synchronisation site b. A penalty larger than the gap keeps b; a smaller
// one lets the exchange move to a.
func TestPenaltyKeepsPreviousSite(t *testing.T) {
	delays := Delays{
		"a": {"b": 20 * time.Millisecond, "c": 30 * time.Millisecond},
		"b": {"c": 30 * time.Millisecond},
	}
	e := Exchange{Name: "pubsub.news", MeanMessageSize: 500, Instances: []Instance{
		{Site: "a", LocalPublished: 60, LocalConsumed: 50, OverlayIn: 40, OverlayOut: 60},
		{Site: "b", LocalPublished: 50, LocalConsumed: 50, OverlayIn: 70, OverlayOut: 100},
		{Site: "c", LocalPublished: 5, LocalConsumed: 5, OverlayIn: 100, OverlayOut: 5},
	}}
	// C(a) = 110/50 = 2.2, C(b) = 100/50 = 2.0.
	for _, tc := range []struct {
		lambda float64
		want   string
		moved  bool
	}{
		{lambda: 0, want: "a", moved: true},
		{lambda: 0.1, want: "a", moved: true},
		{lambda: 0.3, want: "b", moved: false},
		{lambda: 100, want: "b", moved: false},
	} {
		in := Input{Sites: unlimitedSites("a", "b", "c"), Exchanges: []Exchange{e}, Delays: delays,
			Previous: Plan{"pubsub.news": "b"}, Lambda: tc.lambda}
		r, err := Heuristic(in)
		if err != nil {
			t.Fatal(err)
		}
		d := r.Decisions[0]
		if d.Site != tc.want || d.Moved() != tc.moved || d.Previous != "b" {
			t.Errorf("λ=%v: placed at %s (moved %v, previous %q), want %s (moved %v)", tc.lambda, d.Site, d.Moved(), d.Previous, tc.want, tc.moved)
		}
		for _, c := range d.Candidates {
			want := c.Centrality - tc.lambda
			if c.Site == "b" {
				want = c.Centrality
			}
			if math.Abs(c.Score-want) > 1e-12 {
				t.Errorf("λ=%v: %s score %v, want %v", tc.lambda, c.Site, c.Score, want)
			}
		}
	}
}

// TestBandwidthFallsBackToLeastLoadedSite: the exchange's synchronisation
// traffic fits no site, so it goes to the site with the least estimated
// overlay throughput (c), not the best-scored one (a). With room, a wins.
func TestBandwidthFallsBackToLeastLoadedSite(t *testing.T) {
	const size = 1000
	x := Exchange{Name: "pubsub.x", MeanMessageSize: size, Instances: []Instance{
		// Previous synchronisation site: its overlay traffic is all sync
		// traffic, 100 000 B/s in and 200 000 B/s out.
		{Site: "a", LocalPublished: 80, LocalConsumed: 80, OverlayIn: 100, OverlayOut: 200},
		{Site: "b", LocalPublished: 40, LocalConsumed: 40, OverlayIn: 50, OverlayOut: 10},
		{Site: "c", LocalPublished: 1, LocalConsumed: 1, OverlayIn: 50, OverlayOut: 10},
	}}
	y := Exchange{Name: "pubsub.y", MeanMessageSize: size, Instances: []Instance{
		{Site: "a", LocalPublished: 2, LocalConsumed: 2, OverlayIn: 80, OverlayOut: 80},
		{Site: "b", LocalPublished: 1, LocalConsumed: 1, OverlayIn: 60, OverlayOut: 60},
	}}
	// Estimated loads before x is placed (in+out): a 50k+10k (x, borrowed
	// from b or c, which are equal) + 160k (y) = 220k, b 60k + 120k =
	// 180k, c 60k. x's 100 kB/s inbound sync traffic exceeds 90 kB/s
	// everywhere.
	tight := func(in, out float64) []Site {
		return []Site{
			{Name: "a", InboundBandwidth: in, OutboundBandwidth: out},
			{Name: "b", InboundBandwidth: in, OutboundBandwidth: out},
			{Name: "c", InboundBandwidth: in, OutboundBandwidth: out},
		}
	}
	in := Input{Sites: tight(90_000, 150_000), Exchanges: []Exchange{y, x}, Delays: triangle(), Previous: Plan{"pubsub.x": "a"}}
	r, err := Heuristic(in)
	if err != nil {
		t.Fatal(err)
	}
	d := r.Decisions[0]
	if d.Exchange != "pubsub.x" || d.Site != "c" || d.Reason != ReasonLeastLoaded {
		t.Fatalf("decision %+v, want pubsub.x at c (least loaded)", d)
	}
	if d.Candidates[0].Site != "a" || d.Candidates[len(d.Candidates)-1].Site != "c" {
		t.Errorf("walk order %+v: a should score best and c worst", d.Candidates)
	}
	for _, c := range d.Candidates {
		if c.Fits {
			t.Errorf("candidate %s reported to fit", c.Site)
		}
	}
	ev, err := Evaluate(in, r.Plan)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Feasible() || ev.InboundLoad["c"] != 100_000 {
		t.Errorf("evaluation %+v: c should carry x's 100 kB/s and exceed its bandwidth", ev)
	}

	in.Sites = tight(200_000, 400_000)
	r, err = Heuristic(in)
	if err != nil {
		t.Fatal(err)
	}
	if d := r.Decisions[0]; d.Site != "a" || d.Reason != ReasonBestScore {
		t.Errorf("with room: %+v, want a (best score)", d)
	}
}

// TestWorkQueueOverflowTakesBandwidth checks that the work-queue overflow
// a site's links carry counts against its bandwidth: a is the best
// synchronisation site for pubsub.x on latency and has room for its sync
// traffic, until the overflow it receives leaves too little; then both
// methods place x elsewhere, and Evaluate reports the overload of keeping
// it at a. Overflow within the bandwidth changes nothing.
func TestWorkQueueOverflowTakesBandwidth(t *testing.T) {
	x := Exchange{Name: "pubsub.x", MeanMessageSize: 1000, Instances: []Instance{
		// a is the previous sync site: 60 kB/s in, 60 kB/s out.
		{Site: "a", LocalPublished: 80, LocalConsumed: 80, OverlayIn: 60, OverlayOut: 60},
		{Site: "b", LocalPublished: 30, LocalConsumed: 30, OverlayIn: 40, OverlayOut: 30},
		{Site: "c", LocalPublished: 30, LocalConsumed: 30, OverlayIn: 40, OverlayOut: 30},
	}}
	sites := func(overflowIntoA float64) []Site {
		return []Site{
			{Name: "a", InboundBandwidth: 100_000, OutboundBandwidth: 100_000, WorkQueueInbound: overflowIntoA},
			{Name: "b", InboundBandwidth: 100_000, OutboundBandwidth: 100_000, WorkQueueOutbound: overflowIntoA / 2},
			{Name: "c", InboundBandwidth: 100_000, OutboundBandwidth: 100_000, WorkQueueOutbound: overflowIntoA / 2},
		}
	}
	for _, tt := range []struct {
		overflow float64
		want     string
	}{{0, "a"}, {30_000, "a"}, {70_000, "b or c"}} {
		in := Input{Sites: sites(tt.overflow), Exchanges: []Exchange{x}, Delays: triangle(), Previous: Plan{"pubsub.x": "a"}}
		for name, place := range map[string]func(Input) (Result, error){"thesis": Heuristic, "improved": Improved} {
			r, err := place(in)
			if err != nil {
				t.Fatal(err)
			}
			got := r.Plan["pubsub.x"]
			if tt.want == "a" && got != "a" || tt.want != "a" && got == "a" {
				t.Errorf("%s, %.0f B/s of overflow into a: sync site %s, want %s", name, tt.overflow, got, tt.want)
			}
		}
		ev, err := Evaluate(in, Plan{"pubsub.x": "a"})
		if err != nil {
			t.Fatal(err)
		}
		if want := max(60_000+tt.overflow-100_000, 0); math.Abs(ev.Overload-want) > 1e-6 {
			t.Errorf("%.0f B/s of overflow into a: overload of keeping x at a %v, want %v", tt.overflow, ev.Overload, want)
		}
	}
}

func mapsEqual(a, b Plan) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestHeuristicAlwaysProducesValidDeterministicPlan runs the heuristics on
// random instances beyond the exact search's size (up to 30 sites, 15
// exchanges, bandwidth often infeasible): every exchange gets one of its
// own sites, the same input gives the same plan, and Improved is never
// worse than Heuristic.
func TestHeuristicAlwaysProducesValidDeterministicPlan(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	shape := defaultShape
	shape.maxSites, shape.maxExchanges, shape.lambdaScale = 30, 15, 1
	for range 200 {
		in := randomInstance(rng, shape)
		r, err := Heuristic(in)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Plan) != len(in.Exchanges) || len(r.Decisions) != len(in.Exchanges) {
			t.Fatalf("plan %v covers %d of %d exchanges", r.Plan, len(r.Plan), len(in.Exchanges))
		}
		for i := 1; i < len(r.Decisions); i++ {
			if r.Decisions[i].Traffic > r.Decisions[i-1].Traffic {
				t.Fatalf("decision %d (P=%v) placed after a quieter exchange (P=%v)", i, r.Decisions[i].Traffic, r.Decisions[i-1].Traffic)
			}
		}
		thesis, err := Evaluate(in, r.Plan) // also checks every site holds the exchange
		if err != nil {
			t.Fatal(err)
		}
		again, _ := Heuristic(in)
		if !mapsEqual(again.Plan, r.Plan) {
			t.Fatalf("same input, different plans: %v, %v", r.Plan, again.Plan)
		}
		better, err := Improved(in)
		if err != nil {
			t.Fatal(err)
		}
		improved, err := Evaluate(in, better.Plan)
		if err != nil {
			t.Fatal(err)
		}
		for _, res := range []Result{r, better} {
			for _, d := range res.Decisions {
				if res.Plan[d.Exchange] != d.Site {
					t.Fatalf("decision %+v disagrees with plan %v", d, res.Plan)
				}
			}
		}
		if thesis.Better(improved) {
			t.Fatalf("Improved %+v worse than Heuristic %+v", improved, thesis)
		}
	}
}

func TestInvalidInput(t *testing.T) {
	good := func() Input {
		return Input{
			Sites:     unlimitedSites("a", "b", "c"),
			Delays:    triangle(),
			Exchanges: []Exchange{{Name: "pubsub.e", MeanMessageSize: 10, Instances: []Instance{{Site: "a", LocalPublished: 1}, {Site: "b"}}}},
		}
	}
	if _, err := Heuristic(good()); err != nil {
		t.Fatalf("valid input rejected: %v", err)
	}
	for name, spoil := range map[string]func(*Input){
		"no sites":           func(in *Input) { in.Sites = nil },
		"duplicate site":     func(in *Input) { in.Sites = append(in.Sites, Site{Name: "a"}) },
		"missing delay":      func(in *Input) { delete(in.Delays["a"], "c") },
		"negative delay":     func(in *Input) { in.Delays["b"]["c"] = -time.Millisecond },
		"unknown site":       func(in *Input) { in.Exchanges[0].Instances[1].Site = "z" },
		"site twice":         func(in *Input) { in.Exchanges[0].Instances[1].Site = "a" },
		"no instance":        func(in *Input) { in.Exchanges[0].Instances = nil },
		"negative count":     func(in *Input) { in.Exchanges[0].Instances[0].OverlayIn = -1 },
		"NaN size":           func(in *Input) { in.Exchanges[0].MeanMessageSize = math.NaN() },
		"infinite bandwidth": func(in *Input) { in.Sites[0].InboundBandwidth = math.Inf(1) },
		"negative lambda":    func(in *Input) { in.Lambda = -1 },
		"NaN work queue":     func(in *Input) { in.Sites[1].WorkQueueInbound = math.NaN() },
		"negative overflow":  func(in *Input) { in.Sites[2].WorkQueueOutbound = -1 },
		"duplicate exchange": func(in *Input) { in.Exchanges = append(in.Exchanges, in.Exchanges[0]) },
	} {
		in := good()
		spoil(&in)
		if _, err := Heuristic(in); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%s: got %v, want ErrInvalidInput", name, err)
		}
	}
}
