package throughput

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

func TestWaitVerdict(t *testing.T) {
	const w = 3 * time.Second
	tests := []struct {
		name           string
		delivered      int64
		idle           time.Duration
		publishersDone bool
		qos            byte
		pastDeadline   bool
		want           harness.WaitState
	}{
		{"all delivered", 100, 0, true, 1, false, harness.WaitComplete},
		{"all delivered even past the deadline", 100, 5 * time.Second, false, 0, true, harness.WaitComplete},
		{"still growing", 50, 100 * time.Millisecond, false, 1, false, harness.WaitMore},
		{"QoS 1 flat for the window while publishers wait for PUBACKs", 50, w, false, 1, false, harness.WaitStalled},
		{"QoS 1 flat just under the window", 50, w - time.Millisecond, false, 1, false, harness.WaitMore},
		{"QoS 1 flat after publishers finished: acknowledged messages never came", 50, w, true, 1, false, harness.WaitStalled},
		{"QoS 0 flat while publishers are blocked", 50, w, false, 0, false, harness.WaitStalled},
		{"QoS 0 flat after publishers finished: drops", 50, 2 * time.Second, true, 0, false, harness.WaitDrained},
		{"QoS 0 publishers finished, deliveries still trickling", 50, time.Second, true, 0, false, harness.WaitMore},
		{"deadline while still growing", 50, 10 * time.Millisecond, false, 1, true, harness.WaitTimedOut},
		{"flat for the window at the deadline is a stall", 50, w, false, 1, true, harness.WaitStalled},
		{"nothing ever delivered", 0, w, false, 1, false, harness.WaitStalled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := harness.WaitVerdict(tt.delivered, 100, tt.idle, tt.publishersDone, tt.qos, w, tt.pastDeadline)
			require.Equal(t, tt.want, got)
		})
	}
	require.Equal(t, harness.WaitDrained, harness.WaitVerdict(5, 10, time.Second, true, 0, time.Second, false), "a stall window under 2 s also ends QoS 0 drains sooner")
}

func TestThroughputAggregateMediansAndStalls(t *testing.T) {
	runs := []ThroughputRun{
		{Test: "shared-qos1", System: harness.SystemMochi, Repeat: 1, Stalled: true, Delivered: 900, Expected: 2000},
		{Test: "shared-qos1", System: harness.SystemMochi, Repeat: 2, MsgsPerS: 8000, P50Ms: 5, P99Ms: 50},
		{Test: "shared-qos1", System: harness.SystemMochi, Repeat: 3, Stalled: true},
		{Test: "shared-qos1", System: harness.SystemMosquitto, Repeat: 1, MsgsPerS: 10000, P50Ms: 4, P99Ms: 20},
		{Test: "shared-qos1", System: harness.SystemMosquitto, Repeat: 2, MsgsPerS: 12000, P50Ms: 3, P99Ms: 25},
		{Test: "shared-qos1", System: harness.SystemMosquitto, Repeat: 3, MsgsPerS: 11000, P50Ms: 5, P99Ms: 30, Dropped: 2},
		{Test: "shared-qos1", System: "luffymq-adaptive", Repeat: 1, MsgsPerS: 9500},
		{Test: "shared-qos1", System: "luffymq-adaptive", Repeat: 2, MsgsPerS: 10100},
		{Test: "shared-qos1", System: "luffymq-adaptive", Repeat: 3, MsgsPerS: 10000},
		{Test: "shared-qos0", System: harness.SystemMochi, Repeat: 1, Stalled: true},
		{Test: "shared-qos0", System: "luffymq-adaptive", Repeat: 1, MsgsPerS: 100},
		{Test: "fanout-qos0", System: harness.SystemMochi, Repeat: 1, MsgsPerS: 1000},
		{Test: "fanout-qos0", System: "luffymq-adaptive", Repeat: 1, Stalled: true},
		{Test: "fanout-qos0", System: "luffymq-adaptive", Repeat: 2, MsgsPerS: 2000},
	}
	tp := &ThroughputResults{Runs: runs, Config: ThroughputConfig{Repeat: 3}}
	tests := []struct {
		test, system     string
		wantRuns, wantSt int
		wantRate         float64
		wantText         string
	}{
		{"shared-qos1", harness.SystemMochi, 3, 2, 8000, "8000; stalled (2 of 3 runs)"},
		{"shared-qos1", harness.SystemMosquitto, 3, 0, 11000, "11000"},
		{"shared-qos1", "luffymq-adaptive", 3, 0, 10000, "10000"},
		{"shared-qos0", harness.SystemMochi, 1, 1, math.NaN(), "stalled (1 of 1 runs)"},
		{"fanout-qos1", harness.SystemMochi, 0, 0, math.NaN(), "—"},
	}
	for _, tt := range tests {
		t.Run(tt.test+"/"+tt.system, func(t *testing.T) {
			a := throughputAggregate(tp, tt.test, tt.system)
			require.Equal(t, tt.wantRuns, a.Runs)
			require.Equal(t, tt.wantSt, a.Stalled)
			if math.IsNaN(tt.wantRate) {
				require.True(t, math.IsNaN(a.Rate))
			} else {
				require.Equal(t, tt.wantRate, a.Rate)
			}
			require.Equal(t, tt.wantText, a.rateText())
		})
	}
	mq := throughputAggregate(tp, "shared-qos1", harness.SystemMosquitto)
	require.Equal(t, 4.0, mq.P50)
	require.Equal(t, 25.0, mq.P99)
	require.Equal(t, 2, mq.Dropped)

	goals := map[string]harness.Goal{}
	for _, g := range Goals(tp) {
		goals[strings.TrimSuffix(strings.Fields(g.Text)[1], ":")] = g
	}
	require.Equal(t, "met", goals["shared-qos1"].Status, goals["shared-qos1"].Detail) // 10000 ≥ 0.9 × 11000
	require.Equal(t, "not measured", goals["shared-qos0"].Status)
	require.Contains(t, goals["shared-qos0"].Detail, "mochi stalled (1 of 1 runs)")
	require.Equal(t, "missed", goals["fanout-qos0"].Status)
	require.Contains(t, goals["fanout-qos0"].Detail, "stalled (1 of 2 runs)")
	require.Equal(t, "not measured", goals["fanout-qos1"].Status)

	md := Markdown(tp)
	require.Contains(t, md, "| shared-qos1 | mochi | 8000; stalled (2 of 3 runs) |")
	require.Contains(t, md, "| shared-qos0 | mochi | stalled (1 of 1 runs) | — | — |")
}
