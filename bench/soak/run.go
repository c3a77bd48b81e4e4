package soak

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// SoakSample is one point of the soak time series.
type SoakSample struct {
	// T is the time since publishing began, in seconds.
	T float64 `json:"t_s"`
	// Phase is "publish" while publishers run, "drain" during the grace
	// period after.
	Phase         string  `json:"phase"`
	PublishedPerS float64 `json:"published_per_s"`
	// ReceivedPerS counts first receipts; DeliveredPerS every delivery.
	ReceivedPerS  float64 `json:"received_per_s"`
	DeliveredPerS float64 `json:"delivered_per_s"`
	// P99Ms is the p99 latency (receipt − send time) of the messages first
	// received in the window; -1 when none were.
	P99Ms float64 `json:"p99_ms"`
	// LostSoFarQoS1 counts QoS 1 messages acknowledged by the broker at
	// least OverdueAfter ago and not received by any member of their group.
	LostSoFarQoS1  int     `json:"lost_so_far_qos1"`
	AwaitingQoS1   int     `json:"awaiting_qos1"`
	DuplicatedQoS1 int64   `json:"duplicated_qos1"`
	DuplicatedQoS0 int64   `json:"duplicated_qos0"`
	MissingQoS0    int     `json:"missing_qos0"`
	MembersOnline  int64   `json:"members_online"`
	BrokerRSSMB    float64 `json:"broker_rss_mb"`
	// BrokerHeapMB is the broker's go_memstats_heap_inuse_bytes (-1 if
	// /metrics lacks it); BrokerHeapObjects its go_memstats_heap_objects.
	BrokerHeapMB      float64 `json:"broker_heap_inuse_mb"`
	BrokerHeapObjects float64 `json:"broker_heap_objects"`
	// BrokerLiveHeapMB is the broker's heap allocated right after a
	// forced GC (SoakConfig.LiveHeapEvery); -1 in samples without it.
	BrokerLiveHeapMB float64 `json:"broker_live_heap_mb"`
	BrokerThreads    int     `json:"broker_threads"`
	BrokerGoroutine  float64 `json:"broker_goroutines"`
	// BrokerCPUPercent is the broker's CPU time over the window, in % of
	// one core.
	BrokerCPUPercent  float64 `json:"broker_cpu_percent"`
	LoadgenRSSMB      float64 `json:"loadgen_rss_mb"`
	LoadgenHeapMB     float64 `json:"loadgen_heap_inuse_mb"`
	LoadgenGoroutines int     `json:"loadgen_goroutines"`
	LoadgenCPUPercent float64 `json:"loadgen_cpu_percent"`
	// BrokerMetrics holds a few of the broker's /metrics series.
	BrokerMetrics map[string]float64 `json:"broker_metrics,omitempty"`
}

// SoakStability compares the broker's RSS and goroutines between the
// first and the last window of the publishing phase.
type SoakStability struct {
	WindowS float64 `json:"window_s"`
	// WarmupS is the start of the publishing phase left out: the first
	// window begins after it.
	WarmupS float64 `json:"warmup_s"`
	// LiveHeapFirstMB and LiveHeapLastMB are the live heap medians of the
	// windows (-1: not measured).
	LiveHeapFirstMB    float64 `json:"live_heap_first_median_mb"`
	LiveHeapLastMB     float64 `json:"live_heap_last_median_mb"`
	RSSFirstMedianMB   float64 `json:"rss_first_median_mb"`
	RSSLastMedianMB    float64 `json:"rss_last_median_mb"`
	HeapFirstMedianMB  float64 `json:"heap_inuse_first_median_mb"`
	HeapLastMedianMB   float64 `json:"heap_inuse_last_median_mb"`
	HeapObjectsFirst   float64 `json:"heap_objects_first_median"`
	HeapObjectsLast    float64 `json:"heap_objects_last_median"`
	GoroutinesFirst    float64 `json:"goroutines_first_median"`
	GoroutinesLast     float64 `json:"goroutines_last_median"`
	ThreadsFirst       float64 `json:"threads_first_median"`
	ThreadsLast        float64 `json:"threads_last_median"`
	RSSSlopeMBPer10Min float64 `json:"rss_slope_mb_per_10min_after_warmup"`
	GoroutineSlope     float64 `json:"goroutine_slope_per_10min_after_warmup"`
}

