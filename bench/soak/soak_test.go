package soak

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/internal/testenv"
)

func TestSoakPayloadRoundTrip(t *testing.T) {
	b := make([]byte, soakPayloadSize)
	sent := time.Unix(1700000000, 123456789)
	encodeSoakPayload(b, 987654321, sent, 17, 1)
	seq, ns, g, qos, ok := decodeSoakPayload(b)
	require.True(t, ok)
	require.Equal(t, uint64(987654321), seq)
	require.Equal(t, sent.UnixNano(), ns)
	require.Equal(t, 17, g)
	require.Equal(t, byte(1), qos)
	_, _, _, _, ok = decodeSoakPayload(b[:soakPayloadSize-1])
	require.False(t, ok, "a payload of the wrong size is not a soak message")
}

func TestSoakQoSSpreadIsExact(t *testing.T) {
	for _, pct := range []int{0, 1, 33, 50, 99, 100} {
		tr := newSoakTracker(1, pct)
		n := 0
		for seq := range uint64(1000) {
			if tr.qosOf(seq) == 1 {
				n++
			}
		}
		require.Equal(t, 10*pct, n, "QoS 1 IDs per 1000 at %d %%", pct)
	}
}

// TestSoakTrackerCountsLostAndDuplicated publishes eight IDs (QoS 1 and 0
// alternate at 50 %), receives some once, some twice, one in the wrong
// group, and leaves one of each QoS unreceived.
func TestSoakTrackerCountsLostAndDuplicated(t *testing.T) {
	tr := newSoakTracker(8, 50)
	t0 := time.Unix(1000, 0)
	payload := make([]byte, soakPayloadSize)
	var ids []uint64
	for range 8 {
		seq, ok := tr.reserve(3)
		require.True(t, ok)
		ids = append(ids, seq)
	}
	_, ok := tr.reserve(3)
	require.False(t, ok, "capacity is used up")
	require.Equal(t, byte(0), tr.qosOf(0))
	require.Equal(t, byte(1), tr.qosOf(1))
	deliver := func(seq uint64, group int, at time.Time) {
		encodeSoakPayload(payload, seq, t0, 3, tr.qosOf(seq))
		tr.receive(payload, group, at)
	}
	for _, seq := range ids {
		var err error
		if seq == 7 {
			err = errors.New("publish failed")
		}
		tr.publishDone(seq, t0, err)
	}
	// ID 6 (QoS 0) was still being published at the first scan.
	tr.published[6].Store(soakPending)
	deliver(0, 3, t0.Add(2*time.Millisecond))
	deliver(1, 3, t0.Add(4*time.Millisecond))
	deliver(1, 3, t0.Add(5*time.Millisecond)) // QoS 1 duplicate
	deliver(2, 3, t0.Add(time.Millisecond))
	deliver(2, 3, t0.Add(time.Millisecond)) // QoS 0 duplicate
	deliver(3, 4, t0.Add(time.Millisecond)) // wrong group
	// 4 (QoS 0) and 5 (QoS 1) are never received; 7 failed.

	o := tr.scan(t0.Add(time.Second), 10*time.Second)
	require.Equal(t, 0, o.OverdueQoS1, "nothing is overdue before the age")
	require.Equal(t, 1, o.AwaitingQoS1)
	require.Equal(t, 0, o.MissingQoS0)

	tr.published[6].Store(t0.UnixNano())
	for range 2 { // a second scan, from the watermark, counts the same
		o = tr.scan(t0.Add(11*time.Second), 10*time.Second)
		require.Equal(t, 1, o.OverdueQoS1)
		require.Equal(t, []uint64{5}, o.Overdue)
		require.Equal(t, 2, o.MissingQoS0, "IDs 4 and 6")
	}

	f := tr.finalCounts()
	require.Equal(t, 3, f.AckedQoS1, "IDs 1, 3, 5 (7 failed)")
	require.Equal(t, 4, f.WrittenQoS0, "IDs 0, 2, 4, 6")
	require.Equal(t, 1, f.LostQoS1)
	require.Equal(t, []uint64{5}, f.Lost)
	require.Equal(t, 2, f.MissingQoS0)
	require.Equal(t, int64(1), tr.dupQoS1.Load())
	require.Equal(t, int64(1), tr.dupQoS0.Load())
	require.Equal(t, int64(1), tr.misrouted.Load())
	require.Equal(t, int64(1), tr.pubFailed.Load())
	require.Equal(t, int64(6), tr.receipts.Load())

	p99, n, _ := tr.takeWindow(nil)
	require.Equal(t, 4, n, "first receipts only")
	require.InDelta(t, 4.0, p99, 1e-9)
	_, n, _ = tr.takeWindow(nil)
	require.Zero(t, n, "the window restarts after each take")
	q1, q0 := tr.latencies()
	require.Equal(t, []float64{1, 4}, q1)
	require.Equal(t, []float64{1, 2}, q0)
}

