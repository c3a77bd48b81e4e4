package shared

import (
	"context"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/clientsdk"
)

func TestLiveOracleRoutesOnTrueStateAndBooks(t *testing.T) {
	ms := time.Millisecond
	s := Scenario{Members: []Member{{Service: 10 * ms}, {Service: 40 * ms}, {Service: 10 * ms}}}
	lr := &liveRun{s: s, dead: make([]bool, 3), workers: make([]*memberWorker, 3), t0: time.Now()}
	for i := range 3 {
		lr.setWorker(i, &memberWorker{run: lr, i: i})
	}
	h := new(liveOracleHook)
	h.attach(lr, "m")
	// Member 1 is busy for another 25 ms; 2 and 3 are idle.
	lr.worker(0).lastEnd = time.Now().Add(25 * ms)

	pick := func(seq int) string {
		subs := &mqtt.Subscribers{
			Shared: map[string]map[string]packets.Subscription{
				"$share/g/t": {"m1": {Filter: "$share/g/t"}, "m2": {Filter: "$share/g/t"}, "m3": {Filter: "$share/g/t"}},
			},
			SharedSelected: map[string]packets.Subscription{},
		}
		subs = h.OnSelectSubscribers(subs, packets.Packet{Payload: harness.EncodePayload(seq, time.Now())})
		require.Len(t, subs.SharedSelected, 1)
		for id := range subs.SharedSelected {
			return id
		}
		return ""
	}
	first := pick(0)
	require.Contains(t, []string{"m2", "m3"}, first, "an idle member")
	second := pick(1)
	require.Contains(t, []string{"m2", "m3"}, second)
	require.NotEqual(t, first, second, "the first is booked for its message: the other idle one starts sooner")
	// Now m2 (40 ms) and m3 (10 ms) are booked; m3 frees first, m1 at 25 ms.
	require.Equal(t, "m3", pick(2))

	// A message that starts is no longer booked: the worker's schedule
	// has it.
	w := lr.worker(2)
	w.emu = &clientsdk.ServiceEmulator{Lanes: 1}
	w.mu.Lock()
	booked, pendingBefore := w.booked[2], w.pending
	w.mu.Unlock()
	require.Equal(t, 10*ms, booked)
	before := time.Now()
	_, err := w.serve(context.Background(), harness.EncodePayload(2, before), before)
	require.NoError(t, err)
	w.mu.Lock()
	require.Equal(t, pendingBefore-booked, w.pending)
	require.NotContains(t, w.booked, 2)
	require.False(t, w.lastEnd.Before(before.Add(booked)), "its service is on the schedule")
	w.mu.Unlock()

	lr.mu.Lock()
	lr.dead[0] = true // member 1 was killed: never chosen again
	lr.mu.Unlock()
	for seq := 3; seq < 10; seq++ {
		require.NotEqual(t, "m1", pick(seq))
	}

	// Messages that are not the benchmark's keep Mochi's own choice.
	subs := &mqtt.Subscribers{Shared: map[string]map[string]packets.Subscription{"$share/g/t": {"m1": {}}}, SharedSelected: map[string]packets.Subscription{}}
	require.Empty(t, h.OnSelectSubscribers(subs, packets.Packet{Payload: []byte("x")}).SharedSelected)
}

// TestInformedLiveOracleKnowsQueuesNotSizes: the informed live oracle
// predicts from how many messages a member holds and its mean, and expects
// of a running exponential message a whole mean however long it has run;
// the live oracle reads the exact schedule.
func TestInformedLiveOracleKnowsQueuesNotSizes(t *testing.T) {
	ms := time.Millisecond
	s := Scenario{Members: []Member{{Service: 10 * ms}, {Service: 10 * ms}}, ServiceNoise: NoiseExponential}
	now := time.Now()
	lr := &liveRun{s: s, dead: make([]bool, 2), workers: make([]*memberWorker, 2), t0: now.Add(-time.Second)}
	for i := range 2 {
		lr.setWorker(i, &memberWorker{run: lr, i: i})
	}
	// m1 runs a message that started 30 ms ago and ends in 1 ms (a large
	// one); m2 runs one that started just now and ends in 12 ms, and
	// holds one more of exactly known size 2 ms.
	m1, m2 := lr.worker(0), lr.worker(1)
	m1.runStart, m1.lastEnd = now.Add(-30*ms), now.Add(ms)
	m2.runStart, m2.lastEnd = now, now.Add(12*ms)
	m2.booked, m2.pending = map[int]time.Duration{7: 2 * ms}, 2*ms

	require.Equal(t, now.Add(ms), m1.predictedStart(now), "the live oracle knows m1 ends in 1 ms")
	require.Equal(t, now.Add(14*ms), m2.predictedStart(now))
	require.Equal(t, now.Add(10*ms), m1.expectedStart(now), "memoryless: a whole mean left")
	require.Equal(t, now.Add(20*ms), m2.expectedStart(now), "a mean for the running one and one per message held")

	// Uniform work within ±20 %: what is left of [8, 12] ms.
	lr.s.ServiceNoise = NoiseUniform20
	require.Equal(t, now, m1.expectedStart(now), "ran past the longest size: expected to end at once")
	m1.runStart = now.Add(-9 * ms)
	require.Equal(t, now.Add(1500*time.Microsecond), m1.expectedStart(now), "halfway through what is left of [8, 12]")
	// No noise: exact.
	lr.s.ServiceNoise = ""
	m1.runStart = now.Add(-4 * ms)
	require.Equal(t, now.Add(6*ms), m1.expectedStart(now))

	// The hook routes on it.
	h := &liveOracleHook{informed: true}
	h.attach(lr, "m")
	lr.s.ServiceNoise = NoiseExponential
	m1.runStart = now.Add(-30 * ms)
	subs := &mqtt.Subscribers{
		Shared:         map[string]map[string]packets.Subscription{"$share/g/t": {"m1": {Filter: "$share/g/t"}, "m2": {Filter: "$share/g/t"}}},
		SharedSelected: map[string]packets.Subscription{},
	}
	subs = h.OnSelectSubscribers(subs, packets.Packet{Payload: harness.EncodePayload(1, now)})
	require.Contains(t, subs.SharedSelected, "m1", "m1 holds one message, m2 two")
}
