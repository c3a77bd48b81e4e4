// Package sites runs scenario set C of docs/scenarios.md across sites on
// real RabbitMQ nodes joined by delayed links: luffymq against RabbitMQ
// federation full mesh, star, random placement and a central cloud broker.
package sites

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/internal/rabbitharness"
)

// Command is the luffy-bench subcommand that runs scenario set C
// (across sites) on real RabbitMQ nodes.
const Command = "sites"

// SitesConfig configures a luffy-bench sites invocation.
type SitesConfig struct {
	// Sites are the sites, one RabbitMQ node (and luffymq) each; cities of
	// scenarios.md §C get its delays. The first is the cloud's central
	// site and the star's hub; the second is the busy site of every
	// scenario.
	Sites     []string `json:"sites"`
	Scenarios []string `json:"scenarios"`
	// Architectures, when not empty, limits every scenario to these.
	Architectures []string `json:"architectures,omitempty"`
	// ServiceTime is a work-queue consumer's time per message.
	ServiceTime time.Duration `json:"service_ns"`
	// ProducerRate is each pub/sub producer's messages per second.
	ProducerRate float64 `json:"producer_msgs_per_s"`
	// ConsumersPerSite is the number of work-queue consumers at each site.
	ConsumersPerSite int `json:"wq_consumers_per_site"`
	// BusySites is how many sites of the work-queue scenarios are busy,
	// from the second on (1 to len(Sites)−1; 0 in results written before
	// it could be more than 1).
	BusySites int `json:"wq_busy_sites,omitempty"`
	// WQDuration is the publishing time of the work-queue scenarios.
	WQDuration time.Duration `json:"wq_duration_ns"`
	// PSDuration is the publishing time of ps-B, ps-P and ps-S.
	PSDuration time.Duration `json:"ps_duration_ns"`
	// PhaseDuration is the length of each of ps-dynamic's six phases.
	PhaseDuration time.Duration `json:"ps_phase_ns"`
	// ReconfigPeriod is the reconfiguration period of reconfig.
	ReconfigPeriod time.Duration `json:"reconfig_period_ns"`
	// Lambda is λ, the placement's penalty for moving a sync site.
	Lambda float64 `json:"lambda"`
	// DrainTimeout bounds the wait for the last messages of a run.
	DrainTimeout time.Duration `json:"drain_timeout_ns"`
	// Window is the width of the latency-over-time windows.
	Window time.Duration `json:"window_ns"`
	// Seed makes workloads and random placement reproducible.
	Seed uint64 `json:"seed"`
	// WQTTLPerMember, WQMaxLengthPerMember, WQUnackedPerMember and
	// WQRetuneInterval are given to every luffymq (--wq-ttl-per-member,
	// --wq-max-length-per-member, --wq-unacked-per-member,
	// --wq-retune-interval). Zero takes the binary's default, the TTL
	// divided by the time scale (ScaledWQ).
	WQTTLPerMember       time.Duration `json:"wq_ttl_per_member_ns"`
	WQMaxLengthPerMember int           `json:"wq_max_length_per_member"`
	WQUnackedPerMember   int           `json:"wq_unacked_per_member"`
	WQRetuneInterval     time.Duration `json:"wq_retune_interval_ns"`
	// WQStateInterval is given to luffymq's and luffymq-nearest's brokers
	// (--wq-state-interval) when not zero; zero keeps the binary's
	// default, not scaled.
	WQStateInterval time.Duration `json:"wq_state_interval_ns,omitempty"`
	// MemberAckInterval is how often the work-queue members (plain
	// paho.golang clients) send their acknowledgements
	// (paho.ClientConfig.SendAcksInterval); zero in results written before
	// it could be set, which used 1 ms.
	MemberAckInterval time.Duration `json:"member_ack_interval_ns,omitempty"`
	// LuffyMQ is the luffymq binary ("" builds ./cmd/luffymq).
	LuffyMQ string `json:"-"`
	// Controller is the luffy-controller binary of the reconfig runs (""
	// builds ./cmd/luffy-controller).
	Controller string `json:"-"`
	controller string // the binary in use
	// Trace writes, for each work-queue run, trace-<run>.csv in Out: one
	// line per message started (writeWQTrace).
	Trace bool `json:"-"`
	// Out receives sites.json, summary.md, the plots and logs/.
	Out      string    `json:"-"`
	Progress io.Writer `json:"-"`
}

// DefaultSitesConfig is the full run: 4 sites, every scenario, about
// 10 minutes on 2 cores.
func DefaultSitesConfig() SitesConfig {
	return SitesConfig{
		Sites:            []string{"berlin", "tunis", "montreal", "tokyo"},
		Scenarios:        slices.Clone(SitesScenarios),
		ServiceTime:      100 * time.Millisecond,
		ProducerRate:     10,
		ConsumersPerSite: 2,
		BusySites:        1,
		WQDuration:       10 * time.Second,
		PSDuration:       5 * time.Second,
		PhaseDuration:    5 * time.Second,
		ReconfigPeriod:   3 * time.Second,
		Lambda:           100,
		DrainTimeout:     30 * time.Second,
		Window:           500 * time.Millisecond,
		Seed:             1,
		// Acknowledge as soon as processing ends, as the AMQP consumers
		// do; paho.golang's own default batches them every 50 ms
		// (PahoDefaultAckInterval).
		MemberAckInterval: time.Millisecond,
	}
}

