// Package reliability runs `luffy-bench reliability`: what gets lost,
// stalled or dropped (a QoS 1 member crashing, a subscriber that never
// reads, a QoS 0 burst) on luffymq, vanilla Mochi and Mosquitto.
package reliability

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/broker"
)

// Command is the luffy-bench subcommand that runs the
// reliability scenarios (lost, stalled and dropped messages).
const Command = "reliability"

// Reliability scenario IDs.
const (
	// ReliabilityCrash: a QoS 1 shared-group member that acknowledges
	// after processing drops its connection mid-run; lost and duplicated
	// messages are counted.
	ReliabilityCrash = "crash-qos1"
	// ReliabilityStuck: a subscriber that never reads its socket shares a
	// topic (fan-out) or a shared group with a healthy one.
	ReliabilityStuck = "stuck-subscriber"
	// ReliabilityBurst: a QoS 0 fan-out burst that the subscribers absorb
	// on average.
	ReliabilityBurst = "qos0-burst"
)

// ReliabilityScenarios lists the reliability scenarios in report order.
var ReliabilityScenarios = []string{ReliabilityCrash, ReliabilityStuck, ReliabilityBurst}

// ReliabilitySystems are the systems the reliability scenarios compare.
var ReliabilitySystems = []string{"luffymq-adaptive", harness.SystemMochi, harness.SystemMosquitto}

// CrashConfig sizes crash-qos1.
type CrashConfig struct {
	// Rate is the publisher's QoS 1 rate in messages per second.
	Rate int `json:"msgs_per_s"`
	// Duration is how long the publisher sends.
	Duration time.Duration `json:"duration_ns"`
	// CrashAt is when the crashing member drops its connection.
	CrashAt time.Duration `json:"crash_at_ns"`
	// Services are the members' processing times; the last member
	// crashes.
	Services []time.Duration `json:"services_ns"`
	// DrainTimeout bounds the wait for the last messages after publishing.
	DrainTimeout time.Duration `json:"drain_timeout_ns"`
}

// StuckConfig sizes stuck-subscriber.
type StuckConfig struct {
	FanoutMessages int `json:"fanout_messages"`
	FanoutBytes    int `json:"fanout_payload_bytes"`
	SharedMessages int `json:"shared_messages"`
	SharedBytes    int `json:"shared_payload_bytes"`
	// InFlight is how many QoS 1 publishes the publisher keeps
	// outstanding.
	InFlight int `json:"publisher_in_flight"`
	// Timeout bounds each phase (stuck client connected; after it is cut).
	Timeout time.Duration `json:"phase_timeout_ns"`
}

// BurstConfig sizes qos0-burst.
type BurstConfig struct {
	Publishers   int `json:"publishers"`
	Messages     int `json:"messages_per_publisher"`
	Subscribers  int `json:"subscribers"`
	PayloadBytes int `json:"payload_bytes"`
	// Timeout bounds one run.
	Timeout time.Duration `json:"timeout_ns"`
	// PendingWrites, when not empty, adds one luffymq-adaptive run of the
	// burst per value, started with --max-pending-writes VALUE (Mochi's
	// per-client outbound packet queue).
	PendingWrites []int `json:"luffymq_max_pending_writes,omitempty"`
}

// ReliabilityConfig configures a reliability invocation.
type ReliabilityConfig struct {
	Scenarios []string `json:"scenarios"`
	Systems   []string `json:"systems"`
	Repeat    int      `json:"repeat"`
	// StallWindow: a publisher that gets no acknowledgement for this long
	// while it still has messages to send has stalled.
	StallWindow time.Duration `json:"stall_window_ns"`
	Crash       CrashConfig   `json:"crash_qos1"`
	Stuck       StuckConfig   `json:"stuck_subscriber"`
	Burst       BurstConfig   `json:"qos0_burst"`
	// LuffyMQ is the luffymq binary ("" builds ./cmd/luffymq).
	LuffyMQ string `json:"-"`
	// Out receives reliability.json, reliability.md and the plots.
	Out      string    `json:"-"`
	Progress io.Writer `json:"-"`
}

