package scoring

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestAckGridTellsATickerFromWorkEnds(t *testing.T) {
	ms := time.Millisecond
	// A 50 ms ticker seen through ±0.6 ms of jitter, flushing in one
	// period, skipping others.
	var ticker ackGrid
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 16 {
		jitter := time.Duration(rng.IntN(1200)-600) * time.Microsecond
		ticker.observe(time.Duration(1+i%3)*50*ms + jitter)
		if ticker.offGrid() {
			t.Fatalf("a 50 ms ticker is off the grid after %d gaps: period %v, history %016b", i+1, ticker.period, ticker.history)
		}
	}
	if ticker.offGrid() {
		t.Fatalf("a 50 ms ticker is off the grid: period %v, history %016b", ticker.period, ticker.history)
	}
	// Python paho: acks when work ends, exponential work of 40 ms mean;
	// told apart from the eighth gap on.
	for seed := range uint64(5) {
		var ends ackGrid
		rng := rand.New(rand.NewPCG(seed, 7))
		for i := range 64 {
			if i < 8 && ends.offGrid() {
				t.Fatalf("seed %d: off the grid after %d gaps; it needs 8", seed, i)
			}
			ends.observe(time.Duration(rng.ExpFloat64() * float64(40*ms)))
		}
		if !ends.offGrid() {
			t.Fatalf("seed %d: acks at work ends taken for a ticker: period %v, history %016b", seed, ends.period, ends.history)
		}
	}
	// Deterministic work of 30 ms acked when it ends is no grid either
	// once the member idles between messages now and then.
	var steady ackGrid
	for i := range 32 {
		steady.observe(30*ms + time.Duration(i%5)*7*ms)
	}
	if !steady.offGrid() {
		t.Fatalf("work ends every 30–58 ms taken for a ticker: period %v", steady.period)
	}
	// Gaps under minGridPeriod (a burst split by scheduling) are not
	// gaps between flushes.
	var split ackGrid
	for range 16 {
		split.observe(2 * ms)
	}
	if split.seen != 0 || split.offGrid() {
		t.Fatalf("2 ms gaps counted: %+v", split)
	}
}
