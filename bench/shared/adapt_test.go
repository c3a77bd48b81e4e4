package shared

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// steady returns deliveries of one member published every gap from 0 to
// end, each waiting 1 ms, except those published in [badFrom, badUntil),
// which wait bad.
func steady(gap, end, badFrom, badUntil, bad time.Duration) []Delivery {
	var ds []Delivery
	for i, sent := 0, time.Duration(0); sent < end; i, sent = i+1, sent+gap {
		lat := time.Millisecond
		if sent >= badFrom && sent < badUntil {
			lat = bad
		}
		ds = append(ds, Delivery{Seq: i, Sent: sent, Start: sent + lat})
	}
	return ds
}

func TestStepAdaptationTime(t *testing.T) {
	step, err := ScenarioByID("step")
	require.NoError(t, err)
	require.Equal(t, 12500*time.Microsecond, step.Gap)
	require.InDelta(t, 0.67, 80/step.Capacity(0), 0.01, "ρ before the change")
	require.InDelta(t, 0.89, 80/step.Capacity(step.EventAt), 0.01, "ρ after the change")
	s := step
	s.Duration = 15 * time.Second
	ms10 := 10 * time.Millisecond
	tests := []struct {
		name     string
		ds       []Delivery
		wantRecS float64
	}{
		// With 50 messages a window, its p99 is its largest latency: the
		// last window over the limit is the last one holding a slow
		// message, ending 400 ms after the last slow message's publish
		// time rounded up to the 100 ms step.
		{"never over the limit", steady(ms10, 15*time.Second, 0, 0, 0), 0},
		{"slow messages before the change do not count", steady(ms10, 15*time.Second, 8*time.Second, 9*time.Second, 80*time.Millisecond), 0},
		{"over the limit for 1 s after the change", steady(ms10, 15*time.Second, 10*time.Second, 11*time.Second, 80*time.Millisecond), 1.4},
		{"over the limit for 3 s", steady(ms10, 15*time.Second, 10*time.Second, 13*time.Second, 300*time.Millisecond), 3.4},
		{"at the limit is under it", steady(ms10, 15*time.Second, 10*time.Second, 13*time.Second, 50*time.Millisecond), 0},
		{"still over the limit at the end", steady(ms10, 15*time.Second, 10*time.Second, 16*time.Second, 80*time.Millisecond), -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := adaptation(s, tt.ds, nil)
			require.NotNil(t, a)
			require.InDelta(t, tt.wantRecS, a.RecoveryS, 1e-6)
			require.Equal(t, 500.0, a.WindowMs)
			require.Equal(t, 100.0, a.StepMs)
			require.Equal(t, 50.0, a.LimitMs)
			require.Equal(t, 2.0, a.GoalS, "two report intervals of 1 s")
			require.Nil(t, a.NewcomerShare, "step has no newcomer")
		})
	}
	require.Nil(t, adaptation(Scenario{ID: "thesis-2"}, steady(ms10, time.Second, 0, 0, 0), nil), "no event, no adaptation")
}

func TestNewcomerShare(t *testing.T) {
	ms := time.Millisecond
	ds := []Delivery{
		{Seq: 0, Member: 0, Sent: 0},
		{Seq: 1, Member: 2, Sent: 100 * ms},
		{Seq: 2, Member: 1, Sent: 200 * ms},
		{Seq: 3, Member: 2, Sent: 300 * ms},
		{Seq: 4, Member: 2, Sent: 400 * ms},
	}
	tests := []struct {
		name     string
		from, to time.Duration
		want     float64
	}{
		{"everything", 0, time.Second, 0.6},
		{"window start included, end excluded", 100 * ms, 300 * ms, 0.5},
		{"only the newcomer", 300 * ms, 500 * ms, 1},
		{"before it took anything", 0, 100 * ms, 0},
		{"nothing published", time.Second, 2 * time.Second, math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := newcomerShare(ds, 2, tt.from, tt.to)
			if math.IsNaN(tt.want) {
				require.True(t, math.IsNaN(got))
				return
			}
			require.InDelta(t, tt.want, got, 1e-12)
		})
	}
}

