package sites

import (
	"context"
	"github.com/luffymq/luffymq/bench/internal/harness"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// matrixRun is one architecture's figures in a synthetic matrix run.
func matrixRun(arch string, mean, p99 float64, wan int64, oracle float64) SitesMatrixRun {
	return SitesMatrixRun{Architecture: arch, MeanMs: mean, P50Ms: mean, P99Ms: p99, Published: 100, WANMessages: wan, OracleMeanMs: oracle}
}

// The goals are checked on the median of ratios paired within each run:
// a run where queue federation was slow does not carry another where it
// was fast.
func TestSitesMatrixGoals(t *testing.T) {
	c := SitesMatrixCell{Topology: "t", Scale: 10, Scenario: SitesWQBalanced, Runs: [][]SitesMatrixRun{
		{matrixRun(ArchLuffyMQ, 50, 200, 100, 40), matrixRun(ArchQueueFederation, 100, 400, 300, 40)},  // 0.5×
		{matrixRun(ArchLuffyMQ, 90, 500, 100, 40), matrixRun(ArchQueueFederation, 100, 400, 300, 40)},  // 0.9×
		{matrixRun(ArchLuffyMQ, 55, 300, 100, 40), matrixRun(ArchQueueFederation, 1000, 900, 300, 40)}, // 0.055×
	}}
	got := map[string]sitesMatrixGoal{}
	for _, g := range c.goals(ArchLuffyMQ) {
		got[g.name] = g
	}
	want := map[string]bool{
		"mean ≤ 0.6× queue federation":    true, // median of 0.5, 0.9, 0.055
		"mean ≤ 1.5× oracle":              true, // median of 1.25, 2.25, 1.375
		"p99 ≤ queue federation":          true, // median of 0.5, 1.25, 0.33
		"0 lost, 0 duplicated":            true,
		"WAN messages ≤ queue federation": true,
	}
	for name, met := range want {
		g, ok := got[name]
		if !ok {
			t.Fatalf("goal %q missing from %+v", name, got)
		}
		if g.met != met {
			t.Errorf("goal %q: met %v (measured %s), want %v", name, g.met, g.measured, met)
		}
	}
	if g := got["mean ≤ 0.6× queue federation"]; g.measured != harness.FmtRatio(0.5) {
		t.Errorf("mean ratio shown as %s, want the median paired ratio %s", g.measured, harness.FmtRatio(0.5))
	}
	// The oracle's own ratio to queue federation (40 over 100, 100, 1000)
	// bounds the first goal; it is within reach here.
	if g := got["mean ≤ 0.6× queue federation"]; g.bound != "oracle "+harness.FmtRatio(0.4) {
		t.Errorf("mean goal's bound %q, want the oracle's median paired ratio %s", g.bound, harness.FmtRatio(0.4))
	}
	// An oracle at 0.8× queue federation puts 0.6× out of reach.
	far := SitesMatrixCell{Scenario: SitesWQBalanced, Runs: [][]SitesMatrixRun{
		{matrixRun(ArchLuffyMQ, 90, 200, 100, 80), matrixRun(ArchQueueFederation, 100, 400, 300, 80)},
	}}
	if g := far.goals(ArchLuffyMQ)[0]; g.met || !strings.Contains(g.bound, "out of reach") {
		t.Errorf("oracle at 0.8× queue federation: %+v, want unmet and out of reach", g)
	}
	// One lost message anywhere fails the cell.
	c.Runs[1][0].Lost = 1
	for _, g := range c.goals(ArchLuffyMQ) {
		if g.name == "0 lost, 0 duplicated" && g.met {
			t.Error("a lost message still meets the goal")
		}
	}
}

// A cell whose primary architecture failed to measure (NaN) meets no
// latency goal.
func TestSitesMatrixGoalsUnmeasured(t *testing.T) {
	c := SitesMatrixCell{Scenario: SitesWQLocal, Runs: [][]SitesMatrixRun{
		{matrixRun(ArchLuffyMQ, math.NaN(), math.NaN(), 0, 40), matrixRun(ArchQueueFederation, 100, 400, 300, 40)},
	}}
	for _, g := range c.goals(ArchLuffyMQ) {
		if g.met {
			t.Errorf("goal %q met without a measurement (%s)", g.name, g.measured)
		}
	}
}

// writeSitesMatrix writes matrix.json, matrix.md with a row per cell and
// the goals' table, and a plot per scenario.
func TestWriteSitesMatrix(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultSitesMatrixConfig()
	cfg.Scenarios = []string{SitesWQBalanced}
	cfg.Architectures = []string{ArchLuffyMQ, ArchQueueFederation}
	res := &SitesMatrixResults{Generated: time.Date(2026, 11, 27, 4, 0, 0, 0, time.UTC), Config: cfg, RabbitMQ: "3.10.8"}
	for _, scale := range []float64{1, 10} {
		c := res.cell("tunis-busy-4", scale, SitesWQBalanced)
		c.Runs = append(c.Runs, []SitesMatrixRun{matrixRun(ArchLuffyMQ, 80, 300, 1500, 50), matrixRun(ArchQueueFederation, 150, 900, 900, 50)})
	}
	if err := writeSitesMatrix(dir, res); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "matrix.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| tunis-busy-4 | 1× | 80.0 (300) | 150 (900) | 50.0 | 1500 / 900 |",
		"| tunis-busy-4 | 10× |",
		"WAN messages ≤ queue federation",
		"6 of 10 goal checks met",
		"sending their acknowledgements every 1ms (paho's default is 50ms)",
		"| tunis-busy-4 | 10× | 0.53× yes (oracle 0.33×) | 1.60× no | 0.33× yes | 0 / 0 yes | 1.67× no |",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("matrix.md lacks %q:\n%s", want, md)
		}
	}
	// A run that measured nothing is written too (JSON has no NaN).
	res.cell("tokyo-busy-3", 3, SitesWQBalanced).Runs = [][]SitesMatrixRun{{matrixRun(ArchLuffyMQ, math.NaN(), math.NaN(), 0, math.NaN()), matrixRun(ArchQueueFederation, 150, 900, 900, 50)}}
	if err := writeSitesMatrix(dir, res); err != nil {
		t.Fatalf("a NaN in the results: %v", err)
	}
	for _, f := range []string{"matrix.json", "matrix-wq-balanced.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
	// --render writes the same report again from matrix.json alone, the
	// run that measured nothing included.
	written, err := os.ReadFile(filepath.Join(dir, "matrix.md"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "matrix.md")); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := sitesMatrixCommand(context.Background(), []string{"--render", "--out", dir}, &out, &out); err != nil {
		t.Fatalf("--render: %v (%s)", err, out.String())
	}
	rendered, err := os.ReadFile(filepath.Join(dir, "matrix.md"))
	if err != nil {
		t.Fatal(err)
	}
	if string(rendered) != string(written) {
		t.Errorf("--render wrote\n%s\nwhere the run wrote\n%s", rendered, written)
	}
}

