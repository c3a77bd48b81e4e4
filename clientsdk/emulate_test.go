package clientsdk

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseServiceTime(t *testing.T) {
	tests := []struct {
		in   string
		mean time.Duration
		str  string
	}{
		{"25ms", 25 * time.Millisecond, "25ms"},
		{"fixed:1s", time.Second, "1s"},
		{"exp:25ms", 25 * time.Millisecond, "exp:25ms"},
		{"uniform:10ms-40ms", 25 * time.Millisecond, "uniform:10ms-40ms"},
		{" EXP:5ms ", 5 * time.Millisecond, "exp:5ms"},
	}
	for _, tt := range tests {
		st, err := ParseServiceTime(tt.in)
		require.NoError(t, err, tt.in)
		require.Equal(t, tt.mean, st.Mean(), tt.in)
		require.Equal(t, tt.str, st.String(), tt.in)
	}
	for _, bad := range []string{"", "fast", "-5ms", "exp:", "uniform:40ms-10ms", "uniform:10ms", "gauss:5ms"} {
		_, err := ParseServiceTime(bad)
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "service time", bad)
	}
}

func TestServiceTimeDraws(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	u, err := ParseServiceTime("uniform:10ms-40ms")
	require.NoError(t, err)
	e, err := ParseServiceTime("exp:20ms")
	require.NoError(t, err)
	var sumU, sumE time.Duration
	minU, maxU, minE := time.Hour, time.Duration(0), time.Hour
	const n = 20000
	for range n {
		d := u.Draw(r)
		minU, maxU, sumU = min(minU, d), max(maxU, d), sumU+d
		de := e.Draw(r)
		minE, sumE = min(minE, de), sumE+de
	}
	require.GreaterOrEqual(t, minU, 10*time.Millisecond)
	require.LessOrEqual(t, maxU, 40*time.Millisecond)
	require.GreaterOrEqual(t, minE, time.Duration(0))
	require.InDelta(t, float64(25*time.Millisecond), float64(sumU/n), float64(time.Millisecond))
	require.InDelta(t, float64(20*time.Millisecond), float64(sumE/n), float64(time.Millisecond))
	require.Equal(t, 7*time.Millisecond, FixedServiceTime(7*time.Millisecond).Draw(r))
}

// fakeTime is a clock whose sleeps overshoot by a fixed amount, as real
// timers do.
type fakeTime struct {
	mu        sync.Mutex
	now       time.Time
	overshoot time.Duration
}

func (f *fakeTime) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeTime) SleepTo(_ context.Context, t time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t.After(f.now) {
		f.now = t
	}
	f.now = f.now.Add(f.overshoot)
	return nil
}

func TestServiceEmulatorIsDriftFree(t *testing.T) {
	clock := &fakeTime{now: t0, overshoot: 300 * time.Microsecond}
	var starts []time.Time
	e := &ServiceEmulator{
		ServiceTime: FixedServiceTime(25 * time.Millisecond),
		OnStart:     func(_ *Message, s time.Time) { starts = append(starts, s) },
	}
	e.init()
	e.now, e.sleepTo = clock.Now, clock.SleepTo

	// 100 messages all waiting at t0: each starts exactly when the
	// previous one ended, whatever the wake-up overshoot.
	for range 100 {
		require.NoError(t, e.Handle(context.Background(), &Message{ReceivedAt: t0}))
	}
	for i, s := range starts {
		require.Equal(t, t0.Add(time.Duration(i)*25*time.Millisecond), s, "message %d", i)
	}
	// With plain sleeps the 100th would start 99 × 0.3 ms late.

	// A message that arrives while the worker is idle starts on arrival.
	late := clock.Now().Add(time.Second)
	start, err := e.Serve(context.Background(), late, time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, late, start)
}

func TestServiceEmulatorLanes(t *testing.T) {
	clock := &fakeTime{now: t0}
	e := &ServiceEmulator{Lanes: 2}
	e.init()
	e.now, e.sleepTo = clock.Now, clock.SleepTo
	s1, e1 := e.reserve(t0, 10*time.Millisecond)
	s2, e2 := e.reserve(t0, 30*time.Millisecond)
	s3, _ := e.reserve(t0, 10*time.Millisecond)
	require.Equal(t, t0, s1)
	require.Equal(t, t0, s2, "second lane is free")
	require.Equal(t, e1, s3, "third waits for the lane that frees first")
	require.Equal(t, t0.Add(30*time.Millisecond), e2)
}

func TestServiceEmulatorStopsOnContext(t *testing.T) {
	e := &ServiceEmulator{ServiceTime: FixedServiceTime(time.Hour)}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := e.Handle(ctx, &Message{ReceivedAt: time.Now()})
	require.ErrorIs(t, err, context.Canceled)
}
