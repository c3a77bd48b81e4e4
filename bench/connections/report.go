package connections

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot/vg"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// RSSPlotFile is the bar plot of RSS per idle connection by broker.
const RSSPlotFile = "connections-rss.png"

// Goals of issue 21 for idle connections.
const (
	connRSSGoalKiB      = 24
	connRSSMoonshotKiB  = 16
	connRSSVsMochi      = 0.6
	churnGrowthGoalMiB  = 40
	connectionsLuffyMQ  = "luffymq-adaptive"
	connectionsNoResult = "—"
)

// connAggregate is one system's medians over its runs.
type connAggregate struct {
	System string
	Runs   int
	// Medians over the runs that measured them (NaN: none): RSS growth
	// per subscribed device, and once each got its command.
	RSSPerConnKiB          float64
	RSSPerConnCommandedKiB float64
	RSSPerConnIdledKiB     float64 // with Config.Idle
	// Go brokers only: the growth of goroutine stacks per device once
	// each got its command, and of goroutines.
	StackPerConnKiB   float64
	GoroutinesPerConn float64
	ConnectPerS       float64
	// DeliveredMin is the fewest deliveries of a run; Complete counts
	// runs that delivered to every device.
	DeliveredMin int
	Complete     int
	// ChurnGrowthMiB is the median RSS growth over the churn runs.
	ChurnGrowthMiB float64
	ChurnRuns      int
	Errors         []string
}

// Aggregate returns the medians of every system, in the order
// the systems ran.
func Aggregate(res *ConnectionsResults) []connAggregate {
	var out []connAggregate
	for _, sys := range harness.OrderedLabels(res.Runs, func(r ConnectionsRun) string { return r.System }) {
		a := connAggregate{System: sys, DeliveredMin: -1}
		var rss, rssCommanded, rssIdled, stack, goroutines, rate, churn []float64
		for _, r := range res.Runs {
			if r.System != sys {
				continue
			}
			a.Runs++
			if r.Error != "" {
				a.Errors = append(a.Errors, r.Error)
			}
			if r.Subscribed > 0 && r.RSSBeforeBytes > 0 && r.RSSAfterBytes > 0 {
				rss = append(rss, r.RSSPerConnBytes/1024)
			}
			if r.Subscribed > 0 && r.RSSBeforeBytes > 0 && r.RSSCommandedBytes > 0 {
				rssCommanded = append(rssCommanded, r.RSSPerConnCommandedBytes/1024)
			}
			if r.Subscribed > 0 && r.RSSBeforeBytes > 0 && r.RSSIdledBytes > 0 {
				rssIdled = append(rssIdled, r.RSSPerConnIdledBytes/1024)
			}
			if r.Subscribed > 0 && r.GoBefore != nil && r.GoCommanded != nil {
				n := float64(r.Subscribed)
				stack = append(stack, float64(r.GoCommanded.StackBytes-r.GoBefore.StackBytes)/n/1024)
				goroutines = append(goroutines, float64(r.GoCommanded.Goroutines-r.GoBefore.Goroutines)/n)
			}
			if r.Connected > 0 {
				rate = append(rate, r.ConnectPerS)
			}
			if a.DeliveredMin < 0 || r.Delivered < a.DeliveredMin {
				a.DeliveredMin = r.Delivered
			}
			if r.Error == "" && r.Delivered == r.Connections {
				a.Complete++
			}
		}
		for _, c := range res.Churn {
			if c.System == sys && c.Error == "" && c.RSSBeforeBytes > 0 && c.RSSAfterBytes > 0 {
				churn = append(churn, float64(c.RSSAfterBytes-c.RSSBeforeBytes)/(1<<20))
				a.ChurnRuns++
			}
		}
		a.RSSPerConnKiB, a.RSSPerConnCommandedKiB, a.ConnectPerS, a.ChurnGrowthMiB = harness.Median(rss), harness.Median(rssCommanded), harness.Median(rate), harness.Median(churn)
		a.StackPerConnKiB, a.GoroutinesPerConn, a.RSSPerConnIdledKiB = harness.Median(stack), harness.Median(goroutines), harness.Median(rssIdled)
		out = append(out, a)
	}
	return out
}

