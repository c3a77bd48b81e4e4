package pingreq

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/luffymq/luffymq/clientsdk/report"
)

// MaxHeldBytes bounds the QoS≥1 PUBLISH bytes a Conn holds back for a
// client at its Receive Maximum. A client that lets more pile up (it stopped
// acknowledging) is disconnected; its session keeps the messages in flight
// and the broker sends them again when it reconnects.
const MaxHeldBytes = 16 << 20

// ErrHeldTooMuch is returned by Write when a client at its Receive Maximum
// has more than MaxHeldBytes of deliveries waiting for it.
var ErrHeldTooMuch = errors.New("pingreq: client over its Receive Maximum has too many deliveries waiting")

// Packet types in the high nibble of the fixed header byte.
const (
	publishType = 3
	pubrelType  = 6
)

// sendQuota enforces a client's MQTT v5 Receive Maximum on the bytes the
// broker writes to it (MQTT-3.3.4-9): it counts the QoS≥1 PUBLISH packets
// written and not yet acknowledged, and holds back those over the limit,
// in order, until an acknowledgement frees a place. Other packets (QoS 0
// publishes, acknowledgements, PINGRESP) pass at once: MQTT orders
// publishes only within a QoS level.
//
// Mochi MQTT 2.7.9 has this quota too, but using it deadlocks under load
// (a recursive read lock in Inflight.NextImmediate), so LuffyMQ turns it
// off and enforces the limit here, where no broker lock is held.
type sendQuota struct {
	mu        sync.Mutex
	limit     int      // the client's Receive Maximum; 0: none
	inflight  int      // QoS≥1 publishes written and not released
	held      [][]byte // publishes waiting for a place, oldest first
	heldBytes int
	lost      bool  // the byte stream was not whole packets: count nothing
	err       error // sticky write error

	// Between BeginResend and EndResend (a resumed session), QoS≥1
	// publishes are collected here instead of being written, so that
	// EndResend can release them in the order they were first delivered.
	resending bool
	resent    []resentPublish
}

// resentPublish is a QoS≥1 PUBLISH collected while a session resumes.
type resentPublish struct {
	packetID uint16
	packet   []byte
}

// SetReceiveMaximum sets the client's Receive Maximum (0: no limit) and
// writes what the new limit lets through.
func (c *Conn) SetReceiveMaximum(n int) error {
	q := &c.quota
	q.mu.Lock()
	defer q.mu.Unlock()
	q.limit = max(n, 0)
	return c.flushHeldLocked()
}

// ReleaseDelivery records that one QoS≥1 delivery to the client ended (its
// PUBACK, its PUBCOMP, or a PUBREC with an error) and writes the next held
// one, if any.
func (c *Conn) ReleaseDelivery() error {
	q := &c.quota
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.inflight > 0 {
		q.inflight--
	}
	return c.flushHeldLocked()
}

// BeginResend starts collecting the QoS≥1 publishes written to the
// connection (Mochi resending a resumed session's in-flight messages)
// until EndResend.
func (c *Conn) BeginResend() {
	q := &c.quota
	q.mu.Lock()
	defer q.mu.Unlock()
	q.resending = true
}

// EndResend releases the publishes collected since BeginResend, within the
// client's Receive Maximum, ordered by the sequence number order returns
// for their packet identifiers. Those order does not know keep the order
// they were written in, after the known ones.
//
// Mochi 2.7.9 resends in-flight messages sorted by their creation second
// with an unstable sort, so a client that resumes a session would get
// messages queued within one second shuffled.
func (c *Conn) EndResend(order func(packetID uint16) (seq uint64, known bool)) error {
	q := &c.quota
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.resending {
		return q.err
	}
	q.resending = false
	resent := q.resent
	q.resent = nil
	if order != nil && len(resent) > 1 {
		keys := make(map[uint16]uint64, len(resent))
		for _, r := range resent {
			if seq, ok := order(r.packetID); ok {
				keys[r.packetID] = seq
			}
		}
		slices.SortStableFunc(resent, func(a, b resentPublish) int {
			ka, oka := keys[a.packetID]
			kb, okb := keys[b.packetID]
			switch {
			case oka && okb:
				return cmp.Compare(ka, kb)
			case oka:
				return -1
			case okb:
				return 1
			}
			return 0
		})
	}
	for _, r := range resent {
		if q.err != nil {
			break
		}
		q.held = append(q.held, r.packet)
		q.heldBytes += len(r.packet)
	}
	if q.heldBytes > MaxHeldBytes && q.err == nil {
		q.err = fmt.Errorf("%w: more than %d bytes for a client with Receive Maximum %d", ErrHeldTooMuch, MaxHeldBytes, q.limit)
	}
	return c.flushHeldLocked()
}