// DefaultReliabilityConfig returns the sizes of issue 9's measurements;
// the whole run takes about two to three minutes on 2 cores.
func DefaultReliabilityConfig() ReliabilityConfig {
	ms := time.Millisecond
	return ReliabilityConfig{
		Scenarios:   slices.Clone(ReliabilityScenarios),
		Systems:     slices.Clone(ReliabilitySystems),
		Repeat:      1,
		StallWindow: harness.DefaultStallWindow,
		Crash: CrashConfig{Rate: 100, Duration: 10 * time.Second, CrashAt: 5 * time.Second,
			Services: []time.Duration{25 * ms, 25 * ms, 50 * ms}, DrainTimeout: 20 * time.Second},
		Stuck: StuckConfig{FanoutMessages: 2000, FanoutBytes: 8 << 10, SharedMessages: 20000, SharedBytes: 1 << 10,
			InFlight: 16, Timeout: 20 * time.Second},
		Burst: BurstConfig{Publishers: 4, Messages: 12500, Subscribers: 3, PayloadBytes: 100, Timeout: 60 * time.Second},
	}
}

// validate checks the configuration's bounds.
func (c ReliabilityConfig) validate() error {
	if c.Out == "" {
		return errors.New("--out DIR is required")
	}
	if len(c.Scenarios) == 0 {
		return errors.New("no scenario to run")
	}
	for _, s := range c.Scenarios {
		if !slices.Contains(ReliabilityScenarios, s) {
			return fmt.Errorf("unknown scenario %q; choose from %s", s, strings.Join(ReliabilityScenarios, ", "))
		}
	}
	if len(c.Systems) == 0 {
		return errors.New("no system to run")
	}
	for _, s := range c.Systems {
		if !slices.Contains(ReliabilitySystems, s) {
			return fmt.Errorf("unknown system %q; choose from %s", s, strings.Join(ReliabilitySystems, ", "))
		}
	}
	if c.Repeat < 1 || c.Repeat > 20 {
		return fmt.Errorf("--repeat %d: want 1 to 20", c.Repeat)
	}
	if c.StallWindow < 500*time.Millisecond || c.StallWindow > time.Minute {
		return fmt.Errorf("--stall-window %s: want 500ms to 1m", c.StallWindow)
	}
	cr := c.Crash
	if cr.Rate < 1 || cr.Rate > 10000 || cr.Duration <= 0 || cr.Duration > 10*time.Minute || cr.CrashAt <= 0 || cr.CrashAt >= cr.Duration {
		return errors.New("crash-qos1: want a rate of 1 to 10000 msgs/s, a duration up to 10m and the crash inside it")
	}
	if len(cr.Services) < 2 || cr.DrainTimeout <= 0 {
		return errors.New("crash-qos1: want at least two members and a positive drain timeout")
	}
	st := c.Stuck
	if st.FanoutMessages < 1 || st.SharedMessages < 1 || st.FanoutMessages > 1_000_000 || st.SharedMessages > 1_000_000 ||
		st.FanoutBytes < 16 || st.SharedBytes < 16 || st.FanoutBytes > 1<<20 || st.SharedBytes > 1<<20 ||
		st.InFlight < 1 || st.InFlight > 1024 || st.Timeout <= 0 {
		return errors.New("stuck-subscriber: want 1 to 1000000 messages of 16 B to 1 MiB, 1 to 1024 in flight and a positive timeout")
	}
	b := c.Burst
	if b.Publishers < 1 || b.Publishers > 64 || b.Subscribers < 1 || b.Subscribers > 64 || b.Messages < 1 || b.Messages > 1_000_000 ||
		b.PayloadBytes < 16 || b.PayloadBytes > 1<<20 || b.Timeout <= 0 {
		return errors.New("qos0-burst: want 1 to 64 publishers and subscribers, 1 to 1000000 messages of 16 B to 1 MiB and a positive timeout")
	}
	for _, p := range b.PendingWrites {
		if p < 1 || p > 1<<22 {
			return fmt.Errorf("--burst-pending-writes %d: want 1 to %d", p, 1<<22)
		}
	}
	return nil
}