func findConnAgg(aggs []connAggregate, system string) *connAggregate {
	for i := range aggs {
		if aggs[i].System == system {
			return &aggs[i]
		}
	}
	return nil
}

// connectionsNotes are the notes of connections.json and connections.md.
func connectionsNotes(cfg ConnectionsConfig, fdl FDLimit) []string {
	notes := []string{
		"Every broker runs as a process of its own on loopback, a fresh one per run: luffymq (the real binary, default flags" + harness.ArgsNote(cfg.LuffyMQArgs) + "), vanilla Mochi as `luffy-bench " + harness.MochiServerCommand + "` with default options, Mosquitto with set_tcp_nodelay true and persistence off.",
		fmt.Sprintf("Devices are raw MQTT v5 clients (paho.golang's packet codec over net.Conn, no goroutine while idle): clean start, keep-alive 600 s, each subscribed at QoS 1 to its own dev/<id>/cmd; %d are set up at once. The connect rate is the devices that got their CONNACK over the time from the first dial to the last CONNACK.", cfg.Dialers),
		"RSS is the broker's VmRSS (/proc/PID/status), read once it moved less than 0.5 % over " + cfg.SettleWindow.String() + " (an idle broker; at most " + cfg.SettleMax.String() + "): before the devices connect (the publisher already connected), after every device got its SUBACK, and after every device got its command. RSS per connection is the growth since the first reading over the devices subscribed.",
		"Then a paho.golang publisher sends one QoS 1 command to each device topic (64 at a time); a delivery counts when the device gets its own command (it acknowledges it).",
		"The Go brokers (luffymq on --http, vanilla Mochi on `" + harness.MochiServerCommand + " --metrics`) are also asked their Go runtime's gauges at the same points: *Go stacks* is the growth of go_memstats_stack_inuse_bytes per device once each got its command, the stacks of the goroutines each client holds (Mochi runs a reader and a write loop per client). Go shrinks a stack at a garbage collection only to a size four times what the goroutine uses, so these are a floor no option changes.",
		fmt.Sprintf("Open-file limit of the bench: soft %d raised to the hard limit %d; the brokers inherit it, so at most about %d connections fit.", fdl.SoftBefore, fdl.Hard, int(fdl.Hard)-fdReserve),
	}
	if cfg.Idle > 0 {
		notes = append(notes, fmt.Sprintf("Then the devices stay connected and idle for %s while the RSS is read every 0.5 s; *while idling* is the highest reading: an idle broker still allocates (Mochi sweeps its clients every second), and when its garbage collector runs decides how much of that stays resident.", cfg.Idle))
	}
	if cfg.Churn > 0 {
		notes = append(notes, fmt.Sprintf("Churn: a fresh broker of each system gets %d short sessions one after another (connect, subscribe to its own topic, DISCONNECT); its settled RSS is read before and after.", cfg.Churn))
	}
	return notes
}

