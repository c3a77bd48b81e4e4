package shared

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// SharedConfig configures a set-A invocation.
type SharedConfig struct {
	Scenarios []string
	Out       string
	// Duration, when positive, replaces every scenario's publishing time
	// (event times stay).
	Duration time.Duration
	Repeat   int
	Systems  []string
	// Subscribers are the subscriber kinds (KindSDK, …); every kind runs
	// against every system. Empty means KindSDK.
	Subscribers  []string
	LuffyMQ      string
	DrainTimeout time.Duration
	// AckInterval is paho's SendAcksInterval for the paho subscriber kinds
	// at QoS 1 (0: paho's default).
	AckInterval time.Duration
	// Merge keeps the runs already in Out/results.json of every (scenario,
	// subscriber kind) pair this invocation does not run.
	Merge bool
	// Trace writes, for each live run, trace-<run>.csv in Out
	// (writeDeliveryTrace) and logs the SDK members' load reports.
	Trace    bool
	Progress io.Writer
}

// RunCommand parses `luffy-bench shared` flags and runs it.
func RunCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("luffy-bench shared", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var scenarios harness.StringList
	fs.Var(&scenarios, "scenario", "scenario ID, repeatable: thesis-1, thesis-2, thesis-2-qos1, step, join, poisson, crash, the uneven fleets fleet-{6,20,100}-rho{70,85,95}, fleet-{6,20,100}-rho85-{exp,uniform20} and fleet-20-rho85-churn, or all")
	out := fs.String("out", "", "output directory (required)")
	duration := fs.Duration("duration", 0, "publishing time of every scenario (default: the scenario's own)")
	repeat := fs.Int("repeat", 1, "runs of each scenario on each system")
	systems := fs.String("systems", "all", "comma-separated systems: "+strings.Join(harness.AllSystems(), ", ")+" (strategy names may omit luffymq-)")
	luffymq := fs.String("luffymq", "", "luffymq binary (default: build ./cmd/luffymq of the current module)")
	drain := fs.Duration("drain-timeout", 90*time.Second, "longest wait for every sent message to be dequeued after publishing ends")
	merge := fs.Bool("merge", false, "keep the runs already in DIR/results.json of every (scenario, subscriber kind) this invocation does not run")
	subscribers := fs.String("subscriber", KindSDK, "comma-separated subscriber kinds, each run against every system: "+strings.Join(SubscriberKinds, ", ")+", or all")
	trace := fs.Bool("trace", false, "write trace-<scenario>-<kind>-<system>-r<N>.csv per live run in --out: each message's member, publish, receipt, start and end times; the members' client logs in logs/ then include the SDK's load reports (debug level)")
	ackInterval := fs.Duration("paho-ack-interval", 0, "how often the paho subscriber kinds send the acknowledgements of processed QoS 1 messages (paho's SendAcksInterval; 0: paho's default, 50 ms)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	sys, err := harness.ParseSystems(*systems)
	if err != nil {
		return err
	}
	kinds, err := ParseSubscriberKinds(*subscribers)
	if err != nil {
		return err
	}
	if len(scenarios) == 1 && scenarios[0] == "all" {
		scenarios = nil
		for _, s := range Scenarios() {
			scenarios = append(scenarios, s.ID)
		}
	}
	return RunShared(ctx, SharedConfig{Scenarios: scenarios, Out: *out, Duration: *duration, Repeat: *repeat, Systems: sys,
		Subscribers: kinds, LuffyMQ: *luffymq, DrainTimeout: *drain, AckInterval: *ackInterval, Merge: *merge, Trace: *trace, Progress: stdout})
}

// RunShared runs set-A scenarios with every subscriber kind against every
// system and writes results.json, summary.md and plots into cfg.Out.
func RunShared(ctx context.Context, cfg SharedConfig) error {
	if cfg.Out == "" {
		return errors.New("--out DIR is required")
	}
	if len(cfg.Scenarios) == 0 {
		return errors.New("give at least one --scenario (or --scenario all)")
	}
	if cfg.Repeat < 1 || cfg.Repeat > 100 {
		return fmt.Errorf("--repeat %d: want 1 to 100", cfg.Repeat)
	}
	if cfg.Duration < 0 || cfg.Duration > 10*time.Minute {
		return fmt.Errorf("--duration %s: want up to 10m", cfg.Duration)
	}
	if cfg.AckInterval < 0 || cfg.AckInterval > time.Second {
		return fmt.Errorf("--paho-ack-interval %s: want 0 to 1s", cfg.AckInterval)
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 90 * time.Second
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if len(cfg.Subscribers) == 0 {
		cfg.Subscribers = []string{KindSDK}
	}
	for _, k := range cfg.Subscribers {
		if kindOrder(k) == len(SubscriberKinds) {
			return fmt.Errorf("unknown subscriber kind %q", k)
		}
	}
	var scs []Scenario
	for _, id := range cfg.Scenarios {
		s, err := ScenarioByID(id)
		if err != nil {
			return err
		}
		if cfg.Duration > 0 {
			s.Duration = cfg.Duration
			if s.EventAt > 0 && s.EventAt >= s.Duration {
				return fmt.Errorf("--duration %s: scenario %s has its event at %s; give a longer duration", cfg.Duration, s.ID, s.EventAt)
			}
		}
		if !slices.ContainsFunc(scs, func(x Scenario) bool { return x.ID == s.ID }) {
			scs = append(scs, s)
		}
	}
	mosq := harness.FindMosquitto()
	if slices.Contains(cfg.Systems, harness.SystemMosquitto) && mosq == "" {
		return harness.ErrMosquittoMissing
	}
	logDir := filepath.Join(cfg.Out, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	needLuffy := slices.ContainsFunc(cfg.Systems, func(s string) bool { return strings.HasPrefix(s, "luffymq-") })
	bin := cfg.LuffyMQ
	if needLuffy {
		var cleanup func()
		var err error
		if bin, cleanup, err = harness.LuffyMQBinary(ctx, bin, cfg.Progress); err != nil {
			return err
		}
		defer cleanup()
	}
	if needLuffy {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("--luffymq %s: %w", bin, err)
		}
	}
	self, err := os.Executable()
	if err != nil && slices.Contains(cfg.Systems, harness.SystemMochi) {
		return fmt.Errorf("mochi runs as `luffy-bench %s`, but this executable's path is unknown: %w", harness.MochiServerCommand, err)
	}
	results := &SharedResults{
		Machine:   harness.DescribeMachine(mosq),
		Emulation: Emulation,
		Latency:   "dequeue time (virtual service start) − scheduled publish time (the drift-free publisher's slot; the payload also carries the actual send time and results.json the publisher's worst lag); processing excluded",
		Notes:     sharedNotes(),
	}
	jsonPath := filepath.Join(cfg.Out, "results.json")
	if cfg.Merge {
		old, err := loadShared(jsonPath)
		if err != nil {
			return err
		}
		if old != nil {
			results.Runs = keepOtherRuns(old.Runs, scs, cfg.Subscribers)
		}
	}

	type job struct {
		s      Scenario
		kind   string
		system string
		repeat int
	}
	var jobs []job
	estimate := func(j job) float64 {
		if j.system == harness.SystemOracle {
			return 0.05
		}
		return j.s.Duration.Seconds() + 2
	}
	total := 0.0
	for _, s := range scs {
		for _, kind := range cfg.Subscribers {
			for r := 1; r <= cfg.Repeat; r++ {
				for _, sys := range cfg.Systems {
					jobs = append(jobs, job{s, kind, sys, r})
					total += estimate(jobs[len(jobs)-1])
				}
			}
		}
	}
	starter := harness.BrokerStarter{LuffyMQ: bin, Mosquitto: mosq, Self: self, LogDir: logDir, LiveOracle: startLiveOracleBroker}
	opts := sharedOptions{brokers: starter, drainTimeout: cfg.DrainTimeout, logDir: logDir, ackInterval: cfg.AckInterval}
	if cfg.Trace {
		opts.traceDir = cfg.Out
	}
	began := time.Now()
	doneEst := 0.0
	var groupRuns []RunResult
	for k, j := range jobs {
		if ctx.Err() != nil {
			break
		}
		elapsed := time.Since(began)
		eta := "?"
		if doneEst > 0 {
			eta = harness.FmtDur(time.Duration(float64(elapsed) * (total - doneEst) / doneEst))
		} else {
			eta = "≈" + harness.FmtDur(time.Duration(total*float64(time.Second)))
		}
		fmt.Fprintf(cfg.Progress, "[%d/%d] %s · %s subscribers · %s · repeat %d/%d · elapsed %s · ETA %s\n",
			k+1, len(jobs), j.s.ID, j.kind, j.system, j.repeat, cfg.Repeat, harness.FmtDur(elapsed), eta)
		seed := uint64(j.repeat)
		s := j.s.ForRun(seed)
		trace := s.Trace(seed)
		var r RunResult
		if j.system == harness.SystemOracle {
			r = buildResult(s, j.kind, j.system, j.repeat, trace, len(trace), seed, Oracle(s, trace))
		} else {
			var err error
			r, err = runLive(ctx, s, j.kind, j.system, j.repeat, seed, trace, opts)
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				return fmt.Errorf("%s with %s subscribers on %s: %w", j.s.ID, j.kind, j.system, err)
			}
		}
		doneEst += estimate(j)
		fmt.Fprintf(cfg.Progress, "      mean %s ms · p99 %s ms · max %s ms · lost %d · dup %d · %.1f s\n",
			harness.FmtMs(r.Overall.Mean), harness.FmtMs(r.Overall.P99), harness.FmtMs(r.Overall.Max), r.Lost, r.Duplicated, r.WallSeconds)
		results.Runs = append(results.Runs, r)
		groupRuns = append(groupRuns, r)
		results.Generated = time.Now().UTC()
		if err := harness.WriteJSON(jsonPath, results.finite()); err != nil {
			return err
		}
		if k == len(jobs)-1 || jobs[k+1].s.ID != j.s.ID || jobs[k+1].kind != j.kind {
			if err := plotScenario(cfg.Out, j.s, j.kind, groupRuns); err != nil {
				return fmt.Errorf("plots of %s (%s subscribers): %w", j.s.ID, j.kind, err)
			}
			groupRuns = nil
		}
		if k == len(jobs)-1 || jobs[k+1].s.ID != j.s.ID {
			if err := plotKinds(cfg.Out, j.s, results.Runs); err != nil {
				return fmt.Errorf("plots of %s: %w", j.s.ID, err)
			}
			if err := WriteSummary(cfg.Out); err != nil {
				return err
			}
		}
	}
	if err := WriteSummary(cfg.Out); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted; partial results in %s", cfg.Out)
	}
	fmt.Fprintf(cfg.Progress, "done in %s: %s, %s\n", harness.FmtDur(time.Since(began)), jsonPath, filepath.Join(cfg.Out, "summary.md"))
	return nil
}

