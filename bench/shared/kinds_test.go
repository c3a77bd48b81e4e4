package shared

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/broker"
)

func TestParseSubscriberKinds(t *testing.T) {
	tests := []struct {
		list    string
		want    []string
		wantErr string
	}{
		{"", []string{KindSDK}, ""},
		{"sdk", []string{KindSDK}, ""},
		{"all", SubscriberKinds, ""},
		{"paho-qos1-ackafter, sdk,timer-reporter,sdk", []string{KindSDK, KindTimerReporter, KindPahoQoS1AckAfter}, ""},
		{"thesis-reporter,java", nil, `unknown subscriber kind "java"`},
		{",", nil, "names no kind"},
	}
	for _, tt := range tests {
		t.Run(tt.list, func(t *testing.T) {
			got, err := ParseSubscriberKinds(tt.list)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestKindQoS(t *testing.T) {
	q0 := Scenario{QoS: 0}
	q1 := Scenario{QoS: 1}
	tests := []struct {
		s    Scenario
		kind string
		want byte
	}{
		{q0, KindSDK, 0},
		{q0, KindThesisReporter, 0},
		{q0, KindTimerReporter, 0},
		{q0, KindPahoQoS1AckAfter, 1},
		{q1, KindThesisReporter, 1},
		{q1, KindPahoQoS1AckAfter, 1},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, kindQoS(tt.s, tt.kind), "%s at scenario QoS %d", tt.kind, tt.s.QoS)
	}
}

func TestKeepOtherRunsKeysByScenarioAndKind(t *testing.T) {
	old := []RunResult{
		{Scenario: "thesis-2", Subscriber: KindSDK, System: "luffymq-adaptive"},
		{Scenario: "thesis-2", Subscriber: "", System: harness.SystemMochi}, // written before kinds existed: sdk
		{Scenario: "thesis-2", Subscriber: KindTimerReporter, System: "luffymq-adaptive"},
		{Scenario: "thesis-1", Subscriber: KindTimerReporter, System: "luffymq-adaptive"},
	}
	thesis2, _ := ScenarioByID("thesis-2")
	tests := []struct {
		name  string
		kinds []string
		want  []runKey
	}{
		{"rerunning the sdk kind keeps the other kinds", []string{KindSDK}, []runKey{
			{"thesis-2", KindTimerReporter, "luffymq-adaptive"},
			{"thesis-1", KindTimerReporter, "luffymq-adaptive"},
		}},
		{"rerunning another kind keeps sdk runs, old ones included", []string{KindTimerReporter, KindThesisReporter}, []runKey{
			{"thesis-2", KindSDK, "luffymq-adaptive"},
			{"thesis-2", KindSDK, harness.SystemMochi},
			{"thesis-1", KindTimerReporter, "luffymq-adaptive"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []runKey
			for _, r := range keepOtherRuns(old, []Scenario{thesis2}, tt.kinds) {
				got = append(got, r.key())
			}
			require.Equal(t, tt.want, got)
		})
	}
}

// kindRun is a thesis-2 run with subscribers of kind whose every latency
// statistic is mean.
func kindRun(kind, system string, repeat int, mean float64) RunResult {
	r := run(system, repeat, mean, mean, 0)
	r.Subscriber = kind
	r.Params = ScenarioParams{GapMs: 10, DurationS: 15, Members: []string{"25ms", "25ms", "50ms"}, QoS: kindQoS(Scenario{}, kind),
		ReportInterval: "1s", PayloadBytes: harness.PayloadSize, Messages: 1500}
	return r
}

func TestSummaryKeysResultsByKind(t *testing.T) {
	dir := t.TempDir()
	runs := []RunResult{
		kindRun(KindSDK, "luffymq-adaptive", 1, 3),
		kindRun(KindSDK, "luffymq-adaptive", 2, 5),
		kindRun(KindSDK, harness.SystemOracle, 1, 2),
		kindRun(KindTimerReporter, "luffymq-adaptive", 1, 90),
		kindRun(KindTimerReporter, harness.SystemOracle, 1, 2),
		kindRun(KindPahoQoS1AckAfter, "luffymq-adaptive", 1, 30),
	}
	legacy := kindRun("", harness.SystemMosquitto, 1, 1600) // no kind: an sdk run
	runs = append(runs, legacy)
	require.NoError(t, harness.WriteJSON(filepath.Join(dir, "results.json"), (&SharedResults{Runs: runs}).finite()))
	require.NoError(t, WriteSummary(dir))
	data, err := os.ReadFile(filepath.Join(dir, "summary.md"))
	require.NoError(t, err)
	md := string(data)

	section := func(kind string) string {
		head := "### thesis-2 · " + kind + " subscribers"
		i := strings.Index(md, head)
		require.GreaterOrEqual(t, i, 0, "no section %q", head)
		rest := md[i+len(head):]
		if j := strings.Index(rest, "\n### "); j >= 0 {
			rest = rest[:j]
		}
		return rest
	}
	row := func(sec, system string) string {
		for _, l := range strings.Split(sec, "\n") {
			if strings.HasPrefix(l, "| "+system+" |") {
				return l
			}
		}
		return ""
	}
	tests := []struct {
		kind, system, wantPrefix string
	}{
		{KindSDK, "luffymq-adaptive", "| luffymq-adaptive | 2 | 4.00 |"}, // median of 3 and 5
		{KindSDK, "mosquitto", "| mosquitto | 1 | 1600 |"},
		{KindSDK, OracleName, "| " + OracleName + " | 1 | 2.00 |"},
		{KindTimerReporter, "luffymq-adaptive", "| luffymq-adaptive | 1 | 90.0 |"},
		{KindPahoQoS1AckAfter, "luffymq-adaptive", "| luffymq-adaptive | 1 | 30.0 |"},
	}
	for _, tt := range tests {
		got := row(section(tt.kind), tt.system)
		require.True(t, strings.HasPrefix(got, tt.wantPrefix), "%s/%s: %q", tt.kind, tt.system, got)
	}
	require.Empty(t, row(section(KindTimerReporter), "mosquitto"), "runs of one kind never show under another")
	require.Contains(t, section(KindPahoQoS1AckAfter), "QoS 1.")
	// The comparison across kinds.
	require.Contains(t, md, "| system | sdk: mean / p99 ms | timer-reporter: mean / p99 ms | paho-qos1-ackafter: mean / p99 ms |")
	require.Contains(t, md, "| luffymq-adaptive | 4.00 / 4.00 | 90.0 / 90.0 | 30.0 / 30.0 |")
	// Goals per kind, and the oracle named for what it is.
	require.Contains(t, md, "thesis-2 (timer-reporter subscribers): adaptive mean ≤ 97 ms: **met**", "the timer-only goal is its own")
	require.NotContains(t, md, "thesis-2 (timer-reporter subscribers): adaptive mean within 2×")
	require.Contains(t, md, "thesis-2 (sdk subscribers): adaptive mean within 2× of the "+OracleName+": **met**")
	require.NotContains(t, strings.ReplaceAll(md, "not a proven lower bound", ""), "lower bound", "the oracle is never called a lower bound")

	var back SharedResults
	raw, err := os.ReadFile(filepath.Join(dir, "results.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &back))
	require.Equal(t, KindTimerReporter, back.Runs[3].Subscriber, "results.json carries the kind of every run")
}

func TestMedianTable(t *testing.T) {
	tests := []struct {
		name   string
		values []float64
		want   float64
	}{
		{"odd count", []float64{5, 1, 3}, 3},
		{"even count: mean of the middle two", []float64{4, 1, 3, 2}, 2.5},
		{"NaNs ignored", []float64{math.NaN(), 2}, 2},
		{"one value", []float64{7}, 7},
		{"infinity orders last", []float64{1, math.Inf(1), 2}, 2},
		{"none", nil, math.NaN()},
		{"only NaN", []float64{math.NaN()}, math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := harness.Median(tt.values)
			if math.IsNaN(tt.want) {
				require.True(t, math.IsNaN(got), "got %v", got)
				return
			}
			require.Equal(t, tt.want, got)
		})
	}
}

func TestAggregateRecoveryMedianCountsNeverAsWorst(t *testing.T) {
	mk := func(rec float64) RunResult {
		r := run("luffymq-adaptive", 1, 1, 1, 0)
		r.Adaptation = &Adaptation{RecoveryS: rec, GoalS: 2, NewcomerMaxMs: -1, ShareRatio: -1}
		return r
	}
	tests := []struct {
		recoveries []float64
		want       float64
	}{
		{[]float64{1.2, 0.4, 3}, 1.2},
		{[]float64{1.2, -1, -1}, -1},
		{[]float64{0, 0, -1}, 0},
		{[]float64{0.5, -1, 2}, 2},
	}
	for _, tt := range tests {
		var runs []RunResult
		for _, r := range tt.recoveries {
			runs = append(runs, mk(r))
		}
		a := aggregateRuns(runs)[0]
		require.Equal(t, tt.want, a.Recovery, "%v", tt.recoveries)
		require.True(t, math.IsNaN(a.NewMaxMs), "-1 (no data) is not a latency")
		require.Equal(t, 2.0, a.GoalS)
	}
}

// TestLuffymqSelectionArgs: every luffymq system maps to flags the broker
// accepts; adaptive-hold is adaptive with late binding.
func TestLuffymqSelectionArgs(t *testing.T) {
	require.Equal(t, []string{"--strategy", "thesis"}, harness.LuffyMQSelectionArgs("luffymq-thesis"))
	require.Equal(t, []string{"--strategy", "adaptive", "--hold-lead", "5ms"}, harness.LuffyMQSelectionArgs("luffymq-adaptive-hold"))
	all, err := harness.ParseSystems("adaptive-hold,mosquitto")
	require.NoError(t, err)
	require.Equal(t, []string{"luffymq-adaptive-hold", harness.SystemMosquitto}, all)
	for _, system := range harness.AllSystems() {
		if !strings.HasPrefix(system, "luffymq-") {
			continue
		}
		args := harness.LuffyMQSelectionArgs(system)
		cfg, err := broker.LoadConfig(args, nil, nil, nil)
		require.NoError(t, err, system)
		require.NotEmpty(t, cfg.Strategy, system)
	}
}
