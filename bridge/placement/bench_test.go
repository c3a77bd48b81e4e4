package placement

import (
	"math/rand/v2"
	"testing"
)

// benchmarkInstance draws one instance with exactly sites sites and
// exchanges exchanges, each exchange at every site (the largest search).
func benchmarkInstance(sites, exchanges int) Input {
	rng := rand.New(rand.NewPCG(5, 5))
	shape := defaultShape
	shape.maxSites, shape.maxExchanges, shape.unlimitedShare = sites, exchanges, 0
	for {
		in := randomInstance(rng, shape)
		if len(in.Sites) != sites || len(in.Exchanges) != exchanges {
			continue
		}
		full := true
		for _, e := range in.Exchanges {
			full = full && len(e.Instances) == sites
		}
		if full || sites > MaxExactSites {
			return in
		}
	}
}

func BenchmarkHeuristic(b *testing.B) {
	for _, size := range []struct {
		name             string
		sites, exchanges int
	}{{"6x6", 6, 6}, {"30x15", 30, 15}} {
		in := benchmarkInstance(size.sites, size.exchanges)
		b.Run("thesis/"+size.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Heuristic(in); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("improved/"+size.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Improved(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkOptimum6x6(b *testing.B) {
	in := benchmarkInstance(6, 6)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := Optimum(in); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkOverflowDestination(b *testing.B) {
	candidates := []OverflowCandidate{{Site: "berlin", Spare: 0}, {Site: "tunis", Spare: 40}, {Site: "tokyo", Spare: 300}, {Site: "montreal", Spare: 12, Sent: 3}}
	delays := Delays{"berlin": {"tunis": 25e6, "tokyo": 120e6, "montreal": 45e6}}
	b.Run("weight-only", func(b *testing.B) {
		b.ReportAllocs()
		var key uint64
		for b.Loop() {
			key += 0x9e3779b97f4a7c15
			if _, err := WeightedOverflowDestination(candidates, key); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("nearest", func(b *testing.B) {
		b.ReportAllocs()
		var key uint64
		for b.Loop() {
			key += 0x9e3779b97f4a7c15
			if _, err := NearestOverflowDestination("berlin", candidates, delays, key); err != nil {
				b.Fatal(err)
			}
		}
	})
}
