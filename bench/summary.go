package bench

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// aggregate is the medians over repeats of one system in one scenario.
type aggregate struct {
	System     string
	Runs       int
	Overall    LatencyStats // medians of each statistic
	SubMean    []float64
	SubRate    []float64
	Lost       float64 // median
	LostMax    int
	Dup        float64
	DupMax     int
	Undrained  int // runs whose drain timed out
	Notes      []string
	Recovery   float64 // median RecoveryS (NaN if none)
	NewFairS   float64
	NewMaxMs   float64
	NewMeanMs  float64
	FairShare  float64
	ReportsVia []string
}

// aggregateRuns groups runs of one scenario by system, in report order.
func aggregateRuns(runs []RunResult) []aggregate {
	by := map[string][]RunResult{}
	for _, r := range runs {
		by[r.System] = append(by[r.System], r)
	}
	systems := make([]string, 0, len(by))
	for s := range by {
		systems = append(systems, s)
	}
	sort.Slice(systems, func(i, j int) bool { return systemOrder(systems[i]) < systemOrder(systems[j]) })
	var out []aggregate
	for _, sys := range systems {
		rs := by[sys]
		a := aggregate{System: sys, Runs: len(rs)}
		col := func(f func(RunResult) float64) float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = f(r)
			}
			return Median(v)
		}
		a.Overall = LatencyStats{
			Count: int(col(func(r RunResult) float64 { return float64(r.Overall.Count) })),
			Mean:  col(func(r RunResult) float64 { return r.Overall.Mean }),
			P50:   col(func(r RunResult) float64 { return r.Overall.P50 }),
			P99:   col(func(r RunResult) float64 { return r.Overall.P99 }),
			Max:   col(func(r RunResult) float64 { return r.Overall.Max }),
		}
		nsub := 0
		for _, r := range rs {
			nsub = max(nsub, len(r.PerSub))
		}
		for j := range nsub {
			a.SubMean = append(a.SubMean, col(func(r RunResult) float64 {
				if j < len(r.PerSub) {
					return r.PerSub[j].Mean
				}
				return math.NaN()
			}))
			a.SubRate = append(a.SubRate, col(func(r RunResult) float64 {
				if j < len(r.PerSub) {
					return r.PerSub[j].MsgsPerSec
				}
				return math.NaN()
			}))
		}
		a.Lost = col(func(r RunResult) float64 { return float64(r.Lost) })
		a.Dup = col(func(r RunResult) float64 { return float64(r.Duplicated) })
		seenNote := map[string]bool{}
		for _, r := range rs {
			a.LostMax = max(a.LostMax, r.Lost)
			a.DupMax = max(a.DupMax, r.Duplicated)
			if r.DrainTimedOut {
				a.Undrained++
			}
			for _, n := range r.Notes {
				key := strings.SplitN(n, "(", 2)[0]
				if !seenNote[key] {
					seenNote[key] = true
					a.Notes = append(a.Notes, n)
				}
			}
		}
		adapt := func(f func(*Adaptation) float64) float64 {
			return col(func(r RunResult) float64 {
				if r.Adaptation == nil {
					return math.NaN()
				}
				return f(r.Adaptation)
			})
		}
		a.Recovery = adapt(func(x *Adaptation) float64 { return x.RecoveryS })
		a.NewFairS = adapt(func(x *Adaptation) float64 { return x.NewcomerFairS })
		a.NewMaxMs = adapt(func(x *Adaptation) float64 { return x.NewcomerMaxMs })
		a.NewMeanMs = adapt(func(x *Adaptation) float64 { return x.NewcomerMeanMs })
		a.FairShare = adapt(func(x *Adaptation) float64 { return x.NewcomerFairShare })
		out = append(out, a)
	}
	return out
}

func findAgg(aggs []aggregate, system string) *aggregate {
	for i := range aggs {
		if aggs[i].System == system {
			return &aggs[i]
		}
	}
	return nil
}

