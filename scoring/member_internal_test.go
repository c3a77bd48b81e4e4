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
