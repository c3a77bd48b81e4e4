package sites

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// archColors gives every architecture the same colour in every plot.
var archColors = map[string]color.Color{
	ArchLuffyMQ:          harness.Palette[0],
	ArchLuffyMQTTLOnly:   harness.Palette[5],
	ArchLuffyMQNearest:   harness.Palette[7],
	ArchLuffyMQRing:      harness.Palette[6],
	ArchFullMesh:         harness.Palette[2],
	ArchQueueFederation:  harness.Palette[2],
	ArchStar:             harness.Palette[4],
	ArchRandom:           harness.Palette[3],
	ArchCloud:            harness.Palette[1],
	ArchCloudDist:        harness.Palette[6],
	ArchReconfigConserve: harness.Palette[0],
	ArchReconfigDiscard:  harness.Palette[1],
}

func archColor(a string) color.Color {
	if c, ok := archColors[a]; ok {
		return c
	}
	return harness.Palette[7]
}

// Plot files of one scenario.
func sitesPlotFile(scenario, what string) string { return "sites-" + scenario + "-" + what + ".png" }

// plotSites writes the plots of every scenario in res into dir.
func plotSites(dir string, res *SitesResults) error {
	for _, sc := range harness.OrderedLabels(res.Runs, func(r SitesRun) string { return r.Scenario }) {
		runs := runsOf(res.Runs, sc)
		if err := plotLatencyDistribution(filepath.Join(dir, sitesPlotFile(sc, "latency")), sc, runs); err != nil {
			return fmt.Errorf("%s latency plot: %w", sc, err)
		}
		if err := plotSitesOverlay(filepath.Join(dir, sitesPlotFile(sc, "overlay")), sc, res.Config.Sites, runs); err != nil {
			return fmt.Errorf("%s overlay plot: %w", sc, err)
		}
		if sc == SitesPSDynamic || sc == SitesReconfig {
			if err := plotSitesOverTime(filepath.Join(dir, sitesPlotFile(sc, "over-time")), sc, runs, res); err != nil {
				return fmt.Errorf("%s over-time plot: %w", sc, err)
			}
		}
	}
	return nil
}

// runsOf returns the runs of scenario that measured something.
func runsOf(runs []SitesRun, scenario string) []SitesRun {
	var out []SitesRun
	for _, r := range runs {
		if r.Scenario == scenario && len(r.Quantiles) > 0 {
			out = append(out, r)
		}
	}
	return out
}

// plotLatencyDistribution draws each architecture's latency percentiles
// (0–100) against latency on a log axis.
func plotLatencyDistribution(path, scenario string, runs []SitesRun) error {
	p := harness.NewPlot(scenario+": latency distribution per architecture", "latency (ms, log scale)", "percentile of deliveries")
	const floor = 0.1
	lo, hi := math.Inf(1), 0.0
	for _, r := range runs {
		pts := make(plotter.XYs, 0, len(r.Quantiles))
		for q, v := range r.Quantiles {
			v = math.Max(v, floor)
			pts = append(pts, plotter.XY{X: v, Y: float64(q)})
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = archColor(r.Architecture)
		l.Width = vg.Points(2)
		p.Add(l)
		p.Legend.Add(r.Architecture, l)
	}
	if len(runs) == 0 {
		lo, hi = 1, 10
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = harness.ReadableLogTicks{}
	p.X.Min, p.X.Max = harness.FloorPow10(lo), harness.CeilPow10(hi)
	p.Y.Min, p.Y.Max = 0, 100
	p.Legend.Left = false
	p.Legend.Top = false
	return p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}

// plotSitesOverlay draws each site's overlay bytes (out + in) per
// architecture.
func plotSitesOverlay(path, scenario string, sites []string, runs []SitesRun) error {
	p := harness.NewPlot(scenario+": overlay traffic per site (WAN bytes out + in)", "site", "KiB")
	var names []string
	var colors []color.Color
	values := make([][]float64, 0, len(runs))
	for _, r := range runs {
		names = append(names, r.Architecture)
		colors = append(colors, archColor(r.Architecture))
		v := make([]float64, len(sites))
		for i, s := range sites {
			v[i] = math.NaN()
			for _, o := range r.Overlay {
				if o.Site == s {
					v[i] = float64(o.BytesOut+o.BytesIn) / 1024
				}
			}
		}
		values = append(values, v)
	}
	if err := harness.GroupedBars(p, sites, names, colors, values); err != nil {
		return err
	}
	p.Y.Max = math.Max(p.Y.Max*1.3, 1)
	return p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}

// plotSitesOverTime draws the mean latency of each window per
// architecture, with the phase boundaries (and, for reconfig, the
// reconfigurations that moved something) as vertical lines.
func plotSitesOverTime(path, scenario string, runs []SitesRun, res *SitesResults) error {
	p := harness.NewPlot(scenario+": mean latency of the messages sent in each window", "send time (s)", "mean latency (ms)")
	hi := 0.0
	for _, r := range runs {
		pts := make(plotter.XYs, 0, len(r.OverTime))
		for _, w := range r.OverTime {
			pts = append(pts, plotter.XY{X: w.T, Y: w.Mean})
			hi = math.Max(hi, w.Mean)
		}
		if len(pts) == 0 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = archColor(r.Architecture)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(r.Architecture, l)
	}
	p.Y.Min, p.Y.Max = 0, math.Max(hi*1.25, 1)
	p.X.Min = 0
	mark := func(x float64, c color.Color, dashed bool) error {
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: p.Y.Min}, {X: x, Y: p.Y.Max}})
		if err != nil {
			return err
		}
		l.Color = c
		l.Width = vg.Points(0.8)
		if dashed {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		}
		p.Add(l)
		return nil
	}
	for _, wl := range res.Workloads {
		if wl.Scenario == scenario && wl.PS != nil {
			for _, ph := range wl.PS.Phases[1:] {
				if err := mark(ph.Start.Seconds(), harness.Palette[6], true); err != nil {
					return err
				}
			}
		}
	}
	var changes []float64
	for _, r := range runs {
		for _, c := range r.PlanChanges {
			if len(c.Moved) > 0 && !slices.Contains(changes, c.AtS) {
				changes = append(changes, c.AtS)
				if err := mark(c.AtS, archColor(r.Architecture), false); err != nil {
					return err
				}
			}
		}
	}
	return p.Save(9*vg.Inch, 4.5*vg.Inch, path)
}
