package reliability

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/internal/testenv"
	"github.com/luffymq/luffymq/scoring"
)

// TestReliabilitySmoke runs a small version of every reliability scenario
// against the real luffymq binary and Mosquitto, and checks that luffymq
// loses nothing when a QoS 1 member crashes, that a subscriber that never
// reads keeps neither the healthy subscriber nor the publisher from their
// messages, and that the outputs are written and consistent.
func TestReliabilitySmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts luffymq and mosquitto; skipped with -short")
	}
	testenv.RequireBinary(t, "go", "golang-go")
	testenv.StartMosquitto(t) // skips, or fails under CI=true, when Mosquitto is missing
	out := t.TempDir()
	cfg := DefaultReliabilityConfig()
	cfg.Out = out
	cfg.Systems = []string{"luffymq-adaptive", harness.SystemMosquitto}
	cfg.Crash.Duration, cfg.Crash.CrashAt, cfg.Crash.DrainTimeout = 3*time.Second, 1500*time.Millisecond, 15*time.Second
	// 600 × 16 KiB fills the stuck client's socket buffers several times.
	cfg.Stuck.FanoutMessages, cfg.Stuck.FanoutBytes = 600, 16<<10
	cfg.Stuck.SharedMessages, cfg.Stuck.Timeout = 2000, 15*time.Second
	cfg.Burst.Publishers, cfg.Burst.Messages, cfg.Burst.Subscribers = 2, 2000, 2
	cfg.Burst.PendingWrites = []int{65536}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	require.NoError(t, RunReliability(ctx, cfg))

	data, err := os.ReadFile(filepath.Join(out, "reliability.json"))
	require.NoError(t, err)
	var res ReliabilityResults
	require.NoError(t, json.Unmarshal(data, &res))
	require.NotEmpty(t, res.Machine.CPU)

	require.Len(t, res.Crash, 2)
	for _, r := range res.Crash {
		require.Empty(t, r.Error, r.System)
		require.Equal(t, 300, r.Published+r.PublishFailed, r.System)
		require.Equal(t, r.Published, r.Processed+r.Lost, r.System)
		require.Len(t, r.Members, 3)
		require.True(t, r.Members[2].Crashed)
		require.Positive(t, r.Members[2].Processed, "%s: the crashing member worked before it crashed", r.System)
		if r.System == "luffymq-adaptive" {
			require.Equal(t, 300, r.Published)
			require.Zero(t, r.Lost, "luffymq re-dispatches the crashed member's unacknowledged messages; lost %v", r.LostSample)
			require.Positive(t, r.Broker.Redispatched)
			require.Positive(t, r.Broker.PeakRSSBytes)
		} else {
			require.Equal(t, int64(-1), r.Broker.Redispatched, "Mosquitto exposes no such counter")
		}
	}

	require.Len(t, res.Stuck, 4)
	for _, r := range res.Stuck {
		require.Empty(t, r.Error, "%s %s", r.System, r.Mode)
		if r.System != "luffymq-adaptive" {
			continue
		}
		require.False(t, r.Stalled, "%s: the publisher must not stall", r.Mode)
		require.Equal(t, r.Messages, r.Acked, r.Mode)
		require.Equal(t, r.Messages, r.HealthyAfterCut, "%s: the healthy subscriber gets everything", r.Mode)
		if r.Mode == StuckFanout {
			require.Equal(t, r.Messages, r.HealthyDelivered, "fan-out: everything while the stuck client is connected")
		} else {
			// Until the healthy member's first acknowledgement reaches the
			// broker, neither member has proven it finishes work, so what
			// the broker routes meanwhile is split between them (each past
			// the newcomer cap, nothing tells them apart); after that the
			// stuck member gets nothing more. How many are routed depends
			// on that round trip, not on the broker's choice: 3 to 10
			// messages reached the stuck member on an idle machine, 19 in
			// CI under the race detector with other packages' tests
			// running. Two publisher windows plus the cap leave room for a
			// slow round trip and still fail a broker that keeps feeding
			// the stuck member (round robin gives it half of the messages).
			few := 2*cfg.Stuck.InFlight + scoring.DefaultNewcomerCap
			require.GreaterOrEqual(t, r.HealthyDelivered, r.Messages-few, "shared: the stuck member holds only a few messages")
		}
	}

	require.Len(t, res.Burst, 3, "luffymq default, luffymq with --max-pending-writes, Mosquitto")
	for _, r := range res.Burst {
		require.Empty(t, r.Error, r.Label())
		require.Equal(t, 8000, r.Expected)
		require.Equal(t, r.Expected, r.Delivered+r.Dropped)
		require.Len(t, r.PerSubscriber, 2)
		if r.System == "luffymq-adaptive" {
			require.GreaterOrEqual(t, r.Broker.MochiDropped, int64(0))
		}
	}
	require.Equal(t, "luffymq-adaptive (max-pending-writes=65536)", res.Burst[1].Label())

	md, err := os.ReadFile(filepath.Join(out, "reliability.md"))
	require.NoError(t, err)
	for _, want := range []string{"## crash-qos1", "## stuck-subscriber", "## qos0-burst", "| luffymq-adaptive | 1 | 300 |", "mosquitto"} {
		require.Contains(t, string(md), want)
	}
	for _, p := range []string{reliabilityCrashPlot, reliabilityStuckPlot, reliabilityStuckRatePlot, reliabilityBurstPlot} {
		st, err := os.Stat(filepath.Join(out, p))
		require.NoError(t, err)
		require.Greater(t, st.Size(), int64(1000))
		require.Contains(t, string(md), "("+p+")")
	}
}

