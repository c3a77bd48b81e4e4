package clientsdk

import (
	"context"
	"errors"
	"fmt"
	"github.com/luffymq/luffymq/internal/timeutil"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// ServiceTime is a distribution of emulated per-message processing times.
// The zero value is a fixed time of 0.
type ServiceTime struct {
	kind serviceKind
	a, b time.Duration // fixed: a; exp: mean a; uniform: a to b
}

type serviceKind int

const (
	serviceFixed serviceKind = iota
	serviceExp
	serviceUniform
)

// FixedServiceTime returns a distribution that is always d.
func FixedServiceTime(d time.Duration) ServiceTime { return ServiceTime{kind: serviceFixed, a: d} }

// ParseServiceTime parses a service-time distribution: a fixed duration
// ("25ms"), an exponential one by its mean ("exp:25ms") or a uniform one by
// its bounds ("uniform:10ms-40ms").
func ParseServiceTime(s string) (ServiceTime, error) {
	kind, arg, hasKind := strings.Cut(strings.TrimSpace(s), ":")
	if !hasKind {
		kind, arg = "fixed", kind
	}
	switch strings.ToLower(kind) {
	case "fixed":
		d, err := parseNonNegative(arg)
		if err != nil {
			return ServiceTime{}, fmt.Errorf("service time %q: %w", s, err)
		}
		return FixedServiceTime(d), nil
	case "exp":
		d, err := parseNonNegative(arg)
		if err != nil {
			return ServiceTime{}, fmt.Errorf("service time %q: %w", s, err)
		}
		return ServiceTime{kind: serviceExp, a: d}, nil
	case "uniform":
		lo, hi, ok := strings.Cut(arg, "-")
		if !ok {
			return ServiceTime{}, fmt.Errorf("service time %q: write uniform bounds like uniform:10ms-40ms", s)
		}
		a, err := parseNonNegative(lo)
		if err != nil {
			return ServiceTime{}, fmt.Errorf("service time %q: lower bound: %w", s, err)
		}
		b, err := parseNonNegative(hi)
		if err != nil {
			return ServiceTime{}, fmt.Errorf("service time %q: upper bound: %w", s, err)
		}
		if b < a {
			return ServiceTime{}, fmt.Errorf("service time %q: upper bound %s is below lower bound %s", s, b, a)
		}
		return ServiceTime{kind: serviceUniform, a: a, b: b}, nil
	}
	return ServiceTime{}, fmt.Errorf("service time %q: unknown distribution %q; use 25ms, exp:25ms or uniform:10ms-40ms", s, kind)
}

func parseNonNegative(s string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return 0, err
	}
	if d < 0 {
		return 0, errors.New("negative duration")
	}
	return d, nil
}

// Mean returns the distribution's mean.
func (st ServiceTime) Mean() time.Duration {
	if st.kind == serviceUniform {
		return st.a + (st.b-st.a)/2
	}
	return st.a
}

// Draw returns one service time drawn with r.
func (st ServiceTime) Draw(r *rand.Rand) time.Duration {
	switch st.kind {
	case serviceExp:
		d := r.ExpFloat64() * float64(st.a)
		if d > math.MaxInt64/2 {
			return math.MaxInt64 / 2
		}
		return time.Duration(d)
	case serviceUniform:
		if st.b == st.a {
			return st.a
		}
		return st.a + time.Duration(r.Int64N(int64(st.b-st.a)+1))
	}
	return st.a
}

// String returns the distribution in ParseServiceTime's syntax.
func (st ServiceTime) String() string {
	switch st.kind {
	case serviceExp:
		return "exp:" + st.a.String()
	case serviceUniform:
		return "uniform:" + st.a.String() + "-" + st.b.String()
	}
	return st.a.String()
}

// ServiceEmulator emulates workers that spend a given time on each message,
// without drift. Each of its lanes (emulated workers) keeps a virtual
// schedule: a message that was already waiting starts exactly when the
// previous one on its lane ended, not when a sleeping goroutine happened to
// wake. Plain time.Sleep per message overshoots by a fraction of a
// millisecond each time, which silently lowers capacity; here an overshoot
// only delays when the next message is handed over, never its virtual start
// or end.
//
// Its Handle method is a Handler; give the Subscriber as many workers as
// the emulator has lanes. A ServiceEmulator is safe for concurrent use.
type ServiceEmulator struct {
	// ServiceTime is the distribution of per-message service times.
	ServiceTime ServiceTime
	// Lanes is the number of emulated workers; 1 when 0.
	Lanes int
	// Seed seeds the service-time draws; runs with the same seed draw the
	// same sequence.
	Seed uint64
	// OnStart, when set, is called with each message and the virtual time
	// its service starts: its dequeue time in latency measurements.
	OnStart func(m *Message, start time.Time)

	once    sync.Once
	mu      sync.Mutex
	busy    []time.Time // virtual end of the last service on each lane
	rng     *rand.Rand
	now     func() time.Time
	sleepTo func(ctx context.Context, t time.Time) error
}

func (e *ServiceEmulator) init() {
	e.once.Do(func() {
		e.busy = make([]time.Time, max(e.Lanes, 1))
		e.rng = rand.New(rand.NewPCG(e.Seed, e.Seed^0x9e3779b97f4a7c15))
		if e.now == nil {
			e.now = time.Now
		}
		if e.sleepTo == nil {
			e.sleepTo = timeutil.SleepUntil
		}
	})
}

// Handle serves m for a time drawn from ServiceTime, as if m became ready
// when it was received (m.ReceivedAt, or now if unset). It is a Handler.
func (e *ServiceEmulator) Handle(ctx context.Context, m *Message) error {
	e.init()
	e.mu.Lock()
	d := e.ServiceTime.Draw(e.rng)
	e.mu.Unlock()
	ready := m.ReceivedAt
	if ready.IsZero() {
		ready = e.now()
	}
	start, end := e.reserve(ready, d)
	if e.OnStart != nil {
		e.OnStart(m, start)
	}
	return e.sleepTo(ctx, end)
}

// Serve serves one message that became ready at ready for d and returns its
// virtual start time; it blocks until the virtual end or until ctx ends.
func (e *ServiceEmulator) Serve(ctx context.Context, ready time.Time, d time.Duration) (time.Time, error) {
	e.init()
	start, end := e.reserve(ready, d)
	return start, e.sleepTo(ctx, end)
}

// reserve books d on the lane that frees up first: the service starts at
// ready or when that lane's previous service ends, whichever is later.
func (e *ServiceEmulator) reserve(ready time.Time, d time.Duration) (start, end time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	lane := 0
	for i, b := range e.busy {
		if b.Before(e.busy[lane]) {
			lane = i
		}
	}
	start = ready
	if e.busy[lane].After(start) {
		start = e.busy[lane]
	}
	end = start.Add(d)
	e.busy[lane] = end
	return start, end
}
