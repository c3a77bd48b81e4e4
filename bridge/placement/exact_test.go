package placement

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestCostMatchesEquation21 checks eq. 2.1–2.3 on a two-site exchange
// computed by hand.
func TestCostMatchesEquation21(t *testing.T) {
	in := Input{
		Sites:  unlimitedSites("a", "b"),
		Delays: Delays{"a": {"b": 10 * time.Millisecond}},
		Exchanges: []Exchange{{Name: "pubsub.e", MeanMessageSize: 100, Instances: []Instance{
			{Site: "a", LocalPublished: 30, OverlayIn: 10, OverlayOut: 40},
			{Site: "b", LocalPublished: 10, LocalConsumed: 40, OverlayIn: 30, OverlayOut: 10},
		}}},
		Previous: Plan{"pubsub.e": "a"},
		Lambda:   100,
	}
	// 40 deliveries, all at b; publications 3/4 at a, 1/4 at b.
	// Sync at a: 3/4·0 + 1/4·10 + 10 = 12.5 ms, no move.
	// Sync at b: 3/4·10 + 1/4·0 + 0 = 7.5 ms, plus λ/40 = 2.5.
	for site, want := range map[string]struct{ cost, latency float64 }{"a": {12.5, 12.5}, "b": {10, 7.5}} {
		ev, err := Evaluate(in, Plan{"pubsub.e": site})
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(ev.Cost-want.cost) > 1e-9 || math.Abs(ev.MeanLatency-want.latency) > 1e-9 {
			t.Errorf("sync at %s: cost %v latency %v, want %v %v", site, ev.Cost, ev.MeanLatency, want.cost, want.latency)
		}
		// a was the sync site: its 10/40 messages are sync traffic (×100 B);
		// as a non-sync site it borrows b's estimate (the only other node).
		wantIn := map[string]float64{"a": 1000, "b": 3000}
		if site == "b" {
			wantIn = map[string]float64{"a": 3000, "b": 1000}
		}
		for s, w := range wantIn {
			if ev.InboundLoad[s] != w {
				t.Errorf("sync at %s: inbound load at %s %v, want %v", site, s, ev.InboundLoad[s], w)
			}
		}
	}
	p, best, err := Optimum(in)
	if err != nil {
		t.Fatal(err)
	}
	if p["pubsub.e"] != "b" || best.Cost != 10 || best.Moves != 1 {
		t.Errorf("optimum %v %+v, want b at cost 10 with one move", p, best)
	}
	if _, err := Evaluate(in, Plan{"pubsub.e": "c"}); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("plan at a site without the exchange: got %v", err)
	}
	if _, err := Evaluate(in, Plan{}); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("plan missing the exchange: got %v", err)
	}
}

// TestOptimumMatchesBruteForce compares the branch-and-bound search with a
// plain enumeration of every plan through Evaluate on random instances.
func TestOptimumMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 11))
	shape := defaultShape
	shape.maxSites, shape.maxExchanges, shape.lambdaScale = 5, 4, 1
	feasible := 0
	for range 300 {
		in := randomInstance(rng, shape)
		_, got, err := Optimum(in)
		if err != nil {
			t.Fatal(err)
		}
		var best Evaluation
		found := false
		var walk func(i int, p Plan)
		walk = func(i int, p Plan) {
			if i == len(in.Exchanges) {
				ev, err := Evaluate(in, p)
				if err != nil {
					t.Fatal(err)
				}
				if !found || ev.Better(best) {
					best, found = ev, true
				}
				return
			}
			for _, inst := range in.Exchanges[i].Instances {
				p[in.Exchanges[i].Name] = inst.Site
				walk(i+1, p)
			}
		}
		walk(0, Plan{})
		if got.Better(best) || best.Better(got) {
			t.Fatalf("branch and bound %+v, enumeration %+v", got, best)
		}
		if got.Feasible() {
			feasible++
		}
	}
	if feasible == 0 || feasible == 300 {
		t.Errorf("%d of 300 instances feasible: the test should cover both cases", feasible)
	}
}

func TestOptimumRejectsLargeInstances(t *testing.T) {
	var in Input
	in.Delays = Delays{}
	for i := range MaxExactSites + 1 {
		in.Sites = append(in.Sites, Site{Name: fmt.Sprint(i)})
	}
	if _, _, err := Optimum(in); !errors.Is(err, ErrInvalidInput) {
		t.Errorf("got %v, want ErrInvalidInput", err)
	}
}