// Goals evaluates issue 21's goals on the medians.
func Goals(res *ConnectionsResults, aggs []connAggregate) []harness.Goal {
	lm, mochi, mosq := findConnAgg(aggs, connectionsLuffyMQ), findConnAgg(aggs, harness.SystemMochi), findConnAgg(aggs, harness.SystemMosquitto)
	var gs []harness.Goal
	n := res.Config.Connections
	if lm == nil || math.IsNaN(lm.RSSPerConnKiB) {
		return []harness.Goal{{Text: "luffymq's RSS per idle connection", Status: "not measured", Detail: "no luffymq run measured it"}}
	}
	// Issue 21 was measured after one message to each device: the goal
	// holds when both readings are within it.
	worst := lm.RSSPerConnKiB
	for _, v := range []float64{lm.RSSPerConnCommandedKiB, lm.RSSPerConnIdledKiB} {
		if !math.IsNaN(v) {
			worst = math.Max(worst, v)
		}
	}
	idled := ""
	if !math.IsNaN(lm.RSSPerConnIdledKiB) {
		idled = fmt.Sprintf(", at most %s while idling %s", kibOrDash(lm.RSSPerConnIdledKiB), res.Config.Idle)
	}
	gs = append(gs, harness.Goal{Text: fmt.Sprintf("at most %d KiB per idle connection at %d connections, subscribed and after one command each (moonshot %d KiB)", connRSSGoalKiB, n, connRSSMoonshotKiB),
		Status: harness.MetIf(worst <= connRSSGoalKiB),
		Detail: fmt.Sprintf("luffymq %s subscribed, %s after one command each%s (medians of %d)%s%s", kibOrDash(lm.RSSPerConnKiB), kibOrDash(lm.RSSPerConnCommandedKiB), idled, lm.Runs,
			stackFloorNote(lm, mochi), map[bool]string{true: "; moonshot met", false: ""}[worst <= connRSSMoonshotKiB])})
	if mochi != nil && !math.IsNaN(mochi.RSSPerConnKiB) {
		// Each reading against Mochi's at the same point; the goal holds
		// when every ratio is within it.
		var parts []string
		worstRatio := 0.0
		for _, pt := range []struct {
			what      string
			lm, mochi float64
		}{{"subscribed", lm.RSSPerConnKiB, mochi.RSSPerConnKiB}, {"after one command each", lm.RSSPerConnCommandedKiB, mochi.RSSPerConnCommandedKiB},
			{"while idling " + res.Config.Idle.String(), lm.RSSPerConnIdledKiB, mochi.RSSPerConnIdledKiB}} {
			if math.IsNaN(pt.lm) || math.IsNaN(pt.mochi) {
				continue
			}
			r := harness.Ratio(pt.lm, pt.mochi)
			worstRatio = math.Max(worstRatio, r)
			parts = append(parts, fmt.Sprintf("%s %.1f KiB ÷ %.1f KiB = %.2f×", pt.what, pt.lm, pt.mochi, r))
		}
		gs = append(gs, harness.Goal{Text: fmt.Sprintf("at most %.1f× vanilla Mochi in the same run", connRSSVsMochi), Status: harness.MetIf(worstRatio <= connRSSVsMochi),
			Detail: strings.Join(parts, "; ")})
	}
	if mosq != nil && !math.IsNaN(mosq.ConnectPerS) {
		gs = append(gs, harness.Goal{Text: "a connect rate at least Mosquitto's", Status: harness.MetIf(lm.ConnectPerS >= mosq.ConnectPerS),
			Detail: fmt.Sprintf("luffymq %.0f/s, Mosquitto %.0f/s (medians)", lm.ConnectPerS, mosq.ConnectPerS)})
	}
	gs = append(gs, harness.Goal{Text: fmt.Sprintf("every device gets its command (%d of %d)", n, n), Status: harness.MetIf(lm.Complete == lm.Runs),
		Detail: fmt.Sprintf("luffymq: %d of %d runs complete, fewest %d", lm.Complete, lm.Runs, lm.DeliveredMin)})
	if res.Config.Churn > 0 {
		status, detail := "not measured", "no churn run of luffymq completed"
		if !math.IsNaN(lm.ChurnGrowthMiB) {
			status, detail = harness.MetIf(lm.ChurnGrowthMiB <= churnGrowthGoalMiB), fmt.Sprintf("luffymq %+.1f MiB (median of %d)", lm.ChurnGrowthMiB, lm.ChurnRuns)
		}
		gs = append(gs, harness.Goal{Text: fmt.Sprintf("%d short sessions leave RSS within %d MiB of where it started", res.Config.Churn, churnGrowthGoalMiB), Status: status, Detail: detail})
	}
	return gs
}