// scenarioTable renders one scenario's markdown table.
func scenarioTable(aggs []aggregate) string {
	var b strings.Builder
	mosq, orc := findAgg(aggs, SystemMosquitto), findAgg(aggs, SystemOracle)
	nsub := 0
	for _, a := range aggs {
		nsub = max(nsub, len(a.SubMean))
	}
	b.WriteString("| system | runs | mean ms | p50 ms | p99 ms | max ms | mean per subscriber ms | msgs/s per subscriber | lost | dup | mean ÷ Mosquitto | mean ÷ oracle |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, a := range aggs {
		var subs, rates []string
		for j := range a.SubMean {
			subs = append(subs, fmtMs(a.SubMean[j]))
			r := "—"
			if !math.IsNaN(a.SubRate[j]) {
				r = fmt.Sprintf("%.1f", a.SubRate[j])
			}
			rates = append(rates, r)
		}
		ratio := func(ref *aggregate) string {
			if ref == nil {
				return "—"
			}
			return fmtRatio(Ratio(a.Overall.Mean, ref.Overall.Mean))
		}
		lost := fmt.Sprintf("%.0f", a.Lost)
		if a.LostMax > int(a.Lost) {
			lost += fmt.Sprintf(" (max %d)", a.LostMax)
		}
		if a.Undrained > 0 {
			lost += fmt.Sprintf(" ⚠ %d undrained", a.Undrained)
		}
		dup := fmt.Sprintf("%.0f", a.Dup)
		if a.DupMax > int(a.Dup) {
			dup += fmt.Sprintf(" (max %d)", a.DupMax)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			a.System, a.Runs, fmtMs(a.Overall.Mean), fmtMs(a.Overall.P50), fmtMs(a.Overall.P99), fmtMs(a.Overall.Max),
			strings.Join(subs, " / "), strings.Join(rates, " / "), lost, dup, ratio(mosq), ratio(orc))
	}
	return b.String()
}

// goal is one reported goal.
type goal struct {
	Text   string
	Status string // "met", "missed", "not measured"
	Detail string
}

func (g goal) String() string {
	s := "**" + g.Status + "**"
	return fmt.Sprintf("- %s: %s — %s", g.Text, s, g.Detail)
}

