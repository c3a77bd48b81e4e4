package hooks

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDeliveryOrderFollowsStartsAndEnds(t *testing.T) {
	o := NewDeliveryOrder(100)
	require.Equal(t, uint64(101), o.Started("c", 7))
	require.Equal(t, uint64(101), o.Started("c", 7), "the same live delivery keeps its number")
	require.Equal(t, uint64(102), o.Started("c", 3))
	require.Equal(t, uint64(103), o.Started("c", 9))
	require.Equal(t, uint64(104), o.Started("other", 7))

	seq, ok := o.Seq("c", 3)
	require.True(t, ok)
	require.Equal(t, uint64(102), seq)
	last, ok := o.LastPacketID("c")
	require.True(t, ok)
	require.Equal(t, uint16(9), last)

	o.Ended("c", 3) // out of order
	_, ok = o.Seq("c", 3)
	require.False(t, ok)
	require.Equal(t, 3, o.Pending("c"), "7 is still ahead of the ended 3")
	o.Ended("c", 7)
	require.Equal(t, 1, o.Pending("c"))
	o.Ended("c", 9)
	require.Zero(t, o.Pending("c"))
	_, ok = o.LastPacketID("c")
	require.False(t, ok)

	// An identifier used again is a new delivery, after the others.
	require.Equal(t, uint64(105), o.Started("c", 3))
	o.Forget("c")
	require.Zero(t, o.Pending("c"))
	_, ok = o.Seq("other", 7)
	require.True(t, ok, "forgetting one client leaves the others")
}

func TestDeliveryOrderRestoreSortsAndNumbersAfter(t *testing.T) {
	o := NewDeliveryOrder(10)
	o.Restore("c", 5, 500)
	o.Restore("c", 4, 400) // stored records may come back in any order
	o.Restore("c", 6, 600)
	o.Restore("c", 1, 0) // no number: not restored
	require.Equal(t, 3, o.Pending("c"))
	last, _ := o.LastPacketID("c")
	require.Equal(t, uint16(6), last)
	require.Equal(t, uint64(601), o.Started("c", 7), "new deliveries come after restored ones")
}

func TestDeliveryOrderCompactsAfterLongRuns(t *testing.T) {
	o := NewDeliveryOrder(0)
	for i := range 10_000 {
		o.Started("c", uint16(i%65535)+1)
		if i >= 10 {
			o.Ended("c", uint16((i-10)%65535)+1)
		}
	}
	require.Equal(t, 10, o.Pending("c"))
	c := o.client("c", false)
	require.LessOrEqual(t, len(c.entries), 64, "ended entries are dropped as the window moves")
}

// BenchmarkDeliveryOrder is the cost added to every QoS≥1 delivery: its
// start and its acknowledgement, in order, with 20 unacknowledged.
func BenchmarkDeliveryOrder(b *testing.B) {
	o := NewDeliveryOrder(0)
	for i := range 20 {
		o.Started("client", uint16(i)+1)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		o.Started("client", uint16((i+20)%65535)+1)
		o.Ended("client", uint16(i%65535)+1)
	}
}
