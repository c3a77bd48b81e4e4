// Package shared runs scenario set A of docs/scenarios.md (shared-
// subscription latency) side by side against its baselines — Mosquitto,
// vanilla Mochi MQTT, the live oracle and a perfect-information oracle —
// and writes results.json, plots and summary.md, which also takes in the
// throughput and connections results found beside it.
package shared

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"
)

// Member is one shared-subscription member of a scenario.
type Member struct {
	// Service is the per-message processing time.
	Service time.Duration
	// ChangeAt, when positive, is when Service becomes NewService.
	ChangeAt   time.Duration
	NewService time.Duration
	// JoinAt, when positive, is when the member connects.
	JoinAt time.Duration
	// CrashAt, when positive, is when the member is killed (connection
	// closed without DISCONNECT, its pending work lost).
	CrashAt time.Duration
}

// serviceAt returns the member's processing time for a message starting at
// offset t from the start of publishing.
func (m Member) serviceAt(t time.Duration) time.Duration {
	if m.ChangeAt > 0 && t >= m.ChangeAt {
		return m.NewService
	}
	return m.Service
}

// Scenario is one shared-subscription latency scenario (set A).
type Scenario struct {
	ID string
	// Gap is the publishing interval; with Poisson the mean of exponential
	// gaps.
	Gap     time.Duration
	Poisson bool
	// Duration is how long the publisher sends.
	Duration time.Duration
	Members  []Member
	QoS      byte
	// ReportInterval is the broker's load-report interval.
	ReportInterval time.Duration
	// EventAt is the time of the scenario's event (step, join, crash), or 0.
	EventAt time.Duration
	Notes   string
	// ServiceNoise makes each message's service time its member's times a
	// work size drawn per message (mean 1): NoiseExponential or
	// NoiseUniform20; empty: every message takes the member's time.
	ServiceNoise string

	work []float64 // per message, drawn by ForRun; nil: all 1
}

// Per-message service-time noise (Scenario.ServiceNoise).
const (
	// NoiseExponential draws exponential work sizes: service times with
	// as much spread as their mean (an M/M/c-like fleet).
	NoiseExponential = "exp"
	// NoiseUniform20 draws work sizes uniform within ±20 % of the mean.
	NoiseUniform20 = "uniform20"
)

// ForRun returns s for the run with seed: its per-message work sizes are
// drawn (with a generator of their own, so the publish trace stays the
// same), and every system and the oracle of that run see the same ones.
func (s Scenario) ForRun(seed uint64) Scenario {
	if s.ServiceNoise == "" {
		return s
	}
	r := rand.New(rand.NewPCG(seed, 0x3045e))
	s.work = make([]float64, len(s.Trace(seed)))
	for i := range s.work {
		switch s.ServiceNoise {
		case NoiseExponential:
			s.work[i] = r.ExpFloat64()
		case NoiseUniform20:
			s.work[i] = 0.8 + 0.4*r.Float64()
		default:
			s.work[i] = 1
		}
	}
	return s
}

// ServiceTime returns how long member i takes to process message seq
// starting at offset t: the member's service time at t times the
// message's work size.
func (s Scenario) ServiceTime(i, seq int, t time.Duration) time.Duration {
	d := s.Members[i].serviceAt(t)
	if seq >= 0 && seq < len(s.work) {
		d = time.Duration(float64(d) * s.work[seq])
	}
	return d
}

// MeanServiceTime returns member i's mean service time for a message
// starting at offset t: what its speed makes of an average work size.
func (s Scenario) MeanServiceTime(i int, t time.Duration) time.Duration {
	return s.Members[i].serviceAt(t)
}

// ExpectedRemaining returns how long a message that member i started at
// offset started, and that has run for elapsed, is expected to run still,
// knowing the distribution of work sizes but not this message's: with no
// noise that is exact; exponential work is memoryless, so a whole mean
// whatever it ran; uniform work within ±20 % of the mean m ends uniformly
// in what is left of [0.8m, 1.2m].
func (s Scenario) ExpectedRemaining(i int, started, elapsed time.Duration) time.Duration {
	m := s.MeanServiceTime(i, started)
	switch s.ServiceNoise {
	case NoiseExponential:
		return m
	case NoiseUniform20:
		lo, hi := m*8/10, m*12/10
		if elapsed < lo {
			return m - elapsed
		}
		return max(hi-elapsed, 0) / 2
	default:
		return max(m-elapsed, 0)
	}
}