// SoakTotals are the whole run's counts.
type SoakTotals struct {
	Reserved        uint64  `json:"publish_slots"`
	PublishFailed   int64   `json:"publish_failed"`
	ReceivedQoS1    int64   `json:"received_qos1"`
	ReceivedQoS0    int64   `json:"received_qos0"`
	DuplicatedQoS1  int64   `json:"duplicated_qos1"`
	DuplicatedQoS0  int64   `json:"duplicated_qos0"`
	Misrouted       int64   `json:"misrouted"`
	Undecodable     int64   `json:"undecodable"`
	Joins           int64   `json:"rejoins"`
	Leaves          int64   `json:"leaves"`
	Crashes         int64   `json:"crashes"`
	ChurnHeld       int64   `json:"churn_of_members_holding_unacked"`
	Unexpected      int64   `json:"unexpected_disconnects"`
	JoinFailures    int64   `json:"join_failures"`
	PubReconnects   int64   `json:"publisher_reconnects"`
	LateSlots       int64   `json:"publish_slots_over_1s_late"`
	MaxLagMs        float64 `json:"publisher_max_lag_ms"`
	P50QoS1Ms       float64 `json:"p50_qos1_ms"`
	P99QoS1Ms       float64 `json:"p99_qos1_ms"`
	MaxQoS1Ms       float64 `json:"max_qos1_ms"`
	P50QoS0Ms       float64 `json:"p50_qos0_ms"`
	P99QoS0Ms       float64 `json:"p99_qos0_ms"`
	PublishSeconds  float64 `json:"publish_seconds"`
	DrainSeconds    float64 `json:"drain_seconds"`
	ConnectSeconds  float64 `json:"connect_seconds"`
	MeanReceivedPer float64 `json:"mean_received_per_s"`
}

// SoakResults is soak.json.
type SoakResults struct {
	Generated time.Time           `json:"generated"`
	Machine   harness.MachineInfo `json:"machine"`
	Config    struct {
		Connections   int     `json:"connections"`
		Members       int     `json:"members"`
		Groups        int     `json:"groups"`
		Publishers    int     `json:"publishers"`
		Rate          float64 `json:"rate_msgs_per_s"`
		QoS1Percent   int     `json:"qos1_percent"`
		DurationS     float64 `json:"duration_s"`
		ChurnEveryS   float64 `json:"churn_every_s"`
		RejoinAfterS  float64 `json:"rejoin_after_s"`
		SampleEveryS  float64 `json:"sample_every_s"`
		ProcessTimeS  float64 `json:"process_time_s"`
		GraceS        float64 `json:"grace_s"`
		OverdueAfterS float64 `json:"overdue_after_s"`
		// LiveHeapEveryS is SoakConfig.LiveHeapEvery (0: not measured).
		LiveHeapEveryS float64  `json:"live_heap_every_s"`
		BrokerArgs     []string `json:"broker_args"`
		Seed           uint64   `json:"seed"`
	} `json:"config"`
	// FDLimit is the open-file limit of the load generator (inherited by the
	// broker) and whether the run raised it.
	FDLimit struct {
		Soft   uint64 `json:"soft"`
		Hard   uint64 `json:"hard"`
		Raised bool   `json:"raised"`
	} `json:"fd_limit"`
	// GoroutineSource says where broker goroutines come from.
	GoroutineSource string        `json:"goroutine_source"`
	Final           soakFinal     `json:"final"`
	Totals          SoakTotals    `json:"totals"`
	Stability       SoakStability `json:"stability"`
	Samples         []SoakSample  `json:"samples"`
	Notes           []string      `json:"notes"`
}

