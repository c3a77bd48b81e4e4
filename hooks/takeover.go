package hooks

import (
	"bytes"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// TakeoverHook delivers the QoS≥1 messages that Mochi 2.7.9 hands to a
// session's previous client object while a new connection resumes the
// session. Without it they are lost: acknowledged to their publisher, on no
// connection and in no session.
//
// # The race
//
// A publisher's goroutine looks each subscriber up by client ID
// (Clients.Get) and then adds the delivery to that client object's
// in-flight messages. A connection resuming the session (clean start
// false) runs, on its own goroutine: mark the old object taken over, copy
// the old object's in-flight messages to the new object, move the
// subscriptions, clear the old object's in-flight messages, and only then
// register the new object under the client ID. Every delivery the
// publisher adds to the old object after the copy is on neither object;
// one added between the copy and the clear is also dropped from the store.
// The window lasts from about 0.1 ms to several under load; a subscriber
// resuming every 15 ms under 5,000 messages/s lost about one message per
// resumption, in vanilla Mochi and in LuffyMQ alike, and none in Mosquitto.
//
// # The fix
//
// A delivery Mochi starts (OnQosPublish) on a client object already taken
// over is kept, per client ID. When the new connection's session is
// established (OnSessionEstablished, after Mochi resent the copied
// messages) the kept deliveries that the new object does not already hold
// are added to its in-flight messages under their packet identifier (a new
// one if the new object uses that identifier for another message) and
// written to it, in the order they were started; Restore re-records them in
// the persistent store. The hook must come before SelectionHook, so that
// the connection orders them with the resent messages (EndResend). A
// delivery started on the old object after that is written to the new one
// at once, for a short while (lateAdoptWindow). A new connection with clean
// start discards the old session, and the kept deliveries with it.
//
// A connection that takes a session over and then fails before its session
// is established (Mochi could not write its CONNACK or resend its
// messages) never reaches OnSessionEstablished, yet holds the session,
// registered under the client ID. Deliveries kept for such an ID longer
// than lateAdoptWindow are added to whatever object then holds the
// session, at the hook's next takeover event, so that neither they nor the
// record of the takeover stay in the hook for good.
//
// On the delivery path the hook costs one atomic load per QoS≥1 delivery
// (is the client taken over?).
type TakeoverHook struct {
	mqtt.HookBase
	server *mqtt.Server

	// Restore, if set, records an adopted delivery in the persistent
	// store (the store dropped it from the old object, or never had it
	// under its new identifier).
	Restore func(cl *mqtt.Client, pk packets.Packet)
	// Order, if set, records an adopted delivery's new packet identifier
	// when its own was taken.
	Order *DeliveryOrder

	mu sync.Mutex
	// kept are the deliveries started on taken-over client objects, by
	// client ID, oldest first.
	kept map[string][]keptDelivery
	// resumed are the client objects that resumed a session recently,
	// by client ID, for deliveries started on the old object late.
	resumed map[string]resumedSession
	// takingOver are the client IDs whose session a connection is taking
	// over, from OnSessionEstablish to OnSessionEstablished, and since
	// when.
	takingOver map[string]time.Time
	// now is the clock (time.Now; tests set it).
	now func() time.Time

	adopted atomic.Uint64
	missed  atomic.Uint64
}

// lateAdoptWindow is how long after a session resumed a delivery started on
// its old client object is still written to the new one.
const lateAdoptWindow = 5 * time.Second

// keptDelivery is a delivery started on a taken-over client object.
type keptDelivery struct {
	from *mqtt.Client
	pk   packets.Packet
	at   time.Time // when it was kept
}

// resumedSession is a client object that took over a session: resumed it,
// or started clean and discarded it.
type resumedSession struct {
	cl    *mqtt.Client
	at    time.Time
	clean bool
}

// NewTakeoverHook returns a TakeoverHook for server.
func NewTakeoverHook(server *mqtt.Server) *TakeoverHook {
	return &TakeoverHook{server: server, kept: map[string][]keptDelivery{}, resumed: map[string]resumedSession{}, takingOver: map[string]time.Time{}, now: time.Now}
}

// ID names the hook.
func (h *TakeoverHook) ID() string { return "luffymq-takeover" }

// Provides says which events the hook handles.
func (h *TakeoverHook) Provides(b byte) bool {
	switch b {
	case mqtt.OnQosPublish, mqtt.OnSessionEstablish, mqtt.OnSessionEstablished:
		return true
	}
	return false
}

// Adopted returns how many deliveries the hook moved to a resumed session.
func (h *TakeoverHook) Adopted() uint64 { return h.adopted.Load() }

// Missed returns how many deliveries to a taken-over client the hook could
// not move: the delivery named its topic by the old connection's alias, or
// the session had no packet identifier left.
func (h *TakeoverHook) Missed() uint64 { return h.missed.Load() }

// OnQosPublish keeps a delivery started on a taken-over client object, or
// writes it to the session's new object if that one is established.
func (h *TakeoverHook) OnQosPublish(cl *mqtt.Client, pk packets.Packet, _ int64, resends int) {
	if !cl.IsTakenOver() || resends != 0 || pk.FixedHeader.Type != packets.Publish || pk.FixedHeader.Dup || cl.Net.Inline {
		return // DUP: Mochi resending an in-flight message, which the session holds
	}
	if pk.TopicName == "" {
		// Written under the old connection's topic alias: the name is
		// not in the packet, and the alias means nothing to a new
		// connection.
		h.missed.Add(1)
		return
	}
	d := keptDelivery{from: cl, pk: pk.Copy(false)} // without the old connection's topic alias
	d.pk.PacketID = pk.PacketID
	h.route(d)
}

// route keeps d, a delivery started on the taken-over object d.from, for
// the session's next object, or adopts it into that object if it is
// established.
func (h *TakeoverHook) route(d keptDelivery) {
	cl := d.from
	h.mu.Lock()
	now := h.now()
	r, ok := h.resumed[cl.ID]
	if ok && now.Sub(r.at) > lateAdoptWindow {
		delete(h.resumed, cl.ID)
		ok = false
	}
	if !ok || r.cl == cl || r.cl.IsTakenOver() {
		// The session's new object is not established yet (cl may be
		// the object resumed last time, now being taken over itself).
		d.at = now
		h.kept[cl.ID] = append(h.kept[cl.ID], d)
		h.mu.Unlock()
		return
	}
	h.mu.Unlock()
	if r.clean {
		return // for the session the new connection discarded
	}
	// Offline (closed) or not, r.cl holds the session: an offline session
	// keeps the delivery in flight for its next connection.
	h.adopt(r.cl, d)
}

// OnSessionEstablish notes a connection about to take over an existing
// session (Mochi takes it over next), and settles what failed takeovers
// left (pruneLocked).
func (h *TakeoverHook) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	if h.server == nil {
		return
	}
	_, existing := h.server.Clients.Get(cl.ID)
	h.mu.Lock()
	if existing {
		h.takingOver[cl.ID] = h.now()
	}
	orphans := h.pruneLocked()
	h.mu.Unlock()
	h.settleOrphans(orphans)
}

