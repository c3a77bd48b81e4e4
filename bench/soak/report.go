package soak

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// Flatness limits of the soak goals: the broker's median RSS and goroutine
// count in the last window may exceed those of the first window by at most
// these factors.
const (
	soakRSSGrowthLimit       = 1.20
	soakGoroutineGrowthLimit = 1.10
	// soakLiveHeapGrowthLimit bounds the live heap (after a forced GC),
	// which, unlike RSS, does not swing with the GC's cycle: a leak shows
	// there first.
	soakLiveHeapGrowthLimit = 1.10
)

// soakPlots are the PNGs a soak run writes, with their captions.
var soakPlots = []harness.PlotRef{
	{File: "soak-msgs-per-sec.png", Alt: "messages published and received per second"},
	{File: "soak-p99.png", Alt: "p99 latency per sample window"},
	{File: "soak-loss.png", Alt: "QoS 1 lost so far and duplicated, QoS 0 missing"},
	{File: "soak-rss.png", Alt: "broker resident memory and Go heap"},
	{File: "soak-goroutines.png", Alt: "broker goroutines and threads"},
}

func soakNotes(cfg SoakConfig, res *SoakResults) []string {
	notes := []string{
		"The broker is the real luffymq binary, started as a process of its own on a free loopback port with --log-level warn" + harness.ArgsNote(cfg.BrokerArgs) + "; the load generator (publishers and members, paho.golang MQTT v5 clients, clean start, session expiry 0, keep-alive 60 s, Receive Maximum " + fmt.Sprint(soakReceiveMaximum) + ") is one other process.",
		fmt.Sprintf("Publisher i publishes to soak/gNN of group i mod %d on a fixed drift-free schedule; message k is QoS 1 for %d %% of the IDs (evenly spread), QoS 0 otherwise. Members subscribe to $share/gNN/soak/gNN at QoS 1; each holds a QoS 1 message for %s before paho acknowledges it (one at a time per member), QoS 0 messages not at all.", cfg.Groups, cfg.QoS1Percent, cfg.ProcessTime),
		"Every message carries a sequence ID and its send time; the load generator counts receipts per ID. Lost (QoS 1) = acknowledged by the broker (PUBACK) and received by no member by the end of the grace period; duplicated = receipts beyond the first. Lost so far (time series) = acknowledged at least --overdue-after ago and not yet received. A member that crashes or leaves with unacknowledged messages causes duplicates when the broker re-dispatches them: that is at-least-once, not loss.",
		"Latency = receipt time − send time of the first receipt of each message (both clocks are this machine's).",
		"Broker RSS is VmRSS of /proc/<pid>/status; Go heap: go_memstats_heap_inuse_bytes and go_memstats_heap_objects of /metrics; goroutines: " + res.GoroutineSource + "; threads: Threads of /proc/<pid>/status; CPU: utime+stime of /proc/<pid>/stat.",
		fmt.Sprintf("Flatness compares medians of the first %s after a %s warm-up (the heap grows to its working size: Mochi's per-client buffers, the GC target) with the last %s of publishing.", fmtWindow(res.Stability.WindowS), fmtWindow(res.Stability.WarmupS), fmtWindow(res.Stability.WindowS)),
	}
	if cfg.LiveHeapEvery > 0 {
		notes = append(notes, fmt.Sprintf("Live heap: every %s the load generator asks the broker for /debug/pprof/heap?gc=1&debug=1 (the broker runs with --pprof), which runs a garbage collection and then reports HeapAlloc: the memory still referenced. RSS also holds garbage not yet collected (the broker's GC target, --gc-percent, lets the heap grow to 3× the live heap by default) and freed memory not yet returned to the OS, so it swings with the GC's cycle; a leak shows in the live heap.", cfg.LiveHeapEvery))
	}
	if cfg.ChurnEvery > 0 {
		notes = append(notes, fmt.Sprintf("Churn: every %s one member leaves (MQTT DISCONNECT) or, alternately, crashes (TCP closed without DISCONNECT); each joins again %s later with the same client ID and a clean start. The member is drawn at random, preferring (up to 20 draws) one that holds unacknowledged QoS 1 messages, so churn exercises the broker's re-dispatch. A member whose connection ends otherwise also joins again.", cfg.ChurnEvery, cfg.RejoinAfter))
	}
	if res.FDLimit.Raised {
		notes = append(notes, fmt.Sprintf("The open-file limit was raised to %d (hard limit %d) with setrlimit; the broker inherits it.", res.FDLimit.Soft, res.FDLimit.Hard))
	} else {
		notes = append(notes, fmt.Sprintf("The open-file limit (%d) was already high enough; it was not changed.", res.FDLimit.Soft))
	}
	return notes
}

