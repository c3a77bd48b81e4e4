package broker

import (
	"net"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMemTrimmerWaitsForAStormToSettle drives memTrimmer with a clock: it
// trims once Step connections came (or the connected count moved by Step)
// and then nothing moved for the quiet time, once per storm.
func TestMemTrimmerWaitsForAStormToSettle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tr := memTrimmer{step: 100, quiet: time.Second}
	steps := []struct {
		ms   int
		c    counts
		want trimAction
		why  string
	}{
		{0, counts{}, trimNone, "first look"},
		{2000, counts{}, trimNone, "nothing happened"},
		{2100, counts{accepted: 150, connected: 150}, trimNone, "a storm arrives"},
		{2600, counts{accepted: 150, connected: 150, subscriptions: 150}, trimNone, "it subscribes: not quiet"},
		{3500, counts{accepted: 150, connected: 150, subscriptions: 150}, trimNone, "quiet for 0.9 s only"},
		{3700, counts{accepted: 150, connected: 150, subscriptions: 150}, trimReturn, "quiet for 1.1 s after 150 connections"},
		{5000, counts{accepted: 150, connected: 150, subscriptions: 150}, trimNone, "trimmed already"},
		{5100, counts{accepted: 200, connected: 200, subscriptions: 200}, trimNone, "50 more arrive"},
		{7000, counts{accepted: 200, connected: 200, subscriptions: 200}, trimNone, "50 since the trim are below the step"},
		{7100, counts{accepted: 200, connected: 40, subscriptions: 40}, trimNone, "160 leave"},
		{9000, counts{accepted: 200, connected: 40, subscriptions: 40}, trimReturn, "the connected count moved by 160"},
		{9100, counts{accepted: 2000, connected: 40, subscriptions: 40}, trimNone, "churn: 1800 short sessions"},
		{10200, counts{accepted: 2000, connected: 40, subscriptions: 40}, trimReturn, "churn settled"},
	}
	for _, s := range steps {
		require.Equal(t, s.want, tr.due(at(s.ms), s.c), "at %d ms: %s", s.ms, s.why)
	}
}

// TestMemTrimmerCollectsTheGarbageOfAnIdleBroker drives memTrimmer's
// idle rule with a clock: it collects once the broker allocated lightly
// for the quiet time and the garbage is over a quarter of the live heap
// and stacks (and at least minIdleGarbage), never while it allocates fast.
func TestMemTrimmerCollectsTheGarbageOfAnIdleBroker(t *testing.T) {
	const MiB = 1 << 20
	t0 := time.Unix(1000, 0)
	tr := memTrimmer{step: 1000, quiet: time.Second}
	var allocated uint64
	look := func(ms int, rate, objects, live, stacks uint64) trimAction {
		allocated += rate * 250 / 1000 // a look every 250 ms
		return tr.due(t0.Add(time.Duration(ms)*time.Millisecond), counts{heap: heapCounts{allocated: allocated, objects: objects, live: live, stacks: stacks}})
	}
	// 10 000 devices: 140 MiB live, 240 MiB of stacks; the threshold is
	// (140+240)/4 = 95 MiB of garbage.
	ms := 0
	for ; ms < 3000; ms += 250 {
		require.Equal(t, trimNone, look(ms, 100*MiB, 400*MiB, 140*MiB, 240*MiB), "at %d ms: allocating 100 MiB/s is busy, whatever the garbage", ms)
	}
	for ; ms < 4000; ms += 250 { // the rate is measured over windows of a second: 2–3 s was busy
		require.Equal(t, trimNone, look(ms, 2*MiB, 400*MiB, 140*MiB, 240*MiB), "at %d ms: idle for less than a second", ms)
	}
	require.Equal(t, trimCollect, look(ms, 2*MiB, 400*MiB, 140*MiB, 240*MiB), "a light window (3–4 s) after the last busy one, with 260 MiB of garbage")
	ms += 250
	require.Equal(t, trimNone, look(ms, 2*MiB, 150*MiB, 140*MiB, 240*MiB), "collected: 10 MiB of garbage")
	ms += 250
	require.Equal(t, trimNone, look(ms, 2*MiB, 234*MiB, 140*MiB, 240*MiB), "94 MiB is under a quarter of the live heap and stacks")
	ms += 250
	require.Equal(t, trimCollect, look(ms, 2*MiB, 236*MiB, 140*MiB, 240*MiB), "96 MiB is over it")
	ms += 250
	require.Equal(t, trimNone, look(ms, 2*MiB, 30*MiB, 4*MiB, 1*MiB), "a small broker: 26 MiB is under minIdleGarbage")
	ms += 250
	require.Equal(t, trimCollect, look(ms, 2*MiB, 40*MiB, 4*MiB, 1*MiB), "36 MiB is over it")
	// Mochi's sweeps allocate in bursts: 3 MiB in one look of four is
	// 3 MiB/s over the window, light, although 12 MiB/s over that look.
	for i := range 8 {
		ms += 250
		rate := uint64(0)
		if i%4 == 0 {
			rate = 12 * MiB
		}
		require.Equal(t, trimNone, look(ms, rate, 20*MiB, 4*MiB, 1*MiB), "at %d ms: little garbage", ms)
	}
	ms += 250
	require.Equal(t, trimCollect, look(ms, 0, 40*MiB, 4*MiB, 1*MiB), "bursts of a light rate leave the broker idle")
}

// TestHeapReaderReadsTheRuntimeMetrics checks that every metric the idle
// rule needs exists in this Go (a missing one would read 0 and turn the
// rule off) and that the allocation count follows an allocation.
func TestHeapReaderReadsTheRuntimeMetrics(t *testing.T) {
	r := newHeapReader()
	before := r.read()
	require.Positive(t, before.allocated)
	require.Positive(t, before.objects)
	require.Positive(t, before.stacks)
	runtime.GC() // the live heap is known after a collection
	buf := make([]byte, 4<<20)
	after := r.read()
	require.Positive(t, after.live)
	require.GreaterOrEqual(t, after.allocated-before.allocated, uint64(len(buf)))
	runtime.KeepAlive(buf)
}

// TestBrokerTrimsAfterAConnectionStorm connects more clients than the
// trim step and checks that the broker returns its free memory once they
// settle, and that a negative step turns it off.
func TestBrokerTrimsAfterAConnectionStorm(t *testing.T) {
	for _, step := range []int{20, -1} {
		b := startBroker(t, func(c *Config) { c.MemoryTrimStep = step })
		for i := range 25 {
			conn, err := net.Dial("tcp", b.MQTTAddr())
			require.NoError(t, err)
			rc, _ := dialRaw(t, conn, "storm-"+strconv.Itoa(i))
			rc.subscribe("dev/"+strconv.Itoa(i)+"/cmd", 1)
		}
		if step < 0 {
			require.Nil(t, b.trim, "no trim loop with a negative step")
			continue
		}
		eventually(t, 10*time.Second, func() bool { return b.trim.Trims.Load() == 1 }, "one trim after 25 connections settle")
	}
}
