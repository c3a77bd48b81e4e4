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
