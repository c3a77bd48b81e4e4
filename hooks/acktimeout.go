package hooks

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Ack timeout: a shared-group member that stays connected but holds a
// QoS≥1 delivery unacknowledged (no PUBACK, or for QoS 2 no PUBREC) for
// longer than the timeout has that message re-dispatched to another member
// of the group, through the same path as a departed member's (see
// redispatch.go): published again as RedispatchOrigin, DUP set, to that
// group only, never back to the stalled member, and to none of the members
// still holding a taken delivery unanswered while another member is left.
// While the stalled member is the group's only member the message stays
// with it.
//
// What happens to the stalled member's copy: it is taken out of the
// session's in-flight messages and out of the persistent store, so neither
// a resumed session nor a restart sends it to that member again. Its packet
// identifier stays reserved until the member answers it, because the member
// still holds the message: Mochi 2.7.9 gives a free identifier to the next
// delivery, and a client handed a new message under an identifier it has
// not released may take it for a retransmission (a QoS 2 receiver that has
// sent PUBREC for it acknowledges it without passing it on, and it would be
// lost). The reservation is an in-flight PUBREC-typed entry marked with
// RedispatchOrigin, which Mochi never resends as a message:
//
//   - a late PUBACK, or a late PUBREC and then PUBCOMP, from the member
//     completes it through Mochi's ordinary flow, so the member's Receive
//     Maximum place and the engine's count of its unacknowledged
//     deliveries are freed as for any acknowledgement. It is counted as a
//     late acknowledgement: the member finished a message another member
//     was given too, a duplicate (at-least-once).
//   - when the connection ends, the reservations are removed (the member
//     forgets unacknowledged identifiers when its connection ends). A
//     session taken over by a new connection inherits them; Mochi writes
//     them as PUBREC, which the client ends with PUBREL, and nothing is
//     delivered.
//
// Without the reservation Mochi 2.7.9 would ignore a late PUBACK (an
// acknowledgement of an unknown identifier is dropped in processPuback), so
// the late PUBACK would be harmless, but the identifier could be reused as
// described, and the member's Receive Maximum place would never be freed.
//
// Timeouts are checked by one goroutine per broker, every ScanInterval,
// over the in-flight messages of connected shared-group members only;
// nothing is done per message on the delivery path. A delivery is timed
// from the first scan that sees it, so it is taken between Timeout and
// Timeout + 2 × ScanInterval after it was sent. Its unacknowledged
// deliveries keep counting against the stalled member (the engine sees it
// busy), so the selection turns away from it.

// AckTimeoutConfig configures an AckTimeoutHook.
type AckTimeoutConfig struct {
	// Selection is the broker's selection hook: the hook re-dispatches
	// through it and scans the connections it knows to be shared-group
	// members. Required.
	Selection *SelectionHook
	// Timeout is how long a member may hold a delivery unacknowledged
	// before it is given to another member. Must be positive.
	Timeout time.Duration
	// ScanInterval is how often deliveries are checked (default Timeout/8,
	// at least 10 ms and at most 1 s).
	ScanInterval time.Duration
}

// Bounds of the default scan interval.
const (
	minAckScanInterval = 10 * time.Millisecond
	maxAckScanInterval = time.Second
)

// AckTimeoutHook re-dispatches deliveries that a connected shared-group
// member does not acknowledge in time. Add it to the server before the
// selection hook: it tells the member's acknowledgements of deliveries
// from the broker's acknowledgements of the member's own publishes by the
// selection hook's record, which that hook clears in the same event.
type AckTimeoutHook struct {
	mqtt.HookBase
	cfg AckTimeoutConfig

	watches sync.Map // *mqtt.Client → *memberWatch, live member connections

	startOnce sync.Once
	stopOnce  sync.Once
	stop      chan struct{}
	done      chan struct{}
}

// memberWatch is the ack-timeout state of one member connection.
type memberWatch struct {
	// seen and gen belong to the scanning goroutine.
	seen map[uint16]seenDelivery
	gen  uint64

	mu sync.Mutex
	// taken holds the packet identifiers of deliveries taken from the
	// member that it has not answered yet.
	taken map[uint16]takeState
}

// seenDelivery is an in-flight delivery as the scanner first saw it.
type seenDelivery struct {
	since time.Time
	// created, topic and size tell a delivery from a later one that reuses
	// its packet identifier between two scans.
	created int64
	topic   string
	size    int
	gen     uint64 // the last scan that saw it
	// keep is set for deliveries that are the member's own (a plain
	// subscription's) or that cannot be re-dispatched.
	keep bool
}

func (s seenDelivery) same(pk packets.Packet) bool {
	return s.created == pk.Created && s.topic == pk.TopicName && s.size == len(pk.Payload)
}

// takeState is where taking a delivery from its member stands.
type takeState uint8