// sharedNotes are the general notes of results.json and summary.md.
func sharedNotes() []string {
	return []string{
		"Subscriber kinds (column/section *subscribers*): sdk = " + kindDescription(KindSDK) + "; thesis-reporter = " + kindDescription(KindThesisReporter) +
			"; timer-reporter = " + kindDescription(KindTimerReporter) + "; receipt-reporter = " + kindDescription(KindReceiptReporter) + "; paho-qos1-ackafter = " + kindDescription(KindPahoQoS1AckAfter) + ".",
		"Every member, of every kind, has one FIFO and one worker with the same drift-free service emulation. A broker that closes the connection on an extended PINGREQ makes the SDK reconnect and publish its reports to $luffy/load instead (ordinary messages nobody subscribes to on Mosquitto and Mochi); a paho member does not reconnect. Each run's notes say what happened.",
		"luffymq runs as a separate process (the real binary); Mosquitto runs as a separate process with set_tcp_nodelay true; vanilla Mochi runs as a separate process (`luffy-bench " + harness.MochiServerCommand + "`) with default options.",
		OracleName + ": replays the exact arrival trace, always giving a message to the member that can start it soonest, knowing every member's exact busy-until time, with zero network delay (the same at QoS 1). A strong reference, not a proven lower bound; its row is computed once per subscriber kind.",
		"Column *mean ÷ oracle on the run's network*: each live run's mean divided by the oracle replayed on that run's own network — every message reaches its member no earlier than its measured delivery delay in the run (receipt − scheduled publish) — then the median over runs. At 100 % utilisation (thesis-2) a message that reaches an idle member late costs that member's capacity for good, so the plain oracle's zero-delay figure is out of any live system's reach; this column separates the policy's share of the gap from the network's. Not computed for luffymq-adaptive-hold, whose deliberate holds at the broker would count as delivery delays.",
		"Members use clean sessions (session expiry 0).",
	}
}

// keepOtherRuns returns the runs of old that this invocation does not
// replace: those of a (scenario, subscriber kind) pair not in scs × kinds.
// Runs written before subscriber kinds existed count as sdk runs.
func keepOtherRuns(old []RunResult, scs []Scenario, kinds []string) []RunResult {
	var out []RunResult
	for _, r := range old {
		r.Subscriber = normKind(r.Subscriber)
		replaced := slices.ContainsFunc(scs, func(s Scenario) bool { return s.ID == r.Scenario }) && slices.Contains(kinds, r.Subscriber)
		if replaced {
			continue
		}
		r.Overall = r.Overall.Unfinite()
		for j := range r.PerSub {
			r.PerSub[j].LatencyStats = r.PerSub[j].LatencyStats.Unfinite()
		}
		out = append(out, r)
	}
	return out
}
