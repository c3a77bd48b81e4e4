package hooks

import (
	"slices"
	"sync"
	"sync/atomic"
)

// DeliveryOrder remembers, per client ID, the order in which the broker
// started the QoS 1/2 deliveries that the client has not yet completed,
// so that a resumed session gets them again in that order.
//
// Mochi 2.7.9 resends a resumed session's in-flight messages sorted by the
// second they were created in, with an unstable sort: 50 messages queued
// within one second come back shuffled. The connection (broker/pingreq)
// holds the resent messages back while Mochi writes them and releases
// them in the order this type gives (SelectionHook.OnSessionEstablished).
//
// Each delivery gets a sequence number from one counter that starts at
// the broker's start time in nanoseconds, so numbers stored before a
// restart (see broker's persistence) sort before the new ones.
//
// A client costs nothing here until the broker delivers to it at QoS≥1,
// and one small slice while deliveries are unacknowledged.
type DeliveryOrder struct {
	clients sync.Map // client ID → *clientDeliveries
	next    atomic.Uint64
}

// NewDeliveryOrder returns an empty DeliveryOrder whose first sequence
// number is first+1.
func NewDeliveryOrder(first uint64) *DeliveryOrder {
	o := new(DeliveryOrder)
	o.next.Store(first)
	return o
}

// deliveryEntry is one delivery: its packet identifier and sequence
// number; seq 0 marks an entry that ended.
type deliveryEntry struct {
	seq      uint64
	packetID uint16
}

// clientDeliveries is one client's unacknowledged deliveries, oldest
// first: entries[head:] are current, some of them ended (seq 0) when
// acknowledgements came out of order.
type clientDeliveries struct {
	mu      sync.Mutex
	entries []deliveryEntry
	head    int
}

func (o *DeliveryOrder) client(clientID string, create bool) *clientDeliveries {
	if v, ok := o.clients.Load(clientID); ok {
		return v.(*clientDeliveries)
	}
	if !create {
		return nil
	}
	v, _ := o.clients.LoadOrStore(clientID, new(clientDeliveries))
	return v.(*clientDeliveries)
}

// Started records a new delivery to clientID under packetID and returns
// its sequence number. Called again for the same live delivery (the
// newest one), it returns the same number.
func (o *DeliveryOrder) Started(clientID string, packetID uint16) uint64 {
	c := o.client(clientID, true)
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.entries); n > c.head && c.entries[n-1].packetID == packetID && c.entries[n-1].seq != 0 {
		return c.entries[n-1].seq
	}
	seq := o.next.Add(1)
	c.entries = append(c.entries, deliveryEntry{seq: seq, packetID: packetID})
	return seq
}

// Restore records a delivery read back from storage with the sequence
// number it had; the next numbers given out are larger.
func (o *DeliveryOrder) Restore(clientID string, packetID uint16, seq uint64) {
	if seq == 0 {
		return
	}
	for {
		cur := o.next.Load()
		if cur >= seq || o.next.CompareAndSwap(cur, seq) {
			break
		}
	}
	c := o.client(clientID, true)
	c.mu.Lock()
	defer c.mu.Unlock()
	e := deliveryEntry{seq: seq, packetID: packetID}
	live := c.entries[c.head:]
	i, _ := slices.BinarySearchFunc(live, e, func(a, b deliveryEntry) int {
		switch {
		case a.seq == 0: // ended entries sort anywhere; treat them as older
			return -1
		case a.seq < b.seq:
			return -1
		case a.seq > b.seq:
			return 1
		}
		return 0
	})
	c.entries = slices.Insert(c.entries, c.head+i, e)
}

// Seq returns the sequence number of clientID's current delivery under
// packetID.
func (o *DeliveryOrder) Seq(clientID string, packetID uint16) (uint64, bool) {
	e, ok := o.newest(clientID, func(e deliveryEntry) bool { return e.packetID == packetID })
	return e.seq, ok
}

// LastPacketID returns the packet identifier of clientID's newest
// unacknowledged delivery.
func (o *DeliveryOrder) LastPacketID(clientID string) (uint16, bool) {
	e, ok := o.newest(clientID, func(deliveryEntry) bool { return true })
	return e.packetID, ok
}

// newest returns clientID's newest current delivery that match accepts.
func (o *DeliveryOrder) newest(clientID string, match func(deliveryEntry) bool) (deliveryEntry, bool) {
	c := o.client(clientID, false)
	if c == nil {
		return deliveryEntry{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.entries) - 1; i >= c.head; i-- {
		if e := c.entries[i]; e.seq != 0 && match(e) {
			return e, true
		}
	}
	return deliveryEntry{}, false
}

// Ended records that clientID's delivery under packetID ended
// (acknowledged, dropped or taken back). Acknowledgements in order cost
// O(1); an out-of-order one scans the client's unacknowledged deliveries.
func (o *DeliveryOrder) Ended(clientID string, packetID uint16) {
	c := o.client(clientID, false)
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := c.head; i < len(c.entries); i++ {
		if e := &c.entries[i]; e.packetID == packetID && e.seq != 0 {
			e.seq = 0
			break
		}
	}
	for c.head < len(c.entries) && c.entries[c.head].seq == 0 {
		c.head++
	}
	switch {
	case c.head == len(c.entries):
		if cap(c.entries) > 64 {
			c.entries = nil // a burst is over: let its array go
		} else {
			c.entries = c.entries[:0]
		}
		c.head = 0
	case c.head > 32 && c.head*2 > len(c.entries):
		n := copy(c.entries, c.entries[c.head:])
		c.entries = c.entries[:n]
		c.head = 0
	}
}

// Forget drops everything recorded for clientID (its session ended).
func (o *DeliveryOrder) Forget(clientID string) {
	o.clients.Delete(clientID)
}

// Pending returns how many unacknowledged deliveries are recorded for
// clientID (ended ones still waiting behind an older one included).
func (o *DeliveryOrder) Pending(clientID string) int {
	c := o.client(clientID, false)
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries) - c.head
}
