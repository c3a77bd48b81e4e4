package bench

import "time"

// Delivery is one message taken for processing by a member: the unit every
// latency statistic is computed from. Times are offsets from the start of
// publishing.
type Delivery struct {
	Seq    int           `json:"seq"`
	Member int           `json:"member"` // 0-based
	Sent   time.Duration `json:"sent_ns"`
	Start  time.Duration `json:"start_ns"` // dequeue: the virtual service start
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
	busy := make([]time.Duration, len(s.Members))
	for i, m := range s.Members {
		busy[i] = m.JoinAt
	}
	out := make([]Delivery, 0, len(trace))
	for seq, a := range trace {
		best, bestStart := -1, time.Duration(0)
		for i, m := range s.Members {
			if m.JoinAt > a {
				continue
			}
			start := max(a, busy[i])
			if m.CrashAt > 0 && start+m.serviceAt(start) > m.CrashAt {
				continue
			}
			if best < 0 || start < bestStart || (start == bestStart && busy[i] < busy[best]) {
				best, bestStart = i, start
			}
		}
		if best < 0 {
			continue // nobody can take it (cannot happen in set A)
		}
		busy[best] = bestStart + s.Members[best].serviceAt(bestStart)
		out = append(out, Delivery{Seq: seq, Member: best, Sent: a, Start: bestStart})
	}
	return out
}

// OracleName is how summaries and plot legends name the oracle: it is a
// greedy policy with perfect information, a strong reference but not a
// proven lower bound on the latency of every policy.
const OracleName = "perfect-information greedy oracle (not a proven lower bound)"