// Scenarios returns set A of docs/scenarios.md.
func Scenarios() []Scenario {
	ms := time.Millisecond
	fixed := func(ds ...time.Duration) []Member {
		out := make([]Member, len(ds))
		for i, d := range ds {
			out[i] = Member{Service: d}
		}
		return out
	}
	step := fixed(25*ms, 25*ms, 25*ms)
	step[2].ChangeAt, step[2].NewService = 10*time.Second, 100*ms
	join := fixed(50*ms, 50*ms, 25*ms)
	join[2].JoinAt = 10 * time.Second
	crash := fixed(25*ms, 25*ms, 50*ms)
	crash[0].CrashAt = 10 * time.Second
	scenarios := []Scenario{
		{ID: "thesis-1", Gap: 10 * ms, Duration: 15 * time.Second, Members: fixed(25*ms, 25*ms, 25*ms), ReportInterval: time.Second, Notes: "thesis table 6"},
		{ID: "thesis-2", Gap: 10 * ms, Duration: 15 * time.Second, Members: fixed(25*ms, 25*ms, 50*ms), ReportInterval: time.Second, Notes: "thesis table 6; 100 % utilisation"},
		{ID: "thesis-2-qos1", Gap: 10 * ms, Duration: 15 * time.Second, Members: fixed(25*ms, 25*ms, 50*ms), QoS: 1, ReportInterval: time.Second, Notes: "ack after processing"},
		{ID: "step", Gap: 12500 * time.Microsecond, Duration: 30 * time.Second, Members: step, ReportInterval: time.Second, EventAt: 10 * time.Second, Notes: "member 3: 25 ms → 100 ms at t = 10 s; ρ 0.67 → 0.89"},
		{ID: "join", Gap: 30 * ms, Duration: 30 * time.Second, Members: join, ReportInterval: time.Second, EventAt: 10 * time.Second, Notes: "a 25 ms member with no history joins at t = 10 s; ρ 0.83 → 0.42"},
		{ID: "poisson", Gap: 8 * ms, Poisson: true, Duration: 30 * time.Second, Members: fixed(20*ms, 20*ms, 40*ms, 40*ms, 80*ms), ReportInterval: time.Second, Notes: "exponential gaps, ρ ≈ 0.77"},
		{ID: "crash", Gap: 10 * ms, Duration: 30 * time.Second, Members: crash, QoS: 1, ReportInterval: time.Second, EventAt: 10 * time.Second, Notes: "member 1 killed at t = 10 s"},
	}
	for _, size := range []int{6, 20, 100} {
		for _, rho := range []float64{0.70, 0.85, 0.95} {
			scenarios = append(scenarios, FleetScenario(size, rho, false, "", fleetSeed))
		}
		for _, noise := range []string{NoiseExponential, NoiseUniform20} {
			scenarios = append(scenarios, FleetScenario(size, 0.85, false, noise, fleetSeed))
		}
	}
	return append(scenarios, FleetScenario(20, 0.85, true, "", fleetSeed))
}

// fleetSeed draws the fleet scenarios' member speeds: fixed, so that every
// run of a fleet scenario has the same fleet (the publish trace has a seed
// of its own, --seed).
const fleetSeed = 0xF1EE7

// FleetScenario returns a fleet of size members whose mean service times
// are spread log-uniformly over 10× (10 ms to 100 ms, drawn with seed),
// fed Poisson arrivals at utilisation rho of their combined capacity for
// 30 s, with per-message service noise (Scenario.ServiceNoise). With
// churn, a fifth of the fleet (at least one) joins at t = 10 s and as many
// others are killed at t = 20 s; the gap is set for the fleet present
// between the two.
func FleetScenario(size int, rho float64, churn bool, noise string, seed uint64) Scenario {
	r := rand.New(rand.NewPCG(seed, uint64(size)))
	members := make([]Member, size)
	for i := range members {
		// log-uniform in [10 ms, 100 ms]
		members[i].Service = time.Duration(float64(10*time.Millisecond) * math.Pow(10, r.Float64()))
	}
	id := fmt.Sprintf("fleet-%d-rho%02.0f", size, rho*100)
	notes := fmt.Sprintf("%d members, service 10–100 ms log-uniform, Poisson arrivals, ρ %.2f", size, rho)
	switch noise {
	case NoiseExponential:
		id += "-exp"
		notes += ", exponential service times"
	case NoiseUniform20:
		id += "-uniform20"
		notes += ", service times ±20 % uniform"
	}
	var eventAt time.Duration
	if churn {
		moving := max(1, size/5)
		for i := range moving {
			members[i].JoinAt = 10 * time.Second
			members[size-1-i].CrashAt = 20 * time.Second
		}
		id += "-churn"
		notes += fmt.Sprintf("; %d join at t = 10 s, %d killed at t = 20 s", moving, moving)
		eventAt = 10 * time.Second
	}
	s := Scenario{ID: id, Poisson: true, Duration: 30 * time.Second, Members: members, ReportInterval: time.Second, EventAt: eventAt, Notes: notes, ServiceNoise: noise}
	s.Gap = time.Duration(float64(time.Second) / (rho * s.Capacity(15*time.Second)))
	return s
}

// ScenarioByID returns the scenario named id.
func ScenarioByID(id string) (Scenario, error) {
	var ids []string
	for _, s := range Scenarios() {
		if s.ID == id {
			return s, nil
		}
		ids = append(ids, s.ID)
	}
	return Scenario{}, fmt.Errorf("unknown scenario %q; choose from %s", id, strings.Join(ids, ", "))
}

// Trace returns the publish offsets of the scenario's messages: every Gap,
// or exponential gaps drawn with seed, while below Duration.
func (s Scenario) Trace(seed uint64) []time.Duration {
	var out []time.Duration
	if !s.Poisson {
		for t := time.Duration(0); t < s.Duration; t += s.Gap {
			out = append(out, t)
		}
		return out
	}
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	for t := time.Duration(0); t < s.Duration; t += time.Duration(r.ExpFloat64() * float64(s.Gap)) {
		out = append(out, t)
	}
	return out
}

// Capacity returns the members' combined capacity in messages per second at
// offset t (members present and alive at t).
func (s Scenario) Capacity(t time.Duration) float64 {
	c := 0.0
	for _, m := range s.Members {
		if m.JoinAt > t || (m.CrashAt > 0 && m.CrashAt <= t) {
			continue
		}
		c += float64(time.Second) / float64(m.serviceAt(t))
	}
	return c
}
