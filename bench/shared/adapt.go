package shared

import (
	"math"
	"sort"
	"time"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// Adaptation measures how a system reacts to a scenario's event (step,
// join, crash), from one run's deliveries.
type Adaptation struct {
	// RecoveryS is the time after the event until the rolling p99 stays
	// under LimitMs for good: the end of the last window over the limit
	// minus the event time; 0 if no window after the event exceeded it, -1
	// if the last window still does. Windows are WindowMs wide by publish
	// time and end every StepMs.
	RecoveryS float64 `json:"recovery_s"`
	WindowMs  float64 `json:"window_ms"`
	StepMs    float64 `json:"step_ms"`
	LimitMs   float64 `json:"limit_ms"`
	// GoalS is the recovery goal: two report intervals.
	GoalS float64 `json:"goal_s"`
	// For join: the newcomer's share of the messages published in each
	// second after it joined, and its capacity share.
	NewcomerShare     []float64 `json:"newcomer_share,omitempty"`
	NewcomerFairShare float64   `json:"newcomer_fair_share,omitempty"`
	// NewcomerShareEarly is the newcomer's share of the messages published
	// in the ShareWindowS seconds after it joined; OracleShareEarly the
	// share the perfect-information greedy oracle gives it on the same
	// trace; ShareRatio the first divided by the second (-1: undefined).
	ShareWindowS       float64 `json:"share_window_s,omitempty"`
	NewcomerShareEarly float64 `json:"newcomer_share_early,omitempty"`
	OracleShareEarly   float64 `json:"oracle_share_early,omitempty"`
	ShareRatio         float64 `json:"share_ratio_vs_oracle,omitempty"`
	// NewcomerMaxMs and NewcomerMeanMs are the largest and mean latency of
	// the messages the newcomer dequeued (-1: none).
	NewcomerMaxMs  float64 `json:"newcomer_max_ms,omitempty"`
	NewcomerMeanMs float64 `json:"newcomer_mean_ms,omitempty"`
}

const (
	// adaptationLimit is the p99 bound of the step goal (ms).
	adaptationLimit = 50.0
	// adaptationWindow and adaptationStep define the rolling p99.
	adaptationWindow = 500 * time.Millisecond
	adaptationStep   = 100 * time.Millisecond
	// joinShareWindow is how long after joining the newcomer's share is
	// compared with the oracle's.
	joinShareWindow = 2 * time.Second
	// joinShareGoal is the fraction of the oracle's share the newcomer
	// must reach within joinShareWindow; joinMaxGoalMs bounds its worst
	// latency.
	joinShareGoal = 0.9
	joinMaxGoalMs = 50.0
	// recoveryGoalIntervals is the step goal in report intervals.
	recoveryGoalIntervals = 2
)

// adaptation computes the Adaptation of a run of s, or nil if s has no
// event. oracle is the perfect-information greedy oracle's replay of the
// same trace (used for the join share ratio; may be nil).
func adaptation(s Scenario, ds, oracle []Delivery) *Adaptation {
	if s.EventAt == 0 || len(ds) == 0 {
		return nil
	}
	a := &Adaptation{WindowMs: harness.Millis(adaptationWindow), StepMs: harness.Millis(adaptationStep), LimitMs: adaptationLimit,
		GoalS: recoveryGoalIntervals * s.ReportInterval.Seconds()}
	series := RollingP99(ds, adaptationWindow, adaptationStep)
	a.RecoveryS = recoveryTime(series, s.EventAt.Seconds(), adaptationLimit)
	newcomer := -1
	for i, m := range s.Members {
		if m.JoinAt > 0 {
			newcomer = i
		}
	}
	if newcomer < 0 {
		return a
	}
	join := s.Members[newcomer].JoinAt
	a.NewcomerFairShare = float64(time.Second) / float64(s.Members[newcomer].serviceAt(join)) / s.Capacity(join)
	sorted := append([]Delivery(nil), ds...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Sent < sorted[j].Sent })
	last := sorted[len(sorted)-1].Sent
	for from := join; from < last; from += time.Second {
		if share := newcomerShare(sorted, newcomer, from, from+time.Second); !math.IsNaN(share) {
			a.NewcomerShare = append(a.NewcomerShare, share)
		}
	}
	a.ShareWindowS = joinShareWindow.Seconds()
	a.NewcomerShareEarly = orMinus1(newcomerShare(ds, newcomer, join, join+joinShareWindow))
	a.OracleShareEarly = -1
	a.ShareRatio = -1
	if oracle != nil {
		a.OracleShareEarly = orMinus1(newcomerShare(oracle, newcomer, join, join+joinShareWindow))
		if a.NewcomerShareEarly >= 0 && a.OracleShareEarly > 0 {
			a.ShareRatio = a.NewcomerShareEarly / a.OracleShareEarly
		}
	}
	var lat []float64
	for _, d := range ds {
		if d.Member == newcomer {
			lat = append(lat, harness.Millis(d.Latency()))
		}
	}
	st := harness.Summarise(lat)
	a.NewcomerMaxMs, a.NewcomerMeanMs = orMinus1(st.Max), orMinus1(st.Mean)
	return a
}

// newcomerShare returns the fraction of the messages published in
// [from, to) that member took, or NaN if none was published then.
func newcomerShare(ds []Delivery, member int, from, to time.Duration) float64 {
	total, mine := 0, 0
	for _, d := range ds {
		if d.Sent >= from && d.Sent < to {
			total++
			if d.Member == member {
				mine++
			}
		}
	}
	if total == 0 {
		return math.NaN()
	}
	return float64(mine) / float64(total)
}

// orMinus1 maps NaN (no data) to -1, which JSON can hold.
func orMinus1(v float64) float64 {
	if math.IsNaN(v) {
		return -1
	}
	return v
}

// recoveryTime returns how long after event (s) the series stays at or
// under limit for good: the end of the last window over limit minus event;
// 0 if no window after the event exceeds it; -1 if the last window does.
func recoveryTime(series []TimePoint, event, limit float64) float64 {
	lastBad := math.NaN()
	for _, p := range series {
		if p.T > event && p.V > limit {
			lastBad = p.T
		}
	}
	if math.IsNaN(lastBad) {
		return 0
	}
	if len(series) > 0 && series[len(series)-1].T == lastBad {
		return -1
	}
	return lastBad - event
}