func metIf(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// sharedGoals evaluates the set-A goals from aggregated results.
func sharedGoals(byScenario map[string][]aggregate) []goal {
	var gs []goal
	notMeasured := func(text, why string) {
		gs = append(gs, goal{Text: text, Status: "not measured", Detail: why})
	}
	if aggs, ok := byScenario["thesis-2"]; ok {
		ad, th, mq, orc := findAgg(aggs, "luffymq-adaptive"), findAgg(aggs, "luffymq-thesis"), findAgg(aggs, SystemMosquitto), findAgg(aggs, SystemOracle)
		if ad == nil {
			notMeasured("thesis-2 goals", "luffymq-adaptive was not run")
		} else {
			m, p := ad.Overall.Mean, ad.Overall.P99
			gs = append(gs, goal{"thesis-2: adaptive mean ≤ 8 ms and p99 ≤ 25 ms", metIf(m <= 8 && p <= 25),
				fmt.Sprintf("mean %s ms, p99 %s ms (median of %d runs)", fmtMs(m), fmtMs(p), ad.Runs)})
			if th != nil {
				r := Ratio(th.Overall.Mean, m)
				gs = append(gs, goal{"thesis-2: adaptive mean ≥ 3× lower than thesis", metIf(r >= 3),
					fmt.Sprintf("thesis %s ms ÷ adaptive %s ms = %s", fmtMs(th.Overall.Mean), fmtMs(m), fmtRatio(r))})
			} else {
				notMeasured("thesis-2: ≥ 3× lower mean than thesis", "luffymq-thesis not run")
			}
			if mq != nil {
				r := Ratio(mq.Overall.Mean, m)
				gs = append(gs, goal{"thesis-2: adaptive mean ≥ 100× lower than Mosquitto", metIf(r >= 100),
					fmt.Sprintf("Mosquitto %s ms ÷ adaptive %s ms = %s", fmtMs(mq.Overall.Mean), fmtMs(m), fmtRatio(r))})
			} else {
				notMeasured("thesis-2: ≥ 100× lower mean than Mosquitto", "mosquitto not run")
			}
			if orc != nil {
				r := Ratio(m, orc.Overall.Mean)
				gs = append(gs, goal{"thesis-2: adaptive mean within 2× of the oracle", metIf(r <= 2),
					fmt.Sprintf("adaptive %s ms ÷ oracle %s ms = %s", fmtMs(m), fmtMs(orc.Overall.Mean), fmtRatio(r))})
			} else {
				notMeasured("thesis-2: within 2× of the oracle", "oracle not run")
			}
		}
	} else {
		notMeasured("thesis-2 goals", "scenario not run")
	}
	if aggs, ok := byScenario["thesis-1"]; ok {
		ad, rr := findAgg(aggs, "luffymq-adaptive"), findAgg(aggs, "luffymq-round-robin")
		if ad != nil && rr != nil {
			d := ad.Overall.Mean - rr.Overall.Mean
			gs = append(gs, goal{"thesis-1: adaptive mean within 1 ms of round robin", metIf(math.Abs(d) <= 1),
				fmt.Sprintf("adaptive %s ms, round-robin %s ms (difference %+.2f ms)", fmtMs(ad.Overall.Mean), fmtMs(rr.Overall.Mean), d)})
		} else {
			notMeasured("thesis-1: adaptive within 1 ms of round robin", "needs luffymq-adaptive and luffymq-round-robin")
		}
	} else {
		notMeasured("thesis-1: adaptive within 1 ms of round robin", "scenario not run")
	}
	if aggs, ok := byScenario["step"]; ok {
		if ad := findAgg(aggs, "luffymq-adaptive"); ad != nil {
			rec := ad.Recovery
			detail := fmt.Sprintf("rolling p99 (500 ms windows) back under 50 ms %.1f s after the slow-down (median of %d runs; 2 report intervals = 2 s)", rec, ad.Runs)
			if rec < 0 {
				detail = "rolling p99 never came back under 50 ms"
			} else if rec == 0 {
				detail = "rolling p99 never exceeded 50 ms after the slow-down"
			}
			gs = append(gs, goal{"step: p99 back under 50 ms within 2 report intervals", metIf(rec >= 0 && rec <= 2), detail + othersRecovery(aggs)})
		} else {
			notMeasured("step goal", "luffymq-adaptive not run")
		}
	} else {
		notMeasured("step: p99 back under 50 ms within 2 report intervals", "scenario not run")
	}
	if aggs, ok := byScenario["join"]; ok {
		if ad := findAgg(aggs, "luffymq-adaptive"); ad != nil {
			fair := ad.NewFairS >= 0 && ad.NewFairS <= 2
			spike := ad.NewMaxMs <= 50
			detail := fmt.Sprintf("newcomer reached 90 %% of its capacity share (%.0f %%) after %s; largest latency of a message it took %s ms (mean %s ms)",
				100*ad.FairShare, secs(ad.NewFairS), fmtMs(ad.NewMaxMs), fmtMs(ad.NewMeanMs))
			if orc := findAgg(aggs, SystemOracle); orc != nil {
				detail += fmt.Sprintf("; oracle: share after %s, newcomer max %s ms", secs(orc.NewFairS), fmtMs(orc.NewMaxMs))
			}
			gs = append(gs, goal{"join: newcomer takes its fair share within 2 report intervals and is never over-fed (no spike > 50 ms)", metIf(fair && spike), detail})
		} else {
			notMeasured("join goal", "luffymq-adaptive not run")
		}
	} else {
		notMeasured("join: newcomer takes its fair share within 2 report intervals", "scenario not run")
	}
	if aggs, ok := byScenario["crash"]; ok {
		if ad := findAgg(aggs, "luffymq-adaptive"); ad != nil {
			gs = append(gs, goal{"crash (QoS 1): 0 lost", metIf(ad.LostMax == 0),
				fmt.Sprintf("luffymq-adaptive lost %d at most over %d runs (median %.0f), %.0f duplicated", ad.LostMax, ad.Runs, ad.Lost, ad.Dup)})
		} else {
			notMeasured("crash goal", "luffymq-adaptive not run")
		}
	} else {
		notMeasured("crash (QoS 1): 0 lost", "scenario not run")
	}
	return gs
}

func secs(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case v < 0:
		return "never"
	}
	return fmt.Sprintf("%.1f s", v)
}

func othersRecovery(aggs []aggregate) string {
	var parts []string
	for _, a := range aggs {
		if a.System == "luffymq-adaptive" || math.IsNaN(a.Recovery) {
			continue
		}
		v := fmt.Sprintf("%.1f s", a.Recovery)
		if a.Recovery < 0 {
			v = "never"
		}
		parts = append(parts, a.System+" "+v)
	}
	if len(parts) == 0 {
		return ""
	}
	return "; others: " + strings.Join(parts, ", ")
}