func TestSoakStabilityComparesFirstAndLastWindows(t *testing.T) {
	var ss []SoakSample
	for i := 1; i <= 12; i++ {
		rss := 50.0
		if i > 8 {
			rss = 60
		}
		ss = append(ss, SoakSample{T: float64(10 * i), Phase: "publish", BrokerRSSMB: rss, BrokerGoroutine: 400, BrokerThreads: 9})
	}
	ss = append(ss, SoakSample{T: 130, Phase: "drain", BrokerRSSMB: 999, BrokerGoroutine: 999})
	st := soakStability(ss, 0, 40*time.Second, 120)
	require.Equal(t, 50.0, st.RSSFirstMedianMB)
	require.Equal(t, 60.0, st.RSSLastMedianMB, "the drain sample is not in the last window")
	require.Equal(t, 400.0, st.GoroutinesFirst)
	require.Equal(t, 400.0, st.GoroutinesLast)
	require.Equal(t, 0.0, st.GoroutineSlope)
	require.Greater(t, st.RSSSlopeMBPer10Min, 0.0)
	res := &SoakResults{Stability: st}
	res.Final.AckedQoS1 = 10
	gs := soakGoals(res)
	require.Len(t, gs, 3)
	require.Equal(t, "met", gs[0].Status)
	require.Equal(t, "met", gs[1].Status, "×1.2 is within the RSS limit")
	require.Equal(t, "met", gs[2].Status)
	res.Stability.RSSLastMedianMB = 61
	res.Final.LostQoS1 = 1
	gs = soakGoals(res)
	require.Equal(t, "missed", gs[0].Status)
	require.Equal(t, "missed", gs[1].Status)
}

func TestSoakStabilityLeavesOutTheWarmup(t *testing.T) {
	// RSS climbs for the first 30 s, then stays at 80; the live heap,
	// measured every third sample, stays at 20 MB until it leaks at the end.
	var ss []SoakSample
	for i := 1; i <= 12; i++ {
		s := SoakSample{T: float64(10 * i), Phase: "publish", BrokerRSSMB: 80, BrokerGoroutine: 400, BrokerLiveHeapMB: -1}
		if i <= 3 {
			s.BrokerRSSMB = float64(20 * i)
		}
		if i%3 == 0 {
			s.BrokerLiveHeapMB = 20
			if i == 12 {
				s.BrokerLiveHeapMB = 30
			}
		}
		ss = append(ss, s)
	}
	st := soakStability(ss, 30*time.Second, 40*time.Second, 120)
	require.Equal(t, 30.0, st.WarmupS)
	require.Equal(t, 80.0, st.RSSFirstMedianMB, "samples at 40-70 s, after the warm-up")
	require.Equal(t, 80.0, st.RSSLastMedianMB)
	require.Equal(t, 0.0, st.RSSSlopeMBPer10Min, "the slope starts after the warm-up")
	require.Equal(t, 20.0, st.LiveHeapFirstMB, "the live heap of the sample at 60 s")
	require.Equal(t, 25.0, st.LiveHeapLastMB, "the samples at 90 and 120 s")

	// Without the warm-up the climb counts: RSS looks like it grew.
	require.Less(t, soakStability(ss, 0, 40*time.Second, 120).RSSFirstMedianMB, 80.0)

	res := &SoakResults{Stability: st}
	res.Final.AckedQoS1 = 10
	res.Config.LiveHeapEveryS = 30
	gs := soakGoals(res)
	require.Len(t, gs, 4)
	require.Equal(t, "broker live heap (after a forced GC) flat after warm-up", gs[2].Text)
	require.Equal(t, "missed", gs[2].Status, "×1.25 is above the live heap limit")
	require.Contains(t, gs[1].Detail, "after the 30 s warm-up")
}

func TestParseHeapAlloc(t *testing.T) {
	profile := "heap profile: 1: 2 [3: 4] @ heap/1048576\n# runtime.MemStats\n# Alloc = 1\n# TotalAlloc = 2\n# HeapAlloc = 52428800\n# HeapSys = 99\n"
	mb, err := parseHeapAlloc(strings.NewReader(profile))
	require.NoError(t, err)
	require.Equal(t, 50.0, mb)
	_, err = parseHeapAlloc(strings.NewReader("heap profile\n# Alloc = 1\n"))
	require.ErrorContains(t, err, "no HeapAlloc")
	_, err = parseHeapAlloc(strings.NewReader("# HeapAlloc = many\n"))
	require.Error(t, err)
}

