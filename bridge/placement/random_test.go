package placement

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// instanceShape says how randomInstance draws an instance.
type instanceShape struct {
	maxSites, maxExchanges int
	// lambdaScale, when positive, draws λ uniformly in [0, lambdaScale ×
	// the instance's mean weighted centrality), so that the penalty is
	// commensurate with the scores it is subtracted from.
	lambdaScale float64
	// previousShare is the probability that an exchange has a previous
	// synchronisation site.
	previousShare float64
	// unlimitedShare is the probability that no site has a bandwidth limit.
	unlimitedShare float64
	// bandwidthLow and bandwidthHigh bound the factor applied to the
	// busiest site's estimated load under a random plan to draw the sites'
	// common bandwidth.
	bandwidthLow, bandwidthHigh float64
}

// defaultShape is the shape of the quality test's instances.
var defaultShape = instanceShape{
	maxSites: 6, maxExchanges: 6,
	previousShare: 0.8, unlimitedShare: 0.25,
	bandwidthLow: 0.6, bandwidthHigh: 1.6,
}

// randomInstance draws a small placement instance: sites at random points
// of a 100 ms × 100 ms plane (delays are distances, as on a map), a few
// busy sites (log-normal popularity, as the thesis's 70 % of clients on
// 25 % of sites), exchanges at random subsets of sites with overlay counts
// consistent with a hub-and-spoke (previous plan) or full-mesh (no
// previous plan) topology, and one bandwidth limit for all sites around the busiest site's load
// under a random plan.
func randomInstance(rng *rand.Rand, shape instanceShape) Input {
	nSites := 2 + rng.IntN(shape.maxSites-1)
	nExchanges := 1 + rng.IntN(shape.maxExchanges)
	in := Input{Delays: Delays{}, Previous: Plan{}, Seed: rng.Uint64()}
	xs, ys, popularity := make([]float64, nSites), make([]float64, nSites), make([]float64, nSites)
	for j := range nSites {
		name := fmt.Sprintf("s%d", j)
		in.Sites = append(in.Sites, Site{Name: name})
		xs[j], ys[j] = rng.Float64()*100, rng.Float64()*100
		popularity[j] = math.Exp(rng.NormFloat64() * 1.2)
		in.Delays[name] = map[string]time.Duration{}
		for k := range j {
			ms := 1 + math.Hypot(xs[j]-xs[k], ys[j]-ys[k])
			in.Delays[name][in.Sites[k].Name] = time.Duration(ms * float64(time.Millisecond))
		}
	}
	for i := range nExchanges {
		e := Exchange{Name: fmt.Sprintf("pubsub.e%d", i), MeanMessageSize: 1000 + rng.Float64()*29000}
		size := 1 + rng.IntN(nSites)
		if size == 1 && rng.Float64() < 0.7 {
			size = 2
		}
		members := rng.Perm(nSites)[:size]
		rate := 10 + rng.Float64()*90
		published, consumed := make([]float64, size), make([]float64, size)
		var totalPublished float64
		for p, j := range members {
			if rng.Float64() < 0.8 {
				published[p] = popularity[j] * rate * rng.Float64()
			}
			if rng.Float64() < 0.8 {
				consumed[p] = popularity[j] * rate * rng.Float64()
			}
			totalPublished += published[p]
		}
		previous := -1
		if size > 1 && rng.Float64() < shape.previousShare {
			previous = rng.IntN(size)
			in.Previous[e.Name] = in.Sites[members[previous]].Name
		}
		interested := 0
		for p := range members {
			if consumed[p] > 0 {
				interested++
			}
		}
		noise := func() float64 { return 0.9 + 0.2*rng.Float64() }
		for p, j := range members {
			inst := Instance{Site: in.Sites[j].Name, LocalPublished: published[p], LocalConsumed: consumed[p]}
			fromElsewhere := 0.0
			if consumed[p] > 0 {
				fromElsewhere = totalPublished - published[p]
			}
			switch {
			case size == 1:
			case previous < 0: // full mesh: each publication goes to every interested site
				others := interested
				if consumed[p] > 0 {
					others--
				}
				inst.OverlayIn = fromElsewhere * noise()
				inst.OverlayOut = published[p] * float64(others) * noise()
			case p == previous: // hub: receives every remote publication, serves every remote subscriber
				var in, out float64
				for q := range members {
					if q == p {
						continue
					}
					in += published[q]
					if consumed[q] > 0 {
						out += totalPublished - published[q]
					}
				}
				inst.OverlayIn, inst.OverlayOut = in*noise(), out*noise()
			default: // spoke: forwards its publications to the hub, receives the rest
				inst.OverlayIn, inst.OverlayOut = fromElsewhere*noise(), published[p]*noise()
			}
			e.Instances = append(e.Instances, inst)
		}
		in.Exchanges = append(in.Exchanges, e)
	}
	if rng.Float64() >= shape.unlimitedShare {
		// One limit for every site, as in the thesis's experiments (3000
		// kb/s everywhere), drawn around the busiest site's load under a
		// random plan.
		m, err := build(in)
		if err != nil {
			panic(err)
		}
		randomPlan := make([]int, len(m.exchanges))
		for i, x := range m.exchanges {
			randomPlan[i] = rng.IntN(len(x.nodes))
		}
		loadIn, loadOut := m.loads(randomPlan)
		busiestIn, busiestOut := slices.Max(loadIn), slices.Max(loadOut)
		factor := shape.bandwidthLow + (shape.bandwidthHigh-shape.bandwidthLow)*rng.Float64()
		for j := range in.Sites {
			in.Sites[j].InboundBandwidth = math.Max(1, busiestIn*factor)
			in.Sites[j].OutboundBandwidth = math.Max(1, busiestOut*factor)
		}
	}
	if shape.lambdaScale > 0 {
		m, err := build(in)
		if err != nil {
			panic(err)
		}
		var sum float64
		var count int
		for i := range m.exchanges {
			for _, c := range m.scoredNodes(&m.exchanges[i]) {
				if !math.IsInf(c.candidate.Centrality, 0) {
					sum += c.candidate.Centrality
					count++
				}
			}
		}
		if count > 0 {
			in.Lambda = rng.Float64() * shape.lambdaScale * sum / float64(count)
		}
	}
	return in
}