func TestSitesMatrixFlags(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--render"}, "--render needs --out"},
		{[]string{"--out", "x", "--topologies", "nowhere"}, `unknown topology "nowhere"`},
		{[]string{"--out", "x", "--scales", "0"}, "is not a time scale"},
		{[]string{"--out", "x", "--scenario", "ps-B"}, "work-queue scenarios only"},
		{[]string{"--out", "x", "--architectures", "luffymq"}, "must include queue-federation"},
		{[]string{"--out", "x", "--repeat", "0"}, "--repeat 0"},
		{[]string{"--out", "x", "--member-ack-interval", "-5ms"}, "--member-ack-interval -5ms"},
		{[]string{"--topologies", "tokyo-busy-3"}, "--out is required"},
	} {
		err := sitesMatrixCommand(context.Background(), tt.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want one containing %q", tt.args, err, tt.want)
		}
	}
}

// Every default topology is a valid work-queue workload of both
// scenarios (the utilisation bound holds), and publishing lasts at least
// the minimum.
func TestDefaultSitesMatrixCells(t *testing.T) {
	cfg := DefaultSitesMatrixConfig()
	cfg.Out = t.TempDir()
	paho := cfg
	paho.MemberAckInterval = PahoDefaultAckInterval
	if got := paho.cellConfig(cfg.Topologies[0], 1, 0).MemberAckInterval; got != PahoDefaultAckInterval {
		t.Errorf("--member-ack-interval 50ms: a cell's members acknowledge every %v", got)
	}
	for _, top := range cfg.Topologies {
		for _, scale := range cfg.Scales {
			cc := cfg.cellConfig(top, scale, 0).ScaledWQ()
			if err := cc.validate(); err != nil {
				t.Errorf("%s at %v×: %v", top.Name, scale, err)
			}
			for _, sc := range cfg.Scenarios {
				if _, err := newWQWorkload(sc, cc.Sites, cc.ConsumersPerSite, 1, cc.ServiceTime, cc.WQDuration); err != nil {
					t.Errorf("%s at %v×, %s: %v", top.Name, scale, sc, err)
				}
			}
			if cc.MemberAckInterval != time.Millisecond {
				t.Errorf("%s at %v×: members acknowledge every %v, want 1ms unless --member-ack-interval says", top.Name, scale, cc.MemberAckInterval)
			}
			if cc.WQDuration < cfg.MinDuration {
				t.Errorf("%s at %v×: publishing %v, below the minimum", top.Name, scale, cc.WQDuration)
			}
		}
	}
}