// WriteSummary (re)writes dir/summary.md from dir/results.json and
// dir/throughput.json, whichever exist.
func WriteSummary(dir string) error {
	shared, err := loadShared(filepath.Join(dir, "results.json"))
	if err != nil {
		return err
	}
	tp, err := loadThroughput(filepath.Join(dir, "throughput.json"))
	if err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("# LuffyMQ benchmark summary\n\n")
	var machine *MachineInfo
	if shared != nil {
		machine = &shared.Machine
	} else if tp != nil {
		machine = &tp.Machine
	}
	if machine != nil {
		fmt.Fprintf(&b, "Machine: %s, %d cores, %s, %s. Mosquitto: %s. %s.\n\n", machine.CPU, machine.Cores, machine.GoVersion, machine.OS, orDash(machine.Mosquitto), machine.Mochi)
	}
	byScenario := map[string][]aggregate{}
	if shared != nil {
		for i := range shared.Runs {
			r := &shared.Runs[i]
			r.Overall = r.Overall.unfinite()
			for j := range r.PerSub {
				r.PerSub[j].LatencyStats = r.PerSub[j].LatencyStats.unfinite()
			}
		}
		fmt.Fprintf(&b, "Set A (shared-subscription latency): latency = %s. Service emulation: %s. Every number is the median over the repeats of a run (column *runs*); ratio columns divide medians; msgs/s per subscriber = messages it took ÷ time from the first publish to the last dequeue of the run. Raw runs: `results.json`.\n\n",
			shared.Latency, shared.Emulation)
		for _, n := range shared.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
		b.WriteString("\n")
		for _, s := range Scenarios() {
			var runs []RunResult
			for _, r := range shared.Runs {
				if r.Scenario == s.ID {
					runs = append(runs, r)
				}
			}
			if len(runs) > 0 {
				byScenario[s.ID] = aggregateRuns(runs)
			}
		}
	}
	b.WriteString("## Goals\n\n")
	for _, g := range sharedGoals(byScenario) {
		b.WriteString(g.String() + "\n")
	}
	for _, g := range throughputGoals(tp) {
		b.WriteString(g.String() + "\n")
	}
	b.WriteString("\n")
	if shared != nil {
		for _, s := range Scenarios() {
			aggs, ok := byScenario[s.ID]
			if !ok {
				continue
			}
			var p ScenarioParams
			for _, r := range shared.Runs {
				if r.Scenario == s.ID {
					p = r.Params
					break
				}
			}
			gap := fmt.Sprintf("every %.0f ms", p.GapMs)
			if p.Poisson {
				gap = fmt.Sprintf("exponential gaps, mean %.0f ms", p.GapMs)
			}
			fmt.Fprintf(&b, "## %s\n\nPublisher %s for %.0f s (%d messages of %d B), QoS %d, reports every %s; members: %s. %s\n\n",
				s.ID, gap, p.DurationS, p.Messages, p.PayloadBytes, p.QoS, p.ReportInterval, strings.Join(p.Members, ", "), p.Notes)
			b.WriteString(scenarioTable(aggs))
			b.WriteString("\n")
			var notes []string
			for _, a := range aggs {
				for _, n := range a.Notes {
					notes = append(notes, a.System+": "+n)
				}
			}
			if len(notes) > 0 {
				for _, n := range notes {
					fmt.Fprintf(&b, "- %s\n", n)
				}
				b.WriteString("\n")
			}
			for _, img := range scenarioPlots(s.ID) {
				if _, err := os.Stat(filepath.Join(dir, img.file)); err == nil {
					fmt.Fprintf(&b, "![%s](%s)\n", img.alt, img.file)
				}
			}
			b.WriteString("\n")
		}
	}
	if tp != nil {
		b.WriteString(throughputMarkdown(tp))
	}
	return os.WriteFile(filepath.Join(dir, "summary.md"), []byte(b.String()), 0o644)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

type plotRef struct{ file, alt string }

// scenarioPlots lists the plot files of a scenario.
func scenarioPlots(id string) []plotRef {
	out := []plotRef{
		{id + "-subscriber-mean.png", id + ": mean latency per subscriber"},
		{id + "-latency-over-time.png", id + ": latency of each message over time"},
		{id + "-msgs-per-sec.png", id + ": messages per second per subscriber"},
	}
	if id == "step" || id == "join" || id == "crash" {
		out = append(out, plotRef{id + "-adaptation.png", id + ": rolling p99 over time"})
	}
	return out
}
