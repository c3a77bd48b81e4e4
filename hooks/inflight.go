package hooks

import "sync"

// packetIDSet is a set of MQTT packet identifiers: one bit each, 8 KiB, no
// allocation per message.
type packetIDSet [1024]uint64

func (s *packetIDSet) add(id uint16) (added bool) {
	word, bit := id/64, uint64(1)<<(id%64)
	if s[word]&bit != 0 {
		return false
	}
	s[word] |= bit
	return true
}

func (s *packetIDSet) remove(id uint16) (removed bool) {
	word, bit := id/64, uint64(1)<<(id%64)
	if s[word]&bit == 0 {
		return false
	}
	s[word] &^= bit
	return true
}

func (s *packetIDSet) clear() { *s = packetIDSet{} }

// qosFlows tells which QoS≥1 packet identifiers of one client are
// deliveries from the broker awaiting the client's acknowledgement
// (outbound) and which are the client's own publishes the broker is
// acknowledging (inbound). Mochi reports both kinds through the same
// OnQosPublish/OnQosComplete calls, and their identifiers are independent.
type qosFlows struct {
	mu       sync.Mutex
	outbound packetIDSet
	inbound  packetIDSet
	count    int // members of outbound
}

func (f *qosFlows) startOutbound(id uint16) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.outbound.add(id) {
		f.count++
		return true
	}
	return false
}

func (f *qosFlows) finishOutbound(id uint16) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.outbound.remove(id) {
		f.count--
		return true
	}
	return false
}

func (f *qosFlows) startInbound(id uint16) {
	f.mu.Lock()
	f.inbound.add(id)
	f.mu.Unlock()
}

func (f *qosFlows) finishInbound(id uint16) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inbound.remove(id)
}

// resetOutbound replaces the outbound set with ids and returns its size.
func (f *qosFlows) resetOutbound(ids []uint16) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.outbound.clear()
	f.count = 0
	for _, id := range ids {
		if f.outbound.add(id) {
			f.count++
		}
	}
	return f.count
}