func TestParseVmHWM(t *testing.T) {
	status := "Name:\tluffymq\nVmPeak:\t  900000 kB\nVmHWM:\t   21544 kB\nVmRSS:\t   20000 kB\n"
	require.Equal(t, int64(21544)<<10, parseVmHWM(strings.NewReader(status)))
	require.Equal(t, int64(-1), parseVmHWM(strings.NewReader("Name:\tx\n")))
	require.Equal(t, int64(-1), parseVmHWM(strings.NewReader("VmHWM:\tlots\n")))
	require.Equal(t, int64(-1), peakRSS(0))
	require.Positive(t, peakRSS(os.Getpid()))
}

func TestReliabilityConfigValidation(t *testing.T) {
	ok := DefaultReliabilityConfig()
	ok.Out = t.TempDir()
	require.NoError(t, ok.validate())
	for name, mutate := range map[string]func(*ReliabilityConfig){
		"no out":           func(c *ReliabilityConfig) { c.Out = "" },
		"unknown scenario": func(c *ReliabilityConfig) { c.Scenarios = []string{"crash"} },
		"unknown system":   func(c *ReliabilityConfig) { c.Systems = []string{"luffymq-thesis"} },
		"crash after end":  func(c *ReliabilityConfig) { c.Crash.CrashAt = c.Crash.Duration },
		"one member":       func(c *ReliabilityConfig) { c.Crash.Services = c.Crash.Services[:1] },
		"tiny payload":     func(c *ReliabilityConfig) { c.Stuck.SharedBytes = 8 },
		"no publishers":    func(c *ReliabilityConfig) { c.Burst.Publishers = 0 },
		"zero pending":     func(c *ReliabilityConfig) { c.Burst.PendingWrites = []int{0} },
		"short stall":      func(c *ReliabilityConfig) { c.StallWindow = time.Millisecond },
	} {
		c := ok
		c.Crash.Services = append([]time.Duration(nil), ok.Crash.Services...)
		mutate(&c)
		require.Error(t, c.validate(), name)
	}
}

// TestReliabilityReportFromResults renders the markdown and plots of
// hand-made results and checks that the figures land in the right places.
func TestReliabilityReportFromResults(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultReliabilityConfig()
	cfg.Burst.PendingWrites = []int{65536}
	res := &ReliabilityResults{Config: cfg, Notes: reliabilityNotes(cfg),
		Crash: []CrashRun{
			{System: "luffymq-adaptive", Repeat: 1, Published: 1000, Processed: 1000, Duplicated: 2,
				Members: []CrashMember{{Member: 1, Processed: 450}, {Member: 2, Processed: 452}, {Member: 3, Processed: 100, Crashed: true}},
				Broker:  BrokerFigures{PeakRSSBytes: 20 << 20, MochiDropped: 0, OutboxDropped: 0, Redispatched: 3}},
			{System: harness.SystemMosquitto, Repeat: 1, Published: 1000, Processed: 933, Lost: 67, LostSample: []int{300, 303},
				Members: []CrashMember{{Member: 1}, {Member: 2}, {Member: 3, Crashed: true}}, Broker: unknownFigures()},
		},
		Stuck: []StuckRun{
			{System: "luffymq-adaptive", Mode: StuckFanout, Repeat: 1, Messages: 2000, Acked: 2000, HealthyDelivered: 2000, HealthyAfterCut: 2000, PublisherMsgsPerS: 9000, Broker: unknownFigures()},
			{System: harness.SystemMochi, Mode: StuckFanout, Repeat: 1, Messages: 2000, Acked: 499, HealthyDelivered: 499, HealthyAfterCut: 2000, Stalled: true, StalledAfterS: 0.1, Broker: unknownFigures()},
		},
		Burst: []BurstRun{
			{System: "luffymq-adaptive", Repeat: 1, Expected: 150000, Delivered: 149700, Dropped: 300, PerSubscriber: []int{49900, 49900, 49900},
				Broker: BrokerFigures{PeakRSSBytes: 90 << 20, MochiDropped: 300}},
			{System: "luffymq-adaptive", Variant: "max-pending-writes=65536", PendingWrites: 65536, Repeat: 1, Expected: 150000, Delivered: 150000,
				PerSubscriber: []int{50000, 50000, 50000}, Broker: BrokerFigures{PeakRSSBytes: 140 << 20}},
		},
	}
	require.NoError(t, plotReliability(dir, res))
	md := reliabilityMarkdown(res, dir)
	for _, want := range []string{
		"| luffymq-adaptive | 1 | 1000 | 1000 | **0** | 2 | 450 / 452 / 100† |",
		"| mosquitto | 1 | 1000 | 933 | **67** | 0 |",
		"lost e.g. [300 303]",
		"| mochi | fanout | 1 | 499 / 2000 (24.9 %) | 499 | 0 | **yes**, after 0.1 s | 2000 / 2000 |",
		"| luffymq-adaptive | 1 | 149700 / 150000 (99.8 %) | 300 | 49900 / 49900 / 49900 | 300 | 0 |",
		"| luffymq-adaptive (max-pending-writes=65536) | 1 | 150000 / 150000 (100.0 %) | 0 |",
		"140.0 MiB",
	} {
		require.Contains(t, md, want)
	}
	for _, p := range []string{reliabilityCrashPlot, reliabilityStuckPlot, reliabilityStuckRatePlot, reliabilityBurstPlot} {
		require.FileExists(t, filepath.Join(dir, p))
		require.Contains(t, md, "("+p+")")
	}
	require.NotContains(t, reliabilityMarkdown(res, t.TempDir()), ".png)", "no link to a plot that was not written")
}