func TestSoakFlags(t *testing.T) {
	cfg, err := parseSoakFlags(nil, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 2000, cfg.Connections)
	require.Equal(t, 20, cfg.Groups)
	require.Equal(t, 30*time.Minute, cfg.Duration)
	cfg, err = parseSoakFlags([]string{"--duration", "3m", "--connections", "500", "--broker-arg=--write-timeout=5s"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, 3*time.Minute, cfg.Duration)
	require.Equal(t, []string{"--write-timeout=5s"}, cfg.BrokerArgs)
	for _, bad := range [][]string{
		{"--connections", "30"}, {"--rate", "0"}, {"--qos1-percent", "101"}, {"--duration", "1s"}, {"--out", ""}, {"extra"},
		{"--live-heap-every", "-1s"}, {"--duration", "3m", "--warmup", "2m"},
	} {
		_, err := parseSoakFlags(bad, io.Discard)
		require.Error(t, err, "%v", bad)
	}
}

func TestSoakFDLimitAlreadyHighEnough(t *testing.T) {
	soft, hard, raised, err := harness.EnsureFDLimit(64)
	require.NoError(t, err)
	require.False(t, raised)
	require.GreaterOrEqual(t, soft, uint64(64))
	require.GreaterOrEqual(t, hard, soft)
	_, _, _, err = harness.EnsureFDLimit(hard + 1)
	require.Error(t, err, "more than the hard limit cannot be had")
}

// TestSoakRunSmall runs the whole soak pipeline on the real luffymq binary
// at a small scale for 12 s with fast churn and checks the counts and the
// outputs: nothing lost at QoS 1, churn hit members holding unacknowledged
// messages, every sample has the broker's RSS and goroutines.
func TestSoakRunSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts luffymq; skipped with -short")
	}
	testenv.RequireBinary(t, "go", "golang-go")
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var progress strings.Builder
	cfg := SoakConfig{
		Connections: 64, Groups: 4, Publishers: 4, Rate: 100, QoS1Percent: 50,
		Duration: 12 * time.Second, ChurnEvery: 300 * time.Millisecond, RejoinAfter: time.Second,
		ProcessTime: 150 * time.Millisecond, SampleEvery: time.Second, Grace: 15 * time.Second,
		OverdueAfter: 5 * time.Second, Out: out, Seed: 7, Progress: &progress, LiveHeapEvery: 2 * time.Second,
	}
	res, err := RunSoak(ctx, cfg)
	require.NoError(t, err, progress.String())
	liveHeaps := 0
	for _, s := range res.Samples {
		if s.BrokerLiveHeapMB > 0 {
			liveHeaps++
		}
	}
	require.GreaterOrEqual(t, liveHeaps, 4, "the live heap is measured every 2 s")
	require.Positive(t, res.Stability.LiveHeapLastMB)
	f, tt := res.Final, res.Totals
	require.Equal(t, 1200, int(tt.Reserved))
	require.Zero(t, tt.PublishFailed)
	require.Equal(t, 600, f.AckedQoS1)
	require.Equal(t, 600, f.WrittenQoS0)
	require.Zero(t, f.LostQoS1, "lost QoS 1 IDs: %v", f.Lost)
	require.Equal(t, int64(600), tt.ReceivedQoS1)
	require.Equal(t, int64(600-f.MissingQoS0), tt.ReceivedQoS0)
	require.Zero(t, tt.Misrouted)
	require.Zero(t, tt.Undecodable)
	require.Greater(t, tt.Leaves, int64(5))
	require.Greater(t, tt.Crashes, int64(5))
	require.Greater(t, tt.ChurnHeld, int64(0), "churn hit members holding unacknowledged messages")
	require.Greater(t, tt.Joins, int64(5))
	require.Equal(t, "broker /metrics go_goroutines", res.GoroutineSource)
	require.GreaterOrEqual(t, len(res.Samples), 11)
	for _, s := range res.Samples {
		require.Greater(t, s.BrokerRSSMB, 1.0)
		require.Greater(t, s.BrokerGoroutine, 10.0)
		require.Greater(t, s.BrokerThreads, 0)
	}
	redispatched := res.Samples[len(res.Samples)-1].BrokerMetrics[`luffymq_redispatched_messages_total{outcome="delivered"}`]
	require.Greater(t, redispatched, 0.0, "the broker re-dispatched held messages of departed members")

	for _, name := range []string{"soak.json", "summary.md", "broker.log"} {
		_, err := os.Stat(filepath.Join(out, name))
		require.NoError(t, err, name)
	}
	for _, p := range soakPlots {
		st, err := os.Stat(filepath.Join(out, p.File))
		require.NoError(t, err, p.File)
		require.Greater(t, st.Size(), int64(1000), p.File)
	}
	data, err := os.ReadFile(filepath.Join(out, "soak.json"))
	require.NoError(t, err)
	var back SoakResults
	require.NoError(t, json.Unmarshal(data, &back))
	require.Equal(t, f.AckedQoS1, back.Final.AckedQoS1)
	require.Len(t, back.Samples, len(res.Samples))
	md, err := os.ReadFile(filepath.Join(out, "summary.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "- 0 lost at QoS 1: **met** — 0 lost of 600")
}
