package reliability

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"strings"
	"time"

	"gonum.org/v1/plot/vg"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// Plot files of the reliability scenarios.
const (
	reliabilityCrashPlot     = "reliability-crash.png"
	reliabilityStuckPlot     = "reliability-stuck-healthy.png"
	reliabilityStuckRatePlot = "reliability-stuck-publisher.png"
	reliabilityBurstPlot     = "reliability-burst.png"
)

// reliabilityMarkdown renders reliability.md from the results; plots are
// linked when they exist in dir.
func reliabilityMarkdown(res *ReliabilityResults, dir string) string {
	var b strings.Builder
	c := res.Config
	m := res.Machine
	b.WriteString("# Reliability: lost, stalled and dropped messages\n\n")
	fmt.Fprintf(&b, "Generated %s by `luffy-bench %s`. Machine: %s, %d cores, %s, %s. Mosquitto: %s. %s.\n\n",
		res.Generated.Format("2006-01-02 15:04 UTC"), Command, m.CPU, m.Cores, m.GoVersion, m.OS, harness.OrDash(m.Mosquitto), m.Mochi)
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	b.WriteString("\n")
	plotLink := func(file, alt string) {
		if harness.FileExists(filepath.Join(dir, file)) {
			fmt.Fprintf(&b, "![%s](%s)\n\n", alt, file)
		}
	}

	if len(res.Crash) > 0 {
		services := make([]string, len(c.Crash.Services))
		for i, s := range c.Crash.Services {
			services[i] = s.String()
		}
		fmt.Fprintf(&b, "## %s\n\nA publisher sends %d QoS 1 messages a second for %s to `$share/g/work`; %d members (processing %s, one worker each, plain paho.golang with manual acknowledgement after processing, clean sessions) share them. The last member closes its TCP connection without DISCONNECT at t = %s; its queue and the message in progress die with it. *Lost* = acknowledged to the publisher and never processed to the end by anyone; *dup* = processings beyond the first.\n\n",
			ReliabilityCrash, c.Crash.Rate, c.Crash.Duration, len(services), strings.Join(services, " / "), c.Crash.CrashAt)
		b.WriteString("| system | run | published (acked) | processed | lost | dup | processed per member | received with DUP per member | re-dispatched (broker) | peak RSS | notes |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range res.Crash {
			var per, dups []string
			for _, mb := range r.Members {
				mark := ""
				if mb.Crashed {
					mark = "†"
				}
				per = append(per, fmt.Sprintf("%d%s", mb.Processed, mark))
				dups = append(dups, fmt.Sprint(mb.Redelivered))
			}
			notes := r.Error
			if len(r.LostSample) > 0 {
				notes = harness.JoinErr(notes, fmt.Sprintf("lost e.g. %v", r.LostSample[:min(len(r.LostSample), 8)]))
			}
			if r.DrainTimedOut {
				notes = harness.JoinErr(notes, "drain timed out")
			}
			fmt.Fprintf(&b, "| %s | %d | %d | %d | **%d** | %d | %s | %s | %s | %s | %s |\n", r.System, r.Repeat, r.Published, r.Processed, r.Lost, r.Duplicated,
				strings.Join(per, " / "), strings.Join(dups, " / "), fmtCount(r.Broker.Redispatched), harness.FmtBytes(r.Broker.PeakRSSBytes), notes)
		}
		b.WriteString("\n† the member that crashed.\n\n")
		plotLink(reliabilityCrashPlot, "crash-qos1: lost and duplicated messages per system")
	}

	if len(res.Stuck) > 0 {
		s := c.Stuck
		fmt.Fprintf(&b, "## %s\n\nA raw TCP MQTT v5 client subscribes at QoS 1 with keep-alive 0 and never reads its socket again. A healthy paho.golang subscriber shares the topic with it (*fanout*: %d × %d B, every message owed to both) or a shared group (*shared*: `$share/g/…`, %d × %d B). A QoS 1 publisher keeps %d publishes in flight. Phase 1 runs with the stuck client connected until the publisher is done and the healthy subscriber is quiet for 2 s, or the publisher stalls, or %s; then the stuck client's connection is cut (no DISCONNECT) and phase 2 shows what else reaches the healthy subscriber.\n\n",
			ReliabilityStuck, s.FanoutMessages, s.FanoutBytes, s.SharedMessages, s.SharedBytes, s.InFlight, s.Timeout)
		b.WriteString("| system | mode | run | healthy got (stuck connected) | publisher acked | publisher msgs/s | publisher stalled | healthy got (after the cut) | slow clients disconnected (broker) | peak RSS | notes |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range res.Stuck {
			stalled := "no"
			if r.Stalled {
				stalled = fmt.Sprintf("**yes**, after %.1f s", r.StalledAfterS)
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %d / %d (%s) | %d | %.0f | %s | %d / %d | %s | %s | %s |\n", r.System, r.Mode, r.Repeat,
				r.HealthyDelivered, r.Messages, harness.FmtPercent(frac(r.HealthyDelivered, r.Messages)), r.Acked, r.PublisherMsgsPerS, stalled,
				r.HealthyAfterCut, r.Messages, fmtCount(r.Broker.SlowDisconnected), harness.FmtBytes(r.Broker.PeakRSSBytes), r.Error)
		}
		b.WriteString("\n")
		plotLink(reliabilityStuckPlot, "stuck-subscriber: share of the messages the healthy subscriber got while the stuck client was connected")
		plotLink(reliabilityStuckRatePlot, "stuck-subscriber: publisher rate while the stuck client was connected")
	}

	if len(res.Burst) > 0 {
		bc := c.Burst
		fmt.Fprintf(&b, "## %s\n\n%d publishers × %d QoS 0 messages of %d B, as fast as they can, to %d plain paho.golang subscribers of the topic (%d deliveries owed) that only count what arrives. *Mochi channel* = publishes dropped because a client's Mochi outbound packet queue (`MaximumClientWritesPending`, 8192 by default) was full; *outbox* = QoS 0 dropped by luffymq's outbox above `--max-queued-bytes`.\n\n",
			ReliabilityBurst, bc.Publishers, bc.Messages, bc.PayloadBytes, bc.Subscribers, bc.Publishers*bc.Messages*bc.Subscribers)
		b.WriteString("| system | run | delivered | dropped | per subscriber | dropped at the Mochi channel | dropped at the outbox | publish s | last delivery s | peak RSS | notes |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range res.Burst {
			per := make([]string, len(r.PerSubscriber))
			for i, n := range r.PerSubscriber {
				per[i] = fmt.Sprint(n)
			}
			fmt.Fprintf(&b, "| %s | %d | %d / %d (%s) | %d | %s | %s | %s | %.2f | %.2f | %s | %s |\n", r.Label(), r.Repeat, r.Delivered, r.Expected,
				harness.FmtPercent(frac(r.Delivered, r.Expected)), r.Dropped, strings.Join(per, " / "), fmtCount(r.Broker.MochiDropped), fmtCount(r.Broker.OutboxDropped),
				r.PublishSeconds, r.DeliverySeconds, harness.FmtBytes(r.Broker.PeakRSSBytes), r.Error)
		}
		b.WriteString("\n")
		plotLink(reliabilityBurstPlot, "qos0-burst: share of the burst delivered per system")
	}
	b.WriteString("Raw runs: `reliability.json`.\n")
	return b.String()
}

