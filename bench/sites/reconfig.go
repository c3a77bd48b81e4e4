package sites

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/bridge/placement"
)

// SitesPlanChange is one plan change of a reconfig run, as the controller
// reported it.
type SitesPlanChange struct {
	// AtS is when the change was seen, in seconds from the start of
	// publishing.
	AtS float64 `json:"at_s"`
	// Moved lists the exchanges whose synchronisation site changed, as
	// "exchange: old → new".
	Moved []string `json:"moved"`
}

// SitesReconfigFigures sums up a reconfig run.
type SitesReconfigFigures struct {
	// Rounds counts the controller's rounds during publishing; Changes
	// those that changed the plan; Moves the exchanges moved in all.
	Rounds  int `json:"rounds"`
	Changes int `json:"changes"`
	Moves   int `json:"moves"`
	// SteadyP50Ms is the median latency of messages sent away from any
	// change (more than a period after, or a quarter period before).
	SteadyP50Ms float64 `json:"steady_p50_ms"`
	// NearChange counts first deliveries of messages sent from a quarter
	// period before a change to a period after it; SpikeMaxMs is their
	// largest latency and SpikeAboveSteadyMs its excess over SteadyP50Ms.
	NearChange         int     `json:"near_change"`
	SpikeMaxMs         float64 `json:"spike_max_ms"`
	SpikeAboveSteadyMs float64 `json:"spike_above_steady_ms"`
}

// Flags of the luffymq binary that the reconfig runs need.
const (
	flagDiscardHeld = "--federation-discard-held"
	flagMaxHops     = "--federation-max-hops"
)

// luffyMQFlags reports which of flags the luffymq binary at bin knows, by
// its --help.
func luffyMQFlags(bin string, flags ...string) map[string]bool {
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	have := map[string]bool{}
	for _, f := range flags {
		re := regexp.MustCompile(`(?m)^\s+--?` + regexp.QuoteMeta(strings.TrimLeft(f, "-")) + `(\s|$)`)
		have[f] = re.Match(out)
	}
	return have
}

