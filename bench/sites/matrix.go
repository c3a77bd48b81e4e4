package sites

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot/vg"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/internal/rabbitharness"
)

// MatrixCommand is the luffy-bench subcommand that runs the work-queue
// scenarios of set C over several time scales and topologies (issue 22's
// matrix), repeated, and puts the architectures side by side.
const MatrixCommand = "sites-matrix"

// SitesTopology is one arrangement of sites of the matrix.
type SitesTopology struct {
	Name string `json:"name"`
	// Sites are the sites, one RabbitMQ node each; the second is the busy
	// one (SitesConfig.Sites).
	Sites     []string `json:"sites"`
	Consumers int      `json:"consumers_per_site"`
	// Seed draws the Poisson arrivals.
	Seed uint64 `json:"seed"`
}

// DefaultSitesTopologies are the matrix's topologies: the thesis's four
// sites with Tunis busy; Montréal busy among four with three consumers a
// site; and three sites with the farthest, Tokyo, busy. Each has its own
// seed.
var DefaultSitesTopologies = []SitesTopology{
	{Name: "tunis-busy-4", Sites: []string{"berlin", "tunis", "montreal", "tokyo"}, Consumers: 2, Seed: 1},
	{Name: "montreal-busy-4", Sites: []string{"berlin", "montreal", "tunis", "tokyo"}, Consumers: 3, Seed: 2},
	{Name: "tokyo-busy-3", Sites: []string{"tunis", "tokyo", "montreal"}, Consumers: 2, Seed: 3},
}

// SitesMatrixConfig configures a luffy-bench sites-matrix invocation.
type SitesMatrixConfig struct {
	Topologies []SitesTopology `json:"topologies"`
	// Scales are the time scales: consumers take 1 s / scale a message.
	Scales    []float64 `json:"scales"`
	Scenarios []string  `json:"scenarios"`
	// Architectures are run in every cell; queue federation is the
	// reference of the ratios.
	Architectures []string `json:"architectures"`
	// Repeat is how many times each cell runs (medians are reported).
	Repeat int `json:"repeat"`
	// ServiceTimes is how long each run publishes, in service times; at
	// least MinDuration.
	ServiceTimes float64       `json:"service_times"`
	MinDuration  time.Duration `json:"min_duration_ns"`
	// Primary is the luffymq architecture the goals are checked for.
	Primary string `json:"primary"`
	// WQStateInterval is SitesConfig.WQStateInterval for every cell.
	WQStateInterval time.Duration `json:"wq_state_interval_ns,omitempty"`
	// MemberAckInterval is SitesConfig.MemberAckInterval for every cell
	// (0: 1 ms).
	MemberAckInterval time.Duration `json:"member_ack_interval_ns,omitempty"`
	// LuffyMQ is the luffymq binary ("" builds ./cmd/luffymq).
	LuffyMQ  string    `json:"-"`
	Out      string    `json:"-"`
	Progress io.Writer `json:"-"`
}

// DefaultSitesMatrixConfig is the matrix make bench-sites runs.
func DefaultSitesMatrixConfig() SitesMatrixConfig {
	return SitesMatrixConfig{
		Topologies:    slices.Clone(DefaultSitesTopologies),
		Scales:        []float64{1, 3, 10},
		Scenarios:     []string{SitesWQBalanced, SitesWQLocal},
		Architectures: []string{ArchLuffyMQ, ArchLuffyMQRing, ArchLuffyMQTTLOnly, ArchQueueFederation, ArchCloud},
		Repeat:        1,
		ServiceTimes:  30,
		MinDuration:   10 * time.Second,
		Primary:       ArchLuffyMQ,
	}
}

// duration is the publishing time at scale.
func (c SitesMatrixConfig) duration(scale float64) time.Duration {
	return max(time.Duration(c.ServiceTimes*float64(time.Second)/scale).Round(time.Second), c.MinDuration)
}