func TestJoinShareComparedWithOracle(t *testing.T) {
	join, err := ScenarioByID("join")
	require.NoError(t, err)
	require.Equal(t, 30*time.Millisecond, join.Gap)
	require.InDelta(t, 0.83, (1000.0/30)/join.Capacity(0), 0.01, "ρ before the join")
	require.InDelta(t, 0.42, (1000.0/30)/join.Capacity(join.EventAt), 0.01, "ρ after the join")

	s := join
	s.Duration = 14 * time.Second
	trace := s.Trace(1)
	// takeEvery gives the newcomer (member 2) every k-th message published
	// from its join on, with the given latency, the others the rest.
	takeEvery := func(k int, lat time.Duration) []Delivery {
		var ds []Delivery
		n := 0
		for seq, sent := range trace {
			d := Delivery{Seq: seq, Member: seq % 2, Sent: sent, Start: sent + time.Millisecond}
			if sent >= s.EventAt {
				if n%k == 0 {
					d.Member, d.Start = 2, sent+lat
				}
				n++
			}
			ds = append(ds, d)
		}
		return ds
	}
	oracleEvery3 := takeEvery(3, 0)
	tests := []struct {
		name      string
		ds        []Delivery
		oracle    []Delivery
		wantShare float64
		wantRatio float64
		wantMaxMs float64
	}{
		{"as the oracle", takeEvery(3, 2*time.Millisecond), oracleEvery3, 1.0 / 3, 1, 2},
		{"half the oracle's share, slow", takeEvery(6, 70*time.Millisecond), oracleEvery3, 1.0 / 6, 0.5, 70},
		{"took only its first message", takeEvery(1000000, 0), oracleEvery3, 1.0 / 67, 3.0 / 67, 0},
		{"no oracle to compare with", takeEvery(3, 0), nil, 1.0 / 3, -1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := adaptation(s, tt.ds, tt.oracle)
			require.NotNil(t, a)
			require.Equal(t, 2.0, a.ShareWindowS)
			require.InDelta(t, tt.wantShare, a.NewcomerShareEarly, 0.01)
			require.InDelta(t, tt.wantRatio, a.ShareRatio, 0.02)
			require.InDelta(t, tt.wantMaxMs, a.NewcomerMaxMs, 1e-9)
			require.InDelta(t, 0.5, a.NewcomerFairShare, 1e-9, "the 25 ms newcomer is half the capacity after joining")
		})
	}
}

func TestJoinOracleShareOnTheRealTrace(t *testing.T) {
	s, err := ScenarioByID("join")
	require.NoError(t, err)
	trace := s.Trace(1)
	oracle := Oracle(s, trace)
	r := buildResult(s, KindSDK, harness.SystemOracle, 1, trace, len(trace), 1, oracle)
	require.NotNil(t, r.Adaptation)
	require.Greater(t, r.Adaptation.OracleShareEarly, 0.0)
	require.Equal(t, r.Adaptation.OracleShareEarly, r.Adaptation.NewcomerShareEarly)
	require.Equal(t, 1.0, r.Adaptation.ShareRatio, "the oracle against itself")
	require.LessOrEqual(t, r.Adaptation.NewcomerMaxMs, 50.0)
	require.Equal(t, 0.0, r.Adaptation.RecoveryS, "ρ 0.83 then 0.42: the oracle never exceeds 50 ms")
}

func TestRollingP99AndRecovery(t *testing.T) {
	var ds []Delivery
	// 10 messages per 100 ms for 3 s; those published in [1 s, 1.5 s) wait
	// 80 ms, the rest 1 ms.
	for i := range 300 {
		sent := time.Duration(i) * 10 * time.Millisecond
		lat := time.Millisecond
		if sent >= time.Second && sent < 1500*time.Millisecond {
			lat = 80 * time.Millisecond
		}
		ds = append(ds, Delivery{Seq: i, Sent: sent, Start: sent + lat})
	}
	series := RollingP99(ds, 500*time.Millisecond, 100*time.Millisecond)
	require.NotEmpty(t, series)
	for _, p := range series {
		switch {
		case p.T <= 1.0+1e-9 || p.T >= 2.0-1e-9:
			require.Equal(t, 1.0, p.V, "t=%v", p.T)
		default:
			require.Equal(t, 80.0, p.V, "t=%v", p.T)
		}
	}
	// Windows end-exclusive: the last one over 50 ms ends at 1.9 s, so the
	// p99 is back 0.9 s after an event at 1.0 s.
	require.InDelta(t, 0.9, recoveryTime(series, 1.0, 50), 1e-9)
	require.Equal(t, 0.0, recoveryTime(series, 2.5, 50))
	require.Equal(t, -1.0, recoveryTime([]TimePoint{{1, 1}, {2, 60}}, 0.5, 50))
}
