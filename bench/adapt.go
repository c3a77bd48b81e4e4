package bench

import (
	"math"
	"sort"
	"time"
)

// Adaptation measures how a system reacts to a scenario's event (step,
// join, crash), from one run's deliveries.
type Adaptation struct {
	// RecoveryS is the time after the event until the rolling p99
	// (WindowMs windows by publish time) stays under LimitMs; 0 if it never
	// exceeded it, -1 if it never came back.
	RecoveryS float64 `json:"recovery_s"`
	WindowMs  float64 `json:"window_ms"`
	LimitMs   float64 `json:"limit_ms"`
	// For join: the newcomer's share of the messages published in each
	// second after it joined, its capacity share, the time until its share
	// first reached 90 % of that (-1: never) and the largest latency of a
	// message it dequeued.
	NewcomerShare     []float64 `json:"newcomer_share,omitempty"`
	NewcomerFairShare float64   `json:"newcomer_fair_share,omitempty"`
	NewcomerFairS     float64   `json:"newcomer_fair_s,omitempty"`
	NewcomerMaxMs     float64   `json:"newcomer_max_ms,omitempty"`
	NewcomerMeanMs    float64   `json:"newcomer_mean_ms,omitempty"`
}

// adaptationLimit is the p99 bound of the step goal.
const adaptationLimit = 50.0

// adaptation computes the Adaptation of a run of s, or nil if s has no
// event.
func adaptation(s Scenario, ds []Delivery) *Adaptation {
	if s.EventAt == 0 || len(ds) == 0 {
		return nil
	}
	const w = 500 * time.Millisecond
	a := &Adaptation{WindowMs: ms(w), LimitMs: adaptationLimit}
	series := RollingP99(ds, w, 100*time.Millisecond)
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
	a.NewcomerFairS = -1
	for from := join; from < last; from += time.Second {
		total, mine := 0, 0
		for _, d := range sorted {
			if d.Sent >= from && d.Sent < from+time.Second {
				total++
				if d.Member == newcomer {
					mine++
				}
			}
		}
		if total == 0 {
			continue
		}
		share := float64(mine) / float64(total)
		a.NewcomerShare = append(a.NewcomerShare, share)
		if a.NewcomerFairS < 0 && share >= 0.9*a.NewcomerFairShare {
			a.NewcomerFairS = (from + time.Second - join).Seconds()
		}
	}
	var lat []float64
	for _, d := range ds {
		if d.Member == newcomer {
			lat = append(lat, ms(d.Latency()))
		}
	}
	st := Summarise(lat)
	a.NewcomerMaxMs, a.NewcomerMeanMs = st.Max, st.Mean
	if math.IsNaN(st.Max) {
		a.NewcomerMaxMs, a.NewcomerMeanMs = -1, -1
	}
	return a
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
