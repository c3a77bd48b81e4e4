package hooks_test

import (
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
)

// TestMochiNextImmediateDeadlockCondition reproduces, deterministically, the
// deadlock that makes the selection hook turn Mochi 2.7.9's send quota off.
// With the quota on, the client's reader calls Inflight.NextImmediate after
// every packet; it read-locks the in-flight store and, inside, GetAll
// read-locks it again. Go's RWMutex blocks new readers once a writer waits,
// so a publisher's Inflight.Set arriving between the two read locks waits
// for the first, and the second waits for the publisher: neither returns.
//
// The interleaving cannot be forced inside NextImmediate itself, so the test
// holds the outer read lock as NextImmediate does, queues a writer exactly
// as a publisher's Set does, detects the queued writer without timing
// (TryRLock fails only then), and shows that the inner GetAll cannot
// proceed. It then releases the outer lock, which NextImmediate could only
// do after GetAll returned, and everything completes.
func TestMochiNextImmediateDeadlockCondition(t *testing.T) {
	inflight := mqtt.NewInflights()
	inflight.Set(packets.Packet{PacketID: 1, Expiry: -1, FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}})

	inflight.RLock() // NextImmediate's own read lock

	setDone := make(chan struct{})
	go func() { // a publisher adding a delivery for the same client
		inflight.Set(packets.Packet{PacketID: 2, FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}})
		close(setDone)
	}()
	require.Eventually(t, func() bool {
		if inflight.TryRLock() {
			inflight.RUnlock()
			return false
		}
		return true // a writer is queued: no new reader can enter
	}, 5*time.Second, time.Millisecond, "the publisher's Set never queued")

	getDone := make(chan struct{})
	go func() { // NextImmediate's inner call
		inflight.GetAll(true)
		close(getDone)
	}()
	select {
	case <-getDone:
		t.Fatal("GetAll returned while a writer was queued behind the outer read lock")
	case <-setDone:
		t.Fatal("Set returned while the outer read lock was held")
	case <-time.After(50 * time.Millisecond):
		// Both are blocked, and by construction stay so: the cycle.
	}

	inflight.RUnlock()
	<-setDone
	<-getDone
	require.Equal(t, 2, inflight.Len())
}