// PahoDefaultAckInterval is paho.golang's default SendAcksInterval: a
// member that keeps it sends the acknowledgements of what it processed in
// batches, this often.
const PahoDefaultAckInterval = 50 * time.Millisecond

// timeFactor is how many times faster than the thesis's the run goes: its
// 1 s service time over ServiceTime.
func (c SitesConfig) timeFactor() float64 { return float64(time.Second) / float64(c.ServiceTime) }

// scaleText is a time scale as the reports show it, to two decimals: 1 s
// over 333 ms is 3×, not 3.003003…×.
func scaleText(f float64) string { return harness.TrimFloat(math.Round(f*100) / 100) }

// ScaledWQ returns c with every zero work-queue constant set to luffymq's
// default (bridge.Default…), the TTL per member divided by the time scale
// (to the millisecond): it is the time a message waits at its site,
// measured in service times. Counts are not scaled: at ten times the rate
// and a tenth of the wait a queue holds as many messages. Nor is the
// retune interval: each retune rewrites the work queue's policy and the
// consistent-hash weights, which federation carries to the other sites
// over WAN links whose delays are not scaled (round trips up to 240 ms),
// and retuning every 100 ms to 500 ms made luffymq slower than every 1 s
// in trial runs of wq-balanced (see docs/benchmarks.md, Across sites).
func (c SitesConfig) ScaledWQ() SitesConfig {
	scaled := func(d time.Duration) time.Duration {
		if c.ServiceTime <= 0 {
			return d
		}
		return max(time.Duration(float64(d)/c.timeFactor()).Round(time.Millisecond), time.Millisecond)
	}
	if c.WQTTLPerMember == 0 {
		c.WQTTLPerMember = scaled(bridge.DefaultTTLPerMember)
	}
	if c.WQRetuneInterval == 0 {
		c.WQRetuneInterval = bridge.DefaultRetuneInterval
	}
	if c.WQMaxLengthPerMember == 0 {
		c.WQMaxLengthPerMember = bridge.DefaultMaxLengthPerMember
	}
	if c.WQUnackedPerMember == 0 {
		c.WQUnackedPerMember = bridge.DefaultUnackedPerMember
	}
	return c
}

// luffyMQWQFlags are the flags that give every luffymq the run's
// work-queue constants.
func (c SitesConfig) luffyMQWQFlags() []string {
	c = c.ScaledWQ()
	return []string{
		flagWQTTL, c.WQTTLPerMember.String(),
		flagWQMaxLength, strconv.Itoa(c.WQMaxLengthPerMember),
		flagWQUnacked, strconv.Itoa(c.WQUnackedPerMember),
		flagWQRetune, c.WQRetuneInterval.String(),
	}
}

// luffymq's work-queue flags.
const (
	flagWQTTL       = "--wq-ttl-per-member"
	flagWQMaxLength = "--wq-max-length-per-member"
	flagWQUnacked   = "--wq-unacked-per-member"
	flagWQRetune    = "--wq-retune-interval"
	flagWQTTLOnly   = "--wq-ttl-overflow-only"
	flagWQRoute     = "--wq-route"
	// flagWQStateInterval is given only when SitesConfig.WQStateInterval
	// is set.
	flagWQStateInterval = "--wq-state-interval"
)