// soakGoals evaluates the soak goals of issue 9.
func soakGoals(res *SoakResults) []harness.Goal {
	f, st := res.Final, res.Stability
	gs := []harness.Goal{}
	if f.AckedQoS1 == 0 {
		gs = append(gs, harness.Goal{Text: "0 lost at QoS 1", Status: "not measured", Detail: "no QoS 1 message was acknowledged"})
	} else {
		gs = append(gs, harness.Goal{Text: "0 lost at QoS 1", Status: harness.MetIf(f.LostQoS1 == 0),
			Detail: fmt.Sprintf("%d lost of %d acknowledged by the broker (%d duplicated)", f.LostQoS1, f.AckedQoS1, res.Totals.DuplicatedQoS1)})
	}
	flat := func(text, unit string, first, last, limit float64) harness.Goal {
		if math.IsNaN(first) || math.IsNaN(last) || first <= 0 {
			return harness.Goal{Text: text, Status: "not measured", Detail: "no samples"}
		}
		r := last / first
		return harness.Goal{Text: text, Status: harness.MetIf(r <= limit),
			Detail: fmt.Sprintf("median %s%s in the first %s after the %s warm-up, %s in the last %s (×%.2f; limit ×%.2f)", trimNum(first), unit, fmtWindow(st.WindowS), fmtWindow(st.WarmupS), trimNum(last), fmtWindow(st.WindowS), r, limit)}
	}
	gs = append(gs, flat("broker RSS flat after warm-up", " MB", st.RSSFirstMedianMB, st.RSSLastMedianMB, soakRSSGrowthLimit))
	if res.Config.LiveHeapEveryS > 0 {
		gs = append(gs, flat("broker live heap (after a forced GC) flat after warm-up", " MB", st.LiveHeapFirstMB, st.LiveHeapLastMB, soakLiveHeapGrowthLimit))
	}
	gs = append(gs, flat("broker goroutines flat after warm-up", "", st.GoroutinesFirst, st.GoroutinesLast, soakGoroutineGrowthLimit))
	return gs
}