// ReliabilityResults is reliability.json.
type ReliabilityResults struct {
	Generated time.Time           `json:"generated"`
	Machine   harness.MachineInfo `json:"machine"`
	Config    ReliabilityConfig   `json:"config"`
	Notes     []string            `json:"notes"`
	Crash     []CrashRun          `json:"crash_qos1,omitempty"`
	Stuck     []StuckRun          `json:"stuck_subscriber,omitempty"`
	Burst     []BurstRun          `json:"qos0_burst,omitempty"`
}

// BrokerFigures are what a run learned from the broker process itself.
// Counters that a system does not expose are -1.
type BrokerFigures struct {
	// PeakRSSBytes is the broker process's peak resident set (VmHWM).
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	// MochiDropped counts publishes Mochi dropped because a client's
	// outbound packet queue (MaximumClientWritesPending) was full
	// (luffymq only: /api/v1/overview messages_dropped).
	MochiDropped int64 `json:"mochi_dropped"`
	// OutboxDropped counts QoS 0 publishes luffymq's outbox dropped for a
	// slow client (qos0_dropped_slow_client).
	OutboxDropped int64 `json:"outbox_dropped"`
	// SlowDisconnected counts clients luffymq disconnected for not reading.
	SlowDisconnected int64 `json:"slow_clients_disconnected"`
	// Redispatched counts unacknowledged messages luffymq gave to the rest
	// of a shared group after a member left.
	Redispatched int64 `json:"redispatched"`
}

// unknownFigures are the figures of a system that exposes none.
func unknownFigures() BrokerFigures {
	return BrokerFigures{PeakRSSBytes: -1, MochiDropped: -1, OutboxDropped: -1, SlowDisconnected: -1, Redispatched: -1}
}

// reliabilityBroker is a broker process started for one reliability run.
type reliabilityBroker struct {
	harness.RunningBroker
	pid int
	// httpAddr is luffymq's HTTP API ("" for other systems).
	httpAddr string
}

// figures reads the broker's peak RSS and, from luffymq's API, its
// counters.
func (b *reliabilityBroker) figures(ctx context.Context) BrokerFigures {
	f := unknownFigures()
	f.PeakRSSBytes = peakRSS(b.pid)
	if b.httpAddr == "" {
		return f
	}
	o, err := fetchOverview(ctx, b.httpAddr)
	if err != nil {
		return f
	}
	f.MochiDropped, f.OutboxDropped = o.MessagesDropped, int64(o.QoS0Dropped)
	f.SlowDisconnected, f.Redispatched = int64(o.SlowClientsDisconnected), int64(o.Redispatched)
	return f
}

// fetchOverview reads luffymq's GET /api/v1/overview.
func fetchOverview(ctx context.Context, addr string) (*broker.OverviewResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/api/v1/overview", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("overview: %s", resp.Status)
	}
	var o broker.OverviewResponse
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil {
		return nil, fmt.Errorf("overview: %w", err)
	}
	return &o, nil
}

// peakRSS returns the peak resident set size of process pid in bytes
// (VmHWM of /proc/PID/status), or -1.
func peakRSS(pid int) int64 {
	if pid <= 0 {
		return -1
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	return parseVmHWM(f)
}

// parseVmHWM reads the VmHWM line ("VmHWM:   12345 kB") of a
// /proc/PID/status file, in bytes, or -1.
func parseVmHWM(r io.Reader) int64 {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != "VmHWM" {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) != 2 || fields[1] != "kB" {
			return -1
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return -1
		}
		return n << 10
	}
	return -1
}

// reliabilityRunner runs reliability scenarios.
type reliabilityRunner struct {
	cfg     ReliabilityConfig
	starter harness.BrokerStarter
	logDir  string
}

