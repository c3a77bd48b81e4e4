package shared

import (
	"sort"
	"time"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// Delivery is one message taken for processing by a member: the unit every
// latency statistic is computed from. Times are offsets from the start of
// publishing.
type Delivery struct {
	Seq    int           `json:"seq"`
	Member int           `json:"member"` // 0-based
	Sent   time.Duration `json:"sent_ns"`
	Start  time.Duration `json:"start_ns"` // dequeue: the virtual service start
	// Ready is when the member received it (0: not measured, as in the
	// oracle's replays); Ready − Sent is the run's delivery delay.
	Ready time.Duration `json:"ready_ns,omitempty"`
}

// Latency is the queueing delay: dequeue time − publish time.
func (d Delivery) Latency() time.Duration { return d.Start - d.Sent }

// Oracle replays an arrival trace through a perfect-information
// earliest-start policy: each message goes to the member that can start it
// soonest, knowing every member's exact busy-until time, with no network
// delay. A member is eligible once it has joined and, if it crashes, only
// for messages it would finish before the crash. Ties go to the member idle
// longest, then the lowest index. It is a strong reference, not a proven
// lower bound: greedy earliest start is not optimal for every trace (see
// OracleName). At QoS 1 with acknowledgement after processing it is the
// same replay.
func Oracle(s Scenario, trace []time.Duration) []Delivery {
	return OracleWithDelays(s, trace, nil)
}

// OracleWithDelays is Oracle for a network that is not instantaneous:
// message seq reaches whichever member it is given delays[seq] after it
// was sent (0 beyond the slice), and no member can start it before. Fed a
// live run's measured delivery delays (DeliveryDelays), it tells what the
// perfect-information policy would have achieved on that run's network:
// at 100 % utilisation a delay that makes an idle member start late is
// capacity lost for good, for any policy. The delay of each message is the
// one measured on the member the live system chose, assumed to be the
// network's and the same for every member.
func OracleWithDelays(s Scenario, trace, delays []time.Duration) []Delivery {
	busy := make([]time.Duration, len(s.Members))
	for i, m := range s.Members {
		busy[i] = m.JoinAt
	}
	out := make([]Delivery, 0, len(trace))
	for seq, a := range trace {
		ready := a
		if seq < len(delays) {
			ready += delays[seq]
		}
		best, bestStart := -1, time.Duration(0)
		for i, m := range s.Members {
			if m.JoinAt > a {
				continue
			}
			start := max(ready, busy[i])
			if m.CrashAt > 0 && start+s.ServiceTime(i, seq, start) > m.CrashAt {
				continue
			}
			if best < 0 || start < bestStart || (start == bestStart && busy[i] < busy[best]) {
				best, bestStart = i, start
			}
		}
		if best < 0 {
			continue // nobody can take it (cannot happen in set A)
		}
		busy[best] = bestStart + s.ServiceTime(best, seq, bestStart)
		out = append(out, Delivery{Seq: seq, Member: best, Sent: a, Start: bestStart})
	}
	return out
}

// DeliveryDelays returns, indexed by sequence number, how long each of
// n messages took from its send to its receipt at a member in a live run
// (ds); 0 for messages never received or not measured.
func DeliveryDelays(ds []Delivery, n int) []time.Duration {
	delays := make([]time.Duration, n)
	for _, d := range ds {
		if d.Seq >= 0 && d.Seq < n && d.Ready > 0 && d.Ready > d.Sent {
			delays[d.Seq] = d.Ready - d.Sent
		}
	}
	return delays
}

// OracleName is how summaries and plot legends name the oracle: it is a
// greedy policy with perfect information, a strong reference but not a
// proven lower bound on the latency of every policy.
const OracleName = "perfect-information greedy oracle (not a proven lower bound)"

// TimePoint is one value of a time series; T in seconds from the start of
// publishing.
type TimePoint struct {
	T float64 `json:"t_s"`
	V float64 `json:"v"`
}

// RollingP99 returns the p99 latency (ms) of the messages published in each
// window of width w ending at multiples of step, up to the last publish
// time. Windows with no message are skipped.
func RollingP99(ds []Delivery, w, step time.Duration) []TimePoint {
	if len(ds) == 0 {
		return nil
	}
	s := append([]Delivery(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i].Sent < s[j].Sent })
	last := s[len(s)-1].Sent
	var out []TimePoint
	lo := 0
	hi := 0
	for end := step; end <= last+step; end += step {
		for hi < len(s) && s[hi].Sent < end {
			hi++
		}
		for lo < hi && s[lo].Sent < end-w {
			lo++
		}
		if hi == lo {
			continue
		}
		vals := make([]float64, 0, hi-lo)
		for _, d := range s[lo:hi] {
			vals = append(vals, harness.Millis(d.Latency()))
		}
		sort.Float64s(vals)
		out = append(out, TimePoint{T: end.Seconds(), V: harness.Percentile(vals, 99)})
	}
	return out
}