// errWQFlagsUnsupported reports a luffymq binary without the work-queue
// flags.
func errWQFlagsUnsupported(bin string) error {
	var missing []string
	for f, ok := range luffyMQFlags(bin, flagWQTTL, flagWQMaxLength, flagWQUnacked, flagWQRetune, flagWQTTLOnly, flagWQRoute) {
		if !ok {
			missing = append(missing, f)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	return fmt.Errorf("--luffymq %s lacks %s: the run gives every broker its time-scaled work-queue constants; build luffymq from this tree", bin, strings.Join(missing, ", "))
}

// describeWQ states the work-queue constants given to luffymq.
func (c SitesConfig) describeWQ() string {
	c = c.ScaledWQ()
	return fmt.Sprintf("luffymq's work queues get wq TTL per member %s at %s× scale (default %s), retune interval %s (default %s), max length %d and unacked %d per member",
		fmtFlagDur(c.WQTTLPerMember), scaleText(c.timeFactor()), fmtFlagDur(bridge.DefaultTTLPerMember), fmtFlagDur(c.WQRetuneInterval), fmtFlagDur(bridge.DefaultRetuneInterval),
		c.WQMaxLengthPerMember, c.WQUnackedPerMember)
}

// fmtFlagDur writes a duration in ms below a second ("50 ms"), else in s.
func fmtFlagDur(d time.Duration) string {
	if d < time.Second {
		return harness.TrimFloat(float64(d)/float64(time.Millisecond)) + " ms"
	}
	return harness.TrimFloat(d.Seconds()) + " s"
}

// validate checks the configuration's bounds.
func (c SitesConfig) validate() error {
	if c.Out == "" {
		return errors.New("--out DIR is required")
	}
	if len(c.Sites) < 2 || len(c.Sites) > 5 {
		return fmt.Errorf("--sites: give 2 to 5 sites, not %d", len(c.Sites))
	}
	for i, s := range c.Sites {
		if slices.Contains(c.Sites[:i], s) {
			return fmt.Errorf("--sites: %s given twice", s)
		}
	}
	if len(c.Scenarios) == 0 {
		return errors.New("no scenario to run")
	}
	for _, s := range c.Scenarios {
		if !slices.Contains(SitesScenarios, s) {
			return fmt.Errorf("unknown scenario %q; choose from %s", s, strings.Join(SitesScenarios, ", "))
		}
	}
	all := map[string]bool{}
	for _, s := range SitesScenarios {
		for _, a := range append(sitesArchitectures(s), sitesOnRequest(s)...) {
			all[a] = true
		}
	}
	for _, a := range c.Architectures {
		if !all[a] {
			return fmt.Errorf("unknown architecture %q", a)
		}
	}
	if c.ServiceTime < 10*time.Millisecond || c.ServiceTime > 2*time.Second {
		return fmt.Errorf("--service %s: want 10ms to 2s", c.ServiceTime)
	}
	if c.ProducerRate <= 0 || c.ProducerRate > 200 {
		return fmt.Errorf("--rate %v: want more than 0 and up to 200 msgs/s", c.ProducerRate)
	}
	if c.ConsumersPerSite < 1 || c.ConsumersPerSite > 20 {
		return fmt.Errorf("--consumers %d: want 1 to 20", c.ConsumersPerSite)
	}
	if c.BusySites < 1 || c.BusySites >= len(c.Sites) {
		return fmt.Errorf("--busy-sites %d: want 1 to %d (one fewer than the %d sites)", c.BusySites, len(c.Sites)-1, len(c.Sites))
	}
	for name, d := range map[string]time.Duration{"--wq-duration": c.WQDuration, "--ps-duration": c.PSDuration, "--phase": c.PhaseDuration} {
		if d < 500*time.Millisecond || d > 10*time.Minute {
			return fmt.Errorf("%s %s: want 500ms to 10m", name, d)
		}
	}
	if c.ReconfigPeriod < 500*time.Millisecond || c.ReconfigPeriod > time.Minute {
		return fmt.Errorf("--reconfig-period %s: want 500ms to 1m", c.ReconfigPeriod)
	}
	if c.Lambda < 0 {
		return fmt.Errorf("--lambda %v: want 0 or more", c.Lambda)
	}
	if c.DrainTimeout <= 0 || c.Window <= 0 {
		return errors.New("--drain-timeout and --window must be positive")
	}
	wq := c.ScaledWQ()
	if wq.WQTTLPerMember < time.Millisecond || wq.WQRetuneInterval < bridge.MinRetuneInterval {
		return fmt.Errorf("%s %s, %s %s: want 1ms or more and %s or more", flagWQTTL, wq.WQTTLPerMember, flagWQRetune, wq.WQRetuneInterval, bridge.MinRetuneInterval)
	}
	if wq.WQMaxLengthPerMember < 0 || wq.WQUnackedPerMember < 0 {
		return fmt.Errorf("%s %d, %s %d: want positive counts (0: luffymq's default)", flagWQMaxLength, wq.WQMaxLengthPerMember, flagWQUnacked, wq.WQUnackedPerMember)
	}
	if c.WQStateInterval != 0 && c.WQStateInterval < bridge.MinStateInterval {
		return fmt.Errorf("%s %s: want %s or more (0: luffymq's default)", flagWQStateInterval, c.WQStateInterval, bridge.MinStateInterval)
	}
	if c.MemberAckInterval < 0 {
		return fmt.Errorf("--member-ack-interval %s: want a positive interval (paho's default is %s)", c.MemberAckInterval, PahoDefaultAckInterval)
	}
	return nil
}

// TimeScale states how the run's time relates to the thesis's.
func (c SitesConfig) TimeScale() string {
	f := float64(time.Second) / float64(c.ServiceTime)
	if f == 1 {
		return fmt.Sprintf("at the thesis's own time scale: consumers take %s per message, producers send %s msg/s, the reconfiguration period is %s (the thesis used 2 min), %s; one-way delays of scenarios.md §C",
			c.ServiceTime, harness.TrimFloat(c.ProducerRate), c.ReconfigPeriod, c.describeWQ())
	}
	return fmt.Sprintf("time scaled %s× down from the thesis: consumers take %s per message instead of 1 s, producers send %s msg/s instead of %s, the reconfiguration period is %s instead of 30 s (benchmark setting of issue 8; the thesis used 2 min), %s; network delays are not scaled (one-way delays of scenarios.md §C)",
		scaleText(f), c.ServiceTime, harness.TrimFloat(c.ProducerRate), harness.TrimFloat(c.ProducerRate/f), c.ReconfigPeriod, c.describeWQ())
}

// SiteOverlay is one site's overlay traffic during a run's measurement.
type SiteOverlay struct {
	Site string `json:"site"`
	// MessagesOut counts messages this site sent to other sites: delivered
	// over federation links it is the upstream of (RabbitMQ channel
	// statistics of the federation connections, sampled each second), or
	// for the cloud, client messages crossing the WAN from this site.
	MessagesOut int64 `json:"messages_out"`
	// BytesOut and BytesIn count every byte over the WAN links (federation
	// and client connections, AMQP framing included).
	BytesOut int64 `json:"bytes_out"`
	BytesIn  int64 `json:"bytes_in"`
}

// SitesRun is one architecture on one scenario.
type SitesRun struct {
	Scenario     string `json:"scenario"`
	Architecture string `json:"architecture"`
	// Clients says how the clients connect.
	Clients string `json:"clients"`
	// Plan maps each exchange to its synchronisation site (the final plan
	// of a reconfig run).
	Plan        map[string]string `json:"plan,omitempty"`
	PlanChanges []SitesPlanChange `json:"plan_changes,omitempty"`
	// FederationLinks counts the running federation links of every node
	// once the run was set up.
	FederationLinks int `json:"federation_links"`
	// Published counts measured messages their broker accepted;
	// PublishFailed those it refused or never answered.
	Published     int `json:"published"`
	PublishFailed int `json:"publish_failed"`
	// Expected counts deliveries owed (pub/sub: every subscriber of the
	// exchange; work queue: one processing per message).
	Expected  int `json:"expected"`
	Delivered int `json:"delivered"`
	// Lost counts deliveries owed and not made when the drain ended.
	// QueuedAtEnd (work queues) counts the messages then still in the
	// nodes' work-queue queues (wq.*, intakes, their federation links):
	// a drain waits for them up to its timeout, so lost messages with a
	// backlog left are late, not gone.
	Lost        int `json:"lost"`
	QueuedAtEnd int `json:"queued_at_end,omitempty"`
	Duplicated  int `json:"duplicated"`
	Unexpected  int `json:"unexpected"`
	// Remote counts first deliveries (processings) at a site other than
	// the publisher's.
	Remote        int          `json:"remote"`
	Latency       SitesLatency `json:"latency"`
	LocalLatency  SitesLatency `json:"local_latency"`
	RemoteLatency SitesLatency `json:"remote_latency"`
	// Oracle is wqOracle on this run's publishes (work queues only): the
	// latencies of a scheduler that knows every consumer's state and pays
	// only the network.
	Oracle *SitesLatency `json:"oracle,omitempty"`
	// Routes splits work-queue processings by where they were published
	// and where they were processed.
	Routes []SitesRoute `json:"routes,omitempty"`
	// Quantiles are the 0th to 100th latency percentiles in ms.
	Quantiles []float64     `json:"quantiles_ms,omitempty"`
	OverTime  []SitesWindow `json:"over_time,omitempty"`
	Overlay   []SiteOverlay `json:"overlay"`
	// StatesSent and StateRequestsSent count, for luffymq's work queues,
	// the group states its brokers sent to other sites and their requests
	// for states (federation carries each request to every other site)
	// while the run published and drained: the part of the overlay
	// messages that is not work.
	StatesSent        int64 `json:"states_sent,omitempty"`
	StateRequestsSent int64 `json:"state_requests_sent,omitempty"`
	// StateFlows splits StatesSent by "from → to" site; StateReasons, by
	// why they were sent (change, idle, heartbeat, lease).
	StateFlows   map[string]int64 `json:"state_flows,omitempty"`
	StateReasons map[string]int64 `json:"state_reasons,omitempty"`
	// PublisherLagMaxMs is the longest a publication left after its
	// scheduled time.
	PublisherLagMaxMs float64               `json:"publisher_lag_max_ms"`
	Reconfig          *SitesReconfigFigures `json:"reconfig,omitempty"`
	// ResetSeconds, SetupSeconds and TeardownSeconds are the run's
	// overheads: emptying the nodes, starting brokers, links and clients
	// up to the end of the warm-up, stopping them.
	ResetSeconds    float64  `json:"reset_s"`
	SetupSeconds    float64  `json:"setup_s"`
	TeardownSeconds float64  `json:"teardown_s"`
	WallSeconds     float64  `json:"wall_s"`
	Notes           []string `json:"notes,omitempty"`
	Error           string   `json:"error,omitempty"`

	points []latencyPoint
}

// SitesRoute is one route of work-queue messages: published at From,
// processed at To.
type SitesRoute struct {
	From   string  `json:"from"`
	To     string  `json:"to"`
	Count  int     `json:"count"`
	MeanMs float64 `json:"mean_ms"`
}

// SitesWorkload describes one scenario's clients.
type SitesWorkload struct {
	Scenario string      `json:"scenario"`
	WQ       *wqWorkload `json:"work_queue,omitempty"`
	PS       *psWorkload `json:"pubsub,omitempty"`
}

// SitesResults is sites.json.
type SitesResults struct {
	Generated time.Time           `json:"generated"`
	Machine   harness.MachineInfo `json:"machine"`
	Config    SitesConfig         `json:"config"`
	TimeScale string              `json:"time_scale"`
	// DelaysMs is the one-way delay matrix of the WAN links.
	DelaysMs  map[string]map[string]float64 `json:"delays_ms"`
	RabbitMQ  string                        `json:"rabbitmq"`
	Notes     []string                      `json:"notes"`
	Workloads []SitesWorkload               `json:"workloads"`
	Runs      []SitesRun                    `json:"runs"`
}

// finite returns a copy of res whose NaNs are -1 (JSON has no NaN).
func (res *SitesResults) finite() *SitesResults {
	c := *res
	c.Runs = make([]SitesRun, len(res.Runs))
	for i, r := range res.Runs {
		r.Latency, r.LocalLatency, r.RemoteLatency = r.Latency.finite(), r.LocalLatency.finite(), r.RemoteLatency.finite()
		c.Runs[i] = r
	}
	return &c
}

// unfinite turns the -1 of loaded JSON back into NaN.
func (res *SitesResults) unfinite() {
	for i := range res.Runs {
		r := &res.Runs[i]
		r.Latency, r.LocalLatency, r.RemoteLatency = r.Latency.unfinite(), r.LocalLatency.unfinite(), r.RemoteLatency.unfinite()
	}
}

// sitesRunsFor returns the architectures cfg runs for scenario.
func (c SitesConfig) sitesRunsFor(scenario string) []string {
	archs := sitesArchitectures(scenario)
	if len(c.Architectures) == 0 {
		return archs
	}
	var out []string
	for _, a := range append(archs, sitesOnRequest(scenario)...) {
		if slices.Contains(c.Architectures, a) {
			out = append(out, a)
		}
	}
	return out
}

// RunSites runs set C and writes sites.json, summary.md and the plots into
// cfg.Out.
func RunSites(ctx context.Context, cfg SitesConfig) error {
	cfg, cleanup, err := prepareSites(ctx, cfg)
	if err != nil {
		return err
	}
	defer cleanup()
	fmt.Fprintf(cfg.Progress, "starting %d RabbitMQ nodes (%s) …\n", len(cfg.Sites), strings.Join(cfg.Sites, ", "))
	began := time.Now()
	env, err := startSitesEnv(ctx, cfg.Sites, cfg.LuffyMQ, filepath.Join(cfg.Out, "logs"), rabbitharness.CityDelay)
	if err != nil {
		return err
	}
	defer env.Close()
	fmt.Fprintf(cfg.Progress, "nodes up in %s\n", harness.FmtDur(time.Since(began)))
	_, err = runSitesOn(ctx, cfg, env)
	return err
}

// prepareSites checks cfg, creates cfg.Out and its logs/, and finds (or
// builds) the binaries: the returned cfg's LuffyMQ (and controller, when
// reconfig runs) are paths to use. cleanup removes what was built.
func prepareSites(ctx context.Context, cfg SitesConfig) (SitesConfig, func(), error) {
	cfg = cfg.ScaledWQ()
	nothing := func() {}
	if err := cfg.validate(); err != nil {
		return cfg, nothing, err
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if err := rabbitharness.Available(); err != nil {
		return cfg, nothing, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.Out, "logs"), 0o755); err != nil {
		return cfg, nothing, fmt.Errorf("output directory: %w", err)
	}
	bin, cleanBin, err := harness.LuffyMQBinary(ctx, cfg.LuffyMQ, cfg.Progress)
	if err != nil {
		return cfg, nothing, err
	}
	if _, err := os.Stat(bin); err != nil {
		cleanBin()
		return cfg, nothing, fmt.Errorf("--luffymq %s: %w", bin, err)
	}
	if err := errWQFlagsUnsupported(bin); err != nil {
		cleanBin()
		return cfg, nothing, err
	}
	cfg.LuffyMQ = bin
	if !slices.Contains(cfg.Scenarios, SitesReconfig) || len(cfg.sitesRunsFor(SitesReconfig)) == 0 {
		return cfg, cleanBin, nil
	}
	ctl, cleanCtl, err := controllerBinary(ctx, cfg.Controller, cfg.Progress)
	if err != nil {
		cleanBin()
		return cfg, nothing, err
	}
	cfg.controller = ctl
	return cfg, func() { cleanCtl(); cleanBin() }, nil
}

// runSitesOn runs cfg's scenarios on env, whose nodes are cfg.Sites, and
// writes sites.json, summary.md and the plots into cfg.Out (its logs into
// cfg.Out/logs). cfg comes from prepareSites.
func runSitesOn(ctx context.Context, cfg SitesConfig, env *sitesEnv) (*SitesResults, error) {
	began := time.Now()
	res := &SitesResults{Machine: harness.DescribeMachine(""), Config: cfg, TimeScale: cfg.TimeScale(), RabbitMQ: rabbitMQVersion(),
		DelaysMs: map[string]map[string]float64{}, Notes: sitesNotes(cfg)}
	for _, a := range cfg.Sites {
		res.DelaysMs[a] = map[string]float64{}
		for _, b := range cfg.Sites {
			res.DelaysMs[a][b] = harness.Millis(rabbitharness.CityDelay(a, b))
		}
	}
	for _, sc := range cfg.Scenarios {
		wl := SitesWorkload{Scenario: sc}
		if isWorkQueue(sc) {
			w, err := newWQWorkload(sc, cfg.Sites, cfg.ConsumersPerSite, cfg.BusySites, cfg.ServiceTime, cfg.WQDuration)
			if err != nil {
				return nil, err
			}
			wl.WQ = &w
		} else {
			phase := cfg.PSDuration
			if sc == SitesPSDynamic || sc == SitesReconfig {
				phase = cfg.PhaseDuration
			}
			w, err := newPSWorkload(sc, cfg.Sites, cfg.Seed, phase, cfg.ProducerRate)
			if err != nil {
				return nil, err
			}
			wl.PS = &w
		}
		res.Workloads = append(res.Workloads, wl)
	}
	env.luffymq, env.logDir = cfg.LuffyMQ, filepath.Join(cfg.Out, "logs")
	env.brokerFlags = cfg.luffyMQWQFlags()
	fmt.Fprintf(cfg.Progress, "%s (%s)\n", cfg.describeWQ(), strings.Join(env.brokerFlags, " "))
	r := &sitesRunner{cfg: cfg, env: env, delays: delayMatrix(cfg.Sites, rabbitharness.CityDelay), progress: cfg.Progress}
	type job struct{ scenario, arch string }
	var jobs []job
	for _, sc := range cfg.Scenarios {
		for _, a := range cfg.sitesRunsFor(sc) {
			jobs = append(jobs, job{sc, a})
		}
	}
	jsonPath := filepath.Join(cfg.Out, "sites.json")
	for k, j := range jobs {
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(cfg.Progress, "[%d/%d] %s · %s · elapsed %s\n", k+1, len(jobs), j.scenario, j.arch, harness.FmtDur(time.Since(began)))
		run := r.run(ctx, j.scenario, j.arch)
		fmt.Fprintf(cfg.Progress, "      links %d · published %d · lost %d/%d · dup %d · mean %s ms · p50 %s · p99 %s · setup %.1f s %s\n",
			run.FederationLinks, run.Published, run.Lost, run.Expected, run.Duplicated, harness.FmtMs(run.Latency.Mean), harness.FmtMs(run.Latency.P50),
			harness.FmtMs(run.Latency.P99), run.SetupSeconds, run.Error)
		res.Runs = append(res.Runs, run)
		res.Generated = time.Now().UTC()
		if err := harness.WriteJSON(jsonPath, res.finite()); err != nil {
			return nil, err
		}
	}
	if err := writeSitesReport(cfg.Out, res); err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("interrupted; partial results in %s", cfg.Out)
	}
	fmt.Fprintf(cfg.Progress, "done in %s: %s, %s\n", harness.FmtDur(time.Since(began)), jsonPath, filepath.Join(cfg.Out, "summary.md"))
	return res, nil
}

// rabbitMQVersion returns the version of the installed RabbitMQ package,
// from its plugins directory name.
func rabbitMQVersion() string {
	matches, _ := filepath.Glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*")
	if len(matches) == 0 {
		return ""
	}
	return strings.TrimPrefix(filepath.Base(matches[0]), "rabbitmq_server-")
}

// sitesNotes are the general notes of sites.json and summary.md.
func sitesNotes(cfg SitesConfig) []string {
	return []string{
		fmt.Sprintf("%d sites on this machine, each a real RabbitMQ node (own ports, data, Erlang VM with one scheduler); every inter-site connection — federation links and, for the cloud, clients at other sites — goes through a toxiproxy latency proxy with the one-way delay of the matrix in each direction, behind a byte counter. Clients run inside luffy-bench on loopback; a client at a site connects to that site's broker directly.", len(cfg.Sites)),
		"luffymq runs as the real binary, one process per site, bridged to its site's node (--amqp-url, --amqp-management-url, --site). Pub/sub architectures fullmesh, star, random and luffymq use the same luffymq brokers and MQTT clients and differ only in their federation links, set through bridge.ApplyFederation (per-exchange upstreams): fullmesh federates each exchange between all its sites with max-hops 1; the others join each exchange's sites through one synchronisation site with max-hops 2 (algorithms.md §2.2). luffy-bench plays the controller: luffymq's plan is placement.Improved on the scenario's traffic, star puts every sync instance at " + cfg.Sites[0] + ", random at a random site of the exchange (seeded).",
		fmt.Sprintf("reconfig runs the real control plane: luffy-controller (the binary, --period %s, --lambda %s, placement.Improved) reads every node's management API and publishes each site's configuration message to luffymq.config.<site> when the plan changes; each luffymq's site agent (--federation-max-hops 2) applies it, adding the new links before removing the old ones, and the old upstream's agent re-publishes what a removed link held (luffymq-conserve) or deletes it (luffymq-discard, --federation-discard-held). luffy-bench sends the first configuration (placement.Improved on the first phase's traffic) through the same queues; the controller stops when publishing ends.", cfg.ReconfigPeriod, harness.TrimFloat(cfg.Lambda)),
		"Plain-RabbitMQ baselines (queue-federation, cloud, cloud-dist) use AMQP 0-9-1 clients (amqp091-go) directly, not MQTT: RabbitMQ's MQTT plugin is not among the plugins the harness enables, and AMQP is RabbitMQ's native path. Publishers use publisher confirms and persistent messages, as the luffymq bridge does towards RabbitMQ.",
		fmt.Sprintf("luffymq's work-queue members are plain paho.golang MQTT v5 clients (QoS 1, manual acknowledgement after processing, one message at a time, no LuffyMQ SDK) sending their acknowledgements every %s (paho's SendAcksInterval; its default is %s).", cfg.memberAckInterval(), PahoDefaultAckInterval),
		"Latency = receipt time (pub/sub) or start of processing (work queue) − send time, both read on this machine's clock. Lost = accepted by the broker (PUBACK or confirm) and never received by a subscriber owed it (pub/sub: every subscriber of the exchange, all subscribed before measuring starts) or never processed (work queue). Before measuring, every producer sends warm-up messages until every subscriber owed them has one (work queue: until someone processed one).",
		wqNote(cfg),
		"Overlay messages per site: messages the site's RabbitMQ delivered over federation links it is the upstream of (channel statistics of the federation connections, read every second); for the cloud, client messages that crossed the WAN from that site. Overlay bytes: every byte through the site's WAN links in each direction.",
	}
}

// wqNote is the note on luffymq's work-queue constants.
func wqNote(cfg SitesConfig) string {
	c := cfg.ScaledWQ()
	note := fmt.Sprintf("Every luffymq gets %s. Eq. 2.12's C for the TTL is time-scaled like the workload: %s per available member (the binary's default is %s), so a message may wait %s per idle member at its site before it overflows, %s service times, as the default does at the thesis's 1 s. The max length (%d per available member) and the unacknowledged messages per member (%d) are counts, which time scaling leaves unchanged.",
		strings.Join(cfg.luffyMQWQFlags(), " "), fmtFlagDur(c.WQTTLPerMember), fmtFlagDur(bridge.DefaultTTLPerMember), fmtFlagDur(c.WQTTLPerMember),
		harness.TrimFloat(c.WQTTLPerMember.Seconds()/c.ServiceTime.Seconds()), c.WQMaxLengthPerMember, c.WQUnackedPerMember)
	if c.WQRetuneInterval == bridge.DefaultRetuneInterval {
		note += fmt.Sprintf(" The retune interval stays the default %s: each retune rewrites the queue's policy and consistent-hash weights, which federation carries over WAN links whose delays are not scaled.", fmtFlagDur(c.WQRetuneInterval))
	} else {
		note += fmt.Sprintf(" The policy and weights are retuned every %s (the default is %s).", fmtFlagDur(c.WQRetuneInterval), fmtFlagDur(bridge.DefaultRetuneInterval))
	}
	note += " luffymq runs with its default " + flagWQRoute + " nearest: each publish goes to the site whose members would start it soonest, one-way delay included (every site publishes its group state over federation about every 100 ms while another asks for it); " +
		ArchLuffyMQRing + " is the same brokers with " + flagWQRoute + " ring: a message its site's members would not start within the TTL goes to the dead-letter exchange's consistent-hash ring at once; " +
		ArchLuffyMQTTLOnly + " is the same brokers with " + flagWQTTLOnly + ", the thesis's rule: a message leaves wq.jobs only when its TTL expires or the queue is full."
	return note
}

// sitesCommand parses `luffy-bench sites` flags and runs it.
func sitesCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	d := DefaultSitesConfig()
	fs := flag.NewFlagSet("luffy-bench "+Command, flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "output directory (required): sites.json, summary.md, sites-*.png, logs/")
	sites := fs.String("sites", strings.Join(d.Sites, ","), "comma-separated sites, 2 to 5 (berlin, tunis, montreal, mexico-city, tokyo get the delays of scenarios.md §C); the first is the cloud's site and the star's hub, the second the busy site")
	scenarios := fs.String("scenario", strings.Join(d.Scenarios, ","), "comma-separated scenarios: "+strings.Join(SitesScenarios, ", "))
	archs := fs.String("architectures", "", "comma-separated architectures to run (default: each scenario's all)")
	luffymq := fs.String("luffymq", "", "luffymq binary (default: build ./cmd/luffymq of the current module)")
	controller := fs.String("luffy-controller", "", "luffy-controller binary for reconfig (default: build ./cmd/luffy-controller of the current module)")
	service := fs.Duration("service", d.ServiceTime, "work-queue consumer's processing time per message (the thesis's 1 s, scaled)")
	rate := fs.Float64("rate", d.ProducerRate, "pub/sub producer's messages per second (the thesis's 1, scaled)")
	consumers := fs.Int("consumers", d.ConsumersPerSite, "work-queue consumers per site")
	busy := fs.Int("busy-sites", d.BusySites, "busy sites of wq-local and wq-balanced, from the second site on (wq-balanced with more than one: together they bring all consumers to 80 % of their capacity)")
	wqDur := fs.Duration("wq-duration", d.WQDuration, "publishing time of wq-local and wq-balanced")
	psDur := fs.Duration("ps-duration", d.PSDuration, "publishing time of ps-B, ps-P and ps-S")
	phase := fs.Duration("phase", d.PhaseDuration, "length of each of ps-dynamic's six phases (and reconfig's)")
	period := fs.Duration("reconfig-period", d.ReconfigPeriod, "reconfiguration period of reconfig (the issue's 30 s, scaled)")
	lambda := fs.Float64("lambda", d.Lambda, "λ, the placement's penalty for moving a synchronisation site")
	drain := fs.Duration("drain-timeout", d.DrainTimeout, "longest wait for the last messages of a run")
	window := fs.Duration("window", d.Window, "width of the latency-over-time windows")
	seed := fs.String("seed", strconv.FormatUint(d.Seed, 10), "seed of the workloads and of random placement")
	wqTTL := fs.Duration("wq-ttl-per-member", 0, "luffymq's "+flagWQTTL+" (0: its default "+bridge.DefaultTTLPerMember.String()+" divided by the time scale)")
	wqMaxLength := fs.Int("wq-max-length-per-member", 0, fmt.Sprintf("luffymq's %s (0: its default, %d)", flagWQMaxLength, bridge.DefaultMaxLengthPerMember))
	wqUnacked := fs.Int("wq-unacked-per-member", 0, fmt.Sprintf("luffymq's %s (0: its default, %d)", flagWQUnacked, bridge.DefaultUnackedPerMember))
	wqRetune := fs.Duration("wq-retune-interval", 0, "luffymq's "+flagWQRetune+" (0: its default, "+bridge.DefaultRetuneInterval.String()+", not scaled)")
	wqState := fs.Duration("wq-state-interval", 0, "luffymq's "+flagWQStateInterval+" for "+ArchLuffyMQ+" and "+ArchLuffyMQNearest+" (0: its default, "+bridge.DefaultStateInterval.String()+", not scaled)")
	ackInterval := fs.Duration("member-ack-interval", d.MemberAckInterval, "how often the work-queue members (plain paho.golang clients acknowledging after processing) send their acknowledgements; paho's default is "+PahoDefaultAckInterval.String())
	trace := fs.Bool("trace", false, "write trace-<scenario>-<architecture>.csv per work-queue run in --out: each message's origin, publish time, the site that started it and when (LUFFY_BENCH_SITES_LOG_LEVEL=debug adds luffymq's route choices, with the router's inputs, to logs/)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	sd, err := strconv.ParseUint(*seed, 10, 64)
	if err != nil {
		return fmt.Errorf("--seed %q: %w", *seed, err)
	}
	cfg := d
	cfg.Out, cfg.LuffyMQ, cfg.Controller, cfg.Progress, cfg.Trace = *out, *luffymq, *controller, stdout, *trace
	cfg.Sites, cfg.Scenarios, cfg.Architectures = harness.SplitList(*sites), harness.SplitList(*scenarios), harness.SplitList(*archs)
	cfg.ServiceTime, cfg.ProducerRate, cfg.ConsumersPerSite, cfg.BusySites = *service, *rate, *consumers, *busy
	cfg.WQDuration, cfg.PSDuration, cfg.PhaseDuration, cfg.ReconfigPeriod = *wqDur, *psDur, *phase, *period
	cfg.Lambda, cfg.DrainTimeout, cfg.Window, cfg.Seed = *lambda, *drain, *window, sd
	cfg.WQTTLPerMember, cfg.WQMaxLengthPerMember, cfg.WQUnackedPerMember, cfg.WQRetuneInterval = *wqTTL, *wqMaxLength, *wqUnacked, *wqRetune
	cfg.WQStateInterval, cfg.MemberAckInterval = *wqState, *ackInterval
	return RunSites(ctx, cfg)
}

// Main runs `luffy-bench sites` with args (without the subcommand's
// name) and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := sitesCommand(ctx, args, stdout, stderr)
	return harness.ExitCode(err, stderr)
}

// memberAckInterval is MemberAckInterval, 1 ms when unset (as every run
// before it could be set).
func (c SitesConfig) memberAckInterval() time.Duration {
	if c.MemberAckInterval <= 0 {
		return time.Millisecond
	}
	return c.MemberAckInterval
}
