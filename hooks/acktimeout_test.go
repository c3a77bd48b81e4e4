package hooks_test

import (
	"sync"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/hooks"
)

// recordingStorage is an InflightStorage that records what it is told to
// forget, as client ID and packet ID.
type recordingStorage struct {
	mu      sync.Mutex
	dropped []string
}

func (s *recordingStorage) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropped = append(s.dropped, cl.ID+":"+pk.FormatID())
}

func (s *recordingStorage) forgotten() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.dropped...)
}

const testAckTimeout = time.Second

// newAckTimeout returns an ack-timeout hook on the fixture's selection
// hook, scanned by the test.
func (f *hookFixture) newAckTimeout(t *testing.T) *hooks.AckTimeoutHook {
	t.Helper()
	h, err := hooks.NewAckTimeoutHook(hooks.AckTimeoutConfig{Selection: f.hook, Timeout: testAckTimeout})
	require.NoError(t, err)
	return h
}

// member connects a client in the fixture's engine and in Mochi's topic
// index, subscribed to filters.
func (f *hookFixture) member(t *testing.T, id string, filters ...string) *mqtt.Client {
	t.Helper()
	cl := f.connect(t, id, filters...)
	f.subscribeInMochi(cl, filters...)
	return cl
}

// TestAckTimeoutTakesAStalledMembersDelivery: a delivery a connected
// member holds unacknowledged for the timeout goes to another member of
// its group (DUP set, from the re-dispatch origin), not earlier; the
// stalled member's session and the store lose it, and its packet
// identifier stays reserved, so Mochi gives the next deliveries other
// identifiers.
func TestAckTimeoutTakesAStalledMembersDelivery(t *testing.T) {
	f := newHookFixture(t)
	f.allowReading(t)
	store := &recordingStorage{}
	f.hook.SetInflightStorage(store)
	ack := f.newAckTimeout(t)
	stalled := f.member(t, "stalled", "$share/g/jobs")
	other := f.member(t, "other", "$share/g/jobs")

	unacknowledged(stalled, 3, "jobs")
	t0 := time.Now()
	ack.Scan(t0)
	ack.Scan(t0.Add(testAckTimeout - time.Millisecond))
	require.Len(t, publishesIn(stalled), 1, "not taken before the timeout")
	require.Empty(t, publishesIn(other))

	ack.Scan(t0.Add(testAckTimeout))
	require.Empty(t, publishesIn(stalled), "taken out of the stalled session")
	got := publishesIn(other)
	require.Len(t, got, 1)
	require.Equal(t, hooks.RedispatchOrigin, got[0].Origin)
	require.Equal(t, []byte("work"), got[0].Payload)
	require.True(t, f.hook.OnPacketEncode(other, got[0]).FixedHeader.Dup)
	require.Equal(t, []string{"stalled:3"}, store.forgotten(), "taken out of the store")
	require.Equal(t, uint64(1), f.hook.Redispatch.AckTimeouts.Load())
	require.Equal(t, uint64(1), f.hook.Redispatch.Redispatched.Load())

	reserved, ok := stalled.State.Inflight.Get(3)
	require.True(t, ok, "the identifier stays reserved")
	require.NotEqual(t, packets.Publish, reserved.FixedHeader.Type, "the reservation is never sent as a message")
	for range 10 {
		id, err := stalled.NextPacketID()
		require.NoError(t, err)
		require.NotEqual(t, uint32(3), id, "a new delivery got the reserved identifier")
	}

	// The other member acknowledges it; more scans change nothing: the
	// message went once.
	require.True(t, other.State.Inflight.Delete(got[0].PacketID))
	ack.Scan(t0.Add(3 * testAckTimeout))
	require.Empty(t, publishesIn(stalled))
	require.Empty(t, publishesIn(other))
	require.Equal(t, uint64(1), f.hook.Redispatch.AckTimeouts.Load())
}