// OnSessionEstablished moves the deliveries kept for the client ID to the
// new client object if it resumed the session, and forgets them if it
// started clean.
func (h *TakeoverHook) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	h.mu.Lock()
	kept, had := h.kept[cl.ID]
	delete(h.kept, cl.ID)
	_, tookOver := h.takingOver[cl.ID]
	delete(h.takingOver, cl.ID)
	resumed := !cl.Properties.Clean
	if had || tookOver {
		h.resumed[cl.ID] = resumedSession{cl: cl, at: h.now(), clean: !resumed}
	}
	orphans := h.pruneLocked()
	h.mu.Unlock()
	h.settleOrphans(orphans)
	if !resumed {
		return
	}
	for _, d := range kept {
		h.adopt(cl, d)
	}
}

// pruneLocked forgets resumed sessions and takeovers older than
// lateAdoptWindow, and takes out the deliveries kept that long, by client
// ID: no connection established the session they were kept for.
func (h *TakeoverHook) pruneLocked() map[string][]keptDelivery {
	now := h.now()
	for id, r := range h.resumed {
		if now.Sub(r.at) > lateAdoptWindow {
			delete(h.resumed, id)
		}
	}
	for id, since := range h.takingOver {
		if now.Sub(since) > lateAdoptWindow {
			delete(h.takingOver, id)
		}
	}
	var orphans map[string][]keptDelivery
	for id, kept := range h.kept {
		if _, pending := h.takingOver[id]; pending || now.Sub(kept[0].at) <= lateAdoptWindow {
			continue
		}
		if orphans == nil {
			orphans = map[string][]keptDelivery{}
		}
		orphans[id] = kept
		delete(h.kept, id)
	}
	return orphans
}

// settleOrphans adds deliveries kept for sessions that no connection
// established (pruneLocked) to the client object holding each session
// now: the connection that took it over and failed, offline, or a later
// one. A session discarded by a clean start takes none (as in
// OnSessionEstablished); one that is gone neither, and they count as
// missed.
func (h *TakeoverHook) settleOrphans(orphans map[string][]keptDelivery) {
	for id, kept := range orphans {
		var holder *mqtt.Client
		if h.server != nil {
			holder, _ = h.server.Clients.Get(id)
		}
		switch {
		case holder == nil || holder.IsTakenOver():
			h.missed.Add(uint64(len(kept)))
			continue
		case holder.Properties.Clean:
			continue // the session they were for was discarded
		}
		for _, d := range kept {
			h.adopt(holder, d)
		}
	}
}

// adopt adds d to cl's in-flight messages and writes it, unless cl already
// holds it (Mochi copied it from the old object).
func (h *TakeoverHook) adopt(cl *mqtt.Client, d keptDelivery) {
	out := d.pk
	if held, ok := cl.State.Inflight.Get(out.PacketID); ok {
		if sameDelivery(held, out) {
			return
		}
		id, err := cl.NextPacketID()
		if err != nil {
			h.missed.Add(1)
			return
		}
		out.PacketID = uint16(id)
		if h.Order != nil {
			h.Order.Started(cl.ID, out.PacketID)
		}
		if h.Restore != nil {
			h.Restore(cl, held) // the two shared a store key
		}
	}
	if !cl.State.Inflight.Set(out) {
		return // started meanwhile under this identifier: it is there
	}
	if cl.IsTakenOver() {
		// cl was itself taken over meanwhile (the next connection came
		// while this one was being established): its successor may have
		// copied its in-flight messages before this one was added.
		h.route(keptDelivery{from: cl, pk: out})
		return
	}
	h.adopted.Add(1)
	if h.Restore != nil {
		h.Restore(cl, out)
	}
	_ = cl.WritePacket(out) // a failed write ends the connection; the session keeps it
}

// sameDelivery reports whether a and b are the same message: Mochi copied
// the old object's in-flight messages with their identifiers.
func sameDelivery(a, b packets.Packet) bool {
	return a.FixedHeader.Type == b.FixedHeader.Type && a.Created == b.Created &&
		a.TopicName == b.TopicName && bytes.Equal(a.Payload, b.Payload)
}