// startBroker starts system's broker for one run. luffymq gets its HTTP API
// on another free loopback port (for its counters) and, when pendingWrites
// is positive, --max-pending-writes.
func (r *reliabilityRunner) startBroker(ctx context.Context, system string, pendingWrites int, logName string) (*reliabilityBroker, error) {
	if !strings.HasPrefix(system, "luffymq-") {
		br, err := r.starter.Start(ctx, system, time.Second, logName)
		if err != nil {
			return nil, err
		}
		rb := &reliabilityBroker{RunningBroker: br}
		if p, ok := br.(*harness.Process); ok {
			rb.pid = p.Cmd.Process.Pid
		}
		return rb, nil
	}
	var httpAddr string
	p, err := harness.StartProcess(ctx, r.starter.LuffyMQ, filepath.Join(r.logDir, logName+".broker.log"), func(addr string) ([]string, error) {
		h, err := harness.FreeAddr()
		if err != nil {
			return nil, err
		}
		httpAddr = h
		args := append([]string{"--listen", addr, "--http", h, "--log-level", "warn"}, harness.LuffyMQSelectionArgs(system)...)
		if pendingWrites > 0 {
			args = append(args, "--max-pending-writes", strconv.Itoa(pendingWrites))
		}
		return args, nil
	})
	if err != nil {
		return nil, err
	}
	return &reliabilityBroker{RunningBroker: p, pid: p.Cmd.Process.Pid, httpAddr: httpAddr}, nil
}

// clientLogger opens the client log of one run.
func (r *reliabilityRunner) clientLogger(logName string) (*slog.Logger, func(), error) {
	f, err := os.Create(filepath.Join(r.logDir, logName+".clients.log"))
	if err != nil {
		return nil, nil, fmt.Errorf("client log: %w", err)
	}
	return slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelWarn})), func() { _ = f.Close() }, nil
}

// closeBroker stops br, bounded by CleanupTimeout; it returns a note when
// the broker did not stop in time.
func closeBroker(br *reliabilityBroker) string {
	if !harness.Within(harness.CleanupTimeout, func() { _ = br.Close() }) {
		return "broker did not stop within " + harness.CleanupTimeout.String() + " (left running)"
	}
	return ""
}

