package shared

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// subscriberColors are used for per-subscriber bars.
var subscriberColors = []color.Color{harness.Palette[0], harness.Palette[1], harness.Palette[2], harness.Palette[3], harness.Palette[4]}

func shortName(system string) string {
	return strings.TrimPrefix(system, "luffymq-")
}

// legendName is a system's name in plot legends; the oracle is named for
// what it is.
func legendName(system string) string {
	if system == harness.SystemOracle {
		return OracleName
	}
	return shortName(system)
}

// categoryName is a system's label on a category axis, where the oracle's
// full name does not fit: it gets a mark that oracleFootnote explains.
func categoryName(system string) string {
	if system == harness.SystemOracle {
		return "oracle*"
	}
	return shortName(system)
}

// oracleFootnote explains categoryName's mark in a plot title.
const oracleFootnote = "* oracle = " + OracleName

// plotScenario writes the PNGs of a scenario with one subscriber kind into
// dir.
func plotScenario(dir string, s Scenario, kind string, runs []RunResult) error {
	// Plots of results written before subscriber kinds existed had no kind
	// in their names; they would go stale next to the new ones.
	for _, what := range []string{"subscriber-mean", "latency-over-time", "msgs-per-sec", "adaptation"} {
		legacy := filepath.Join(dir, s.ID+"-"+what+".png")
		if _, err := os.Stat(legacy); err == nil {
			_ = os.Remove(legacy)
		}
	}
	aggs := aggregateRuns(runs)
	if err := plotSubscriberMeans(filepath.Join(dir, plotFile(s.ID, kind, "subscriber-mean")), s, kind, aggs); err != nil {
		return err
	}
	if err := plotRates(filepath.Join(dir, plotFile(s.ID, kind, "msgs-per-sec")), s, kind, aggs); err != nil {
		return err
	}
	if err := plotOverTime(filepath.Join(dir, plotFile(s.ID, kind, "latency-over-time")), s, kind, runs); err != nil {
		return err
	}
	if s.EventAt > 0 {
		if err := plotAdaptation(filepath.Join(dir, plotFile(s.ID, kind, "adaptation")), s, kind, runs); err != nil {
			return err
		}
	}
	return nil
}

// plotKinds writes the scenario's comparison of subscriber kinds (median
// overall mean latency per system, one bar per kind) when all holds runs
// of more than one kind for it.
func plotKinds(dir string, s Scenario, all []RunResult) error {
	byKind := map[string][]RunResult{}
	for _, r := range all {
		if r.Scenario == s.ID {
			k := normKind(r.Subscriber)
			byKind[k] = append(byKind[k], r)
		}
	}
	if len(byKind) < 2 {
		return nil
	}
	kinds := sortedKinds(byKind)
	aggs := map[string][]aggregate{}
	var systems []string
	seen := map[string]bool{}
	for _, k := range kinds {
		aggs[k] = aggregateRuns(byKind[k])
		for _, a := range aggs[k] {
			if !seen[a.System] {
				seen[a.System] = true
				systems = append(systems, a.System)
			}
		}
	}
	sort.Slice(systems, func(i, j int) bool { return harness.SystemOrder(systems[i]) < harness.SystemOrder(systems[j]) })
	p := harness.NewPlot(fmt.Sprintf("%s: mean queueing latency by subscriber kind (median of runs)", s.ID), "system", "mean latency (ms, log scale)")
	names := make([]string, len(systems))
	lo, hi := math.Inf(1), 0.0
	for i, sys := range systems {
		names[i] = categoryName(sys)
		for _, k := range kinds {
			if a := findAgg(aggs[k], sys); a != nil && a.Overall.Mean > 0 {
				lo, hi = math.Min(lo, a.Overall.Mean), math.Max(hi, a.Overall.Mean)
			}
		}
	}
	floor := harness.FloorPow10(lo)
	n := len(kinds)
	w := vg.Points(min(64/float64(n), 18))
	for j, k := range kinds {
		vals := make([]float64, len(systems))
		for i, sys := range systems {
			vals[i] = math.NaN()
			if a := findAgg(aggs[k], sys); a != nil {
				vals[i] = a.Overall.Mean
			}
		}
		b := &harness.LogBars{Values: vals, Floor: floor, Width: w, Offset: w * vg.Length(float64(j)-float64(n-1)/2), Color: subscriberColors[j%len(subscriberColors)]}
		p.Add(b)
		p.Legend.Add(k+" subscribers", b)
	}
	harness.LogAxis(p, floor, harness.CeilPow10(hi)*8)
	harness.CategoryAxis(p, names)
	p.Title.Text += "\n(a missing bar is a mean below " + harness.TrimFloat(floor) + " ms; " + oracleFootnote + ")"
	return p.Save(vg.Length(max(8, 1.3*float64(len(systems))))*vg.Inch, 4.8*vg.Inch, filepath.Join(dir, kindsPlotFile(s.ID)))
}