// errReconfigUnsupported explains why this tree's luffymq cannot run the
// reconfig scenario.
func errReconfigUnsupported(bin string) error {
	have := luffyMQFlags(bin, flagDiscardHeld, flagMaxHops)
	var missing []string
	if !have[flagDiscardHeld] {
		missing = append(missing, flagDiscardHeld+" (conservation of held messages cannot be switched off)")
	}
	if !have[flagMaxHops] {
		missing = append(missing, flagMaxHops+" (the site agent federates with max-hops 1, so a message from a site that is not its exchange's sync site stops at the sync site: the controller's 2·(N−1)-link layout cannot deliver it)")
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("luffymq lacks %s", strings.Join(missing, " and "))
}

// reconfigRun is the control plane of a reconfig run: the luffy-controller
// process, fed with the sites and the delay matrix, publishing each site's
// configuration to the luffymq site agents, which move links with or
// without conserving what the old links hold.
type reconfigRun struct {
	proc   *harness.Process
	status string // the controller's status URL

	mu         sync.Mutex
	plan       map[string]string
	changes    []SitesPlanChange
	times      []time.Duration
	firstRound uint64
	lastRound  uint64
	roundErrs  []string
}

// reconfigLuffyMQFlags returns the extra luffymq flags of arch's runs.
func reconfigLuffyMQFlags(arch string) []string {
	flags := []string{flagMaxHops, "2"}
	if arch == ArchReconfigDiscard {
		flags = append(flags, flagDiscardHeld)
	}
	return flags
}

// initialPlan is the plan the first phase's traffic asks for: what the
// controller would have found after watching it for a period.
func (r *sitesRunner) initialPlan(w psWorkload) (placement.Plan, error) {
	res, err := placement.Improved(w.placementInput(w.ExpectedTraffic([]int{0}), r.delays, nil, r.cfg.Lambda, r.cfg.Seed))
	if err != nil {
		return nil, err
	}
	return res.Plan, nil
}

// siteConfigs turns a federation layout into each site's configuration
// message (algorithms.md §2.6), upstreams reached through the WAN links.
func (e *sitesEnv) siteConfigs(layout federationLayout) (map[string]bridge.SiteConfig, error) {
	out := map[string]bridge.SiteConfig{}
	for _, site := range e.sites {
		c := bridge.SiteConfig{}
		for _, f := range layout[site] {
			for _, up := range f.Upstreams {
				uri, err := e.amqpURL(site, up)
				if err != nil {
					return nil, err
				}
				c[f.Exchange] = append(c[f.Exchange], uri)
			}
		}
		out[site] = c
	}
	return out, nil
}

// sendConfigs publishes each site's configuration to its configuration
// queue, as the controller does.
func (e *sitesEnv) sendConfigs(ctx context.Context, configs map[string]bridge.SiteConfig) error {
	for _, site := range e.sites {
		body, err := configs[site].Marshal()
		if err != nil {
			return fmt.Errorf("configuration of %s: %w", site, err)
		}
		if err := publishToQueue(ctx, e.node(site).AMQPURL(), bridge.ConfigQueueName(site), body); err != nil {
			return fmt.Errorf("configuration message to %s: %w", site, err)
		}
	}
	return nil
}

// controllerSitesFile writes the luffy-controller sites file of the env.
func (e *sitesEnv) controllerSitesFile(path string) error {
	y, err := controllerSitesYAML(e.sites, func(s string) (string, string) { return e.node(s).AMQPURL(), e.node(s).ManagementURL() }, e.amqpURL, e.delay)
	if err != nil {
		return err
	}
	return os.WriteFile(path, []byte(y), 0o600)
}

// controllerSitesYAML renders a luffy-controller sites file: each node as
// the controller reaches it (node), how each site reaches the others
// (upstream: the WAN links) and the delay matrix.
func controllerSitesYAML(sites []string, node func(site string) (amqpURL, mgmtURL string), upstream func(from, to string) (string, error), delay func(a, b string) time.Duration) (string, error) {
	var b strings.Builder
	b.WriteString("# Written by luffy-bench sites for its reconfig runs.\nsites:\n")
	for _, s := range sites {
		amqpURL, mgmtURL := node(s)
		fmt.Fprintf(&b, "  - name: %s\n    amqp_url: %s\n    management_url: %s\n    upstream_urls:\n", s, amqpURL, mgmtURL)
		for _, o := range sites {
			if o == s {
				continue
			}
			uri, err := upstream(s, o)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&b, "      %s: %s\n", o, uri)
		}
	}
	b.WriteString("delays_ms:\n")
	for i, a := range sites {
		var pairs []string
		for _, o := range sites[i+1:] {
			pairs = append(pairs, fmt.Sprintf("%s: %d", o, delay(a, o).Milliseconds()))
		}
		if len(pairs) > 0 {
			fmt.Fprintf(&b, "  %s: {%s}\n", a, strings.Join(pairs, ", "))
		}
	}
	return b.String(), nil
}

