package scoring

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestOverdueGuessIsBounded: the wait guessed for an overdue newcomer
// saturates instead of overflowing into the past.
func TestOverdueGuessIsBounded(t *testing.T) {
	tests := []struct {
		name        string
		unconfirmed int
		since, now  time.Duration
		want        time.Duration
	}{
		{"one", 1, 10 * ms, 40 * ms, 30 * ms},                 // halfway through a 60 ms message
		{"three", 3, 0, 40 * ms, 200 * ms},                    // 3 · 2 · 40 from 0
		{"huge", 1 << 40, 0, 48 * time.Hour, maxOverdueGuess}, // would overflow
		{"long", 1, 0, 30 * 24 * time.Hour, maxOverdueGuess},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMember("m", 0)
			m.unconfirmed, m.unconfirmedSince = tt.unconfirmed, tt.since
			m.lastReport = tt.now // it reports: the guess applies
			require.Equal(t, tt.now+tt.want, m.predictedStart(tt.now, 10*ms, time.Second))
		})
	}
}

// ackPairs acknowledges pairs of deliveries to m, each pair ending gap
// after the last: the first pair member's work took half the gap.
func ackPairs(m *member, now time.Duration, gaps []time.Duration) time.Duration {
	for _, gap := range gaps {
		m.deliveryStarted(now)
		m.deliveryStarted(now)
		now += gap
		m.deliveryAcknowledged(now, 0)
		m.deliveryAcknowledged(now, 0)
	}
	return now
}

// A member whose acks come in pairs on a timer's 50 ms grid (paho.golang)
// shows in its ack times when it flushed, not how variable its work is;
// one whose pairs end when its work does (Python paho writes an ack after
// its next read) shows its work's variability, and its unacknowledged
// messages are not all taken as finished since its last burst.
func TestBurstsOnAGridAndAtWorkEnds(t *testing.T) {
	grid := newMember("paho.golang", 0)
	ackPairs(grid, 0, []time.Duration{50 * ms, 100 * ms, 50 * ms, 150 * ms, 50 * ms, 50 * ms, 100 * ms, 50 * ms, 50 * ms, 100 * ms})
	require.Positive(t, grid.ackLag)
	require.True(t, grid.acksOnTimer())
	require.Zero(t, grid.serviceVariability())

	ends := newMember("python-paho", 0)
	now := ackPairs(ends, 0, []time.Duration{37 * ms, 91 * ms, 24 * ms, 53 * ms, 12 * ms, 71 * ms, 148 * ms, 66 * ms, 9 * ms, 57 * ms, 33 * ms})
	require.Positive(t, ends.ackLag)
	require.False(t, ends.acksOnTimer(), "pairs at work ends taken for a timer's flush")
	cv2 := ends.serviceVariability()
	require.Greater(t, cv2, 0.2)
	// Three sent now; 45 ms later, without the work's variability (what
	// a timer's member gets) the member would be taken to have finished
	// the first and be far into the second.
	svc := ends.service()
	for range 3 {
		ends.deliveryStarted(now)
	}
	at := now + 45*ms
	wait := ends.predictedStart(at, svc, time.Second) - at
	burstRule := 3*svc - 45*ms // all but the running one queued, less what 45 ms did
	require.Greater(t, wait, burstRule, "svc %v, cv² %.2f", svc, cv2)
}