// publishPacketID returns the packet identifier of pk, a whole QoS≥1
// PUBLISH whose remaining length took lengthBytes bytes.
func publishPacketID(pk []byte, lengthBytes int) (uint16, bool) {
	at := 1 + lengthBytes // topic name length
	if len(pk) < at+2 {
		return 0, false
	}
	at += 2 + int(binary.BigEndian.Uint16(pk[at:]))
	if len(pk) < at+2 {
		return 0, false
	}
	return binary.BigEndian.Uint16(pk[at:]), true
}

// QuotaState returns the deliveries written and unacknowledged, and those
// held back.
func (c *Conn) QuotaState() (inflight, held int) {
	q := &c.quota
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.inflight, len(q.held)
}

// flushHeldLocked writes held publishes while the limit allows.
func (c *Conn) flushHeldLocked() error {
	q := &c.quota
	for len(q.held) > 0 && q.err == nil && (q.limit == 0 || q.inflight < q.limit) {
		pk := q.held[0]
		q.held[0] = nil
		q.held = q.held[1:]
		q.heldBytes -= len(pk)
		q.inflight++
		if err := c.enqueueOut(pk, false); err != nil {
			q.err = err
		}
	}
	if len(q.held) == 0 {
		q.held = nil // let the backing array go
	}
	return q.err
}

// Write queues p, a sequence of whole MQTT packets as Mochi writes them,
// for the connection's writer (see outbox.go), holding back QoS≥1
// publishes over the client's Receive Maximum and dropping QoS 0 publishes
// while the outbox is full. It never blocks on the socket, and reports all
// of p written unless the connection failed.
func (c *Conn) Write(p []byte) (int, error) {
	q := &c.quota
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		return 0, q.err
	}
	if q.lost {
		if err := c.enqueueOut(p, false); err != nil {
			q.err = err
			return 0, err
		}
		return len(p), nil
	}
	from := 0 // start of the bytes not yet queued or held
	for off := 0; off < len(p); {
		length, used, err := report.DecodeVarint(p[off+1:])
		end := off + 1 + used + length
		if err != nil || end > len(p) {
			// Not whole packets (Mochi always writes whole ones): stop
			// counting rather than corrupt the stream.
			q.lost = true
			break
		}
		header := p[off]
		switch {
		case q.resending && header>>4 == pubrelType:
			// A resumed session's QoS 2 delivery waiting for PUBCOMP
			// counts against the Receive Maximum until it completes.
			q.inflight++
		case header>>4 != publishType:
		case header&0x06 == 0: // QoS 0: may be dropped on its own
			if err := c.enqueueOut(p[from:off], false); err != nil {
				q.err = err
				return 0, err
			}
			if err := c.enqueueOut(p[off:end], true); err != nil {
				q.err = err
				return 0, err
			}
			from = end
		case q.resending:
			if err := c.enqueueOut(p[from:off], false); err != nil {
				q.err = err
				return 0, err
			}
			id, _ := publishPacketID(p[off:end], used)
			q.resent = append(q.resent, resentPublish{packetID: id, packet: append([]byte(nil), p[off:end]...)})
			from = end
		case len(q.held) > 0 || (q.limit > 0 && q.inflight >= q.limit):
			if err := c.enqueueOut(p[from:off], false); err != nil {
				q.err = err
				return 0, err
			}
			q.held = append(q.held, append([]byte(nil), p[off:end]...))
			q.heldBytes += end - off
			from = end
			if q.heldBytes > MaxHeldBytes {
				q.err = fmt.Errorf("%w: more than %d bytes for a client with Receive Maximum %d", ErrHeldTooMuch, MaxHeldBytes, q.limit)
				return 0, q.err
			}
		default:
			q.inflight++
		}
		off = end
	}
	if err := c.enqueueOut(p[from:], false); err != nil {
		q.err = err
		return 0, err
	}
	return len(p), nil
}