// frac returns a/b, or NaN when b is 0.
func frac(a, b int) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// meanOf returns the mean of f over the items of xs for which keep holds,
// or NaN.
func meanOf[T any](xs []T, keep func(T) bool, f func(T) float64) float64 {
	sum, n := 0.0, 0
	for _, x := range xs {
		if keep(x) {
			sum += f(x)
			n++
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return sum / float64(n)
}

// plotReliability writes the bar plots of every scenario in res.
func plotReliability(dir string, res *ReliabilityResults) error {
	if len(res.Crash) > 0 {
		if err := plotCrash(filepath.Join(dir, reliabilityCrashPlot), res.Crash, res.Config.Crash.CrashAt); err != nil {
			return fmt.Errorf("crash plot: %w", err)
		}
	}
	if len(res.Stuck) > 0 {
		if err := plotStuck(dir, res.Stuck); err != nil {
			return fmt.Errorf("stuck plots: %w", err)
		}
	}
	if len(res.Burst) > 0 {
		if err := plotBurst(filepath.Join(dir, reliabilityBurstPlot), res.Burst); err != nil {
			return fmt.Errorf("burst plot: %w", err)
		}
	}
	return nil
}

func plotCrash(path string, runs []CrashRun, crashAt time.Duration) error {
	systems := harness.OrderedLabels(runs, func(r CrashRun) string { return r.System })
	lost := make([]float64, len(systems))
	dup := make([]float64, len(systems))
	for i, s := range systems {
		is := func(r CrashRun) bool { return r.System == s }
		lost[i] = meanOf(runs, is, func(r CrashRun) float64 { return float64(r.Lost) })
		dup[i] = meanOf(runs, is, func(r CrashRun) float64 { return float64(r.Duplicated) })
	}
	p := harness.NewPlot(fmt.Sprintf("crash-qos1: a member drops its connection at t = %s (mean over runs)", crashAt), "system", "messages")
	if err := harness.GroupedBars(p, systems, []string{"lost", "duplicated"}, []color.Color{harness.Palette[1], harness.Palette[0]}, [][]float64{lost, dup}); err != nil {
		return err
	}
	p.Y.Max = math.Max(p.Y.Max*1.3, 1)
	return p.Save(7*vg.Inch, 4*vg.Inch, path)
}

func plotStuck(dir string, runs []StuckRun) error {
	modes := harness.OrderedLabels(runs, func(r StuckRun) string { return r.Mode })
	systems := harness.OrderedLabels(runs, func(r StuckRun) string { return r.System })
	share := make([][]float64, len(systems))
	rate := make([][]float64, len(systems))
	colors := make([]color.Color, len(systems))
	for j, s := range systems {
		colors[j] = harness.SystemColor(s)
		share[j] = make([]float64, len(modes))
		rate[j] = make([]float64, len(modes))
		for i, m := range modes {
			is := func(r StuckRun) bool { return r.System == s && r.Mode == m }
			share[j][i] = 100 * meanOf(runs, is, func(r StuckRun) float64 { return frac(r.HealthyDelivered, r.Messages) })
			rate[j][i] = meanOf(runs, is, func(r StuckRun) float64 { return r.PublisherMsgsPerS })
		}
	}
	p := harness.NewPlot("stuck-subscriber: healthy subscriber's share while the stuck client is connected", "mode", "% of the messages")
	if err := harness.GroupedBars(p, modes, systems, colors, share); err != nil {
		return err
	}
	p.Y.Max = 130
	if err := p.Save(7*vg.Inch, 4*vg.Inch, filepath.Join(dir, reliabilityStuckPlot)); err != nil {
		return err
	}
	p = harness.NewPlot("stuck-subscriber: QoS 1 publisher rate while the stuck client is connected", "mode", "acknowledged publishes per second")
	if err := harness.GroupedBars(p, modes, systems, colors, rate); err != nil {
		return err
	}
	p.Y.Max = math.Max(p.Y.Max*1.3, 1)
	return p.Save(7*vg.Inch, 4*vg.Inch, filepath.Join(dir, reliabilityStuckRatePlot))
}

func plotBurst(path string, runs []BurstRun) error {
	labels := harness.OrderedLabels(runs, BurstRun.Label)
	delivered := make([]float64, len(labels))
	dropped := make([]float64, len(labels))
	for i, l := range labels {
		is := func(r BurstRun) bool { return r.Label() == l }
		delivered[i] = meanOf(runs, is, func(r BurstRun) float64 { return float64(r.Delivered) })
		dropped[i] = meanOf(runs, is, func(r BurstRun) float64 { return float64(r.Dropped) })
	}
	names := make([]string, len(labels))
	for i, l := range labels {
		names[i] = strings.NewReplacer("luffymq-", "", "max-pending-writes=", "pending ").Replace(l)
	}
	p := harness.NewPlot("qos0-burst: deliveries and drops (mean over runs)", "system", "messages")
	if err := harness.GroupedBars(p, names, []string{"delivered", "dropped"}, []color.Color{harness.Palette[2], harness.Palette[1]}, [][]float64{delivered, dropped}); err != nil {
		return err
	}
	p.Y.Max = math.Max(p.Y.Max*1.3, 1)
	return p.Save(8*vg.Inch, 4*vg.Inch, path)
}