// RunReliability runs the reliability scenarios against every system in
// the same invocation and writes reliability.json, reliability.md and the
// plots into cfg.Out.
func RunReliability(ctx context.Context, cfg ReliabilityConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	starter, cleanup, err := harness.NewBrokerStarter(ctx, cfg.Out, cfg.Systems, cfg.LuffyMQ, cfg.Progress)
	if err != nil {
		return err
	}
	defer cleanup()
	r := &reliabilityRunner{cfg: cfg, starter: starter, logDir: starter.LogDir}
	res := &ReliabilityResults{Machine: harness.DescribeMachine(starter.Mosquitto), Config: cfg, Notes: reliabilityNotes(cfg)}
	began := time.Now()
	type job struct {
		scenario, system string
		pendingWrites    int
		repeat           int
	}
	var jobs []job
	for rep := 1; rep <= cfg.Repeat; rep++ {
		for _, sc := range cfg.Scenarios {
			for _, sys := range cfg.Systems {
				jobs = append(jobs, job{sc, sys, 0, rep})
				if sc == ReliabilityBurst && strings.HasPrefix(sys, "luffymq-") {
					for _, pw := range cfg.Burst.PendingWrites {
						jobs = append(jobs, job{sc, sys, pw, rep})
					}
				}
			}
		}
	}
	save := func() error {
		res.Generated = time.Now().UTC()
		return harness.WriteJSON(filepath.Join(cfg.Out, "reliability.json"), res)
	}
	for k, j := range jobs {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted; partial results in %s", cfg.Out)
		}
		variant := ""
		if j.pendingWrites > 0 {
			variant = fmt.Sprintf("max-pending-writes=%d", j.pendingWrites)
		}
		fmt.Fprintf(cfg.Progress, "[%d/%d] %s · %s · repeat %d/%d · elapsed %s\n", k+1, len(jobs), j.scenario,
			systemLabel(j.system, variant), j.repeat, cfg.Repeat, harness.FmtDur(time.Since(began)))
		switch j.scenario {
		case ReliabilityCrash:
			run := r.runCrash(ctx, j.system, j.repeat)
			fmt.Fprintf(cfg.Progress, "      published %d · processed %d · lost %d · dup %d %s\n", run.Published, run.Processed, run.Lost, run.Duplicated, run.Error)
			res.Crash = append(res.Crash, run)
		case ReliabilityStuck:
			for _, mode := range []string{StuckFanout, StuckShared} {
				run := r.runStuck(ctx, j.system, mode, j.repeat)
				stalled := ""
				if run.Stalled {
					stalled = fmt.Sprintf(" · publisher STALLED after %.1f s", run.StalledAfterS)
				}
				fmt.Fprintf(cfg.Progress, "      %s: healthy got %d/%d while stuck, %d after the cut · publisher %.0f msgs/s%s %s\n",
					mode, run.HealthyDelivered, run.Messages, run.HealthyAfterCut, run.PublisherMsgsPerS, stalled, run.Error)
				res.Stuck = append(res.Stuck, run)
			}
		case ReliabilityBurst:
			run := r.runBurst(ctx, j.system, j.pendingWrites, j.repeat)
			fmt.Fprintf(cfg.Progress, "      delivered %d/%d · dropped %d · peak RSS %s %s\n", run.Delivered, run.Expected, run.Dropped, harness.FmtBytes(run.Broker.PeakRSSBytes), run.Error)
			res.Burst = append(res.Burst, run)
		}
		if err := save(); err != nil {
			return err
		}
	}
	if err := plotReliability(cfg.Out, res); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cfg.Out, "reliability.md"), []byte(reliabilityMarkdown(res, cfg.Out)), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(cfg.Progress, "done in %s: %s, %s\n", harness.FmtDur(time.Since(began)),
		filepath.Join(cfg.Out, "reliability.json"), filepath.Join(cfg.Out, "reliability.md"))
	return nil
}

// reliabilityNotes are the general notes of reliability.json and
// reliability.md.
func reliabilityNotes(cfg ReliabilityConfig) []string {
	return []string{
		"Every system runs as a process of its own on loopback, a fresh one for each run: luffymq (the real binary, default flags but --http on a free loopback port to read its counters), Mosquitto with set_tcp_nodelay true, vanilla Mochi as `luffy-bench " + harness.MochiServerCommand + "` with default options. Clients are real paho.golang clients (the stuck subscriber is a raw TCP MQTT v5 client).",
		"Peak RSS is the broker process's VmHWM at the end of the run. Mochi-channel and outbox drops are luffymq's own counters (GET /api/v1/overview); the other systems expose none (—).",
		fmt.Sprintf("A publisher has stalled when it got no acknowledgement for %s while it still had messages to send.", cfg.StallWindow),
	}
}

// systemLabel names a system and its variant in tables and plots.
func systemLabel(system, variant string) string {
	if variant == "" {
		return system
	}
	return system + " (" + variant + ")"
}

// fmtCount formats a counter that may be unknown (-1).
func fmtCount(n int64) string {
	if n < 0 {
		return "—"
	}
	return strconv.FormatInt(n, 10)
}

// seqPayload returns a payload of size bytes (at least 16) carrying seq and
// the send time as EncodePayload does, padded with 'x'.
func seqPayload(seq, size int) []byte {
	b := make([]byte, size)
	binary.BigEndian.PutUint64(b[0:8], uint64(seq))
	binary.BigEndian.PutUint64(b[8:16], uint64(time.Now().UnixNano()))
	for i := 16; i < size; i++ {
		b[i] = 'x'
	}
	return b
}

