package sites

import (
	"math"
	"slices"
	"sort"
	"time"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// SitesLatency summarises latencies in milliseconds (NaN, or -1 in JSON,
// when there are none).
type SitesLatency struct {
	Count int     `json:"count"`
	Min   float64 `json:"min_ms"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P75   float64 `json:"p75_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// summariseSites computes count, minimum, mean, median, p75, p99 and max (nearest
// rank) of values in any order.
func summariseSites(values []float64) SitesLatency {
	if len(values) == 0 {
		nan := math.NaN()
		return SitesLatency{Min: nan, Mean: nan, P50: nan, P75: nan, P99: nan, Max: nan}
	}
	s := append([]float64(nil), values...)
	sort.Float64s(s)
	sum := 0.0
	for _, v := range s {
		sum += v
	}
	return SitesLatency{Count: len(s), Min: s[0], Mean: sum / float64(len(s)), P50: harness.Percentile(s, 50), P75: harness.Percentile(s, 75),
		P99: harness.Percentile(s, 99), Max: s[len(s)-1]}
}

// finite replaces NaNs by -1 for JSON.
func (l SitesLatency) finite() SitesLatency {
	f := func(v float64) float64 {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return -1
		}
		return v
	}
	return SitesLatency{Count: l.Count, Min: f(l.Min), Mean: f(l.Mean), P50: f(l.P50), P75: f(l.P75), P99: f(l.P99), Max: f(l.Max)}
}

// unfinite turns the -1 of JSON back into NaN.
func (l SitesLatency) unfinite() SitesLatency {
	f := func(v float64) float64 {
		if v < 0 {
			return math.NaN()
		}
		return v
	}
	return SitesLatency{Count: l.Count, Min: f(l.Min), Mean: f(l.Mean), P50: f(l.P50), P75: f(l.P75), P99: f(l.P99), Max: f(l.Max)}
}

// SitesWindow is the latency of the messages sent in one window of a run.
type SitesWindow struct {
	// T is the end of the window in seconds from the start of publishing.
	T     float64 `json:"t_s"`
	Count int     `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// sitesExpectation says who must receive a measured message.
type sitesExpectation struct {
	// Origin is the publishing site.
	Origin int
	// Receivers are the receivers owed the message (pub/sub); nil means
	// exactly one of any receiver (work queue).
	Receivers []int
	// Sent is when the message was handed to its publisher.
	Sent time.Time
}

// sitesAnalysis is what a run's receipts say against what was owed.
type sitesAnalysis struct {
	Published  int
	Expected   int
	Delivered  int
	Lost       int
	Duplicated int
	// Unexpected counts receipts of messages owed to nobody (a failed
	// publish that arrived anyway) or at a receiver not owed them.
	Unexpected int
	// Remote counts first deliveries at a site other than the origin.
	Remote        int
	Latency       SitesLatency
	RemoteLatency SitesLatency
	LocalLatency  SitesLatency
	Quantiles     []float64
	OverTime      []SitesWindow
	// Routes sums work-queue processings by (origin site, processing
	// site).
	Routes map[[2]int]*routeSum
	// LostByOrigin counts lost deliveries by origin site.
	LostByOrigin map[int]int
	// LostSent are the send times of lost messages (from the start of
	// publishing), sorted.
	LostSent []time.Duration
	// latencies of first deliveries with their send offsets, for
	// reconfiguration windows.
	points []latencyPoint
}

// routeSum adds up the latencies of one route's processings.
type routeSum struct {
	n   int
	sum float64
}

// latencyPoint is one first delivery: its send time from the start of
// publishing and its latency in milliseconds.
type latencyPoint struct {
	Sent    time.Duration
	Latency float64
}

// analyseSites matches receipts with what was owed. receiverSite gives
// each receiver's site; start is the start of publishing; window the width
// of the over-time series.
func analyseSites(owed map[uint64]sitesExpectation, receipts []receipt, receiverSite []int, start time.Time, window time.Duration) sitesAnalysis {
	a := sitesAnalysis{Published: len(owed), LostByOrigin: map[int]int{}, Routes: map[[2]int]*routeSum{}}
	type key struct {
		id       uint64
		receiver int
	}
	seen := map[key]int{}
	seenID := map[uint64]int{}
	var all, remote, local []float64
	for _, r := range receipts {
		exp, ok := owed[r.ID]
		if !ok {
			a.Unexpected++
			continue
		}
		lat := float64(r.At.Sub(r.Sent)) / float64(time.Millisecond)
		if exp.Receivers == nil {
			seenID[r.ID]++
			if seenID[r.ID] > 1 {
				a.Duplicated++
				continue
			}
		} else {
			if !containsInt(exp.Receivers, r.Receiver) {
				a.Unexpected++
				continue
			}
			k := key{r.ID, r.Receiver}
			seen[k]++
			if seen[k] > 1 {
				a.Duplicated++
				continue
			}
		}
		a.Delivered++
		all = append(all, lat)
		a.points = append(a.points, latencyPoint{Sent: r.Sent.Sub(start), Latency: lat})
		if exp.Receivers == nil && r.Receiver >= 0 && r.Receiver < len(receiverSite) {
			k := [2]int{exp.Origin, receiverSite[r.Receiver]}
			if a.Routes[k] == nil {
				a.Routes[k] = &routeSum{}
			}
			a.Routes[k].n++
			a.Routes[k].sum += lat
		}
		if r.Receiver >= 0 && r.Receiver < len(receiverSite) && receiverSite[r.Receiver] != exp.Origin {
			a.Remote++
			remote = append(remote, lat)
		} else {
			local = append(local, lat)
		}
	}
	for id, exp := range owed {
		if exp.Receivers == nil {
			a.Expected++
			if seenID[id] == 0 {
				a.Lost++
				a.LostByOrigin[exp.Origin]++
				a.LostSent = append(a.LostSent, exp.Sent.Sub(start))
			}
			continue
		}
		a.Expected += len(exp.Receivers)
		lost := false
		for _, rc := range exp.Receivers {
			if seen[key{id, rc}] == 0 {
				a.Lost++
				a.LostByOrigin[exp.Origin]++
				lost = true
			}
		}
		if lost {
			a.LostSent = append(a.LostSent, exp.Sent.Sub(start))
		}
	}
	slices.Sort(a.LostSent)
	a.Latency, a.RemoteLatency, a.LocalLatency = summariseSites(all), summariseSites(remote), summariseSites(local)
	a.Quantiles = quantiles(all)
	a.OverTime = overTime(a.points, window)
	return a
}

func containsInt(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// quantiles returns the 0th to 100th percentiles of values (nearest rank;
// the 0th is the minimum), or nil.
func quantiles(values []float64) []float64 {
	if len(values) == 0 {
		return nil
	}
	s := append([]float64(nil), values...)
	sort.Float64s(s)
	out := make([]float64, 101)
	out[0] = s[0]
	for p := 1; p <= 100; p++ {
		out[p] = harness.Percentile(s, float64(p))
	}
	return out
}

// overTime groups points by send time into windows of width w and
// summarises each non-empty one.
func overTime(points []latencyPoint, w time.Duration) []SitesWindow {
	if len(points) == 0 || w <= 0 {
		return nil
	}
	byWindow := map[int][]float64{}
	last := 0
	for _, p := range points {
		k := int(p.Sent / w)
		if p.Sent < 0 {
			k = 0
		}
		byWindow[k] = append(byWindow[k], p.Latency)
		last = max(last, k)
	}
	var out []SitesWindow
	for k := 0; k <= last; k++ {
		vals := byWindow[k]
		if len(vals) == 0 {
			continue
		}
		s := summariseSites(vals)
		out = append(out, SitesWindow{T: (time.Duration(k+1) * w).Seconds(), Count: s.Count, Mean: s.Mean, P99: s.P99, Max: s.Max})
	}
	return out
}

// steadyAndSpike splits first deliveries into those sent within span
// after any of the instants in changes and the others, and returns the
// median latency of the others (steady state) and the largest latency of
// the first group (NaN when a group is empty), with its size.
func steadyAndSpike(points []latencyPoint, changes []time.Duration, span time.Duration) (steadyP50, spikeMax float64, near int) {
	var steady []float64
	spikeMax = math.NaN()
	for _, p := range points {
		isNear := false
		for _, c := range changes {
			if p.Sent >= c-span/4 && p.Sent < c+span {
				isNear = true
				break
			}
		}
		if isNear {
			near++
			if math.IsNaN(spikeMax) || p.Latency > spikeMax {
				spikeMax = p.Latency
			}
			continue
		}
		steady = append(steady, p.Latency)
	}
	return harness.Median(steady), spikeMax, near
}