// startController starts luffy-controller on the env's sites and watches
// its plan through its status API until Stop.
func (r *sitesRunner) startController(ctx context.Context, run *SitesRun, plan placement.Plan) (*reconfigRun, error) {
	sitesFile := filepath.Join(r.env.logDir, logName(run)+".sites.yaml")
	if err := r.env.controllerSitesFile(sitesFile); err != nil {
		return nil, err
	}
	var statusAddr string
	p, err := harness.StartProcess(ctx, r.cfg.controller, filepath.Join(r.env.logDir, logName(run)+".controller.log"), func(addr string) ([]string, error) {
		statusAddr = addr
		return []string{"--sites", sitesFile, "--period", r.cfg.ReconfigPeriod.String(), "--first-window", r.cfg.ReconfigPeriod.String(),
			"--lambda", harness.TrimFloat(r.cfg.Lambda), "--http", addr}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("luffy-controller: %w", err)
	}
	return &reconfigRun{proc: p, status: "http://" + statusAddr, plan: maps.Clone(plan)}, nil
}

// controllerStatus is the part of luffy-controller's /api/v1/status the
// bench reads.
type controllerStatus struct {
	Rounds    uint64            `json:"rounds"`
	Plan      map[string]string `json:"plan"`
	LastRound *struct {
		Errors []string `json:"errors"`
	} `json:"last_round"`
}

// watch polls the controller's status from start until stop is closed and
// records every plan change.
func (c *reconfigRun) watch(ctx context.Context, start time.Time) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		first := true
		for {
			var st controllerStatus
			if err := getJSON(ctx, c.status+"/api/v1/status", false, &st); err == nil {
				c.observe(st, time.Since(start), first)
				first = false
			}
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

func (c *reconfigRun) observe(st controllerStatus, at time.Duration, first bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if first {
		c.firstRound = st.Rounds
	}
	if st.Rounds > c.lastRound && st.LastRound != nil {
		for _, e := range st.LastRound.Errors {
			if !slices.Contains(c.roundErrs, e) {
				c.roundErrs = append(c.roundErrs, e)
			}
		}
	}
	c.lastRound = max(c.lastRound, st.Rounds)
	if len(st.Plan) == 0 {
		return
	}
	var moved []string
	for _, x := range slices.Sorted(maps.Keys(st.Plan)) {
		if c.plan[x] != st.Plan[x] {
			moved = append(moved, fmt.Sprintf("%s: %s → %s", x, harness.OrDash(c.plan[x]), st.Plan[x]))
		}
	}
	if len(moved) == 0 {
		return
	}
	c.plan = maps.Clone(st.Plan)
	c.changes = append(c.changes, SitesPlanChange{AtS: at.Seconds(), Moved: moved})
	c.times = append(c.times, at)
}

// finish writes the plan changes and the latency figures around them
// into run.
func (c *reconfigRun) finish(run *SitesRun, period time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	run.PlanChanges = c.changes
	run.Plan = c.plan
	f := &SitesReconfigFigures{Rounds: int(c.lastRound - c.firstRound), Changes: len(c.changes)}
	for _, ch := range c.changes {
		f.Moves += len(ch.Moved)
	}
	f.SteadyP50Ms, f.SpikeMaxMs, f.NearChange = steadyAndSpike(run.points, c.times, period)
	f.SpikeAboveSteadyMs = f.SpikeMaxMs - f.SteadyP50Ms
	for _, p := range []*float64{&f.SteadyP50Ms, &f.SpikeMaxMs, &f.SpikeAboveSteadyMs} {
		if math.IsNaN(*p) {
			*p = -1
		}
	}
	run.Reconfig = f
	for _, e := range c.roundErrs {
		run.Notes = append(run.Notes, "controller: "+e)
	}
}

// controllerBinary returns path when set; otherwise it builds
// ./cmd/luffy-controller of the current module into a temporary directory.
func controllerBinary(ctx context.Context, path string, progress io.Writer) (bin string, cleanup func(), err error) {
	if path != "" {
		return path, func() {}, nil
	}
	tmp, err := os.MkdirTemp("", "luffy-bench-controller-")
	if err != nil {
		return "", nil, err
	}
	fmt.Fprintln(progress, "building luffy-controller …")
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(out))
	if err != nil || gomod == "" || gomod == os.DevNull {
		_ = os.RemoveAll(tmp)
		return "", nil, errors.New("cannot build luffy-controller: run luffy-bench inside the luffymq module, or pass --luffy-controller PATH")
	}
	bin = filepath.Join(tmp, "luffy-controller")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/luffy-controller")
	cmd.Dir = filepath.Dir(gomod)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		_ = os.RemoveAll(tmp)
		return "", nil, fmt.Errorf("building luffy-controller: %w: %s (or pass --luffy-controller PATH)", err, harness.LastLine(stderr.Bytes()))
	}
	return bin, func() { _ = os.RemoveAll(tmp) }, nil
}