func (c SitesMatrixConfig) validate() error {
	if len(c.Topologies) == 0 || len(c.Scales) == 0 || len(c.Scenarios) == 0 {
		return errors.New("sites-matrix needs at least one topology, scale and scenario")
	}
	for _, s := range c.Scales {
		if !(s > 0 && s <= 100) {
			return fmt.Errorf("--scales: %v is not a time scale between 0 and 100", s)
		}
	}
	for _, sc := range c.Scenarios {
		if !isWorkQueue(sc) {
			return fmt.Errorf("--scenario %s: the matrix runs work-queue scenarios only (%s, %s)", sc, SitesWQBalanced, SitesWQLocal)
		}
	}
	if !slices.Contains(c.Architectures, ArchQueueFederation) {
		return fmt.Errorf("--architectures must include %s, the reference", ArchQueueFederation)
	}
	if !slices.Contains(c.Architectures, c.Primary) {
		return fmt.Errorf("--primary %s is not among --architectures", c.Primary)
	}
	if c.Repeat < 1 || c.Repeat > 9 {
		return fmt.Errorf("--repeat %d: want 1 to 9", c.Repeat)
	}
	if c.Out == "" {
		return errors.New("--out is required")
	}
	return nil
}

// cellConfig is the sites configuration of one run of a cell.
func (c SitesMatrixConfig) cellConfig(t SitesTopology, scale float64, repeat int) SitesConfig {
	cfg := DefaultSitesConfig()
	cfg.Sites, cfg.ConsumersPerSite, cfg.Seed = slices.Clone(t.Sites), t.Consumers, t.Seed
	cfg.Scenarios, cfg.Architectures = slices.Clone(c.Scenarios), slices.Clone(c.Architectures)
	cfg.ServiceTime = time.Duration(float64(time.Second) / scale).Round(time.Millisecond)
	cfg.WQDuration = c.duration(scale)
	cfg.LuffyMQ, cfg.Progress, cfg.WQStateInterval = c.LuffyMQ, c.Progress, c.WQStateInterval
	if c.MemberAckInterval > 0 {
		cfg.MemberAckInterval = c.MemberAckInterval
	}
	cfg.Out = filepath.Join(c.Out, "runs", fmt.Sprintf("%s-%sx-r%d", t.Name, harness.TrimFloat(scale), repeat+1))
	return cfg
}