// RunSoak runs a soak test against a luffymq process and writes soak.json,
// summary.md and PNG plots into cfg.Out.
func RunSoak(ctx context.Context, cfg SoakConfig) (*SoakResults, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, fmt.Errorf("output directory: %w", err)
	}
	res := &SoakResults{Machine: harness.DescribeMachine("")}
	fillSoakConfig(res, cfg)
	soft, hard, raised, err := harness.EnsureFDLimit(uint64(2*cfg.Connections + 512))
	res.FDLimit.Soft, res.FDLimit.Hard, res.FDLimit.Raised = soft, hard, raised
	if err != nil {
		return nil, err
	}
	bin, cleanup, err := harness.LuffyMQBinary(ctx, cfg.LuffyMQ, cfg.Progress)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("--luffymq %s: %w", bin, err)
	}
	httpAddr, err := harness.FreeAddr()
	if err != nil {
		return nil, err
	}
	br, err := harness.StartProcess(ctx, bin, filepath.Join(cfg.Out, "broker.log"), func(addr string) ([]string, error) {
		args := []string{"--listen", addr, "--http", httpAddr, "--log-level", "warn"}
		if cfg.LiveHeapEvery > 0 {
			args = append(args, "--pprof")
		}
		return append(args, cfg.BrokerArgs...), nil
	})
	if err != nil {
		return nil, err
	}
	defer br.Close()
	probe := newSoakProbe(br.Cmd.Process.Pid, "http://"+httpAddr)
	if err := probe.waitMetrics(ctx); err != nil {
		return nil, err
	}

	run := &soakRun{cfg: cfg, addr: br.Addr(), rng: rand.New(rand.NewPCG(cfg.Seed, 0x50a1))}
	capacity := int(math.Ceil(cfg.Rate*cfg.Duration.Seconds())) + cfg.Publishers + 16
	run.tracker = newSoakTracker(capacity, cfg.QoS1Percent)
	for i := range cfg.members() {
		g := i % cfg.Groups
		run.members = append(run.members, &soakMember{run: run, group: g, id: fmt.Sprintf("soak-%s-m%03d", soakGroupName(g), i/cfg.Groups)})
	}
	fmt.Fprintf(cfg.Progress, "soak: luffymq on %s (pid %d); connecting %d members in %d groups and %d publishers …\n",
		run.addr, br.Cmd.Process.Pid, cfg.members(), cfg.Groups, cfg.Publishers)
	connStart := time.Now()
	if err := run.connectMembers(ctx); err != nil {
		run.closeAll()
		return nil, fmt.Errorf("connecting members: %w", err)
	}
	res.Totals.ConnectSeconds = time.Since(connStart).Seconds()
	fmt.Fprintf(cfg.Progress, "soak: %d members connected in %.1f s; publishing %.0f msg/s (%d%% QoS 1) for %s\n",
		run.connected.Load(), res.Totals.ConnectSeconds, cfg.Rate, cfg.QoS1Percent, cfg.Duration)

	start := time.Now().Add(200 * time.Millisecond)
	end := start.Add(cfg.Duration)
	sampler := newSoakSampler(run, probe, start)
	samplerDone := make(chan struct{})
	stopSampling := make(chan struct{})
	go func() {
		defer close(samplerDone)
		sampler.loop(stopSampling)
	}()
	churnStop := make(chan struct{})
	var churnWG sync.WaitGroup
	if cfg.ChurnEvery > 0 {
		churnWG.Add(1)
		go func() {
			defer churnWG.Done()
			run.churn(ctx, churnStop)
		}()
	}
	var pubWG sync.WaitGroup
	interval := time.Duration(float64(cfg.Publishers) / cfg.Rate * float64(time.Second))
	for i := range cfg.Publishers {
		pubWG.Add(1)
		offset := time.Duration(float64(i) / cfg.Rate * float64(time.Second))
		go func() {
			defer pubWG.Done()
			run.publisher(ctx, i, i%cfg.Groups, start, end, offset, interval)
		}()
	}
	pubWG.Wait()
	pubEnd := time.Now()
	close(churnStop)
	churnWG.Wait()
	sampler.setPhase("drain")
	// Grace: wait for every acknowledged QoS 1 message to arrive.
	graceEnd := time.Now().Add(cfg.Grace)
	for ctx.Err() == nil && time.Now().Before(graceEnd) {
		if run.tracker.scan(time.Now(), cfg.OverdueAfter).AwaitingQoS1 == 0 {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	// A short settle lets late duplicates show before the final count.
	time.Sleep(min(cfg.SampleEvery, time.Second))
	close(stopSampling)
	<-samplerDone
	drainEnd := time.Now()

	res.Final = run.tracker.finalCounts()
	res.Samples = sampler.samples
	res.GoroutineSource = probe.goroutineSource
	t := &res.Totals
	tr := run.tracker
	t.Reserved = min(tr.next.Load(), uint64(len(tr.published)))
	t.PublishFailed = tr.pubFailed.Load()
	t.ReceivedQoS1, t.ReceivedQoS0 = tr.firstQoS1.Load(), tr.firstQoS0.Load()
	t.DuplicatedQoS1, t.DuplicatedQoS0 = tr.dupQoS1.Load(), tr.dupQoS0.Load()
	t.Misrouted, t.Undecodable = tr.misrouted.Load(), tr.undecoded.Load()
	t.Joins, t.Leaves, t.Crashes, t.ChurnHeld = run.joins.Load(), run.leaves.Load(), run.crashes.Load(), run.churnHeld.Load()
	t.Unexpected, t.JoinFailures, t.PubReconnects = run.unexpected.Load(), run.joinFailures.Load(), run.pubReconn.Load()
	t.LateSlots, t.MaxLagMs = run.lateSlots.Load(), harness.Millis(time.Duration(run.maxLagNs.Load()))
	l1, l0 := tr.latencies()
	t.P50QoS1Ms, t.P99QoS1Ms, t.P50QoS0Ms, t.P99QoS0Ms = harness.Percentile(l1, 50), harness.Percentile(l1, 99), harness.Percentile(l0, 50), harness.Percentile(l0, 99)
	if len(l1) > 0 {
		t.MaxQoS1Ms = l1[len(l1)-1]
	}
	t.PublishSeconds = pubEnd.Sub(start).Seconds()
	t.DrainSeconds = drainEnd.Sub(pubEnd).Seconds()
	if t.PublishSeconds > 0 {
		t.MeanReceivedPer = float64(t.ReceivedQoS1+t.ReceivedQoS0) / t.PublishSeconds
	}
	res.Stability = soakStability(res.Samples, cfg.warmup(), cfg.stabilityWindow(), t.PublishSeconds)
	res.Notes = soakNotes(cfg, res)
	res.Generated = time.Now().UTC()

	fmt.Fprintln(cfg.Progress, "soak: closing connections and stopping the broker …")
	if !harness.Within(30*time.Second, run.closeAll) {
		fmt.Fprintln(cfg.Progress, "soak: members did not close within 30 s; going on")
	}
	_ = br.Close()
	if err := writeSoakOutputs(cfg.Out, res); err != nil {
		return res, err
	}
	fmt.Fprintf(cfg.Progress, "soak: QoS 1 acked %d, lost %d, duplicated %d; QoS 0 written %d, missing %d; RSS %.1f → %.1f MB, goroutines %.0f → %.0f (medians of first/last %.0f s)\n",
		res.Final.AckedQoS1, res.Final.LostQoS1, t.DuplicatedQoS1, res.Final.WrittenQoS0, res.Final.MissingQoS0,
		res.Stability.RSSFirstMedianMB, res.Stability.RSSLastMedianMB, res.Stability.GoroutinesFirst, res.Stability.GoroutinesLast, res.Stability.WindowS)
	fmt.Fprintf(cfg.Progress, "soak: wrote %s and %s\n", filepath.Join(cfg.Out, "soak.json"), filepath.Join(cfg.Out, "summary.md"))
	if ctx.Err() != nil {
		return res, fmt.Errorf("interrupted; partial results in %s", cfg.Out)
	}
	return res, nil
}

func fillSoakConfig(res *SoakResults, cfg SoakConfig) {
	c := &res.Config
	c.Connections, c.Members, c.Groups, c.Publishers = cfg.Connections, cfg.members(), cfg.Groups, cfg.Publishers
	c.Rate, c.QoS1Percent, c.DurationS = cfg.Rate, cfg.QoS1Percent, cfg.Duration.Seconds()
	c.ChurnEveryS, c.RejoinAfterS, c.SampleEveryS = cfg.ChurnEvery.Seconds(), cfg.RejoinAfter.Seconds(), cfg.SampleEvery.Seconds()
	c.ProcessTimeS = cfg.ProcessTime.Seconds()
	c.GraceS, c.OverdueAfterS, c.Seed = cfg.Grace.Seconds(), cfg.OverdueAfter.Seconds(), cfg.Seed
	c.LiveHeapEveryS = cfg.LiveHeapEvery.Seconds()
	c.BrokerArgs = append([]string{}, cfg.BrokerArgs...)
}

// soakProbe reads the broker's resident memory, threads and CPU time from
// /proc and its goroutines from /metrics (go_goroutines).
type soakProbe struct {
	pid             int
	metricsURL      string
	liveHeapURL     string
	client          *http.Client
	goroutineSource string
	buf             bytes.Buffer
}

// newSoakProbe probes the broker of process pid whose HTTP API is at
// base (http://host:port).
func newSoakProbe(pid int, base string) *soakProbe {
	return &soakProbe{pid: pid, metricsURL: base + "/metrics", liveHeapURL: base + "/debug/pprof/heap?gc=1&debug=1",
		client: &http.Client{Timeout: 10 * time.Second}}
}

// liveHeapMB makes the broker collect garbage and returns its heap
// allocated right after, in MB: the runtime.MemStats HeapAlloc line of the
// text heap profile, which the runtime writes after the forced GC.
func (p *soakProbe) liveHeapMB() (float64, error) {
	resp, err := p.client.Get(p.liveHeapURL)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: status %s (does the broker run with --pprof?)", p.liveHeapURL, resp.Status)
	}
	return parseHeapAlloc(resp.Body)
}

