package sites

import (
	"testing"
	"time"
)

func TestWQOracle(t *testing.T) {
	ms := time.Millisecond
	delay := func(o, s int) time.Duration {
		if o == s {
			return 0
		}
		return 20 * ms
	}
	// Site 0 has one consumer, site 1 one; service 100 ms. Three messages
	// at site 0 at t = 0, 10, 20 ms: the first starts at once locally, the
	// second goes to site 1 (starts at 30 ms, latency 20), the third waits
	// for the local consumer (free at 100 ms: latency 80) rather than for
	// site 1's (free at 130 ms).
	got := wqOracle([]wqOracleMessage{{0, 20 * ms}, {0, 0}, {0, 10 * ms}}, []int{1, 1}, delay, 100*ms)
	want := []float64{0, 20, 80}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	// A tie between the local consumer and a remote one goes local: the
	// remote site's consumer is free, the local one frees exactly when the
	// message would reach the remote site.
	got = wqOracle([]wqOracleMessage{{0, 0}, {0, 80 * ms}}, []int{1, 1}, delay, 100*ms)
	if got[1] != 20 {
		t.Fatalf("second message latency %v, want 20 (local and remote tie at 100 ms)", got[1])
	}
	// No consumer anywhere: nothing is placed.
	if got := wqOracle([]wqOracleMessage{{0, 0}}, []int{0, 0}, delay, 100*ms); len(got) != 0 {
		t.Fatalf("placed %v with no consumers", got)
	}
}