// SitesMatrixRun is one architecture's figures in one run of a cell.
type SitesMatrixRun struct {
	Architecture string  `json:"architecture"`
	MeanMs       float64 `json:"mean_ms"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	Published    int     `json:"published"`
	Lost         int     `json:"lost"`
	Duplicated   int     `json:"duplicated"`
	// WANMessages counts the messages the sites sent each other.
	WANMessages int64 `json:"wan_messages"`
	// StatesSent and StateRequestsSent are luffymq's group states sent to
	// other sites and its requests for states (SitesRun's).
	StatesSent        int64 `json:"states_sent,omitempty"`
	StateRequestsSent int64 `json:"state_requests_sent,omitempty"`
	// OracleMeanMs is the oracle's mean on this run's publishes.
	OracleMeanMs float64 `json:"oracle_mean_ms"`
	Error        string  `json:"error,omitempty"`
}

// SitesMatrixCell is one (topology, scale, scenario) with its repeats.
type SitesMatrixCell struct {
	Topology string  `json:"topology"`
	Scale    float64 `json:"scale"`
	Scenario string  `json:"scenario"`
	// Runs holds, per repeat, every architecture's figures.
	Runs [][]SitesMatrixRun `json:"runs"`
}

// SitesMatrixResults is matrix.json.
type SitesMatrixResults struct {
	Generated time.Time           `json:"generated"`
	Machine   harness.MachineInfo `json:"machine"`
	Config    SitesMatrixConfig   `json:"config"`
	RabbitMQ  string              `json:"rabbitmq"`
	Cells     []SitesMatrixCell   `json:"cells"`
}

// finite returns a copy of res whose NaNs (not measured) are -1: JSON
// has no NaN.
func (res *SitesMatrixResults) finite() *SitesMatrixResults {
	c := *res
	c.Cells = make([]SitesMatrixCell, len(res.Cells))
	orMinus := func(v float64) float64 {
		if math.IsNaN(v) {
			return -1
		}
		return v
	}
	for i, cell := range res.Cells {
		runs := make([][]SitesMatrixRun, len(cell.Runs))
		for k, rep := range cell.Runs {
			runs[k] = make([]SitesMatrixRun, len(rep))
			for j, r := range rep {
				r.MeanMs, r.P50Ms, r.P99Ms, r.OracleMeanMs = orMinus(r.MeanMs), orMinus(r.P50Ms), orMinus(r.P99Ms), orMinus(r.OracleMeanMs)
				runs[k][j] = r
			}
		}
		cell.Runs = runs
		c.Cells[i] = cell
	}
	return &c
}

// withNaN is the inverse of finite: the -1s of a matrix.json read back
// are not measured (NaN).
func (res *SitesMatrixResults) withNaN() {
	orNaN := func(v float64) float64 {
		if v < 0 {
			return math.NaN()
		}
		return v
	}
	for i := range res.Cells {
		for k := range res.Cells[i].Runs {
			for j := range res.Cells[i].Runs[k] {
				r := &res.Cells[i].Runs[k][j]
				r.MeanMs, r.P50Ms, r.P99Ms, r.OracleMeanMs = orNaN(r.MeanMs), orNaN(r.P50Ms), orNaN(r.P99Ms), orNaN(r.OracleMeanMs)
			}
		}
	}
}

// RenderSitesMatrix writes matrix.md and the plots of dir again from its
// matrix.json, as the run that wrote it would with this code: a report's
// form can change without running the matrix again (its figures do not).
func RenderSitesMatrix(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, "matrix.json"))
	if err != nil {
		return err
	}
	var res SitesMatrixResults
	if err := json.Unmarshal(data, &res); err != nil {
		return fmt.Errorf("reading %s: %w", filepath.Join(dir, "matrix.json"), err)
	}
	res.withNaN()
	return writeSitesMatrix(dir, &res)
}

// matrixRunOf extracts one architecture's figures from a run.
func matrixRunOf(r SitesRun) SitesMatrixRun {
	m := SitesMatrixRun{Architecture: r.Architecture, MeanMs: r.Latency.Mean, P50Ms: r.Latency.P50, P99Ms: r.Latency.P99,
		Published: r.Published, Lost: r.Lost, Duplicated: r.Duplicated, OracleMeanMs: math.NaN(), Error: firstLine(r.Error),
		StatesSent: r.StatesSent, StateRequestsSent: r.StateRequestsSent}
	if !measured(&r) {
		m.MeanMs, m.P50Ms, m.P99Ms = math.NaN(), math.NaN(), math.NaN()
	}
	for _, o := range r.Overlay {
		m.WANMessages += o.MessagesOut
	}
	if r.Oracle != nil {
		m.OracleMeanMs = r.Oracle.Mean
	}
	return m
}

// cell returns the cell of (topology, scale, scenario), added if new.
func (res *SitesMatrixResults) cell(topology string, scale float64, scenario string) *SitesMatrixCell {
	for i := range res.Cells {
		c := &res.Cells[i]
		if c.Topology == topology && c.Scale == scale && c.Scenario == scenario {
			return c
		}
	}
	res.Cells = append(res.Cells, SitesMatrixCell{Topology: topology, Scale: scale, Scenario: scenario})
	return &res.Cells[len(res.Cells)-1]
}

// RunSitesMatrix runs every cell cfg.Repeat times, each topology on one
// set of RabbitMQ nodes, and writes matrix.json, matrix.md and
// matrix-*.png into cfg.Out (each run's own sites.json, summary and logs
// under runs/).
func RunSitesMatrix(ctx context.Context, cfg SitesMatrixConfig) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	first, cleanup, err := prepareSites(ctx, cfg.cellConfig(cfg.Topologies[0], cfg.Scales[0], 0))
	if err != nil {
		return err
	}
	defer cleanup()
	cfg.LuffyMQ = first.LuffyMQ
	res := &SitesMatrixResults{Machine: harness.DescribeMachine(""), Config: cfg, RabbitMQ: rabbitMQVersion()}
	began := time.Now()
	for _, t := range cfg.Topologies {
		if err := runMatrixTopology(ctx, cfg, t, res, began); err != nil {
			return err
		}
	}
	return writeSitesMatrix(cfg.Out, res)
}

// runMatrixTopology runs topology t's cells on nodes of its own.
func runMatrixTopology(ctx context.Context, cfg SitesMatrixConfig, t SitesTopology, res *SitesMatrixResults, began time.Time) error {
	fmt.Fprintf(cfg.Progress, "== %s: starting %d RabbitMQ nodes (%s) · elapsed %s\n", t.Name, len(t.Sites), strings.Join(t.Sites, ", "), harness.FmtDur(time.Since(began)))
	env, err := startSitesEnv(ctx, t.Sites, cfg.LuffyMQ, cfg.Out, rabbitharness.CityDelay)
	if err != nil {
		return fmt.Errorf("topology %s: %w", t.Name, err)
	}
	defer env.Close()
	for rep := range cfg.Repeat {
		for _, scale := range cfg.Scales {
			cc := cfg.cellConfig(t, scale, rep)
			cc, cleanup, err := prepareSites(ctx, cc)
			if err != nil {
				return err
			}
			fmt.Fprintf(cfg.Progress, "== %s · %s× · run %d of %d · elapsed %s\n", t.Name, harness.TrimFloat(scale), rep+1, cfg.Repeat, harness.FmtDur(time.Since(began)))
			sr, err := runSitesOn(ctx, cc, env)
			cleanup()
			if err != nil {
				return fmt.Errorf("%s at %s×: %w", t.Name, harness.TrimFloat(scale), err)
			}
			for _, sc := range cfg.Scenarios {
				c := res.cell(t.Name, scale, sc)
				var runs []SitesMatrixRun
				for _, r := range sr.Runs {
					if r.Scenario == sc {
						runs = append(runs, matrixRunOf(r))
					}
				}
				c.Runs = append(c.Runs, runs)
			}
			res.Generated = time.Now().UTC()
			if err := harness.WriteJSON(filepath.Join(cfg.Out, "matrix.json"), res.finite()); err != nil {
				return err
			}
		}
	}
	return nil
}

// archFigures are one architecture's figures in a cell over its repeats.
type archFigures struct {
	mean, p99, wan, oracle []float64
	lost, dup, runs        int
}

// complete reports whether every run measured and none lost or
// duplicated a message.
func (f archFigures) complete() bool {
	return f.runs > 0 && len(f.mean) == f.runs && f.lost == 0 && f.dup == 0
}

func (c *SitesMatrixCell) figures(arch string) archFigures {
	var f archFigures
	for _, rep := range c.Runs {
		for _, r := range rep {
			if r.Architecture != arch {
				continue
			}
			f.runs++
			f.lost += r.Lost
			f.dup += r.Duplicated
			if !math.IsNaN(r.MeanMs) {
				f.mean, f.p99 = append(f.mean, r.MeanMs), append(f.p99, r.P99Ms)
				f.wan = append(f.wan, float64(r.WANMessages))
			}
			if !math.IsNaN(r.OracleMeanMs) {
				f.oracle = append(f.oracle, r.OracleMeanMs)
			}
		}
	}
	return f
}

// pairedRatios are, per repeat, arch's value over ref's (both measured in
// the same run).
func (c *SitesMatrixCell) pairedRatios(arch, ref string, value func(SitesMatrixRun) float64) []float64 {
	return c.pairedBy(arch, ref, value, value)
}

// pairedBy is, per repeat, of(arch's run) over by(ref's run in the same
// repeat).
func (c *SitesMatrixCell) pairedBy(arch, ref string, of, by func(SitesMatrixRun) float64) []float64 {
	var out []float64
	for _, rep := range c.Runs {
		a, b := math.NaN(), math.NaN()
		for _, r := range rep {
			switch r.Architecture {
			case arch:
				a = of(r)
			case ref:
				b = by(r)
			}
		}
		if v := harness.Ratio(a, b); !math.IsNaN(v) {
			out = append(out, v)
		}
	}
	return out
}

// sitesMatrixGoal is one goal's verdict in one cell.
type sitesMatrixGoal struct {
	name     string
	measured string
	met      bool
	// bound, if set, is what the greedy oracle itself reaches on the same
	// publishes: a goal it misses is out of any scheduler's reach that
	// places each message once, in publish order, knowing everything.
	bound string
}

// goals checks issue 22's goals for cfg.Primary in c (medians over the
// repeats; ratios are paired within each run).
func (c *SitesMatrixCell) goals(primary string) []sitesMatrixGoal {
	mean := func(r SitesMatrixRun) float64 { return r.MeanMs }
	p99 := func(r SitesMatrixRun) float64 { return r.P99Ms }
	wan := func(r SitesMatrixRun) float64 { return float64(r.WANMessages) }
	oracle := func(r SitesMatrixRun) float64 { return r.OracleMeanMs }
	vsQF := harness.Median(c.pairedRatios(primary, ArchQueueFederation, mean))
	f := c.figures(primary)
	var vsOracle []float64
	for _, rep := range c.Runs {
		for _, r := range rep {
			if r.Architecture == primary {
				if v := harness.Ratio(mean(r), oracle(r)); !math.IsNaN(v) {
					vsOracle = append(vsOracle, v)
				}
			}
		}
	}
	if c.Scenario == SitesWQLocal {
		return []sitesMatrixGoal{
			{name: "mean ≤ 0.5× queue federation", measured: harness.FmtRatio(vsQF), met: vsQF <= 0.5},
			{name: "0 lost, 0 duplicated", measured: fmt.Sprintf("%d / %d", f.lost, f.dup), met: f.complete()},
		}
	}
	p99QF := harness.Median(c.pairedRatios(primary, ArchQueueFederation, p99))
	wanQF := harness.Median(c.pairedRatios(primary, ArchQueueFederation, wan))
	or := harness.Median(vsOracle)
	meanQF := sitesMatrixGoal{name: "mean ≤ 0.6× queue federation", measured: harness.FmtRatio(vsQF), met: vsQF <= 0.6}
	if oracleQF := harness.Median(c.oracleOver(primary, ArchQueueFederation)); !math.IsNaN(oracleQF) {
		meanQF.bound = "oracle " + harness.FmtRatio(oracleQF)
		if oracleQF > 0.6 {
			meanQF.bound += ": *out of reach*"
		}
	}
	return []sitesMatrixGoal{
		meanQF,
		{name: "mean ≤ 1.5× oracle", measured: harness.FmtRatio(or), met: or <= 1.5},
		{name: "p99 ≤ queue federation", measured: harness.FmtRatio(p99QF), met: p99QF <= 1},
		{name: "0 lost, 0 duplicated", measured: fmt.Sprintf("%d / %d", f.lost, f.dup), met: f.complete()},
		{name: "WAN messages ≤ queue federation", measured: harness.FmtRatio(wanQF), met: wanQF <= 1},
	}
}

// oracleOver is, per repeat, the oracle's mean on arch's publishes over
// ref's mean in the same run: the ratio to ref that a scheduler as good as
// the oracle would reach.
func (c *SitesMatrixCell) oracleOver(arch, ref string) []float64 {
	return c.pairedBy(arch, ref, func(r SitesMatrixRun) float64 { return r.OracleMeanMs }, func(r SitesMatrixRun) float64 { return r.MeanMs })
}

// writeSitesMatrix writes matrix.json, matrix.md and the plots.
func writeSitesMatrix(dir string, res *SitesMatrixResults) error {
	if err := harness.WriteJSON(filepath.Join(dir, "matrix.json"), res.finite()); err != nil {
		return err
	}
	for _, sc := range res.Config.Scenarios {
		if err := plotSitesMatrix(filepath.Join(dir, "matrix-"+sc+".png"), res, sc); err != nil {
			return fmt.Errorf("%s matrix plot: %w", sc, err)
		}
	}
	return os.WriteFile(filepath.Join(dir, "matrix.md"), []byte(sitesMatrixMarkdown(res)), 0o644)
}

// sitesMatrixMarkdown is matrix.md.
func sitesMatrixMarkdown(res *SitesMatrixResults) string {
	var b strings.Builder
	cfg := res.Config
	fmt.Fprintf(&b, "# Work queues across sites: the matrix\n\nGenerated %s by `luffy-bench %s`. Machine: %s, %d cores, %s. RabbitMQ %s.\n\n",
		res.Generated.Format("2006-01-02 15:04 UTC"), MatrixCommand, res.Machine.CPU, res.Machine.Cores, res.Machine.GoVersion, res.RabbitMQ)
	fmt.Fprintf(&b, "Each cell ran %d time(s); figures are medians over the runs, ratios are taken within each run (the same publishes, one after another on the same nodes) and their median reported. ", cfg.Repeat)
	fmt.Fprintf(&b, "At scale s consumers take 1 s / s a message and publishing lasts %s service times (at least %s); one-way delays are those of scenarios.md §C, not scaled. ", harness.TrimFloat(cfg.ServiceTimes), cfg.MinDuration)
	b.WriteString("Clients are plain MQTT v5 (paho.golang) members acknowledging after processing, no LuffyMQ SDK, sending their acknowledgements every " + SitesConfig{MemberAckInterval: cfg.MemberAckInterval}.memberAckInterval().String() + " (paho's default is " + PahoDefaultAckInterval.String() + "); the plain-RabbitMQ baselines use AMQP clients. Each run's own report is in `runs/<topology>-<scale>x-r<k>/summary.md`.\n\n")
	b.WriteString("Topologies (the second site is the busy one):\n\n")
	for _, t := range cfg.Topologies {
		fmt.Fprintf(&b, "- **%s**: %s; %d consumers a site; seed %d\n", t.Name, strings.Join(t.Sites, ", "), t.Consumers, t.Seed)
	}
	for _, sc := range cfg.Scenarios {
		fmt.Fprintf(&b, "\n## %s\n\nMean latency in ms (p99), medians over the runs; the oracle is the greedy oracle on the same publishes.\n\n", sc)
		b.WriteString("| topology | scale |")
		for _, a := range cfg.Architectures {
			fmt.Fprintf(&b, " %s |", a)
		}
		b.WriteString(" oracle | WAN messages: " + strings.Join(cfg.Architectures, " / ") + " |\n|---|---|")
		for range cfg.Architectures {
			b.WriteString("---|")
		}
		b.WriteString("---|---|\n")
		for _, c := range res.Cells {
			if c.Scenario != sc {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s× |", c.Topology, harness.TrimFloat(c.Scale))
			var wans, oracle []string
			for _, a := range cfg.Architectures {
				f := c.figures(a)
				cellText := fmt.Sprintf(" %s (%s)", harness.FmtMs(harness.Median(f.mean)), harness.FmtMs(harness.Median(f.p99)))
				if f.lost > 0 || f.dup > 0 {
					cellText += fmt.Sprintf(", lost %d dup %d", f.lost, f.dup)
				}
				if len(f.mean) < f.runs {
					cellText += fmt.Sprintf(", %d of %d runs failed", f.runs-len(f.mean), f.runs)
				}
				b.WriteString(cellText + " |")
				wans = append(wans, fmt.Sprintf("%.0f", harness.Median(f.wan)))
				if len(oracle) == 0 && len(f.oracle) > 0 {
					oracle = append(oracle, harness.FmtMs(harness.Median(f.oracle)))
				}
			}
			if len(oracle) == 0 {
				oracle = []string{"—"}
			}
			fmt.Fprintf(&b, " %s | %s |\n", oracle[0], strings.Join(wans, " / "))
		}
		b.WriteString(stateTrafficTable(res, sc))
		fmt.Fprintf(&b, "\nGoals of issue 22 for **%s** (medians of paired ratios):\n\n| topology | scale |", cfg.Primary)
		var names []string
		for _, c := range res.Cells {
			if c.Scenario == sc {
				for _, g := range c.goals(cfg.Primary) {
					names = append(names, g.name)
				}
				break
			}
		}
		for _, n := range names {
			fmt.Fprintf(&b, " %s |", n)
		}
		b.WriteString("\n|---|---|" + strings.Repeat("---|", len(names)) + "\n")
		met, total := 0, 0
		for _, c := range res.Cells {
			if c.Scenario != sc {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s× |", c.Topology, harness.TrimFloat(c.Scale))
			for _, g := range c.goals(cfg.Primary) {
				fmt.Fprintf(&b, " %s %s", g.measured, yesNo(g.met))
				if g.bound != "" {
					fmt.Fprintf(&b, " (%s)", g.bound)
				}
				b.WriteString(" |")
				total++
				if g.met {
					met++
				}
			}
			b.WriteString("\n")
		}
		if sc == SitesWQBalanced {
			b.WriteString("\nIn parentheses: the greedy oracle's own mean over queue federation's, paired within each run. The oracle sends each message, in publish order, to the consumer that would start it first, knowing every consumer's state at once and paying only the network's delays. Where even it exceeds 0.6×, the cell says *out of reach*.\n")
		}
		fmt.Fprintf(&b, "\n%d of %d goal checks met.\n\n![%s: mean latency over queue federation's per cell](matrix-%s.png)\n", met, total, sc, sc)
	}
	return b.String()
}

// plotSitesMatrix draws, per cell of scenario, each architecture's mean
// latency over queue federation's (median of the paired ratios; log
// scale), with the oracle's.
func plotSitesMatrix(path string, res *SitesMatrixResults, scenario string) error {
	p := harness.NewPlot(scenario+": mean latency ÷ queue federation's, per cell (median of runs)", "topology · scale", "ratio (log scale)")
	var cells []*SitesMatrixCell
	var labels []string
	for i := range res.Cells {
		if c := &res.Cells[i]; c.Scenario == scenario {
			cells = append(cells, c)
			labels = append(labels, c.Topology+" "+harness.TrimFloat(c.Scale)+"×")
		}
	}
	mean := func(r SitesMatrixRun) float64 { return r.MeanMs }
	var names []string
	var colors []color.Color
	var values [][]float64
	for _, a := range res.Config.Architectures {
		if a == ArchQueueFederation {
			continue
		}
		v := make([]float64, len(cells))
		for i, c := range cells {
			v[i] = harness.Median(c.pairedRatios(a, ArchQueueFederation, mean))
		}
		names, colors, values = append(names, a), append(colors, archColor(a)), append(values, v)
	}
	oracle := make([]float64, len(cells))
	for i, c := range cells {
		var rs []float64
		for _, rep := range c.Runs {
			for _, r := range rep {
				if r.Architecture == ArchQueueFederation {
					if x := harness.Ratio(r.OracleMeanMs, r.MeanMs); !math.IsNaN(x) {
						rs = append(rs, x)
					}
				}
			}
		}
		oracle[i] = harness.Median(rs)
	}
	names, colors, values = append(names, "oracle"), append(colors, harness.Palette[3]), append(values, oracle)
	lo, hi := math.Inf(1), 0.0
	for _, v := range values {
		for _, x := range v {
			if !math.IsNaN(x) && x > 0 {
				lo, hi = math.Min(lo, x), math.Max(hi, x)
			}
		}
	}
	floor := harness.FloorPow10(lo)
	w := vg.Points(min(60/float64(len(names)), 18))
	for j, name := range names {
		b := &harness.LogBars{Values: values[j], Floor: floor, Width: w, Offset: w * vg.Length(float64(j)-float64(len(names)-1)/2), Color: colors[j]}
		p.Add(b)
		p.Legend.Add(name, b)
	}
	harness.LogAxis(p, floor, harness.CeilPow10(hi)*8) // headroom for the legend
	harness.CategoryAxis(p, labels)
	return p.Save(vg.Length(max(8, 1.6*float64(len(cells))))*vg.Inch, 4.5*vg.Inch, path)
}

// sitesMatrixCommand parses the flags of luffy-bench sites-matrix.
func sitesMatrixCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	d := DefaultSitesMatrixConfig()
	fs := flag.NewFlagSet("luffy-bench "+MatrixCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "output directory (required): matrix.json, matrix.md, matrix-*.png, runs/")
	luffymq := fs.String("luffymq", "", "luffymq binary (default: build ./cmd/luffymq of the current module)")
	topologies := fs.String("topologies", topologyNames(d.Topologies), "comma-separated topologies: "+topologyNames(DefaultSitesTopologies))
	scales := fs.String("scales", "1,3,10", "comma-separated time scales: consumers take 1 s / scale a message")
	scenarios := fs.String("scenario", strings.Join(d.Scenarios, ","), "comma-separated work-queue scenarios")
	archs := fs.String("architectures", strings.Join(d.Architectures, ","), "comma-separated architectures (must include "+ArchQueueFederation+", the reference)")
	primary := fs.String("primary", d.Primary, "the luffymq architecture the goals are checked for")
	repeat := fs.Int("repeat", d.Repeat, "runs per cell (medians are reported)")
	serviceTimes := fs.Float64("service-times", d.ServiceTimes, "publishing time of each run, in service times")
	minDur := fs.Duration("min-duration", d.MinDuration, "shortest publishing time of a run")
	render := fs.Bool("render", false, "run nothing: write matrix.md and the plots of --out again from its matrix.json")
	wqState := fs.Duration("wq-state-interval", 0, "luffymq's "+flagWQStateInterval+" for "+ArchLuffyMQ+" and "+ArchLuffyMQNearest+" (0: its default, "+bridge.DefaultStateInterval.String()+", not scaled)")
	ackInterval := fs.Duration("member-ack-interval", 0, "how often the work-queue members (plain paho.golang clients) send their acknowledgements (0: 1 ms; paho's default is "+PahoDefaultAckInterval.String()+")")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *render {
		if *out == "" {
			return fmt.Errorf("--render needs --out, the directory of a matrix.json")
		}
		return RenderSitesMatrix(*out)
	}
	cfg := d
	cfg.Topologies = nil
	for _, name := range harness.SplitList(*topologies) {
		i := slices.IndexFunc(DefaultSitesTopologies, func(t SitesTopology) bool { return t.Name == name })
		if i < 0 {
			return fmt.Errorf("--topologies: unknown topology %q (known: %s)", name, topologyNames(DefaultSitesTopologies))
		}
		cfg.Topologies = append(cfg.Topologies, DefaultSitesTopologies[i])
	}
	cfg.Scales = nil
	for _, s := range harness.SplitList(*scales) {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("--scales %q: %w", s, err)
		}
		cfg.Scales = append(cfg.Scales, v)
	}
	cfg.Scenarios, cfg.Architectures, cfg.Primary = harness.SplitList(*scenarios), harness.SplitList(*archs), *primary
	cfg.Repeat, cfg.ServiceTimes, cfg.MinDuration, cfg.WQStateInterval = *repeat, *serviceTimes, *minDur, *wqState
	if *ackInterval < 0 {
		return fmt.Errorf("--member-ack-interval %s: want a positive interval (paho's default is %s)", *ackInterval, PahoDefaultAckInterval)
	}
	cfg.MemberAckInterval = *ackInterval
	cfg.Out, cfg.LuffyMQ, cfg.Progress = *out, *luffymq, stdout
	return RunSitesMatrix(ctx, cfg)
}

func topologyNames(ts []SitesTopology) string {
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = t.Name
	}
	return strings.Join(names, ",")
}

// MatrixMain runs `luffy-bench sites-matrix` with args (without the
// subcommand's name) and returns the exit code.
func MatrixMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := sitesMatrixCommand(ctx, args, stdout, stderr)
	return harness.ExitCode(err, stderr)
}

// stateTrafficTable splits the WAN messages of the primary architecture
// in scenario's cells into group states, requests for states (each
// delivered to every other site) and the rest, the work itself (medians
// over the runs); empty when no run counted any state traffic.
func stateTrafficTable(res *SitesMatrixResults, scenario string) string {
	var b strings.Builder
	primary := res.Config.Primary
	for _, c := range res.Cells {
		if c.Scenario != scenario {
			continue
		}
		sites := 0
		for _, t := range res.Config.Topologies {
			if t.Name == c.Topology {
				sites = len(t.Sites)
			}
		}
		var wan, states, requests []float64
		for _, rep := range c.Runs {
			for _, r := range rep {
				if r.Architecture == primary && !math.IsNaN(r.MeanMs) && (r.StatesSent > 0 || r.StateRequestsSent > 0) {
					wan = append(wan, float64(r.WANMessages))
					states = append(states, float64(r.StatesSent))
					requests = append(requests, float64(r.StateRequestsSent*int64(max(sites-1, 0))))
				}
			}
		}
		if len(wan) == 0 {
			continue
		}
		if b.Len() == 0 {
			fmt.Fprintf(&b, "\nWhat **%s**'s WAN messages are (medians over the runs): group states sent to other sites, requests for states (each federated to every other site), and the rest, the work itself.\n\n| topology | scale | WAN messages | states | requests for states | work |\n|---|---|---|---|---|---|\n", primary)
		}
		w, st, rq := harness.Median(wan), harness.Median(states), harness.Median(requests)
		fmt.Fprintf(&b, "| %s | %s× | %.0f | %.0f | %.0f | %.0f |\n", c.Topology, harness.TrimFloat(c.Scale), w, st, rq, max(w-st-rq, 0))
	}
	return b.String()
}