// stackFloorNote says how much of luffymq's figure is goroutine stacks,
// and Mochi's, when both were measured.
func stackFloorNote(lm, mochi *connAggregate) string {
	if math.IsNaN(lm.StackPerConnKiB) {
		return ""
	}
	s := fmt.Sprintf("; of which Go stacks %.1f KiB (%.1f goroutines per connection)", lm.StackPerConnKiB, lm.GoroutinesPerConn)
	if mochi != nil && !math.IsNaN(mochi.StackPerConnKiB) {
		s += fmt.Sprintf(", vanilla Mochi's %.1f KiB (%.1f goroutines)", mochi.StackPerConnKiB, mochi.GoroutinesPerConn)
	}
	return s
}

// idleFlag is the --idle flag of a run that measured it, or "".
func idleFlag(cfg ConnectionsConfig) string {
	if cfg.Idle <= 0 {
		return ""
	}
	return " --idle " + cfg.Idle.String()
}

func kibOrDash(v float64) string {
	if math.IsNaN(v) {
		return connectionsNoResult
	}
	return fmt.Sprintf("%.1f KiB", v)
}

// connectionsMarkdown renders connections.md; the plot is linked when it
// exists in dir.
func connectionsMarkdown(res *ConnectionsResults, dir string) string {
	var b strings.Builder
	m := res.Machine
	aggs := Aggregate(res)
	b.WriteString("# Idle connections: memory, connect rate and delivery\n\n")
	fmt.Fprintf(&b, "Generated %s by `luffy-bench %s --connections %d --repeat %d%s`. Machine: %s, %d cores, %s, %s. Mosquitto: %s. %s.\n\n",
		res.Generated.Format("2006-01-02 15:04 UTC"), Command, res.Config.Connections, res.Config.Repeat, idleFlag(res.Config), m.CPU, m.Cores, m.GoVersion, m.OS, harness.OrDash(m.Mosquitto), m.Mochi)
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	b.WriteString("\n## Goals\n\n")
	for _, g := range Goals(res, aggs) {
		b.WriteString(g.String() + "\n")
	}
	fmt.Fprintf(&b, "\n## Medians over runs (%d connections)\n\n", res.Config.Connections)
	b.WriteString(connectionsTable(res, aggs, dir))
	b.WriteString("## Runs\n\n| system | run | connected | subscribed | connect rate | RSS before → subscribed → commanded | per connection, subscribed | after a command each | Go stacks before → commanded | delivered | deliver time | notes |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range res.Runs {
		stacks := connectionsNoResult
		if r.GoBefore != nil && r.GoCommanded != nil {
			stacks = harness.FmtBytes(r.GoBefore.StackBytes) + " → " + harness.FmtBytes(r.GoCommanded.StackBytes)
		}
		commanded := fmt.Sprintf("%.1f KiB", r.RSSPerConnCommandedBytes/1024)
		if r.RSSIdledBytes > 0 {
			commanded += fmt.Sprintf("; at most %.1f KiB while idling (%s)", r.RSSPerConnIdledBytes/1024, harness.FmtBytes(r.RSSIdledBytes))
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %.0f/s | %s → %s → %s | %.1f KiB | %s | %s | %d / %d | %.2f s | %s |\n", r.System, r.Repeat, r.Connected, r.Subscribed,
			r.ConnectPerS, harness.FmtBytes(r.RSSBeforeBytes), harness.FmtBytes(r.RSSAfterBytes), harness.FmtBytes(r.RSSCommandedBytes), r.RSSPerConnBytes/1024, commanded,
			stacks, r.Delivered, r.Connections, r.DeliverS, r.Error)
	}
	if len(res.Churn) > 0 {
		b.WriteString("\n## Churn runs\n\n| system | run | sessions | seconds | RSS before → after | notes |\n|---|---|---|---|---|---|\n")
		for _, c := range res.Churn {
			fmt.Fprintf(&b, "| %s | %d | %d / %d | %.1f | %s → %s | %s |\n", c.System, c.Repeat, c.Completed, c.Sessions, c.Seconds,
				harness.FmtBytes(c.RSSBeforeBytes), harness.FmtBytes(c.RSSAfterBytes), c.Error)
		}
	}
	b.WriteString("\nRaw runs: `connections.json`.\n")
	return b.String()
}