const (
	// takeStarted: the placeholder is being put in the delivery's place.
	takeStarted takeState = iota + 1
	// takeAnswered: the member acknowledged the delivery while it was
	// being taken; it is not re-dispatched.
	takeAnswered
	// takeDone: re-dispatched; the placeholder reserves the identifier.
	takeDone
)

// takeOutcome is what became of an attempt to take a delivery.
type takeOutcome int

const (
	takeTaken   takeOutcome = iota // re-dispatched
	takeKept                       // the member's own: never taken
	takeWait                       // no other member now: try again later
	takeSettled                    // acknowledged meanwhile
)

// NewAckTimeoutHook returns a hook for cfg.
func NewAckTimeoutHook(cfg AckTimeoutConfig) (*AckTimeoutHook, error) {
	if cfg.Selection == nil {
		return nil, errors.New("ack timeout hook needs the selection hook")
	}
	if cfg.Timeout <= 0 {
		return nil, errors.New("ack timeout must be positive")
	}
	if cfg.ScanInterval <= 0 {
		cfg.ScanInterval = min(max(cfg.Timeout/8, minAckScanInterval), maxAckScanInterval)
	}
	return &AckTimeoutHook{cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// ID identifies the hook to Mochi.
func (h *AckTimeoutHook) ID() string { return "luffymq-ack-timeout" }

// Provides tells Mochi which events the hook handles.
func (h *AckTimeoutHook) Provides(b byte) bool {
	switch b {
	case mqtt.OnStarted, mqtt.OnQosComplete, mqtt.OnQosDropped, mqtt.OnDisconnect:
		return true
	}
	return false
}

// OnStarted starts the scanning goroutine.
func (h *AckTimeoutHook) OnStarted() {
	h.startOnce.Do(func() { go h.run() })
}

// Stop ends the scanning goroutine (Mochi stops every hook in Close).
func (h *AckTimeoutHook) Stop() error {
	h.stopOnce.Do(func() { close(h.stop) })
	started := true
	h.startOnce.Do(func() { started = false }) // never started: nothing to wait for
	if started {
		<-h.done
	}
	return nil
}

func (h *AckTimeoutHook) run() {
	defer close(h.done)
	t := time.NewTicker(h.cfg.ScanInterval)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case now := <-t.C:
			h.Scan(now)
		}
	}
}

// Scan takes from every connected member the deliveries it has held
// unacknowledged for longer than the timeout, as seen from earlier scans,
// and re-dispatches them. The hook's goroutine calls it every
// ScanInterval; tests may call it themselves on a hook whose server is not
// started, one call at a time.
func (h *AckTimeoutHook) Scan(now time.Time) {
	sel := h.cfg.Selection
	// Members holding a taken delivery they have not answered are stalled:
	// while the group has others, nothing is re-dispatched to them.
	stalled := map[string]struct{}{}
	h.watches.Range(func(k, v any) bool {
		w := v.(*memberWatch)
		w.mu.Lock()
		if len(w.taken) > 0 {
			stalled[k.(*mqtt.Client).ID] = struct{}{}
		}
		w.mu.Unlock()
		return true
	})
	sel.conns.Range(func(k, v any) bool {
		cl := k.(*mqtt.Client)
		if v.(*connState).isMember() && !cl.Closed() {
			h.scanMember(cl, h.watchFor(cl), now, stalled)
		}
		return true
	})
	h.watches.Range(func(k, _ any) bool {
		if _, live := sel.conns.Load(k); !live {
			h.watches.Delete(k)
		}
		return true
	})
}

func (h *AckTimeoutHook) watchFor(cl *mqtt.Client) *memberWatch {
	if w, ok := h.watches.Load(cl); ok {
		return w.(*memberWatch)
	}
	w, _ := h.watches.LoadOrStore(cl, &memberWatch{seen: map[uint16]seenDelivery{}, taken: map[uint16]takeState{}})
	return w.(*memberWatch)
}

func (h *AckTimeoutHook) scanMember(cl *mqtt.Client, w *memberWatch, now time.Time, stalled map[string]struct{}) {
	w.gen++
	for _, pk := range cl.State.Inflight.GetAll(false) {
		if pk.FixedHeader.Type != packets.Publish || pk.FixedHeader.Qos == 0 {
			continue
		}
		id := pk.PacketID
		s, ok := w.seen[id]
		if !ok || !s.same(pk) {
			w.seen[id] = seenDelivery{since: now, created: pk.Created, topic: pk.TopicName, size: len(pk.Payload), gen: w.gen}
			continue
		}
		s.gen = w.gen
		if !s.keep && now.Sub(s.since) >= h.cfg.Timeout {
			switch h.take(cl, w, pk, stalled) {
			case takeTaken, takeSettled:
				delete(w.seen, id)
				continue
			case takeKept:
				s.keep = true
			case takeWait:
			}
		}
		w.seen[id] = s
	}
	for id, s := range w.seen {
		if s.gen != w.gen {
			delete(w.seen, id) // acknowledged, or no longer a PUBLISH (QoS 2 past PUBREC)
		}
	}
}