func memberLabel(s Scenario, i int) string {
	return fmt.Sprintf("subscriber %d (%s)", i+1, s.Members[i].describe())
}

// plotSubscriberMeans is thesis fig. 44: mean latency per subscriber, per
// system, log scale.
func plotSubscriberMeans(path string, s Scenario, kind string, aggs []aggregate) error {
	p := harness.NewPlot(fmt.Sprintf("%s, %s subscribers: mean queueing latency per subscriber (median of runs)", s.ID, kind), "system", "mean latency (ms, log scale)")
	names := make([]string, len(aggs))
	lo, hi := math.Inf(1), 0.0
	for i, a := range aggs {
		names[i] = categoryName(a.System)
		for _, v := range a.SubMean {
			if !math.IsNaN(v) && v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	floor := harness.FloorPow10(lo)
	n := len(s.Members)
	w := vg.Points(min(60/float64(n), 18))
	for j := range n {
		vals := make([]float64, len(aggs))
		for i, a := range aggs {
			vals[i] = math.NaN()
			if j < len(a.SubMean) {
				vals[i] = a.SubMean[j]
			}
		}
		b := &harness.LogBars{Values: vals, Floor: floor, Width: w, Offset: w * vg.Length(float64(j)-float64(n-1)/2), Color: subscriberColors[j%len(subscriberColors)]}
		p.Add(b)
		p.Legend.Add(memberLabel(s, j), b)
	}
	harness.LogAxis(p, floor, harness.CeilPow10(hi)*8) // headroom for the legend
	harness.CategoryAxis(p, names)
	p.Title.Text += "\n(a missing bar is a mean below " + harness.TrimFloat(floor) + " ms; " + oracleFootnote + ")"
	return p.Save(vg.Length(max(8, 1.1*float64(len(aggs))))*vg.Inch, 4.5*vg.Inch, path)
}

// plotRates is thesis fig. 45: messages per second per subscriber.
func plotRates(path string, s Scenario, kind string, aggs []aggregate) error {
	p := harness.NewPlot(fmt.Sprintf("%s, %s subscribers: messages per second taken by each subscriber\n(%s)", s.ID, kind, oracleFootnote), "system", "messages per second")
	names := make([]string, len(aggs))
	for i, a := range aggs {
		names[i] = categoryName(a.System)
	}
	n := len(s.Members)
	w := vg.Points(min(60/float64(n), 18))
	for j := range n {
		vals := make(plotter.Values, len(aggs))
		for i, a := range aggs {
			if j < len(a.SubRate) && !math.IsNaN(a.SubRate[j]) {
				vals[i] = a.SubRate[j]
			}
		}
		b, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		b.Offset = w * vg.Length(float64(j)-float64(n-1)/2)
		b.Color = subscriberColors[j%len(subscriberColors)]
		b.LineStyle.Width = 0
		p.Add(b)
		p.Legend.Add(memberLabel(s, j), b)
	}
	harness.CategoryAxis(p, names)
	p.Y.Min = 0
	p.Y.Max *= 1.55 // room for the legend
	return p.Save(vg.Length(max(8, 1.1*float64(len(aggs))))*vg.Inch, 4.5*vg.Inch, path)
}

// overTimeSystems picks the systems for the latency-over-time plot.
func overTimeSystems(runs []RunResult) []string {
	have := map[string]bool{}
	for _, r := range runs {
		have[r.System] = true
	}
	var out []string
	for _, s := range []string{"luffymq-round-robin", "luffymq-thesis", "luffymq-adaptive"} {
		if have[s] {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		for _, s := range harness.AllSystems() {
			if have[s] {
				out = append(out, s)
			}
		}
	}
	return out
}

// firstRun returns the lowest-repeat run of system with deliveries.
func firstRun(runs []RunResult, system string) *RunResult {
	var best *RunResult
	for i := range runs {
		r := &runs[i]
		if r.System == system && len(r.Deliveries) > 0 && (best == nil || r.Repeat < best.Repeat) {
			best = r
		}
	}
	return best
}

// plotOverTime is thesis fig. 47: latency of every message by publish time.
func plotOverTime(path string, s Scenario, kind string, runs []RunResult) error {
	systems := overTimeSystems(runs)
	p := harness.NewPlot(fmt.Sprintf("%s, %s subscribers: latency of each message (first run of each system)", s.ID, kind), "publish time (s)", "latency (ms)")
	const floor = 0.01
	lo, hi := math.Inf(1), 0.0
	type series struct {
		name string
		pts  plotter.XYs
	}
	var all []series
	for _, sys := range systems {
		r := firstRun(runs, sys)
		if r == nil {
			continue
		}
		pts := make(plotter.XYs, len(r.Deliveries))
		for i, d := range r.Deliveries {
			v := math.Max(harness.Millis(d.Latency()), floor)
			pts[i] = plotter.XY{X: d.Sent.Seconds(), Y: v}
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
		all = append(all, series{sys, pts})
	}
	logScale := hi/math.Max(lo, floor) > 50
	for _, se := range all {
		sc, err := plotter.NewScatter(se.pts)
		if err != nil {
			return err
		}
		sc.GlyphStyle.Radius = vg.Points(1.2)
		sc.GlyphStyle.Shape = draw.CircleGlyph{}
		sc.GlyphStyle.Color = harness.SystemColor(se.name)
		p.Add(sc)
		p.Legend.Add(legendName(se.name), sc)
	}
	if logScale {
		harness.LogAxis(p, harness.FloorPow10(math.Max(lo, floor)), harness.CeilPow10(hi)*4)
		p.Y.Label.Text = "latency (ms, log scale)"
	} else {
		p.Y.Min = 0
		p.Y.Max = hi * 1.3
	}
	p.X.Min = 0
	p.X.Tick.Marker = harness.SecondTicks{}
	addEventLine(p, s)
	return p.Save(9*vg.Inch, 4.5*vg.Inch, path)
}

// addEventLine marks the scenario's event.
func addEventLine(p *plot.Plot, s Scenario) {
	if s.EventAt == 0 {
		return
	}
	ev := s.EventAt.Seconds()
	l, err := plotter.NewLine(plotter.XYs{{X: ev, Y: p.Y.Min}, {X: ev, Y: p.Y.Max}})
	if err != nil {
		return
	}
	l.Color = color.Black
	l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(l)
	p.Legend.Add(fmt.Sprintf("event at t = %.0f s", ev), l)
}

// plotAdaptation plots the rolling p99 over time (step, join, crash).
func plotAdaptation(path string, s Scenario, kind string, runs []RunResult) error {
	p := harness.NewPlot(fmt.Sprintf("%s, %s subscribers: rolling p99 latency (%.0f ms windows by publish time, every %.0f ms; first run)", s.ID, kind, harness.Millis(adaptationWindow), harness.Millis(adaptationStep)), "publish time (s)", "p99 latency (ms, log scale)")
	const floor = 0.1
	lo, hi := math.Inf(1), 0.0
	var systems []string
	seen := map[string]bool{}
	for _, r := range runs {
		if !seen[r.System] {
			seen[r.System] = true
			systems = append(systems, r.System)
		}
	}
	sort.Slice(systems, func(i, j int) bool { return harness.SystemOrder(systems[i]) < harness.SystemOrder(systems[j]) })
	type series struct {
		name string
		pts  plotter.XYs
	}
	var all []series
	maxT := 0.0
	for _, sys := range systems {
		r := firstRun(runs, sys)
		if r == nil {
			continue
		}
		ser := RollingP99(r.Deliveries, adaptationWindow, adaptationStep)
		pts := make(plotter.XYs, len(ser))
		for i, tp := range ser {
			v := math.Max(tp.V, floor)
			pts[i] = plotter.XY{X: tp.T, Y: v}
			lo, hi = math.Min(lo, v), math.Max(hi, v)
			maxT = math.Max(maxT, tp.T)
		}
		all = append(all, series{sys, pts})
	}
	if len(all) == 0 {
		return nil
	}
	for _, se := range all {
		l, err := plotter.NewLine(se.pts)
		if err != nil {
			return err
		}
		l.Color = harness.SystemColor(se.name)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(legendName(se.name), l)
	}
	harness.LogAxis(p, harness.FloorPow10(math.Max(lo, floor)), harness.CeilPow10(hi)*8)
	p.X.Min, p.X.Max = 0, maxT
	p.X.Tick.Marker = harness.SecondTicks{}
	limit, _ := plotter.NewLine(plotter.XYs{{X: 0, Y: adaptationLimit}, {X: maxT, Y: adaptationLimit}})
	limit.Color = color.RGBA{200, 0, 0, 255}
	limit.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
	p.Add(limit)
	p.Legend.Add("50 ms goal", limit)
	addEventLine(p, s)
	return p.Save(9*vg.Inch, 4.5*vg.Inch, path)
}