// TestAckTimeoutLateAckIsCounted: a late PUBACK for a taken delivery is a
// duplicate (the stalled member finished it too) and is counted once;
// Mochi ends the reservation through its ordinary flow (processPuback
// deletes the entry, then tells the hooks).
func TestAckTimeoutLateAckIsCounted(t *testing.T) {
	f := newHookFixture(t)
	f.allowReading(t)
	ack := f.newAckTimeout(t)
	stalled := f.member(t, "stalled", "$share/g/jobs")
	f.member(t, "other", "$share/g/jobs")
	unacknowledged(stalled, 5, "jobs")
	t0 := time.Now()
	ack.Scan(t0)
	ack.Scan(t0.Add(testAckTimeout))
	require.Equal(t, uint64(1), f.hook.Redispatch.AckTimeouts.Load())

	require.True(t, stalled.State.Inflight.Delete(5))
	ack.OnQosComplete(stalled, qosPacket(packets.Puback, 5))
	require.Equal(t, uint64(1), f.hook.Redispatch.LateAcks.Load())
	ack.OnQosComplete(stalled, qosPacket(packets.Puback, 5))
	require.Equal(t, uint64(1), f.hook.Redispatch.LateAcks.Load(), "counted once")
	ack.OnQosComplete(stalled, qosPacket(packets.Puback, 6))
	require.Equal(t, uint64(1), f.hook.Redispatch.LateAcks.Load(), "an ordinary acknowledgement is not late")
}

// TestAckTimeoutNeverReturnsToTheStalledMember: while the stalled member
// is its group's only member, its delivery stays with it; once another
// member joins, the next scan gives it to that one.
func TestAckTimeoutNeverReturnsToTheStalledMember(t *testing.T) {
	f := newHookFixture(t)
	f.allowReading(t)
	ack := f.newAckTimeout(t)
	stalled := f.member(t, "stalled", "$share/g/jobs")
	unacknowledged(stalled, 1, "jobs")
	t0 := time.Now()
	ack.Scan(t0)
	ack.Scan(t0.Add(2 * testAckTimeout))
	require.Len(t, publishesIn(stalled), 1, "kept by the only member")
	require.Zero(t, f.hook.Redispatch.AckTimeouts.Load())
	require.Zero(t, f.hook.ParkedRedispatch(), "not parked either")

	next := f.member(t, "next", "$share/g/jobs")
	ack.Scan(t0.Add(2*testAckTimeout + time.Millisecond))
	require.Empty(t, publishesIn(stalled))
	require.Len(t, publishesIn(next), 1)
}

// TestAckTimeoutLeavesWhatIsNotTheGroups: deliveries through a plain
// subscription, deliveries acknowledged in time, and a later delivery
// that reuses an acknowledged one's identifier between two scans (timed
// from when it is first seen) are not taken.
func TestAckTimeoutLeavesWhatIsNotTheGroups(t *testing.T) {
	f := newHookFixture(t)
	f.allowReading(t)
	ack := f.newAckTimeout(t)
	stalled := f.member(t, "stalled", "$share/g/jobs", "news")
	other := f.member(t, "other", "$share/g/jobs")

	unacknowledged(stalled, 1, "news")
	unacknowledged(stalled, 2, "jobs")
	t0 := time.Now()
	ack.Scan(t0)
	require.True(t, stalled.State.Inflight.Delete(2)) // acknowledged in time
	stalled.State.Inflight.Set(packets.Packet{        // the identifier reused for a new message
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1},
		PacketID:    2, TopicName: "jobs", Payload: []byte("newer work"), Created: 1,
	})
	ack.Scan(t0.Add(testAckTimeout))
	require.Len(t, publishesIn(stalled), 2)
	require.Empty(t, publishesIn(other))

	ack.Scan(t0.Add(2 * testAckTimeout))
	got := publishesIn(other)
	require.Len(t, got, 1, "the newer message, once it is overdue itself")
	require.Equal(t, []byte("newer work"), got[0].Payload)
	left := publishesIn(stalled)
	require.Len(t, left, 1)
	require.Equal(t, "news", left[0].TopicName, "the plain subscription's delivery stays")
}

