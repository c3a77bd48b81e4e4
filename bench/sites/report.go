package sites

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// writeSitesReport writes the plots and summary.md of res into dir.
func writeSitesReport(dir string, res *SitesResults) error {
	if err := plotSites(dir, res); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "summary.md"), []byte(sitesMarkdown(res, dir)), 0o644)
}

// WriteSitesSummary rewrites summary.md and the plots of dir from
// dir/sites.json.
func WriteSitesSummary(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, "sites.json"))
	if err != nil {
		return err
	}
	var res SitesResults
	if err := json.Unmarshal(data, &res); err != nil {
		return fmt.Errorf("sites.json: %w", err)
	}
	res.unfinite()
	return writeSitesReport(dir, &res)
}

// findRun returns the run of arch on scenario, or nil.
func findRun(runs []SitesRun, scenario, arch string) *SitesRun {
	for i := range runs {
		if runs[i].Scenario == scenario && runs[i].Architecture == arch {
			return &runs[i]
		}
	}
	return nil
}

// measured reports whether r exists and delivered something.
func measured(r *SitesRun) bool { return r != nil && r.Error == "" && r.Latency.Count > 0 }

// sitesGoal is one of issue 8's goals and what the run reached.
type sitesGoal struct {
	Goal, Measured string
	// Met is "yes", "no" or "—" (not measured).
	Met string
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

// sitesGoals evaluates issue 8's goals on res.
func sitesGoals(res *SitesResults) []sitesGoal {
	var goals []sitesGoal
	ratio := func(sc, field string) (float64, bool) {
		ref := sitesReferenceRun(res.Runs, sc)
		lm := findRun(res.Runs, sc, ArchLuffyMQ)
		if !measured(lm) || !measured(ref) {
			return math.NaN(), false
		}
		if field == "p50" {
			return harness.Ratio(lm.Latency.P50, ref.Latency.P50), true
		}
		return harness.Ratio(lm.Latency.Mean, ref.Latency.Mean), true
	}
	if m, ok := ratio(SitesWQBalanced, "mean"); ok {
		p, _ := ratio(SitesWQBalanced, "p50")
		measuredText := fmt.Sprintf("mean %s, median %s", harness.FmtPercent(m), harness.FmtPercent(p))
		if lm, ref := findRun(res.Runs, SitesWQBalanced, ArchLuffyMQ), sitesReferenceRun(res.Runs, SitesWQBalanced); lm.Oracle != nil {
			measuredText += fmt.Sprintf(" (the oracle on the same publishes: mean %s, median %s)",
				harness.FmtPercent(harness.Ratio(lm.Oracle.Mean, ref.Latency.Mean)), harness.FmtPercent(harness.Ratio(lm.Oracle.P50, ref.Latency.P50)))
		}
		goals = append(goals, sitesGoal{"wq-balanced: mean ≤ 25 % and median ≤ 20 % of queue-federation full mesh",
			measuredText, yesNo(m <= 0.25 && p <= 0.20)})
	} else {
		goals = append(goals, sitesGoal{"wq-balanced: mean ≤ 25 % and median ≤ 20 % of queue-federation full mesh", "not measured", "—"})
	}
	if m, ok := ratio(SitesWQLocal, "mean"); ok {
		goals = append(goals, sitesGoal{"wq-local: mean ≤ 50 % of queue-federation full mesh", "mean " + harness.FmtPercent(m), yesNo(m <= 0.5)})
	} else {
		goals = append(goals, sitesGoal{"wq-local: mean ≤ 50 % of queue-federation full mesh", "not measured", "—"})
	}
	for _, sc := range []string{SitesPSB, SitesPSP, SitesPSS, SitesPSDynamic} {
		lm, fm := findRun(res.Runs, sc, ArchLuffyMQ), findRun(res.Runs, sc, ArchFullMesh)
		goal := sc + ": mean ≤ 1.15× exchange-federation full mesh, ≤ 2·(N−1) links per exchange, lower than star and random"
		if !measured(lm) || !measured(fm) {
			goals = append(goals, sitesGoal{goal, "not measured", "—"})
			continue
		}
		r := harness.Ratio(lm.Latency.Mean, fm.Latency.Mean)
		bound := syncLinkBound(res, sc)
		parts := []string{fmt.Sprintf("mean %s of full mesh", harness.FmtRatio(r)), fmt.Sprintf("links %d (bound %d; full mesh %d)", lm.FederationLinks, bound, fm.FederationLinks)}
		ok := r <= 1.15 && (bound < 0 || lm.FederationLinks <= bound)
		for _, other := range []string{ArchStar, ArchRandom} {
			if o := findRun(res.Runs, sc, other); measured(o) {
				parts = append(parts, fmt.Sprintf("%s %s ms vs %s ms", other, harness.FmtMs(o.Latency.Mean), harness.FmtMs(lm.Latency.Mean)))
				ok = ok && lm.Latency.Mean < o.Latency.Mean
			}
		}
		goals = append(goals, sitesGoal{goal, strings.Join(parts, "; "), yesNo(ok)})
	}
	c := findRun(res.Runs, SitesReconfig, ArchReconfigConserve)
	goal := "reconfig: 0 lost, held messages ≤ 2 s above steady state (with conservation)"
	switch {
	case c == nil:
		goals = append(goals, sitesGoal{goal, "not measured", "—"})
	case c.Error != "" || c.Reconfig == nil:
		goals = append(goals, sitesGoal{goal, "not measured: " + firstLine(c.Error), "—"})
	default:
		f := c.Reconfig
		goals = append(goals, sitesGoal{goal, fmt.Sprintf("lost %d of %d; %d moves in %d changes; worst latency near a change %s ms, %s ms above the steady median",
			c.Lost, c.Expected, f.Moves, f.Changes, harness.FmtMs(orNaN(f.SpikeMaxMs)), harness.FmtMs(orNaN(f.SpikeAboveSteadyMs))),
			yesNo(c.Lost == 0 && f.Moves > 0 && f.SpikeAboveSteadyMs <= 2000)})
	}
	return goals
}

// orNaN turns the -1 of "no value" into NaN for formatting.
func orNaN(v float64) float64 {
	if v < 0 {
		return math.NaN()
	}
	return v
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// syncLinkBound is Σ 2·(N_i − 1) over the scenario's exchanges, or -1
// when its workload is unknown.
func syncLinkBound(res *SitesResults, scenario string) int {
	for _, wl := range res.Workloads {
		if wl.Scenario == scenario && wl.PS != nil {
			n := 0
			for _, sites := range wl.PS.InstanceSites() {
				n += 2 * (len(sites) - 1)
			}
			return n
		}
	}
	return -1
}

// sitesReferenceRun is the full-mesh run the ratios of scenario use.
func sitesReferenceRun(runs []SitesRun, scenario string) *SitesRun {
	sc, arch := sitesReference(scenario)
	return findRun(runs, sc, arch)
}

// sitesMarkdown renders summary.md.
func sitesMarkdown(res *SitesResults, dir string) string {
	var b strings.Builder
	m := res.Machine
	c := res.Config
	b.WriteString("# Across sites: scenario set C\n\n")
	fmt.Fprintf(&b, "Generated %s by `luffy-bench %s`. Machine: %s, %d cores, %s, %s. RabbitMQ %s.\n\n",
		res.Generated.Format("2006-01-02 15:04 UTC"), Command, m.CPU, m.Cores, m.GoVersion, m.OS, harness.OrDash(res.RabbitMQ))
	fmt.Fprintf(&b, "**%d sites** (%s), **%s**.\n\n", len(c.Sites), strings.Join(c.Sites, ", "), res.TimeScale)
	b.WriteString("One-way delays (ms):\n\n|  |")
	for _, s := range c.Sites {
		fmt.Fprintf(&b, " %s |", s)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(c.Sites)) + "\n")
	for _, a := range c.Sites {
		fmt.Fprintf(&b, "| %s |", a)
		for _, s := range c.Sites {
			if a == s {
				b.WriteString(" — |")
			} else {
				fmt.Fprintf(&b, " %.0f |", res.DelaysMs[a][s])
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	b.WriteString("\n## Goals of issue 8\n\n| goal | measured | met |\n|---|---|---|\n")
	for _, g := range sitesGoals(res) {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", g.Goal, g.Measured, g.Met)
	}
	b.WriteString("\n(The placement-quality goal — heuristic within 10 % of the optimum — is measured by `go test -v -run TestPlacementQuality ./bridge/placement`, not here.)\n\n")
	for _, sc := range harness.OrderedLabels(res.Runs, func(r SitesRun) string { return r.Scenario }) {
		writeSitesScenario(&b, res, sc, dir)
	}
	b.WriteString("Raw runs: `sites.json` (latency percentiles, windows, plans, overlay per site, notes); broker logs in `logs/`.\n")
	return b.String()
}

// describeWorkload says what a scenario's clients do.
func describeWorkload(res *SitesResults, scenario string) string {
	for _, wl := range res.Workloads {
		if wl.Scenario != scenario {
			continue
		}
		if w := wl.WQ; w != nil {
			var parts []string
			for i, s := range w.Sites {
				parts = append(parts, fmt.Sprintf("%s %.1f msg/s, %d consumers", s, w.Rates[i], w.Consumers[i]))
			}
			total := 0.0
			for _, r := range w.Rates {
				total += r
			}
			var busy []string
			for _, i := range w.BusySites() {
				busy = append(busy, w.Sites[i])
			}
			from := "all from the busy site " + busy[0]
			if len(busy) > 1 {
				from = "all from the busy sites " + strings.Join(busy, " and ")
			}
			return fmt.Sprintf("Poisson arrivals for %s: %s; each consumer takes %s per message. Total %.1f msg/s for a capacity of %.0f msg/s; %.1f msg/s (%s), %s, cannot be processed where published.",
				w.Duration, strings.Join(parts, "; "), w.Service, total, w.Capacity(), w.MustMove(), harness.FmtPercent(w.MustMove()/total), from)
		}
		if w := wl.PS; w != nil {
			inst := w.InstanceSites()
			var xs []string
			for i := range w.Topics {
				var names []string
				for _, s := range inst[i] {
					names = append(names, w.Sites[s])
				}
				subs := 0
				for _, s := range w.Subscribers {
					if s.Exchange == i {
						subs++
					}
				}
				xs = append(xs, fmt.Sprintf("%s at %s (%d subscribers)", w.Exchange(i), strings.Join(names, ", "), subs))
			}
			var phases []string
			for _, ph := range w.Phases {
				phases = append(phases, fmt.Sprintf("%s %d producers %s", ph.Kind, len(ph.Producers), ph.Duration))
			}
			return fmt.Sprintf("%d exchanges: %s. Phases: %s; each producer sends Poisson arrivals at %s msg/s of %d B; 70 %% of the clients at %s.",
				len(w.Topics), strings.Join(xs, "; "), strings.Join(phases, " → "), harness.TrimFloat(w.Rate), sitesPayloadBytes, w.Sites[w.Hot])
		}
	}
	return ""
}

func writeSitesScenario(b *strings.Builder, res *SitesResults, sc, dir string) {
	fmt.Fprintf(b, "## %s\n\n", sc)
	if d := describeWorkload(res, sc); d != "" {
		b.WriteString(d + "\n\n")
	}
	ref := sitesReferenceRun(res.Runs, sc)
	refName := "—"
	if ref != nil {
		refName = ref.Architecture
		if ref.Scenario != sc {
			refName = ref.Scenario + " " + ref.Architecture
		}
	}
	fmt.Fprintf(b, "Ratios are against **%s** (the full mesh).\n\n", refName)
	b.WriteString("| architecture | federation links | published | expected | lost | dup | remote | mean ms | p50 | p75 | p99 | max | mean ÷ ref | p50 ÷ ref | p99 ÷ ref | overlay msgs out | overlay KiB out / in |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	var runs []SitesRun
	for _, r := range res.Runs {
		if r.Scenario == sc {
			runs = append(runs, r)
		}
	}
	for _, r := range runs {
		if r.Error != "" && r.Latency.Count == 0 {
			fmt.Fprintf(b, "| %s | — | — | — | — | — | — | — | — | — | — | — | — | — | — | — | — |\n", r.Architecture)
			continue
		}
		var msgs, out, in int64
		for _, o := range r.Overlay {
			msgs += o.MessagesOut
			out += o.BytesOut
			in += o.BytesIn
		}
		rm, r50, r99 := math.NaN(), math.NaN(), math.NaN()
		if measured(ref) {
			rm, r50, r99 = harness.Ratio(r.Latency.Mean, ref.Latency.Mean), harness.Ratio(r.Latency.P50, ref.Latency.P50), harness.Ratio(r.Latency.P99, ref.Latency.P99)
		}
		lost := fmt.Sprint(r.Lost)
		if r.Lost > 0 {
			lost = "**" + lost + "**"
		}
		fmt.Fprintf(b, "| %s | %d | %d | %d | %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %d | %.0f / %.0f |\n",
			r.Architecture, r.FederationLinks, r.Published, r.Expected, lost, r.Duplicated, r.Remote,
			harness.FmtMs(r.Latency.Mean), harness.FmtMs(r.Latency.P50), harness.FmtMs(r.Latency.P75), harness.FmtMs(r.Latency.P99), harness.FmtMs(r.Latency.Max),
			harness.FmtRatio(rm), harness.FmtRatio(r50), harness.FmtRatio(r99), msgs, float64(out)/1024, float64(in)/1024)
	}
	b.WriteString("\n")
	for _, r := range runs {
		var lines []string
		if len(r.Plan) > 0 && r.Scenario != SitesReconfig {
			lines = append(lines, "sync sites "+formatPlan(r.Plan))
		}
		if r.Remote > 0 && isWorkQueue(sc) {
			lines = append(lines, fmt.Sprintf("processed away from the publishing site: %d (mean %s ms, local mean %s ms)", r.Remote, harness.FmtMs(r.RemoteLatency.Mean), harness.FmtMs(r.LocalLatency.Mean)))
		}
		if r.StatesSent > 0 || r.StateRequestsSent > 0 {
			lines = append(lines, fmt.Sprintf("of its overlay messages, %d are group states sent to other sites and %d requests for states, each federated to every other site (%d deliveries)",
				r.StatesSent, r.StateRequestsSent, r.StateRequestsSent*int64(len(r.Overlay)-1)))
			flows := slices.Sorted(maps.Keys(r.StateFlows))
			for i, f := range flows {
				flows[i] = fmt.Sprintf("%s %d", f, r.StateFlows[f])
			}
			if len(flows) > 0 {
				lines = append(lines, "states by flow: "+strings.Join(flows, ", "))
			}
			reasons := slices.Sorted(maps.Keys(r.StateReasons))
			for i, why := range reasons {
				reasons[i] = fmt.Sprintf("%s %d", why, r.StateReasons[why])
			}
			if len(reasons) > 0 {
				lines = append(lines, "states by reason: "+strings.Join(reasons, ", "))
			}
		}
		if r.Oracle != nil && r.Architecture == ArchLuffyMQ {
			lines = append(lines, fmt.Sprintf("the oracle on the same publishes (each message, in publish order, to the consumer that can start it first; network delays only, every consumer's state known at once): mean %s ms, p50 %s ms, p99 %s ms", harness.FmtMs(r.Oracle.Mean), harness.FmtMs(r.Oracle.P50), harness.FmtMs(r.Oracle.P99)))
		}
		if isWorkQueue(sc) && len(r.Routes) > 0 {
			lines = append(lines, "by route (published → processed: count, mean ms): "+formatRoutes(r.Routes))
		}
		if r.PublishFailed > 0 {
			lines = append(lines, fmt.Sprintf("%d publishes failed", r.PublishFailed))
		}
		if r.Unexpected > 0 {
			lines = append(lines, fmt.Sprintf("%d unexpected receipts", r.Unexpected))
		}
		if r.Error != "" {
			lines = append(lines, "**error**: "+firstLine(r.Error))
		}
		lines = append(lines, r.Notes...)
		if len(lines) > 0 {
			fmt.Fprintf(b, "- **%s**: %s.\n", r.Architecture, strings.Join(lines, "; "))
		}
	}
	if sc == SitesReconfig {
		b.WriteString("\n| architecture | rounds | changes | moves | lost | dup | steady median ms | near-change deliveries | worst near a change ms | above steady ms |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range runs {
			if f := r.Reconfig; f != nil {
				fmt.Fprintf(b, "| %s | %d | %d | %d | %d | %d | %s | %d | %s | %s |\n", r.Architecture, f.Rounds, f.Changes, f.Moves, r.Lost, r.Duplicated,
					harness.FmtMs(orNaN(f.SteadyP50Ms)), f.NearChange, harness.FmtMs(orNaN(f.SpikeMaxMs)), harness.FmtMs(orNaN(f.SpikeAboveSteadyMs)))
			}
		}
		b.WriteString("\n")
		for _, r := range runs {
			for _, ch := range r.PlanChanges {
				fmt.Fprintf(b, "- %s at %.1f s: %s\n", r.Architecture, ch.AtS, strings.Join(ch.Moved, ", "))
			}
		}
	}
	b.WriteString("\n")
	for _, f := range []struct{ what, alt string }{
		{"latency", "latency distribution per architecture"},
		{"over-time", "mean latency over time"},
		{"overlay", "overlay bytes per site"},
	} {
		if name := sitesPlotFile(sc, f.what); harness.FileExists(filepath.Join(dir, name)) {
			fmt.Fprintf(b, "![%s: %s](%s)\n\n", sc, f.alt, name)
		}
	}
}

// formatPlan lists exchange → site pairs sorted by exchange.
func formatPlan(p map[string]string) string {
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + " → " + p[k]
	}
	return strings.Join(parts, ", ")
}

// formatRoutes lists the routes of the busiest origins first.
func formatRoutes(routes []SitesRoute) string {
	byOrigin := map[string]int{}
	for _, r := range routes {
		byOrigin[r.From] += r.Count
	}
	sorted := slices.Clone(routes)
	slices.SortStableFunc(sorted, func(x, y SitesRoute) int {
		return cmp.Or(cmp.Compare(byOrigin[y.From], byOrigin[x.From]), cmp.Compare(x.From, y.From))
	})
	parts := make([]string, len(sorted))
	for i, r := range sorted {
		parts[i] = fmt.Sprintf("%s → %s %d (%s)", r.From, r.To, r.Count, harness.FmtMs(r.MeanMs))
	}
	return strings.Join(parts, ", ")
}