// take replaces cl's delivery pk by a placeholder and re-dispatches it to
// the rest of its group, to a member that is not stalled if there is one.
// It adds cl to stalled.
func (h *AckTimeoutHook) take(cl *mqtt.Client, w *memberWatch, pk packets.Packet, stalled map[string]struct{}) takeOutcome {
	sel := h.cfg.Selection
	if pk.TopicName == "" {
		sel.Redispatch.Unroutable.Add(1)
		return takeKept
	}
	group, ok := sel.groupOf(cl.ID, pk.TopicName)
	if !ok {
		return takeKept // a plain subscription's delivery: the member's own
	}
	if sel.requeuedElsewhere(group) {
		return takeKept // its owner (the bridge) decides
	}
	if !sel.hasOtherMember(group, cl.ID, pk.TopicName) {
		return takeWait
	}
	id := pk.PacketID
	w.mu.Lock()
	w.taken[id] = takeStarted
	w.mu.Unlock()

	// Set replaces the delivery only if the member has not acknowledged it
	// yet: an acknowledgement deletes the entry first. The client's lock
	// keeps Mochi from giving the identifier to a new delivery in the
	// moment the entry is absent (NextPacketID holds it).
	cl.Lock()
	replaced := !cl.State.Inflight.Set(reservation(cl, id))
	if !replaced {
		cl.State.Inflight.Delete(id)
	}
	cl.Unlock()

	w.mu.Lock()
	answered := w.taken[id] != takeStarted
	if !replaced || answered {
		delete(w.taken, id)
		w.mu.Unlock()
		return takeSettled
	}
	w.taken[id] = takeDone
	w.mu.Unlock()

	stalled[cl.ID] = struct{}{}
	sel.forgetStored(cl, pk)
	sel.Redispatch.AckTimeouts.Add(1)
	sel.injectAvoiding(group, cl.ID, stalled, pk)
	return takeTaken
}

// reservation is the in-flight entry that keeps packet identifier id of a
// taken delivery reserved (see the comment at the top of this file).
func reservation(cl *mqtt.Client, id uint16) packets.Packet {
	return packets.Packet{
		FixedHeader:     packets.FixedHeader{Type: packets.Pubrec},
		PacketID:        id,
		Origin:          RedispatchOrigin,
		Created:         time.Now().Unix(),
		ProtocolVersion: cl.Properties.ProtocolVersion,
	}
}

// isReservation reports whether pk is a reservation entry.
func isReservation(pk packets.Packet) bool {
	return pk.FixedHeader.Type == packets.Pubrec && pk.Origin == RedispatchOrigin
}

// OnQosComplete counts a member's late acknowledgement of a delivery taken
// from it.
func (h *AckTimeoutHook) OnQosComplete(cl *mqtt.Client, pk packets.Packet) {
	switch pk.FixedHeader.Type {
	case packets.Puback:
		if st := h.cfg.Selection.lookup(cl); st != nil && st.inboundAck.Load() == uint32(pk.PacketID)+1 {
			return // the broker acknowledged the member's own publish
		}
	case packets.Pubcomp:
	default:
		return
	}
	h.answered(cl, pk.PacketID, true)
}

// OnQosDropped forgets a taken delivery the member refused (PUBREC with
// an error) or whose reservation expired.
func (h *AckTimeoutHook) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if pk.FixedHeader.Type == packets.Pubrec {
		h.answered(cl, pk.PacketID, false)
	}
}

func (h *AckTimeoutHook) answered(cl *mqtt.Client, id uint16, acknowledged bool) {
	v, ok := h.watches.Load(cl)
	if !ok {
		return
	}
	w := v.(*memberWatch)
	w.mu.Lock()
	defer w.mu.Unlock()
	switch w.taken[id] {
	case takeStarted:
		w.taken[id] = takeAnswered
	case takeDone:
		delete(w.taken, id)
		if acknowledged {
			h.cfg.Selection.Redispatch.LateAcks.Add(1)
		}
	}
}

// OnDisconnect removes the connection's reservations: a client forgets
// the identifiers it has not acknowledged when its connection ends. A
// session taken over keeps them (see the top of this file).
func (h *AckTimeoutHook) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	v, ok := h.watches.LoadAndDelete(cl)
	if !ok || cl.IsTakenOver() {
		return
	}
	w := v.(*memberWatch)
	w.mu.Lock()
	ids := make([]uint16, 0, len(w.taken))
	for id, state := range w.taken {
		if state == takeDone {
			ids = append(ids, id)
		}
	}
	clear(w.taken)
	w.mu.Unlock()
	for _, id := range ids {
		cl.Lock()
		if pk, ok := cl.State.Inflight.Get(id); ok && isReservation(pk) && cl.State.Inflight.Delete(id) {
			atomic.AddInt64(&h.cfg.Selection.cfg.Server.Info.Inflight, -1)
		}
		cl.Unlock()
	}
}
