package sites

import (
	"slices"
	"time"
)

// wqOracleMessage is one work-queue message for wqOracle: published at
// site Origin at time Sent.
type wqOracleMessage struct {
	Origin int
	Sent   time.Duration
}

// wqOracle returns the latencies (ms) a scheduler would get that knows
// every consumer's state at every site and pays nothing but the network:
// in publish order, each message goes to the consumer that can start it
// first, at max(sent + one-way delay to the consumer's site, the moment
// the consumer finishes its previous message). consumers gives each site's
// consumers, delay(o, s) the one-way delay from site o to site s (0 for
// o = s), service each consumer's time per message. It is a reference, not
// a proof of optimality: a policy that holds a message back for a better
// consumer could beat it on some inputs; no online policy knows the
// consumers' state without delay, as this one does.
func wqOracle(msgs []wqOracleMessage, consumers []int, delay func(o, s int) time.Duration, service time.Duration) []float64 {
	sorted := slices.Clone(msgs)
	slices.SortStableFunc(sorted, func(a, b wqOracleMessage) int { return int(a.Sent - b.Sent) })
	free := make([][]time.Duration, len(consumers))
	for s, n := range consumers {
		free[s] = make([]time.Duration, n)
		for k := range free[s] {
			free[s][k] = -1 << 62 // free from the start
		}
	}
	out := make([]float64, 0, len(sorted))
	for _, m := range sorted {
		bestS, bestK, best := -1, -1, time.Duration(0)
		for s := range free {
			arrive := m.Sent + delay(m.Origin, s)
			for k, f := range free[s] {
				start := max(arrive, f)
				// Ties go to the origin's own site, then to the lower index.
				if bestS < 0 || start < best || (start == best && s == m.Origin && bestS != m.Origin) {
					bestS, bestK, best = s, k, start
				}
			}
		}
		if bestS < 0 {
			continue // no consumer anywhere
		}
		free[bestS][bestK] = best + service
		out = append(out, float64(best-m.Sent)/float64(time.Millisecond))
	}
	return out
}