// reliabilityCommand parses `luffy-bench reliability` flags and runs it.
func reliabilityCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	d := DefaultReliabilityConfig()
	fs := flag.NewFlagSet("luffy-bench "+Command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "output directory (required): reliability.json, reliability.md, reliability-*.png")
	scenarios := fs.String("scenario", strings.Join(d.Scenarios, ","), "comma-separated scenarios: "+strings.Join(ReliabilityScenarios, ", "))
	systems := fs.String("systems", strings.Join(d.Systems, ","), "comma-separated systems: "+strings.Join(ReliabilitySystems, ", "))
	luffymq := fs.String("luffymq", "", "luffymq binary (default: build ./cmd/luffymq of the current module)")
	repeat := fs.Int("repeat", d.Repeat, "runs of each scenario on each system")
	stall := fs.Duration("stall-window", d.StallWindow, "a publisher with no acknowledgement for this long while it still has messages to send has stalled")
	crashDur := fs.Duration("crash-duration", d.Crash.Duration, "crash-qos1: publishing time")
	crashAt := fs.Duration("crash-at", d.Crash.CrashAt, "crash-qos1: when the last member drops its connection")
	crashRate := fs.Int("crash-rate", d.Crash.Rate, "crash-qos1: QoS 1 messages per second")
	fanN := fs.Int("stuck-fanout-messages", d.Stuck.FanoutMessages, "stuck-subscriber: messages of the fan-out test")
	fanB := fs.Int("stuck-fanout-bytes", d.Stuck.FanoutBytes, "stuck-subscriber: payload bytes of the fan-out test")
	shN := fs.Int("stuck-shared-messages", d.Stuck.SharedMessages, "stuck-subscriber: messages of the shared-group test")
	shB := fs.Int("stuck-shared-bytes", d.Stuck.SharedBytes, "stuck-subscriber: payload bytes of the shared-group test")
	stuckTimeout := fs.Duration("stuck-timeout", d.Stuck.Timeout, "stuck-subscriber: longest time of each phase (stuck client connected; after it is cut)")
	burstPubs := fs.Int("burst-publishers", d.Burst.Publishers, "qos0-burst: publishers")
	burstN := fs.Int("burst-messages", d.Burst.Messages, "qos0-burst: messages per publisher")
	burstSubs := fs.Int("burst-subscribers", d.Burst.Subscribers, "qos0-burst: subscribers")
	var pending harness.StringList
	fs.Var(&pending, "burst-pending-writes", "qos0-burst: also run luffymq with --max-pending-writes N (comma-separated or repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg := d
	cfg.Out, cfg.LuffyMQ, cfg.Repeat, cfg.StallWindow, cfg.Progress = *out, *luffymq, *repeat, *stall, stdout
	cfg.Scenarios, cfg.Systems = harness.SplitList(*scenarios), harness.SplitList(*systems)
	cfg.Crash.Duration, cfg.Crash.CrashAt, cfg.Crash.Rate = *crashDur, *crashAt, *crashRate
	cfg.Stuck.FanoutMessages, cfg.Stuck.FanoutBytes, cfg.Stuck.SharedMessages, cfg.Stuck.SharedBytes = *fanN, *fanB, *shN, *shB
	cfg.Stuck.Timeout = *stuckTimeout
	cfg.Burst.Publishers, cfg.Burst.Messages, cfg.Burst.Subscribers = *burstPubs, *burstN, *burstSubs
	for _, p := range pending {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			return fmt.Errorf("--burst-pending-writes %q: not a number", p)
		}
		cfg.Burst.PendingWrites = append(cfg.Burst.PendingWrites, n)
	}
	return RunReliability(ctx, cfg)
}

// Main runs `luffy-bench reliability` with args (without the
// subcommand's name) and returns the exit code, as Main does for the
// other subcommands.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := reliabilityCommand(ctx, args, stdout, stderr)
	return harness.ExitCode(err, stderr)
}
