package throughput

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// RunCommand parses `luffy-bench throughput` flags and runs it;
// writeSummary rewrites the summary once the results are written.
func RunCommand(ctx context.Context, args []string, stdout, stderr io.Writer, writeSummary func(dir string) error) error {
	fs := flag.NewFlagSet("luffy-bench throughput", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "output directory (required)")
	pubs := fs.Int("publishers", 4, "publishers")
	shared := fs.Int("messages", 25000, "messages per publisher in the shared tests")
	fan := fs.Int("fanout-messages", 10000, "messages per publisher in the fan-out tests")
	members := fs.Int("members", 3, "shared-group members / fan-out subscribers")
	inflight := fs.Int("inflight", 16, "QoS 1 publishes each publisher keeps in flight")
	repeat := fs.Int("repeat", 3, "runs of each test on each system (medians are reported)")
	timeout := fs.Duration("timeout", 60*time.Second, "longest time one measurement may take")
	stall := fs.Duration("stall-window", harness.DefaultStallWindow, "a broker whose delivered count stays flat this long with messages still owed has stalled (no rate is reported for that run)")
	systems := fs.String("systems", strings.Join(ThroughputSystems, ","), "comma-separated subset of "+strings.Join(ThroughputSystems, ", ")+"; may add "+strings.Join(ThroughputOptionalSystems, ", ")+" (luffymq with --data-dir in a temporary directory)")
	luffymq := fs.String("luffymq", "", "luffymq binary (default: build ./cmd/luffymq of the current module)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var optional, listed []string
	for _, s := range strings.Split(*systems, ",") {
		if slices.Contains(ThroughputOptionalSystems, strings.TrimSpace(s)) {
			optional = append(optional, strings.TrimSpace(s))
		} else {
			listed = append(listed, s)
		}
	}
	var sys []string
	if len(listed) > 0 || len(optional) == 0 {
		var err error
		if sys, err = harness.ParseSystems(strings.Join(listed, ",")); err != nil {
			return err
		}
	}
	sys = append(sys, optional...)
	for _, s := range sys {
		if !slices.Contains(ThroughputSystems, s) && !slices.Contains(ThroughputOptionalSystems, s) {
			return fmt.Errorf("system %s is not part of the throughput set (%s)", s, strings.Join(ThroughputSystems, ", "))
		}
	}
	cfg := ThroughputConfig{Publishers: *pubs, SharedMessages: *shared, FanoutMessages: *fan, Members: *members, InFlight: *inflight, Repeat: *repeat, Timeout: *timeout, StallWindow: *stall}
	return RunThroughput(ctx, *out, sys, *luffymq, cfg, stdout, writeSummary)
}

// RunThroughput runs set B and writes throughput.json, throughput.png and
// refreshes summary.md in out through writeSummary.
func RunThroughput(ctx context.Context, out string, systems []string, luffymq string, cfg ThroughputConfig, progress io.Writer, writeSummary func(dir string) error) error {
	if out == "" {
		return errors.New("--out DIR is required")
	}
	if cfg.Publishers < 1 || cfg.Publishers > 64 || cfg.Members < 1 || cfg.Members > 64 || cfg.InFlight < 1 || cfg.InFlight > 1024 {
		return errors.New("--publishers and --members want 1 to 64, --inflight 1 to 1024")
	}
	if cfg.SharedMessages < 1 || cfg.SharedMessages > 1_000_000 || cfg.FanoutMessages < 1 || cfg.FanoutMessages > 1_000_000 {
		return errors.New("--messages and --fanout-messages want 1 to 1000000")
	}
	if cfg.Repeat < 1 || cfg.Repeat > 20 {
		return errors.New("--repeat wants 1 to 20")
	}
	if cfg.Timeout <= 0 || cfg.Timeout > 10*time.Minute {
		return errors.New("--timeout wants more than 0 and up to 10m")
	}
	if cfg.StallWindow == 0 {
		cfg.StallWindow = harness.DefaultStallWindow
	}
	if cfg.StallWindow < 500*time.Millisecond || cfg.StallWindow > cfg.Timeout {
		return fmt.Errorf("--stall-window %s: want 500ms up to the --timeout", cfg.StallWindow)
	}
	mosq := harness.FindMosquitto()
	if slices.Contains(systems, harness.SystemMosquitto) && mosq == "" {
		return harness.ErrMosquittoMissing
	}
	logDir := filepath.Join(out, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	if slices.ContainsFunc(systems, func(s string) bool { return strings.HasPrefix(s, "luffymq-") }) {
		var cleanup func()
		var err error
		if luffymq, cleanup, err = harness.LuffyMQBinary(ctx, luffymq, progress); err != nil {
			return err
		}
		defer cleanup()
	}
	self, err := os.Executable()
	if err != nil && slices.Contains(systems, harness.SystemMochi) {
		return fmt.Errorf("mochi runs as `luffy-bench %s`, but this executable's path is unknown: %w", harness.MochiServerCommand, err)
	}
	starter := harness.BrokerStarter{LuffyMQ: luffymq, Mosquitto: mosq, Self: self, LogDir: logDir}
	res := &ThroughputResults{Machine: harness.DescribeMachine(mosq), Config: cfg}
	logf, err := os.Create(filepath.Join(logDir, "throughput.clients.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	logger := slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	began := time.Now()
	n := cfg.Repeat * len(ThroughputTests) * len(systems)
	k := 0
	for r := 1; r <= cfg.Repeat; r++ {
		for _, t := range ThroughputTests {
			for _, sys := range systems {
				if ctx.Err() != nil {
					return fmt.Errorf("interrupted")
				}
				k++
				elapsed := time.Since(began)
				eta := "?"
				if k > 1 {
					eta = harness.FmtDur(elapsed / time.Duration(k-1) * time.Duration(n-k+1))
				}
				fmt.Fprintf(progress, "[%d/%d] throughput %s · %s · repeat %d/%d · elapsed %s · ETA %s\n", k, n, t.ID, sys, r, cfg.Repeat, harness.FmtDur(elapsed), eta)
				br, err := startThroughputBroker(ctx, starter, sys, time.Second, fmt.Sprintf("throughput-%s-%s-r%d", t.ID, sys, r))
				if err != nil {
					return fmt.Errorf("throughput %s on %s: %w", t.ID, sys, err)
				}
				run := runThroughput(ctx, t, sys, r, br, cfg, logger.With("system", sys, "test", t.ID))
				if !harness.Within(harness.CleanupTimeout, func() { _ = br.Close() }) {
					run.Error = strings.TrimSpace(run.Error + " broker did not stop within " + harness.CleanupTimeout.String() + " (left running)")
				}
				if run.Stalled {
					fmt.Fprintf(progress, "      STALLED: delivered %d/%d, none for %s after %.1f s\n", run.Delivered, run.Expected, cfg.StallWindow, run.StalledAfterS)
				} else {
					fmt.Fprintf(progress, "      %.0f msgs/s · p50 %s ms · p99 %s ms · delivered %d/%d %s\n", run.MsgsPerS, harness.FmtMs(run.P50Ms), harness.FmtMs(run.P99Ms), run.Delivered, run.Expected, run.Error)
				}
				res.Runs = append(res.Runs, run)
			}
		}
	}
	res.Generated = time.Now().UTC()
	for i := range res.Runs {
		for _, p := range []*float64{&res.Runs[i].P50Ms, &res.Runs[i].P99Ms} {
			if *p != *p { // NaN: no deliveries
				*p = -1
			}
		}
	}
	if err := harness.WriteJSON(filepath.Join(out, "throughput.json"), res); err != nil {
		return err
	}
	if err := plotThroughput(filepath.Join(out, "throughput.png"), res); err != nil {
		return err
	}
	if err := writeSummary(out); err != nil {
		return err
	}
	fmt.Fprintf(progress, "done in %s: %s\n", harness.FmtDur(time.Since(began)), filepath.Join(out, "throughput.json"))
	return nil
}

// plotThroughput draws msgs/s per test and system.
func plotThroughput(path string, tp *ThroughputResults) error {
	p := harness.NewPlot("Broker throughput (median msgs/s delivered; no bar: stalled in every run)", "test", "messages per second")
	names := make([]string, len(ThroughputTests))
	for i, t := range ThroughputTests {
		names[i] = t.ID
	}
	n := len(ThroughputSystems)
	w := vg.Points(16)
	for j, sys := range ThroughputSystems {
		vals := make(plotter.Values, len(ThroughputTests))
		any := false
		for i, t := range ThroughputTests {
			a := throughputAggregate(tp, t.ID, sys)
			if a.Runs > 0 {
				any = true
				if !math.IsNaN(a.Rate) {
					vals[i] = a.Rate
				}
			}
		}
		if !any {
			continue
		}
		b, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		b.Offset = w * vg.Length(float64(j)-float64(n-1)/2)
		b.Color = harness.SystemColor(sys)
		b.LineStyle.Width = 0
		p.Add(b)
		p.Legend.Add(sys, b)
	}
	harness.CategoryAxis(p, names)
	p.Y.Min = 0
	p.Y.Max *= 1.35
	return p.Save(8*vg.Inch, 4.5*vg.Inch, path)
}
