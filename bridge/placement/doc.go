// Package placement decides where each global pub/sub exchange has its
// synchronisation instance (LuffyMQ thesis §2.4–2.5, algorithms.md §2.4)
// and where a work queue's overflow goes (§2.3). It is pure: no I/O, no
// goroutines, no clock; the same Input always gives the same answer.
//
// # Inputs
//
// Input holds what algorithm 2.1 reads: the sites N with their inbound and
// outbound overlay bandwidth B_o^in/out (of which the work-queue overflow
// the site receives and sends takes its share first); the global exchanges
// E, each with its mean message size D(E_i) and, per instance (site of
// N_i), the local publish and consume counts P^in_ij, P^out_ij and the
// overlay counts T^in_ij, T^out_ij (messages per second over the last
// period); the delay matrix d; the previous plan S_{t-1}; λ. Plan maps
// exchange → sync site.
//
// # Cost (eq. 2.1–2.5)
//
// Evaluate scores a plan. Its Cost is eq. 2.1: for every exchange, the mean
// over (publication, interested consumer) pairs of d(src, sync) + d(sync,
// dst) (eq. 2.2), plus λ·h_i (eq. 2.3) over the number of pairs. Counts per
// instance do not say which publication each delivery carried, so a
// delivery's origin is taken to follow the publications (see fillObjective
// in input.go); an exchange with no previous sync site pays no λ. Its
// Overload is how far the estimated overlay throughput exceeds the
// bandwidths (eq. 2.5, with the estimates of §2.5.2 eq. 2.10–2.11: the sync
// site carries the previous sync site's observed traffic T_is·D, every
// other site its own T_ij·D, the previous sync site the estimate of another
// node picked at random through Input.Seed). Evaluation.Better orders
// plans by overload, then cost; Optimum finds the best plan in that order
// by exhaustive search (≤ 6 sites, ≤ 6 exchanges).
//
// # Heuristic (algorithm 2.1, as the thesis writes it)
//
// Heuristic: busiest exchange first (P(E_i), eq. 2.6); weighted closeness
// centrality C_i(n_j) = P_ij / Σ_{k≠j} d(n_k, n_j) (eq. 2.9); λ subtracted
// from every site but the previous sync site; the best-scored site whose
// bandwidth holds the sync traffic (eq. 2.11) wins, else the least-loaded
// site; a plan is always produced. Each Decision says why (best-score,
// bandwidth, least-loaded). Where the thesis is silent: ties go to the
// previous site, then by name; a first placement (no previous sync site)
// estimates the sync traffic as every publication in and every publication
// out to every other instance.
//
// # Measured quality (go test -v -run TestPlacementQuality)
//
// 1 000 random instances per configuration (2–6 sites on a 100 ms map with
// log-normal popularity, 1–6 exchanges, one bandwidth limit for all sites
// drawn around the busiest site's load under a random plan, 25 % of
// instances unlimited), ratio = cost / optimum cost (overload / least
// overload when no plan is feasible; +Inf when a feasible plan exists and
// the method's is not):
//
//	configuration      method    within 10 %   median   p95     worst
//	λ = 0              thesis     62.6 %       1.031    4.30    +Inf (30 infeasible)
//	λ = 0              improved   99.2 %       1.000    1.000   2.38
//	λ ~ centrality     thesis     54.3 %       1.069    4.06    +Inf (30 infeasible)
//	λ ~ centrality     improved   99.3 %       1.000    1.000   2.26
//	unconstrained      thesis     77.6 %       1.000    1.36    2.61
//	unconstrained      improved  100.0 %       1.000    1.000   1.000
//
// The thesis heuristic does not meet issue 8's goal (within 10 % on ≥ 95 %
// of instances): centrality weights a site by its own traffic and the
// unweighted distance to the other instances, not by where publications
// come from and deliveries go, so even without constraints it misses the
// best site on 22 % of instances; its least-loaded fallback ignores delay;
// and λ is subtracted from centralities (messages/s per ms) while eq. 2.1
// adds it to latencies, so the two disagree on when moving pays.
//
// Improved is the documented improvement, kept apart: the same busiest-
// first greedy walking sites by the exchange's own eq. 2.1 term (falling
// back to the site adding the least overload), then a local search
// (single and paired exchange moves) from both that plan and the thesis
// heuristic's, keeping strict improvements in Evaluation.Better's order.
// It meets the goal in every configuration and is never worse than
// Heuristic. Cost: ~12–27 µs per small instance, ~9 ms for 30 sites × 15
// exchanges (Heuristic: ~0.1 ms).
//
// # Work-queue overflow
//
// WeightedOverflowDestination is the thesis's rule: the consistent-hash
// exchange sends each message to a site in proportion to its weight
// max(MaxLength − MessagesInQueue, 1) (eq. 2.13), however far.
// NearestOverflowDestination sends it to the nearest site that still has
// room (room shared among the overflowing sites; weighted rule when none
// has). Over 1 000 simulated retune periods (go test -v -run
// TestNearestOverflowBeatsWeightOnly): when the sites with room can absorb
// the overflow, mean extra delay 65.2 ms → 40.9 ms (link 53.7 → 40.3 ms,
// waiting 11.5 → 0.6 ms); when they cannot, both ≈ 1 040 ms (waiting
// dominates); overall 329.1 → 310.2 ms.
package placement
