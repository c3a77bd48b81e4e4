package clientsdk

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEstimateBacklog(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name    string
		mean    time.Duration
		elapsed []time.Duration
		pending int
		workers int
		want    time.Duration
	}{
		{"idle", 25 * ms, nil, 0, 1, 0},
		{"one running half done", 25 * ms, []time.Duration{10 * ms}, 0, 1, 15 * ms},
		{"running plus pending", 25 * ms, []time.Duration{10 * ms}, 3, 1, 90 * ms},
		{"overrunning handler counts as done", 25 * ms, []time.Duration{40 * ms}, 2, 1, 50 * ms},
		{"shared among workers", 20 * ms, []time.Duration{5 * ms, 15 * ms}, 4, 2, (15*ms + 5*ms + 80*ms) / 2},
		{"zero workers means one", 10 * ms, nil, 2, 0, 20 * ms},
		{"unknown mean", 0, []time.Duration{time.Second}, 10, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, estimateBacklog(tt.mean, tt.elapsed, tt.pending, tt.workers))
		})
	}
}

func TestLoadTrackerReportsMeanSinceLastReport(t *testing.T) {
	l := newLoadTracker(2)
	snap := l.take(t0, 0)
	require.Zero(t, snap.processingTime, "nothing finished yet")
	require.False(t, snap.backlogKnown, "no estimate before a measurement")

	l.begin(t0)
	l.begin(t0)
	finished, running := l.end(t0, t0.Add(10*time.Millisecond))
	require.Equal(t, 1, finished, "first finish since the report")
	require.Equal(t, 1, running)
	finished, running = l.end(t0, t0.Add(30*time.Millisecond))
	require.Equal(t, 2, finished)
	require.Zero(t, running)
	finished, running, known := l.signal()
	require.Equal(t, 2, finished)
	require.Zero(t, running)
	require.True(t, known)

	// Running mean: 10 ms, then 10 + 0.1×(30−10) = 12 ms.
	mean, inFlight := l.meanProcessingTime()
	require.Equal(t, 12*time.Millisecond, mean)
	require.Zero(t, inFlight)

	l.begin(t0.Add(40 * time.Millisecond))
	snap = l.take(t0.Add(44*time.Millisecond), 3)
	require.Equal(t, 20*time.Millisecond, snap.processingTime, "mean of 10 ms and 30 ms")
	require.Equal(t, 1, snap.inFlight)
	require.True(t, snap.backlogKnown)
	require.Equal(t, (8*time.Millisecond+3*12*time.Millisecond)/2, snap.backlog)

	snap = l.take(t0.Add(50*time.Millisecond), 0)
	require.Zero(t, snap.processingTime, "the period restarted")
	finished, running, _ = l.signal()
	require.Zero(t, finished)
	require.Equal(t, 1, running, "the handler begun at 40 ms")
}
