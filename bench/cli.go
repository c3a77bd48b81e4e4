package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, strings.Split(v, ",")...); return nil }

const usage = `Usage: luffy-bench COMMAND [flags]

Commands:
  shared      shared-subscription latency scenarios (set A of docs/scenarios.md)
  throughput  broker throughput, shared fan-in and plain fan-out (set B)
  connections N idle MQTT v5 connections, each subscribed to its own topic, against
              luffymq, vanilla Mochi and Mosquitto: RSS per connection, connect rate,
              delivery of one command to each, RSS after churn
  reliability lost / stalled / dropped scenarios against luffymq, vanilla Mochi and Mosquitto
  soak        2 000 connections in shared groups with churn, for --duration
  sites       scenario set C across sites on real RabbitMQ nodes joined by delayed links
  sites-matrix  set C's work-queue scenarios over time scales and topologies, repeated,
              every architecture side by side (matrix.md)
  summary     rewrite DIR/summary.md from DIR/results.json and DIR/throughput.json
  mochi-server  run vanilla Mochi MQTT (default options, allow-all auth) on --listen;
              the benchmarks start it as a broker process of its own

Run luffy-bench COMMAND --help for its flags.
`

// Main runs luffy-bench with args (without the program name) and returns the
// exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch args[0] {
	case "shared":
		err = sharedCommand(ctx, args[1:], stdout, stderr)
	case "throughput":
		err = throughputCommand(ctx, args[1:], stdout, stderr)
	case ConnectionsCommand:
		err = connectionsCommand(ctx, args[1:], stdout, stderr)
	case MochiServerCommand:
		err = mochiServerCommand(ctx, args[1:], stdout, stderr)
	case "summary":
		fs := flag.NewFlagSet("luffy-bench summary", flag.ContinueOnError)
		fs.SetOutput(stderr)
		out := fs.String("out", "", "results directory")
		if err = fs.Parse(args[1:]); err == nil {
			if *out == "" {
				err = errors.New("--out DIR is required")
			} else {
				err = WriteSummary(*out)
			}
		}
	default:
		err = fmt.Errorf("unknown command %q (want shared, throughput, connections, summary or %s)", args[0], MochiServerCommand)
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "luffy-bench:", err)
		return 1
	}
	return 0
}

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
	Merge    bool
	Progress io.Writer
}

func sharedCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("luffy-bench shared", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var scenarios stringList
	fs.Var(&scenarios, "scenario", "scenario ID, repeatable: thesis-1, thesis-2, thesis-2-qos1, step, join, poisson, crash, or all")
	out := fs.String("out", "", "output directory (required)")
	duration := fs.Duration("duration", 0, "publishing time of every scenario (default: the scenario's own)")
	repeat := fs.Int("repeat", 1, "runs of each scenario on each system")
	systems := fs.String("systems", "all", "comma-separated systems: "+strings.Join(AllSystems(), ", ")+" (strategy names may omit luffymq-)")
	luffymq := fs.String("luffymq", "", "luffymq binary (default: build ./cmd/luffymq of the current module)")
	drain := fs.Duration("drain-timeout", 90*time.Second, "longest wait for every sent message to be dequeued after publishing ends")
	merge := fs.Bool("merge", false, "keep the runs already in DIR/results.json of every (scenario, subscriber kind) this invocation does not run")
	subscribers := fs.String("subscriber", KindSDK, "comma-separated subscriber kinds, each run against every system: "+strings.Join(SubscriberKinds, ", ")+", or all")
	ackInterval := fs.Duration("paho-ack-interval", 0, "how often the paho subscriber kinds send the acknowledgements of processed QoS 1 messages (paho's SendAcksInterval; 0: paho's default, 50 ms)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	sys, err := ParseSystems(*systems)
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
		Subscribers: kinds, LuffyMQ: *luffymq, DrainTimeout: *drain, AckInterval: *ackInterval, Merge: *merge, Progress: stdout})
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
	mosq := findMosquitto()
	if slices.Contains(cfg.Systems, SystemMosquitto) && mosq == "" {
		return errMosquittoMissing
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
		if bin, cleanup, err = luffyMQBinary(ctx, bin, cfg.Progress); err != nil {
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
	if err != nil && slices.Contains(cfg.Systems, SystemMochi) {
		return fmt.Errorf("mochi runs as `luffy-bench %s`, but this executable's path is unknown: %w", MochiServerCommand, err)
	}
	results := &SharedResults{
		Machine:   machineInfo(mosq),
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
		if j.system == SystemOracle {
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
	starter := brokerStarter{LuffyMQ: bin, Mosquitto: mosq, Self: self, LogDir: logDir}
	opts := sharedOptions{brokers: starter, drainTimeout: cfg.DrainTimeout, logDir: logDir, ackInterval: cfg.AckInterval}
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
			eta = fmtDur(time.Duration(float64(elapsed) * (total - doneEst) / doneEst))
		} else {
			eta = "≈" + fmtDur(time.Duration(total*float64(time.Second)))
		}
		fmt.Fprintf(cfg.Progress, "[%d/%d] %s · %s subscribers · %s · repeat %d/%d · elapsed %s · ETA %s\n",
			k+1, len(jobs), j.s.ID, j.kind, j.system, j.repeat, cfg.Repeat, fmtDur(elapsed), eta)
		seed := uint64(j.repeat)
		s := j.s.ForRun(seed)
		trace := s.Trace(seed)
		var r RunResult
		if j.system == SystemOracle {
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
			fmtMs(r.Overall.Mean), fmtMs(r.Overall.P99), fmtMs(r.Overall.Max), r.Lost, r.Duplicated, r.WallSeconds)
		results.Runs = append(results.Runs, r)
		groupRuns = append(groupRuns, r)
		results.Generated = time.Now().UTC()
		if err := writeJSON(jsonPath, results); err != nil {
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
	fmt.Fprintf(cfg.Progress, "done in %s: %s, %s\n", fmtDur(time.Since(began)), jsonPath, filepath.Join(cfg.Out, "summary.md"))
	return nil
}

// sharedNotes are the general notes of results.json and summary.md.
func sharedNotes() []string {
	return []string{
		"Subscriber kinds (column/section *subscribers*): sdk = " + kindDescription(KindSDK) + "; thesis-reporter = " + kindDescription(KindThesisReporter) +
			"; timer-reporter = " + kindDescription(KindTimerReporter) + "; paho-qos1-ackafter = " + kindDescription(KindPahoQoS1AckAfter) + ".",
		"Every member, of every kind, has one FIFO and one worker with the same drift-free service emulation. A broker that closes the connection on an extended PINGREQ makes the SDK reconnect and publish its reports to $luffy/load instead (ordinary messages nobody subscribes to on Mosquitto and Mochi); a paho member does not reconnect. Each run's notes say what happened.",
		"luffymq runs as a separate process (the real binary); Mosquitto runs as a separate process with set_tcp_nodelay true; vanilla Mochi runs as a separate process (`luffy-bench " + MochiServerCommand + "`) with default options.",
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
		r.Overall = r.Overall.unfinite()
		for j := range r.PerSub {
			r.PerSub[j].LatencyStats = r.PerSub[j].LatencyStats.unfinite()
		}
		out = append(out, r)
	}
	return out
}

func fmtDur(d time.Duration) string {
	d = d.Round(time.Second)
	if d >= time.Minute {
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%ds", int(d.Seconds()))
}

func throughputCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
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
	stall := fs.Duration("stall-window", DefaultStallWindow, "a broker whose delivered count stays flat this long with messages still owed has stalled (no rate is reported for that run)")
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
		if sys, err = ParseSystems(strings.Join(listed, ",")); err != nil {
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
	return RunThroughput(ctx, *out, sys, *luffymq, cfg, stdout)
}

// RunThroughput runs set B and writes throughput.json, throughput.png and
// refreshes summary.md in out.
func RunThroughput(ctx context.Context, out string, systems []string, luffymq string, cfg ThroughputConfig, progress io.Writer) error {
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
		cfg.StallWindow = DefaultStallWindow
	}
	if cfg.StallWindow < 500*time.Millisecond || cfg.StallWindow > cfg.Timeout {
		return fmt.Errorf("--stall-window %s: want 500ms up to the --timeout", cfg.StallWindow)
	}
	mosq := findMosquitto()
	if slices.Contains(systems, SystemMosquitto) && mosq == "" {
		return errMosquittoMissing
	}
	logDir := filepath.Join(out, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	if slices.ContainsFunc(systems, func(s string) bool { return strings.HasPrefix(s, "luffymq-") }) {
		var cleanup func()
		var err error
		if luffymq, cleanup, err = luffyMQBinary(ctx, luffymq, progress); err != nil {
			return err
		}
		defer cleanup()
	}
	self, err := os.Executable()
	if err != nil && slices.Contains(systems, SystemMochi) {
		return fmt.Errorf("mochi runs as `luffy-bench %s`, but this executable's path is unknown: %w", MochiServerCommand, err)
	}
	starter := brokerStarter{LuffyMQ: luffymq, Mosquitto: mosq, Self: self, LogDir: logDir}
	res := &ThroughputResults{Machine: machineInfo(mosq), Config: cfg}
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
					eta = fmtDur(elapsed / time.Duration(k-1) * time.Duration(n-k+1))
				}
				fmt.Fprintf(progress, "[%d/%d] throughput %s · %s · repeat %d/%d · elapsed %s · ETA %s\n", k, n, t.ID, sys, r, cfg.Repeat, fmtDur(elapsed), eta)
				br, err := startThroughputBroker(ctx, starter, sys, time.Second, fmt.Sprintf("throughput-%s-%s-r%d", t.ID, sys, r))
				if err != nil {
					return fmt.Errorf("throughput %s on %s: %w", t.ID, sys, err)
				}
				run := runThroughput(ctx, t, sys, r, br, cfg, logger.With("system", sys, "test", t.ID))
				if !within(cleanupTimeout, func() { _ = br.Close() }) {
					run.Error = strings.TrimSpace(run.Error + " broker did not stop within " + cleanupTimeout.String() + " (left running)")
				}
				if run.Stalled {
					fmt.Fprintf(progress, "      STALLED: delivered %d/%d, none for %s after %.1f s\n", run.Delivered, run.Expected, cfg.StallWindow, run.StalledAfterS)
				} else {
					fmt.Fprintf(progress, "      %.0f msgs/s · p50 %s ms · p99 %s ms · delivered %d/%d %s\n", run.MsgsPerS, fmtMs(run.P50Ms), fmtMs(run.P99Ms), run.Delivered, run.Expected, run.Error)
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
	if err := writeJSON(filepath.Join(out, "throughput.json"), res); err != nil {
		return err
	}
	if err := plotThroughput(filepath.Join(out, "throughput.png"), res); err != nil {
		return err
	}
	if err := WriteSummary(out); err != nil {
		return err
	}
	fmt.Fprintf(progress, "done in %s: %s\n", fmtDur(time.Since(began)), filepath.Join(out, "throughput.json"))
	return nil
}