// parseHeapAlloc reads "# HeapAlloc = <bytes>" from a text heap profile
// (debug=1) and returns it in MB.
func parseHeapAlloc(r io.Reader) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# HeapAlloc = "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("heap profile: HeapAlloc %q: %w", v, err)
			}
			return n / (1 << 20), nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("heap profile: no HeapAlloc line")
}

// waitMetrics waits until /metrics answers and decides where goroutine
// counts come from.
func (p *soakProbe) waitMetrics(ctx context.Context) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, err := p.metrics()
		if err == nil {
			if _, ok := m["go_goroutines"]; ok {
				p.goroutineSource = "broker /metrics go_goroutines"
			} else {
				p.goroutineSource = "none: /metrics has no go_goroutines (threads from /proc/<pid>/status are reported instead)"
			}
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("broker /metrics at %s: %w", p.metricsURL, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// soakMetricNames are the /metrics series kept in every sample.
var soakMetricNames = map[string]bool{
	"go_goroutines":                                                   true,
	"go_memstats_heap_inuse_bytes":                                    true,
	"go_memstats_heap_objects":                                        true,
	"luffymq_clients_connected":                                       true,
	"luffymq_inflight_messages":                                       true,
	"luffymq_messages_dropped_total":                                  true,
	`luffymq_redispatched_messages_total{outcome="delivered"}`:        true,
	`luffymq_redispatched_messages_total{outcome="dropped"}`:          true,
	`luffymq_redispatched_messages_total{outcome="unroutable"}`:       true,
	"luffymq_redispatch_parked_messages":                              true,
	`luffymq_qos0_dropped_total{reason="outbox_full"}`:                true,
	`luffymq_slow_clients_disconnected_total{reason="outbox_full"}`:   true,
	`luffymq_slow_clients_disconnected_total{reason="write_timeout"}`: true,
}

// metrics fetches /metrics and returns the series of soakMetricNames.
func (p *soakProbe) metrics() (map[string]float64, error) {
	resp, err := p.client.Get(p.metricsURL)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	p.buf.Reset()
	if _, err := p.buf.ReadFrom(resp.Body); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(&p.buf)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if i <= 0 || strings.HasPrefix(line, "#") || !soakMetricNames[line[:i]] {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat CPU times (100 on
// every Linux architecture Go supports).
const clockTicks = 100

// procCPUSeconds returns user + system CPU time of /proc/<pid>/stat.
func procCPUSeconds(pid string) (float64, error) {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after it are
	// plain. utime and stime are fields 14 and 15.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("malformed stat")
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / clockTicks, nil
}

// soakSampler takes a sample every SampleEvery.
type soakSampler struct {
	run     *soakRun
	probe   *soakProbe
	start   time.Time
	mu      sync.Mutex
	phase   string
	samples []SoakSample

	last                      time.Time
	lastLiveHeap              time.Time
	lastReserved, lastFirst   uint64
	lastReceipts              int64
	lastBrokerCPU, lastOwnCPU float64
	scratch                   []float64
}

func newSoakSampler(run *soakRun, probe *soakProbe, start time.Time) *soakSampler {
	return &soakSampler{run: run, probe: probe, start: start, phase: "publish"}
}

func (s *soakSampler) setPhase(p string) {
	s.mu.Lock()
	s.phase = p
	s.mu.Unlock()
}

func (s *soakSampler) loop(stop <-chan struct{}) {
	if d := time.Until(s.start); d > 0 {
		time.Sleep(d)
	}
	s.last = time.Now()
	pid := strconv.Itoa(s.probe.pid)
	s.lastBrokerCPU, _ = procCPUSeconds(pid)
	s.lastOwnCPU, _ = procCPUSeconds("self")
	t := time.NewTicker(s.run.cfg.SampleEvery)
	defer t.Stop()
	lines := 0
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		sm := s.sample(pid)
		s.mu.Lock()
		s.samples = append(s.samples, sm)
		s.mu.Unlock()
		if lines++; lines%max(1, int(30*time.Second/s.run.cfg.SampleEvery)) == 0 || sm.Phase == "drain" {
			fmt.Fprintf(s.run.cfg.Progress, "  t=%5.0fs %-7s pub %5.0f/s recv %5.0f/s p99 %6.1f ms lost so far %d dup %d online %d RSS %.1f MB goroutines %.0f\n",
				sm.T, sm.Phase, sm.PublishedPerS, sm.ReceivedPerS, sm.P99Ms, sm.LostSoFarQoS1, sm.DuplicatedQoS1, sm.MembersOnline, sm.BrokerRSSMB, sm.BrokerGoroutine)
		}
	}
}

func (s *soakSampler) sample(pid string) SoakSample {
	now := time.Now()
	dt := now.Sub(s.last).Seconds()
	s.last = now
	tr := s.run.tracker
	s.mu.Lock()
	sm := SoakSample{T: now.Sub(s.start).Seconds(), Phase: s.phase}
	s.mu.Unlock()
	reserved := tr.next.Load()
	first := uint64(tr.firstQoS1.Load() + tr.firstQoS0.Load())
	receipts := tr.receipts.Load()
	sm.PublishedPerS = float64(reserved-s.lastReserved) / dt
	sm.ReceivedPerS = float64(first-s.lastFirst) / dt
	sm.DeliveredPerS = float64(receipts-s.lastReceipts) / dt
	s.lastReserved, s.lastFirst, s.lastReceipts = reserved, first, receipts
	var n int
	sm.P99Ms, n, s.scratch = tr.takeWindow(s.scratch)
	if n == 0 {
		sm.P99Ms = -1
	}
	o := tr.scan(now, s.run.cfg.OverdueAfter)
	sm.LostSoFarQoS1, sm.AwaitingQoS1, sm.MissingQoS0 = o.OverdueQoS1, o.AwaitingQoS1, o.MissingQoS0
	sm.DuplicatedQoS1, sm.DuplicatedQoS0 = tr.dupQoS1.Load(), tr.dupQoS0.Load()
	sm.MembersOnline = s.run.connected.Load()
	sm.BrokerRSSMB, sm.BrokerThreads, _ = harness.ProcStatus(pid)
	sm.LoadgenRSSMB, _, _ = harness.ProcStatus("self")
	if c, err := procCPUSeconds(pid); err == nil {
		sm.BrokerCPUPercent = 100 * (c - s.lastBrokerCPU) / dt
		s.lastBrokerCPU = c
	}
	if c, err := procCPUSeconds("self"); err == nil {
		sm.LoadgenCPUPercent = 100 * (c - s.lastOwnCPU) / dt
		s.lastOwnCPU = c
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	sm.LoadgenHeapMB = float64(ms.HeapInuse) / (1 << 20)
	sm.LoadgenGoroutines = runtime.NumGoroutine()
	sm.BrokerGoroutine, sm.BrokerHeapMB, sm.BrokerHeapObjects, sm.BrokerLiveHeapMB = -1, -1, -1, -1
	if every := s.run.cfg.LiveHeapEvery; every > 0 && now.Sub(s.lastLiveHeap) >= every {
		s.lastLiveHeap = now
		if v, err := s.probe.liveHeapMB(); err == nil {
			sm.BrokerLiveHeapMB = v
		} else {
			fmt.Fprintf(s.run.cfg.Progress, "soak: live heap not measured: %v\n", err)
		}
	}
	if m, err := s.probe.metrics(); err == nil {
		sm.BrokerMetrics = m
		if v, ok := m["go_goroutines"]; ok {
			sm.BrokerGoroutine = v
		}
		if v, ok := m["go_memstats_heap_inuse_bytes"]; ok {
			sm.BrokerHeapMB = v / (1 << 20)
		}
		if v, ok := m["go_memstats_heap_objects"]; ok {
			sm.BrokerHeapObjects = v
		}
	}
	return sm
}

// soakStability compares the first window (of length window, after the
// warm-up) and the last window of the publishing phase, which lasted pubS
// seconds.
func soakStability(samples []SoakSample, warmup, window time.Duration, pubS float64) SoakStability {
	w, wu := window.Seconds(), warmup.Seconds()
	st := SoakStability{WindowS: w, WarmupS: wu}
	var rssF, rssL, gF, gL, thF, thL, hF, hL, oF, oL, lF, lL []float64
	var tail []SoakSample
	for _, s := range samples {
		if s.Phase != "publish" {
			continue
		}
		if s.T > wu && s.T <= wu+w {
			rssF, thF = append(rssF, s.BrokerRSSMB), append(thF, float64(s.BrokerThreads))
			hF, oF = appendKnown(hF, s.BrokerHeapMB), appendKnown(oF, s.BrokerHeapObjects)
			lF = appendKnown(lF, s.BrokerLiveHeapMB)
			if s.BrokerGoroutine >= 0 {
				gF = append(gF, s.BrokerGoroutine)
			}
		}
		if s.T > pubS-w {
			rssL, thL = append(rssL, s.BrokerRSSMB), append(thL, float64(s.BrokerThreads))
			hL, oL = appendKnown(hL, s.BrokerHeapMB), appendKnown(oL, s.BrokerHeapObjects)
			lL = appendKnown(lL, s.BrokerLiveHeapMB)
			if s.BrokerGoroutine >= 0 {
				gL = append(gL, s.BrokerGoroutine)
			}
		}
		if s.T > wu {
			tail = append(tail, s)
		}
	}
	st.LiveHeapFirstMB, st.LiveHeapLastMB = measuredOr(harness.Median(lF), -1), measuredOr(harness.Median(lL), -1)
	st.RSSFirstMedianMB, st.RSSLastMedianMB = harness.Median(rssF), harness.Median(rssL)
	st.GoroutinesFirst, st.GoroutinesLast = harness.Median(gF), harness.Median(gL)
	st.ThreadsFirst, st.ThreadsLast = harness.Median(thF), harness.Median(thL)
	st.HeapFirstMedianMB, st.HeapLastMedianMB = harness.Median(hF), harness.Median(hL)
	st.HeapObjectsFirst, st.HeapObjectsLast = harness.Median(oF), harness.Median(oL)
	st.RSSSlopeMBPer10Min = 600 * slope(tail, func(s SoakSample) float64 { return s.BrokerRSSMB })
	st.GoroutineSlope = 600 * slope(tail, func(s SoakSample) float64 { return s.BrokerGoroutine })
	return st
}

// measuredOr returns v, or none when v is NaN (no samples): JSON has no
// NaN.
func measuredOr(v, none float64) float64 {
	if math.IsNaN(v) {
		return none
	}
	return v
}

// appendKnown appends v unless it is negative (not measured).
func appendKnown(vs []float64, v float64) []float64 {
	if v < 0 {
		return vs
	}
	return append(vs, v)
}

// slope is the least-squares slope of f over the samples' times (per
// second); NaN with fewer than 3 samples.
func slope(samples []SoakSample, f func(SoakSample) float64) float64 {
	if len(samples) < 3 {
		return math.NaN()
	}
	var sx, sy, sxx, sxy float64
	n := float64(len(samples))
	for _, s := range samples {
		x, y := s.T, f(s)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return math.NaN()
	}
	return (n*sxy - sx*sy) / den
}