// The state traffic is read from luffymq's /metrics, summed over labels;
// a sample that does not parse is an error, not a zero.
func TestParseStateTraffic(t *testing.T) {
	text := `# HELP luffymq_bridge_wq_states_sent_total Group states ...
# TYPE luffymq_bridge_wq_states_sent_total counter
luffymq_bridge_wq_states_sent_total{queue="wq.jobs",site="tunis",to="berlin"} 12
luffymq_bridge_wq_states_sent_total{queue="wq.jobs",site="tunis",to="tokyo"} 30
luffymq_bridge_wq_state_requests_sent_total{queue="wq.jobs",site="tunis"} 7
luffymq_bridge_wq_states_sent_by_reason_total{queue="wq.jobs",reason="heartbeat",site="tunis"} 40
luffymq_bridge_wq_states_sent_by_reason_total{queue="wq.jobs",reason="lease",site="tunis"} 2
luffymq_bridge_wq_routed_total{queue="wq.jobs",site="tunis",to="berlin"} 99
`
	got, err := parseStateTraffic(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if got.States != 42 || got.Requests != 7 || got.StatesTo["berlin"] != 12 || got.StatesTo["tokyo"] != 30 || got.StatesWhy["heartbeat"] != 40 || got.StatesWhy["lease"] != 2 {
		t.Errorf("got %+v, want 42 states and 7 requests", got)
	}
	if _, err := parseStateTraffic(strings.NewReader(`luffymq_bridge_wq_states_sent_total{to="x"} many` + "\n")); err == nil {
		t.Error("a malformed sample parsed")
	}
}

// The matrix splits the primary's WAN messages into states, requests
// (times the other sites each reaches) and work.
func TestStateTrafficTable(t *testing.T) {
	res := &SitesMatrixResults{Config: SitesMatrixConfig{Primary: ArchLuffyMQ, Topologies: []SitesTopology{{Name: "t", Sites: []string{"a", "b", "c", "d"}}}}}
	lm := matrixRun(ArchLuffyMQ, 50, 200, 500, 40)
	lm.StatesSent, lm.StateRequestsSent = 300, 50
	res.Cells = []SitesMatrixCell{{Topology: "t", Scale: 1, Scenario: SitesWQBalanced, Runs: [][]SitesMatrixRun{{lm, matrixRun(ArchQueueFederation, 100, 400, 300, 40)}}}}
	got := stateTrafficTable(res, SitesWQBalanced)
	if !strings.Contains(got, "| t | 1× | 500 | 300 | 150 | 50 |") {
		t.Errorf("table:\n%s\nwant the row | t | 1× | 500 | 300 | 150 | 50 |", got)
	}
	if stateTrafficTable(res, SitesWQLocal) != "" {
		t.Error("a scenario without runs got a table")
	}
}