// TestAckTimeoutReservationsEndWithTheConnection: when the stalled
// member's connection ends, the reserved identifiers are released, so a
// resumed session is sent nothing for them.
func TestAckTimeoutReservationsEndWithTheConnection(t *testing.T) {
	f := newHookFixture(t)
	f.allowReading(t)
	ack := f.newAckTimeout(t)
	stalled := f.member(t, "stalled", "$share/g/jobs")
	f.member(t, "other", "$share/g/jobs")
	unacknowledged(stalled, 1, "jobs")
	unacknowledged(stalled, 2, "jobs")
	t0 := time.Now()
	ack.Scan(t0)
	ack.Scan(t0.Add(testAckTimeout))
	require.Equal(t, 2, stalled.State.Inflight.Len(), "two reservations")
	stalled.Stop(nil)
	ack.OnDisconnect(stalled, nil, false)
	require.Zero(t, stalled.State.Inflight.Len())
}

// TestRedispatchOfADepartedMemberForgetsTheStoredCopies: what re-dispatch
// takes out of a departed member's session is deleted from the store too,
// so a restart cannot load it back into the session.
func TestRedispatchOfADepartedMemberForgetsTheStoredCopies(t *testing.T) {
	f := newHookFixture(t)
	f.allowReading(t)
	store := &recordingStorage{}
	f.hook.SetInflightStorage(store)
	gone := f.member(t, "gone", "$share/g/jobs", "news")
	f.member(t, "other", "$share/g/jobs")
	unacknowledged(gone, 1, "jobs")
	unacknowledged(gone, 2, "jobs")
	unacknowledged(gone, 3, "news")
	f.hook.OnDisconnect(gone, nil, true)
	require.ElementsMatch(t, []string{"gone:1", "gone:2"}, store.forgotten(),
		"the two re-dispatched deliveries, not the plain subscription's")
}

// TestAckTimeoutConfig: the timeout must be positive and the selection
// hook given.
func TestAckTimeoutConfig(t *testing.T) {
	f := newHookFixture(t)
	_, err := hooks.NewAckTimeoutHook(hooks.AckTimeoutConfig{Selection: f.hook})
	require.Error(t, err)
	_, err = hooks.NewAckTimeoutHook(hooks.AckTimeoutConfig{Timeout: time.Second})
	require.Error(t, err)
	h, err := hooks.NewAckTimeoutHook(hooks.AckTimeoutConfig{Selection: f.hook, Timeout: time.Second})
	require.NoError(t, err)
	require.NoError(t, h.Stop(), "stopping a hook that never started")
}

// TestAckTimeoutAvoidsStalledMembers: a delivery taken from one member
// goes to a member that is not itself holding a taken delivery
// unanswered, while there is one.
func TestAckTimeoutAvoidsStalledMembers(t *testing.T) {
	f := newHookFixture(t)
	f.allowReading(t)
	ack := f.newAckTimeout(t)
	first := f.member(t, "first", "$share/g/jobs")
	second := f.member(t, "second", "$share/g/jobs")
	healthy := f.member(t, "healthy", "$share/g/jobs")

	// first stalls on a delivery; wherever it went, that member acknowledges it.
	unacknowledged(first, 1, "jobs")
	t0 := time.Now()
	ack.Scan(t0)
	ack.Scan(t0.Add(testAckTimeout))
	require.Equal(t, uint64(1), f.hook.Redispatch.AckTimeouts.Load())
	for _, cl := range []*mqtt.Client{second, healthy} {
		for _, pk := range publishesIn(cl) {
			require.True(t, cl.State.Inflight.Delete(pk.PacketID))
		}
	}

	// second stalls too: its deliveries go to healthy, never to first.
	const n = 5
	for i := range uint16(n) {
		unacknowledged(second, 100+i, "jobs")
	}
	t1 := t0.Add(testAckTimeout + time.Millisecond)
	ack.Scan(t1)
	ack.Scan(t1.Add(testAckTimeout))
	require.Equal(t, uint64(1+n), f.hook.Redispatch.AckTimeouts.Load())
	require.Empty(t, publishesIn(first), "a stalled member got a re-dispatched message")
	require.Len(t, publishesIn(healthy), n)
}