// connectionsTable is the table of each system's medians, and the plot
// when it exists in dir.
func connectionsTable(res *ConnectionsResults, aggs []connAggregate, dir string) string {
	var b strings.Builder
	idleHead, idleRule := "", ""
	if res.Config.Idle > 0 {
		idleHead, idleRule = " at most, while idling "+res.Config.Idle.String()+" |", "---|"
	}
	b.WriteString("| system | runs | RSS per connection, subscribed | after a command each |" + idleHead + " of which Go stacks | connect rate | deliveries (fewest) | runs delivering all | churn RSS growth |\n|---|---|---|---|" + idleRule + "---|---|---|---|---|\n")
	for _, a := range aggs {
		churn := connectionsNoResult
		if !math.IsNaN(a.ChurnGrowthMiB) {
			churn = fmt.Sprintf("%+.1f MiB", a.ChurnGrowthMiB)
		}
		idled := ""
		if res.Config.Idle > 0 {
			idled = " " + kibOrDash(a.RSSPerConnIdledKiB) + " |"
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s |%s %s | %.0f/s | %d / %d | %d of %d | %s |\n", a.System, a.Runs, kibOrDash(a.RSSPerConnKiB), kibOrDash(a.RSSPerConnCommandedKiB),
			idled, kibOrDash(a.StackPerConnKiB), a.ConnectPerS, a.DeliveredMin, res.Config.Connections, a.Complete, a.Runs, churn)
	}
	b.WriteString("\n")
	if harness.FileExists(filepath.Join(dir, RSSPlotFile)) {
		fmt.Fprintf(&b, "![RSS per idle connection by broker](%s)\n\n", RSSPlotFile)
	}
	return b.String()
}

// Load reads connections.json, or returns nil when there is
// none.
func Load(path string) (*ConnectionsResults, error) {
	return harness.LoadJSON[ConnectionsResults](path)
}

// Summary is the section of summary.md on idle connections.
func Summary(res *ConnectionsResults, dir string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## Idle connections\n\n`luffy-bench %s --connections %d --repeat %d`: each device connects (MQTT v5), subscribes to its own dev/<id>/cmd and idles; then one command goes to each. RSS per connection is the broker's settled RSS growth over the devices; medians over the runs. Details: [connections.md](connections.md).\n\n",
		Command, res.Config.Connections, res.Config.Repeat)
	b.WriteString(connectionsTable(res, Aggregate(res), dir))
	return b.String()
}

// plotConnections draws the median RSS per idle connection of each broker.
func plotConnections(path string, res *ConnectionsResults) error {
	aggs := Aggregate(res)
	names := make([]string, len(aggs))
	colors := make([]color.Color, len(aggs))
	values := make([][]float64, len(aggs))
	for j, a := range aggs {
		names[j], colors[j], values[j] = a.System, harness.SystemColor(a.System), []float64{a.RSSPerConnKiB, a.RSSPerConnCommandedKiB, a.StackPerConnKiB}
		if res.Config.Idle > 0 {
			values[j] = append(values[j], a.RSSPerConnIdledKiB)
		}
	}
	groups := []string{"RSS, subscribed", "after a command", "its Go stacks"}
	if res.Config.Idle > 0 {
		groups = append(groups, "peak, idling "+res.Config.Idle.String())
	}
	p := harness.NewPlot(fmt.Sprintf("Memory per idle connection at %d connections (median of %d)", res.Config.Connections, res.Config.Repeat),
		"", "KiB per connection")
	if err := harness.GroupedBars(p, groups, names, colors, values); err != nil {
		return err
	}
	p.Y.Max = math.Max(p.Y.Max*1.3, 1)
	return p.Save(9*vg.Inch, 4*vg.Inch, path)
}