func trimNum(v float64) string {
	if math.Abs(v) >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func fmtWindow(s float64) string {
	if s >= 60 && math.Mod(s, 60) == 0 {
		return fmt.Sprintf("%.0f min", s/60)
	}
	return fmt.Sprintf("%.0f s", s)
}

// soakMarkdown renders summary.md.
func soakMarkdown(res *SoakResults) string {
	var b strings.Builder
	c, t, f, st := res.Config, res.Totals, res.Final, res.Stability
	fmt.Fprintf(&b, "# Soak test\n\n`luffy-bench soak`: %d MQTT connections (%d shared-group members in %d groups, %d publishers), %.0f msg/s (%d %% QoS 1), %s of publishing, churn every %s (leave / crash alternately, rejoin after %s), samples every %s, %s grace. Generated %s on %s (%d cores, %s). Raw data: `soak.json`.\n\n",
		c.Connections, c.Members, c.Groups, c.Publishers, c.Rate, c.QoS1Percent, fmtWindow(c.DurationS), secsText(c.ChurnEveryS), secsText(c.RejoinAfterS),
		secsText(c.SampleEveryS), secsText(c.GraceS), res.Generated.Format("2006-01-02 15:04 UTC"), res.Machine.CPU, res.Machine.Cores, res.Machine.GoVersion)
	b.WriteString("## Goals\n\n")
	for _, g := range soakGoals(res) {
		b.WriteString(g.String() + "\n")
	}
	b.WriteString("\n## Totals\n\n| | QoS 1 | QoS 0 |\n|---|---|---|\n")
	fmt.Fprintf(&b, "| published (QoS 1: acknowledged by the broker; QoS 0: written) | %d | %d |\n", f.AckedQoS1, f.WrittenQoS0)
	fmt.Fprintf(&b, "| received (first receipts) | %d | %d |\n", t.ReceivedQoS1, t.ReceivedQoS0)
	fmt.Fprintf(&b, "| lost (QoS 1) / missing (QoS 0, not a failure) | **%d** | %d (%s) |\n", f.LostQoS1, f.MissingQoS0, pctOf(f.MissingQoS0, f.WrittenQoS0))
	fmt.Fprintf(&b, "| duplicated | %d | %d |\n", t.DuplicatedQoS1, t.DuplicatedQoS0)
	fmt.Fprintf(&b, "| latency p50 / p99 (ms) | %s / %s | %s / %s |\n\n", harness.FmtMs(t.P50QoS1Ms), harness.FmtMs(t.P99QoS1Ms), harness.FmtMs(t.P50QoS0Ms), harness.FmtMs(t.P99QoS0Ms))
	if len(f.Lost) > 0 {
		fmt.Fprintf(&b, "First lost QoS 1 sequence IDs: %v\n\n", f.Lost)
	}
	fmt.Fprintf(&b, "Publish slots %d, failed publishes %d, publisher reconnects %d, slots sent over 1 s late %d (largest lag %s ms); mean received %.1f msg/s; misrouted (to another group) %d; undecodable %d.\n\n",
		t.Reserved, t.PublishFailed, t.PubReconnects, t.LateSlots, harness.FmtMs(t.MaxLagMs), t.MeanReceivedPer, t.Misrouted, t.Undecodable)
	fmt.Fprintf(&b, "Churn: %d leaves, %d crashes (%d of these hit a member holding unacknowledged QoS 1 messages), %d rejoins, %d unexpected disconnects, %d failed joins. Members connected in %.1f s; drain after publishing %.1f s.\n\n",
		t.Leaves, t.Crashes, t.ChurnHeld, t.Joins, t.Unexpected, t.JoinFailures, t.ConnectSeconds, t.DrainSeconds)
	if n := len(res.Samples); n > 0 {
		last := res.Samples[n-1]
		if m := last.BrokerMetrics; m != nil {
			fmt.Fprintf(&b, "Broker counters at the end: re-dispatched to another member %.0f, re-dispatch dropped %.0f, QoS 0 dropped (outbox full) %.0f, slow clients disconnected %.0f.\n\n",
				m[`luffymq_redispatched_messages_total{outcome="delivered"}`], m[`luffymq_redispatched_messages_total{outcome="dropped"}`],
				m[`luffymq_qos0_dropped_total{reason="outbox_full"}`],
				m[`luffymq_slow_clients_disconnected_total{reason="outbox_full"}`]+m[`luffymq_slow_clients_disconnected_total{reason="write_timeout"}`])
		}
	}
	fmt.Fprintf(&b, "## Resources (broker)\n\n| | first %s after the %s warm-up (median) | last %s (median) | slope after the warm-up, per 10 min |\n|---|---|---|---|\n", fmtWindow(st.WindowS), fmtWindow(st.WarmupS), fmtWindow(st.WindowS))
	fmt.Fprintf(&b, "| RSS (MB) | %s | %s | %s |\n", numOrDash(st.RSSFirstMedianMB), numOrDash(st.RSSLastMedianMB), signedOrDash(st.RSSSlopeMBPer10Min))
	if st.LiveHeapFirstMB >= 0 || st.LiveHeapLastMB >= 0 {
		fmt.Fprintf(&b, "| live heap after a forced GC (MB) | %s | %s | |\n", numOrDash(negativeAsNaN(st.LiveHeapFirstMB)), numOrDash(negativeAsNaN(st.LiveHeapLastMB)))
	}
	fmt.Fprintf(&b, "| Go heap in use (MB) | %s | %s | |\n", numOrDash(st.HeapFirstMedianMB), numOrDash(st.HeapLastMedianMB))
	fmt.Fprintf(&b, "| Go heap objects | %s | %s | |\n", numOrDash(st.HeapObjectsFirst), numOrDash(st.HeapObjectsLast))
	fmt.Fprintf(&b, "| goroutines | %s | %s | %s |\n", numOrDash(st.GoroutinesFirst), numOrDash(st.GoroutinesLast), signedOrDash(st.GoroutineSlope))
	fmt.Fprintf(&b, "| threads | %s | %s | |\n\n", numOrDash(st.ThreadsFirst), numOrDash(st.ThreadsLast))
	cpuB, cpuL, rssL := meanOver(res.Samples, func(s SoakSample) float64 { return s.BrokerCPUPercent }),
		meanOver(res.Samples, func(s SoakSample) float64 { return s.LoadgenCPUPercent }),
		maxOver(res.Samples, func(s SoakSample) float64 { return s.LoadgenRSSMB })
	lgG := maxOver(res.Samples, func(s SoakSample) float64 { return float64(s.LoadgenGoroutines) })
	fmt.Fprintf(&b, "Mean CPU over the publishing phase: broker %.0f %% of a core, load generator %.0f %%; load generator RSS at most %.0f MB, goroutines at most %.0f.\n\n", cpuB, cpuL, rssL, lgG)
	b.WriteString("## Time series\n\n")
	for _, p := range soakPlots {
		fmt.Fprintf(&b, "![%s](%s)\n\n", p.Alt, p.File)
	}
	b.WriteString("## How it was measured\n\n")
	for _, n := range res.Notes {
		b.WriteString("- " + n + "\n")
	}
	return b.String()
}

func secsText(s float64) string {
	if s >= 60 {
		return fmtWindow(s)
	}
	return harness.TrimFloat(math.Round(s*1000)/1000) + " s"
}

func pctOf(n, of int) string {
	if of == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f %%", 100*float64(n)/float64(of))
}

func numOrDash(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	return trimNum(v)
}

func signedOrDash(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	return fmt.Sprintf("%+.2f", v)
}

func meanOver(ss []SoakSample, f func(SoakSample) float64) float64 {
	sum, n := 0.0, 0
	for _, s := range ss {
		if s.Phase == "publish" {
			sum += f(s)
			n++
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return sum / float64(n)
}

func maxOver(ss []SoakSample, f func(SoakSample) float64) float64 {
	m := 0.0
	for _, s := range ss {
		m = math.Max(m, f(s))
	}
	return m
}

// finiteOr returns v, or alt when v is NaN or infinite (JSON has neither).
func finiteOr(v, alt float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return alt
	}
	return v
}

// soakJSONSafe returns a copy of res whose statistics are finite (-1 for
// no data).
func soakJSONSafe(res *SoakResults) *SoakResults {
	c := *res
	t := &c.Totals
	for _, p := range []*float64{&t.P50QoS1Ms, &t.P99QoS1Ms, &t.MaxQoS1Ms, &t.P50QoS0Ms, &t.P99QoS0Ms, &t.MaxLagMs, &t.MeanReceivedPer} {
		*p = finiteOr(*p, -1)
	}
	s := &c.Stability
	for _, p := range []*float64{&s.HeapFirstMedianMB, &s.HeapLastMedianMB, &s.HeapObjectsFirst, &s.HeapObjectsLast, &s.RSSFirstMedianMB, &s.RSSLastMedianMB, &s.GoroutinesFirst, &s.GoroutinesLast, &s.ThreadsFirst, &s.ThreadsLast, &s.RSSSlopeMBPer10Min, &s.GoroutineSlope} {
		*p = finiteOr(*p, -1)
	}
	c.Samples = make([]SoakSample, len(res.Samples))
	for i, sm := range res.Samples {
		sm.P99Ms = finiteOr(sm.P99Ms, -1)
		sm.BrokerCPUPercent = finiteOr(sm.BrokerCPUPercent, -1)
		sm.LoadgenCPUPercent = finiteOr(sm.LoadgenCPUPercent, -1)
		c.Samples[i] = sm
	}
	return &c
}

// writeSoakOutputs writes soak.json, the plots and summary.md into dir.
func writeSoakOutputs(dir string, res *SoakResults) error {
	if err := harness.WriteJSON(filepath.Join(dir, "soak.json"), soakJSONSafe(res)); err != nil {
		return err
	}
	if err := plotSoak(dir, res); err != nil {
		return fmt.Errorf("soak plots: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "summary.md"), []byte(soakMarkdown(res)), 0o644)
}

// soakSeries is one line of a soak plot.
type soakSeries struct {
	name  string
	value func(SoakSample) float64
	color color.Color
}

// plotSoak writes the soak time-series PNGs (time in minutes since
// publishing began; the drain phase is included).
func plotSoak(dir string, res *SoakResults) error {
	st := res.Stability
	pubEnd := res.Totals.PublishSeconds / 60
	type spec struct {
		file, title, y string
		series         []soakSeries
		refs           []float64 // horizontal reference lines (first/last medians)
	}
	specs := []spec{
		{"soak-msgs-per-sec.png", "Messages per second", "msgs/s", []soakSeries{
			{"published", func(s SoakSample) float64 { return s.PublishedPerS }, harness.Palette[0]},
			{"received (first receipts)", func(s SoakSample) float64 { return s.ReceivedPerS }, harness.Palette[1]},
			{"delivered (with duplicates)", func(s SoakSample) float64 { return s.DeliveredPerS }, harness.Palette[6]},
		}, nil},
		{"soak-p99.png", fmt.Sprintf("p99 latency per %s window", secsText(res.Config.SampleEveryS)), "p99 latency (ms)", []soakSeries{
			{"p99", func(s SoakSample) float64 { return s.P99Ms }, harness.Palette[0]},
		}, nil},
		{"soak-loss.png", "Lost and duplicated (cumulative)", "messages", []soakSeries{
			{fmt.Sprintf("QoS 1 lost so far (acked > %s ago, unreceived)", secsText(res.Config.OverdueAfterS)), func(s SoakSample) float64 { return float64(s.LostSoFarQoS1) }, harness.Palette[1]},
			{"QoS 1 duplicated", func(s SoakSample) float64 { return float64(s.DuplicatedQoS1) }, harness.Palette[0]},
			{"QoS 0 duplicated", func(s SoakSample) float64 { return float64(s.DuplicatedQoS0) }, harness.Palette[5]},
			{"QoS 0 missing", func(s SoakSample) float64 { return float64(s.MissingQoS0) }, harness.Palette[4]},
		}, nil},
		{"soak-rss.png", fmt.Sprintf("Broker RSS (dashed: medians of the first %s after the warm-up and the last)", fmtWindow(st.WindowS)), "MB", []soakSeries{
			{"broker VmRSS", func(s SoakSample) float64 { return s.BrokerRSSMB }, harness.Palette[0]},
			{"broker Go heap in use", func(s SoakSample) float64 { return s.BrokerHeapMB }, harness.Palette[2]},
			{"broker live heap (after a forced GC)", func(s SoakSample) float64 { return s.BrokerLiveHeapMB }, harness.Palette[1]},
		}, []float64{st.RSSFirstMedianMB, st.RSSLastMedianMB}},
		{"soak-goroutines.png", fmt.Sprintf("Broker goroutines and threads (dashed: goroutine medians of the first %s after the warm-up and the last)", fmtWindow(st.WindowS)), "count", []soakSeries{
			{"goroutines", func(s SoakSample) float64 { return s.BrokerGoroutine }, harness.Palette[0]},
			{"OS threads", func(s SoakSample) float64 { return float64(s.BrokerThreads) }, harness.Palette[2]},
			{"members online", func(s SoakSample) float64 { return float64(s.MembersOnline) }, harness.Palette[6]},
		}, []float64{st.GoroutinesFirst, st.GoroutinesLast}},
	}
	for _, sp := range specs {
		p := harness.NewPlot(sp.title, "minutes since publishing began", sp.y)
		maxX, maxY := 0.0, 0.0
		for _, se := range sp.series {
			var pts plotter.XYs
			for _, s := range res.Samples {
				v := se.value(s)
				if math.IsNaN(v) || v < 0 {
					continue // no data in this window
				}
				pts = append(pts, plotter.XY{X: s.T / 60, Y: v})
				maxX, maxY = math.Max(maxX, s.T/60), math.Max(maxY, v)
			}
			if len(pts) == 0 {
				continue
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			l.Color = se.color
			l.Width = vg.Points(1.3)
			p.Add(l)
			p.Legend.Add(se.name, l)
		}
		for _, r := range sp.refs {
			if math.IsNaN(r) || r <= 0 || maxX == 0 {
				continue
			}
			l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: r}, {X: maxX, Y: r}})
			if err != nil {
				return err
			}
			l.Color = color.RGBA{200, 0, 0, 255}
			l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
			p.Add(l)
		}
		if pubEnd > 0 && pubEnd < maxX {
			l, err := plotter.NewLine(plotter.XYs{{X: pubEnd, Y: 0}, {X: pubEnd, Y: math.Max(maxY, 1) * 1.3}})
			if err != nil {
				return err
			}
			l.Color = color.Black
			l.Dashes = []vg.Length{vg.Points(1), vg.Points(3)}
			p.Add(l)
			p.Legend.Add("publishing ends", l)
		}
		p.X.Min = 0
		p.Y.Min = 0
		p.Y.Max = math.Max(maxY, 1) * 1.3
		p.X.Tick.Marker = plot.DefaultTicks{}
		if err := p.Save(9*vg.Inch, 4*vg.Inch, filepath.Join(dir, sp.file)); err != nil {
			return err
		}
	}
	return nil
}

// negativeAsNaN turns a "not measured" -1 into NaN (shown as a dash).
func negativeAsNaN(v float64) float64 {
	if v < 0 {
		return math.NaN()
	}
	return v
}
