// Package hooks connects Mochi MQTT to LuffyMQ's load-aware selection: a
// hook that keeps the scoring engine informed of sessions, subscriptions,
// load reports and QoS flows, and picks the member of every shared group
// that receives a message.
package hooks

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/luffymq/luffymq/clientsdk/report"
	"github.com/luffymq/luffymq/scoring"
)

// LiftedReportSource is implemented by connections that lift load reports
// off extended PINGREQ packets before Mochi reads them (see broker/pingreq).
type LiftedReportSource interface {
	TakeLiftedReports() (payloads [][]byte, oversized bool)
}

// ReceiveQuota is implemented by connections that enforce the client's
// Receive Maximum on what the broker writes to them (see broker/pingreq):
// the hook tells them the limit and when a QoS≥1 delivery ends.
type ReceiveQuota interface {
	SetReceiveMaximum(n int) error
	ReleaseDelivery() error
	// BeginResend and EndResend bracket Mochi's resending of a resumed
	// session's in-flight messages: the connection holds them and
	// releases them in the order given (see DeliveryOrder).
	BeginResend()
	EndResend(order func(packetID uint16) (seq uint64, known bool)) error
}

// DelayEstimator is implemented by connections that can tell the one-way
// delay from the client (see broker/pingreq): a report without the SDK's
// "received" key is taken to have been written that long before it
// arrived, and what the broker sent since is counted as not in it.
type DelayEstimator interface {
	OneWayDelay() time.Duration
}

// connState is what the hook keeps per live connection: nothing that
// grows with traffic.
type connState struct {
	// member is true while the client is in a shared group: only then do
	// its QoS flows reach the engine.
	member atomic.Bool
	// inboundAck is 1 + the packet ID of the broker's PUBACK to the
	// client's own QoS 1 publish between Mochi's OnQosPublish and
	// OnQosComplete for it (both on the client's reader goroutine), so that
	// completion is not taken for the client acknowledging a delivery.
	inboundAck atomic.Uint32
	// ackIDRemap is set while Mochi processes the client's SUBSCRIBE or
	// UNSUBSCRIBE under a packet identifier other than the client's (see
	// OnPacketRead): the identifier Mochi uses in the high 16 bits, the
	// client's in the low 16 bits, and 1<<32 to mark it set.
	ackIDRemap atomic.Uint64
}

// ConnectionCount returns how many live connections the hook keeps state
// for.
func (h *SelectionHook) ConnectionCount() int {
	n := 0
	h.conns.Range(func(any, any) bool { n++; return true })
	return n
}

// stateOf returns the connection's state, creating it: only for events of
// a live connection (session established, subscribe).
func (h *SelectionHook) stateOf(cl *mqtt.Client) *connState {
	if st := h.lookup(cl); st != nil {
		return st
	}
	st, _ := h.conns.LoadOrStore(cl, new(connState))
	return st.(*connState)
}

// lookup returns the connection's state, or nil once it is gone.
func (h *SelectionHook) lookup(cl *mqtt.Client) *connState {
	if st, ok := h.conns.Load(cl); ok {
		return st.(*connState)
	}
	return nil
}

// isMember reports whether the connection's client is in a shared group.
func (st *connState) isMember() bool { return st != nil && st.member.Load() }

// SelectionConfig configures a SelectionHook.
type SelectionConfig struct {
	// Engine holds the load state and the strategy. Required.
	Engine *scoring.Engine
	// Server is used to disconnect clients that send oversized reports.
	// Required.
	Server *mqtt.Server
	// ReportInterval is announced to MQTT v5 clients in every CONNACK.
	ReportInterval time.Duration
	// RedispatchGrace is how long a disconnected persistent session of a
	// shared-group member keeps its unacknowledged messages before they
	// are re-dispatched to the rest of the group; 0 keeps them until the
	// session expires. Clean sessions re-dispatch at once.
	RedispatchGrace time.Duration
	// RequeuedElsewhere, if set, reports the shared groups (their
	// $share/<group>/<filter>) whose deliveries another component puts
	// back itself when their member leaves or stalls: the multi-site
	// bridge's exported groups, whose messages return to RabbitMQ. The
	// hook neither re-dispatches nor takes back those deliveries (a copy
	// of its own could never reach the group, which only the bridge feeds,
	// and would be parked).
	RequeuedElsewhere func(group string) bool
	// DeliveryOrder records the order of the clients' QoS≥1 deliveries,
	// so that resumed sessions get them again in that order. Nil: the hook
	// makes its own; the broker shares one with its persistent store.
	DeliveryOrder *DeliveryOrder
}

// ReportChannel says how a load report arrived.
type ReportChannel int

// Report channels.
const (
	ViaPingreq ReportChannel = iota
	ViaPublish
)

// String returns "pingreq" or "publish".
func (c ReportChannel) String() string {
	if c == ViaPingreq {
		return "pingreq"
	}
	return "publish"
}

// ReportCounters counts load reports by channel and outcome.
type ReportCounters struct {
	Accepted  [2]atomic.Uint64 // by ReportChannel
	Malformed [2]atomic.Uint64 // by ReportChannel
	// Oversized counts extended PINGREQs over report.MaxPayload (the
	// client was disconnected).
	Oversized atomic.Uint64
}

// SelectionHook is the Mochi hook that drives shared-subscription selection.
type SelectionHook struct {
	mqtt.HookBase
	cfg          SelectionConfig
	intervalProp packets.UserProperty
	holdLead     bool // the engine does late binding (see lateBindingOn)

	conns sync.Map // *mqtt.Client → *connState, one per live connection

	// Reports counts load reports.
	Reports ReportCounters
	// Fallbacks counts messages for which the engine knew no member of a
	// group Mochi matched (a race with subscribe/unsubscribe); Mochi's
	// own choice was kept.
	Fallbacks atomic.Uint64
	// Redispatch counts unacknowledged messages of departed members given
	// to the rest of their group (see redispatch.go).
	Redispatch RedispatchCounters

	redispatch redispatcher
	// LateBinding counts messages held while every member was busy (see
	// latebinding.go).
	LateBinding LateBindingCounters
	late        lateBinder
	// rejections keeps the most recent rejected reports (RecentRejections).
	rejections rejectionLog
}

// NewSelectionHook returns a hook for cfg.
func NewSelectionHook(cfg SelectionConfig) (*SelectionHook, error) {
	if cfg.Engine == nil || cfg.Server == nil {
		return nil, errors.New("selection hook needs an engine and a server")
	}
	if cfg.ReportInterval <= 0 {
		cfg.ReportInterval = cfg.Engine.Config().ReportInterval
	}
	if cfg.DeliveryOrder == nil {
		cfg.DeliveryOrder = NewDeliveryOrder(uint64(time.Now().UnixNano()))
	}
	return &SelectionHook{
		cfg: cfg,
		intervalProp: packets.UserProperty{
			Key: report.ReportIntervalProperty,
			Val: strconv.FormatInt(cfg.ReportInterval.Milliseconds(), 10),
		},
		holdLead: cfg.Engine.Config().HoldLead > 0,
		late:     newLateBinder(),
	}, nil
}

// Stop stops late binding's goroutine, if it started.
func (h *SelectionHook) Stop() error {
	h.stopLateBinder()
	return nil
}

// ID identifies the hook to Mochi.
func (h *SelectionHook) ID() string { return "luffymq-selection" }

// Provides tells Mochi which events the hook handles.
func (h *SelectionHook) Provides(b byte) bool { return selectionEvents[b] }

// selectionEvents are the Mochi events the selection hook handles, as a
// table: Mochi asks on every event it dispatches.
var selectionEvents = func() (t [256]bool) {
	for _, e := range []byte{
		mqtt.OnSessionEstablish,
		mqtt.OnSessionEstablished,
		mqtt.OnDisconnect,
		mqtt.OnClientExpired,
		mqtt.OnSubscribed,
		mqtt.OnUnsubscribed,
		mqtt.OnPacketRead,
		mqtt.OnPacketEncode,
		mqtt.OnPublish,
		mqtt.OnSelectSubscribers,
		mqtt.OnQosPublish,
		mqtt.OnQosComplete,
		mqtt.OnQosDropped,
		mqtt.OnPublishDropped,
	} {
		t[e] = true
	}
	return t
}()

// OnSessionEstablish hands the client's Receive Maximum to its connection
// before Mochi sends anything on it (in-flight messages of a resumed
// session included), and has the connection hold what Mochi resends until
// OnSessionEstablished puts it in order.
func (h *SelectionHook) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	if q, ok := cl.Net.Conn.(ReceiveQuota); ok {
		_ = q.SetReceiveMaximum(int(cl.Properties.Props.ReceiveMaximum))
		q.BeginResend()
	}
}

// OnSessionEstablished resumes the client's load state if it is in shared
// groups (a resumed session), rejoining them.
//
// It also turns off Mochi's per-client send quota. Mochi 2.7.9 deadlocks
// under QoS 1/2 load through that quota: after each inbound packet, while
// the quota is positive and deliveries are in flight, the client's reader
// calls Inflight.NextImmediate, which takes the in-flight read lock twice
// (once more in GetAll); a publisher adding a delivery in between queues
// for the write lock, and both wait forever. Without the quota that call
// never happens. The client's Receive Maximum is then enforced by its
// connection (broker/pingreq), which holds back QoS≥1 publishes over the
// limit, and the selection engine prefers members below their limit.
func (h *SelectionHook) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	cl.State.Inflight.ResetSendQuota(0)
	if q, ok := cl.Net.Conn.(ReceiveQuota); ok {
		order := h.cfg.DeliveryOrder
		id := cl.ID
		_ = q.EndResend(func(packetID uint16) (uint64, bool) { return order.Seq(id, packetID) })
	}
	st := h.stateOf(cl)
	e := h.cfg.Engine
	e.Connect(cl.ID)
	for filter := range cl.State.Subscriptions.GetAll() {
		if mqtt.IsSharedFilter(filter) {
			e.Join(filter, cl.ID)
			st.member.Store(true)
		}
	}
	if st.member.Load() {
		e.SetReceiveMaximum(cl.ID, int(cl.Properties.Props.ReceiveMaximum))
		h.resyncInFlight(cl)
	}
}

// OnDisconnect marks the client offline, or forgets it when its session
// ends. A connection replaced by a newer one with the same client ID
// changes nothing: the new session owns the state.
//
// A member's unacknowledged messages go to the rest of its groups when its
// session ends with the connection, or after RedispatchGrace for a
// persistent session (see redispatch.go).
func (h *SelectionHook) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	st := h.lookup(cl)
	h.conns.Delete(cl)
	if cl.IsTakenOver() {
		return
	}
	h.cfg.Engine.Disconnect(cl.ID, expire)
	if expire {
		h.cfg.DeliveryOrder.Forget(cl.ID)
	}
	switch {
	case !st.isMember():
	case expire:
		h.redispatchUnacknowledged(cl)
	case h.cfg.RedispatchGrace > 0:
		h.scheduleRedispatch(cl, h.cfg.RedispatchGrace)
	}
}

// OnClientExpired forgets a client whose session expired while it was
// disconnected: the engine releases all its state.
// Its unacknowledged shared-group messages then go to the rest of its
// groups.
func (h *SelectionHook) OnClientExpired(cl *mqtt.Client) {
	h.conns.Delete(cl)
	member := h.cfg.Engine.IsMember(cl.ID)
	h.cfg.Engine.Disconnect(cl.ID, true)
	defer h.cfg.DeliveryOrder.Forget(cl.ID)
	if member {
		h.redispatchUnacknowledged(cl)
	}
}

// OnSubscribed adds the client to every shared group it was granted.
func (h *SelectionHook) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	var joined []string
	for i, sub := range pk.Filters {
		if i < len(reasonCodes) && reasonCodes[i] < packets.ErrUnspecifiedError.Code && mqtt.IsSharedFilter(sub.Filter) {
			h.cfg.Engine.Join(sub.Filter, cl.ID)
			joined = append(joined, sub.Filter)
		}
	}
	if len(joined) > 0 && !h.stateOf(cl).member.Swap(true) {
		h.cfg.Engine.SetReceiveMaximum(cl.ID, int(cl.Properties.Props.ReceiveMaximum))
		h.resyncInFlight(cl)
	}
	if len(joined) > 0 {
		h.wakeLateBinder()
	}
	if len(joined) > 0 && h.ParkedRedispatch() > 0 {
		h.releaseParked(joined)
	}
}

// OnUnsubscribed removes the client from the shared groups it left.
func (h *SelectionHook) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	left := false
	for _, sub := range pk.Filters {
		if mqtt.IsSharedFilter(sub.Filter) {
			h.cfg.Engine.Leave(sub.Filter, cl.ID)
			left = true
		}
	}
	if st := h.lookup(cl); left && st != nil {
		st.member.Store(h.cfg.Engine.IsMember(cl.ID))
	}
}

// OnPacketRead applies the load reports lifted off the client's extended
// PINGREQs. A malformed report is counted and ignored (the PINGREQ still
// keeps the connection alive and is answered); an oversized one ends the
// connection with reason "packet too large".
//
// It also moves a SUBSCRIBE or UNSUBSCRIBE whose packet identifier is one
// the broker is using for a delivery to the client onto a free identifier
// (OnPacketEncode puts the client's back on the SUBACK or UNSUBACK):
// Mochi 2.7.9 keeps both directions' identifiers in one table and would
// refuse the subscription with 0x91 Packet Identifier in use, although
// the client's identifiers are its own ([MQTT-2.2.1-3]). mosquitto_sub,
// which subscribes with identifier 1 on every connection, then quits on
// resuming a session with messages waiting.
func (h *SelectionHook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	switch pk.FixedHeader.Type {
	case packets.Pingreq:
	case packets.Subscribe, packets.Unsubscribe:
		return h.unclashPacketID(cl, pk), nil
	default:
		return pk, nil
	}
	src, ok := cl.Net.Conn.(LiftedReportSource)
	if !ok {
		return pk, nil
	}
	payloads, oversized := src.TakeLiftedReports()
	for _, p := range payloads {
		h.applyReport(cl, p, ViaPingreq)
	}
	if oversized {
		h.Reports.Oversized.Add(1)
		h.rejections.add(cl.ID, ViaPingreq, "report larger than "+strconv.Itoa(report.MaxPayload)+" bytes; client disconnected")
		h.Log.Warn("load report larger than allowed; disconnecting",
			"client", cl.ID, "limit_bytes", report.MaxPayload)
		_ = h.cfg.Server.DisconnectClient(cl, packets.ErrPacketTooLarge)
		return pk, packets.ErrRejectPacket // ends Mochi's read loop
	}
	return pk, nil
}

// OnPublish consumes publishes to report.LoadTopic: the report applies to
// the publishing client only and is never routed to subscribers.
func (h *SelectionHook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.TopicName != report.LoadTopic {
		return pk, nil
	}
	if !h.applyReport(cl, pk.Payload, ViaPublish) && pk.FixedHeader.Qos > 0 && cl.Properties.ProtocolVersion == 5 {
		return pk, packets.ErrPayloadFormatInvalid // the PUBACK tells the client
	}
	return pk, packets.CodeSuccessIgnore // acknowledged, not routed
}

func (h *SelectionHook) applyReport(cl *mqtt.Client, payload []byte, via ReportChannel) bool {
	r, err := report.Decode(payload)
	if err != nil {
		h.Reports.Malformed[via].Add(1)
		h.rejections.add(cl.ID, via, err.Error())
		h.Log.Debug("ignored malformed load report", "client", cl.ID, "via", via.String(), "error", err)
		return false
	}
	var writtenAgo time.Duration
	if d, ok := cl.Net.Conn.(DelayEstimator); ok && !r.HasReceived {
		writtenAgo = d.OneWayDelay()
	}
	h.cfg.Engine.Report(cl.ID, scoring.Load{
		Pending:        r.Pending,
		ProcessingTime: r.ProcessingTime,
		Workers:        r.Workers,
		InProgress:     r.InProgress,
		Processed:      r.Processed,
		Backlog:        r.Backlog,
		HasBacklog:     r.HasBacklog,
		Received:       r.Received,
		HasReceived:    r.HasReceived,
		WrittenAgo:     writtenAgo,
	})
	h.wakeLateBinder()
	h.Reports.Accepted[via].Add(1)
	return true
}

// OnPacketEncode announces the report interval in successful MQTT v5
// CONNACKs as the User Property luffy-report-interval-ms.
//
// It sets DUP on re-dispatched messages (see redispatch.go).
//
// It also keeps User Properties on PUBLISH, CONNACK and DISCONNECT when the
// client asked for no problem information: Mochi strips them from every
// packet then, but MQTT-3.1.2-29 forbids them only on other packets, and
// paho clients send Request Problem Information = 0 whenever CONNECT has
// any property — they would lose the report interval and the properties of
// every message.
func (h *SelectionHook) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	switch pk.FixedHeader.Type {
	case packets.Suback, packets.Unsuback:
		if st := h.lookup(cl); st != nil {
			if m := st.ackIDRemap.Load(); m != 0 && uint16(m>>16) == pk.PacketID && st.ackIDRemap.CompareAndSwap(m, 0) {
				pk.PacketID = uint16(m) // the client's own identifier
			}
		}
	case packets.Publish:
		pk.Mods.DisallowProblemInfo = false
		if pk.Origin == RedispatchOrigin && pk.FixedHeader.Qos > 0 {
			pk.FixedHeader.Dup = true // Mochi clears it when it copies a delivery
		}
	case packets.Disconnect:
		pk.Mods.DisallowProblemInfo = false
	case packets.Connack:
		pk.Mods.DisallowProblemInfo = false
		if pk.ReasonCode == packets.CodeSuccess.Code && cl.Properties.ProtocolVersion == 5 {
			pk.Properties.User = append(pk.Properties.User, h.intervalProp)
		}
	}
	return pk
}

// OnSelectSubscribers picks the receiving member of every shared group
// that matched the message.
//
// Mochi adds the members chosen (SharedSelected) to the message's other
// recipients (Subscriptions) after the hooks, with MergeSharedSelected.
// When the message matched one group only (the usual case), the member
// chosen is added to Subscriptions here instead, as MergeSharedSelected
// would add it, and the group is taken off Shared, so that nothing is left
// for Mochi to select or merge: the SharedSelected map then never gets an
// entry, which cost an allocation of its storage (about 800 bytes) and a
// pass over it per message.
func (h *SelectionHook) OnSelectSubscribers(subs *mqtt.Subscribers, pk packets.Packet) *mqtt.Subscribers {
	redispatched := h.restrictToRedispatchGroup(subs, pk.Origin)
	lateBound := h.restrictToLateBoundGroup(subs, pk.Origin)
	mayHold := !redispatched && !lateBound && h.lateBindingOn()
	msg := scoringMessage(pk)
	merged := len(subs.Shared) == 1 && len(subs.SharedSelected) == 0 && subs.Subscriptions != nil
	for filter, members := range subs.Shared {
		var id string
		var ok bool
		if mayHold {
			var held bool
			if id, held, ok = h.holdOrSelect(filter, pk); held {
				delete(subs.Shared, filter) // handed over later (latebinding.go)
				continue
			}
		} else {
			id, ok = h.cfg.Engine.SelectMember(filter, msg)
		}
		sub, found := members[id]
		if !ok || !found {
			h.Fallbacks.Add(1)
			for cid, s := range members {
				id, sub = cid, s
				break
			}
		}
		if merged {
			// MergeSharedSelected's merge of the only selected member.
			// Merged with itself, a subscription without an identifier
			// only gains the map {filter: 0}, for which Mochi then builds
			// and sorts, for every delivery, a list of identifiers that
			// encodes to nothing (it writes those above 0): it goes in as
			// it is.
			switch cls, ok := subs.Subscriptions[id]; {
			case ok:
				subs.Subscriptions[id] = cls.Merge(sub)
			case sub.Identifier == 0 && sub.Identifiers == nil:
				subs.Subscriptions[id] = sub
			default:
				subs.Subscriptions[id] = sub.Merge(sub)
			}
			delete(subs.Shared, filter)
			continue
		}
		if prev, ok := subs.SharedSelected[id]; ok {
			sub = prev.Merge(sub)
		}
		subs.SharedSelected[id] = sub
	}
	return subs
}

// OnQosPublish counts a new QoS≥1 delivery to a shared-group member as in
// flight, and marks the broker's acknowledgement of the client's own QoS 1
// publish so that its completion is not taken for the client's.
//
// The delivery's place in the client's order is recorded only for a
// session that can resume: one that ends with its connection (MQTT 5
// session expiry 0 at CONNECT, which DISCONNECT cannot raise; 3.1.1 clean
// session) is never resent anything, so the order would be kept for
// nothing on every delivery.
func (h *SelectionHook) OnQosPublish(cl *mqtt.Client, pk packets.Packet, _ int64, resends int) {
	switch pk.FixedHeader.Type {
	case packets.Publish:
		if !pk.FixedHeader.Dup && !sessionEndsWithConnection(cl) { // a new delivery, not Mochi resending one
			h.cfg.DeliveryOrder.Started(cl.ID, pk.PacketID)
		}
		if resends == 0 && h.lookup(cl).isMember() {
			h.cfg.Engine.InFlightStarted(cl.ID)
		}
	case packets.Puback:
		if st := h.lookup(cl); st != nil {
			st.inboundAck.Store(uint32(pk.PacketID) + 1)
		}
	}
}

// OnQosComplete handles the end of a QoS flow: the client's PUBACK or
// PUBCOMP for a delivery frees a place under its Receive Maximum and, for a
// shared-group member, is a completion the engine learns from.
func (h *SelectionHook) OnQosComplete(cl *mqtt.Client, pk packets.Packet) {
	switch pk.FixedHeader.Type {
	case packets.Puback, packets.Pubcomp:
	default:
		return // PUBREL: the client's own QoS 2 publish completed
	}
	st := h.lookup(cl) // once: every QoS 1 message comes here twice or more
	if pk.FixedHeader.Type == packets.Puback && st != nil && st.inboundAck.CompareAndSwap(uint32(pk.PacketID)+1, 0) {
		return // the broker acknowledged the client's own publish
	}
	h.cfg.DeliveryOrder.Ended(cl.ID, pk.PacketID)
	h.deliveryEnded(cl, st, true)
}

// OnQosDropped handles a delivery that ended without acknowledgement: the
// client answered PUBREC with an error, or it expired.
//
// A taken-over client's deliveries are not ended: Mochi drops them from the
// old client after it moved them to the new one, which resends them.
func (h *SelectionHook) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if cl.IsTakenOver() {
		return
	}
	switch pk.FixedHeader.Type {
	case packets.Pubrec, packets.Publish:
		h.cfg.DeliveryOrder.Ended(cl.ID, pk.PacketID)
		h.deliveryEnded(cl, h.lookup(cl), false)
	case 0: // expired while the client was offline: no connection
		h.cfg.DeliveryOrder.Ended(cl.ID, pk.PacketID)
		h.cfg.Engine.InFlightDropped(cl.ID)
	}
}

// deliveryEnded frees the client's place under its Receive Maximum and
// tells the engine, for a shared-group member; st is the client's state
// (nil once the connection is gone).
func (h *SelectionHook) deliveryEnded(cl *mqtt.Client, st *connState, acknowledged bool) {
	if q, ok := cl.Net.Conn.(ReceiveQuota); ok {
		_ = q.ReleaseDelivery() // a failed write ends the connection anyway
	}
	if !st.isMember() {
		return
	}
	if acknowledged {
		h.cfg.Engine.InFlightAcknowledged(cl.ID)
	} else {
		h.cfg.Engine.InFlightDropped(cl.ID)
	}
	h.wakeLateBinder()
}

// OnPublishDropped resynchronises a member's in-flight count: Mochi rolls a
// dropped QoS≥1 delivery back without telling which packet it was. The
// delivery was never written, so the connection's quota is unaffected.
func (h *SelectionHook) OnPublishDropped(cl *mqtt.Client, pk packets.Packet) {
	if pk.FixedHeader.Qos > 0 && h.lookup(cl).isMember() {
		h.resyncInFlight(cl)
	}
}

// resyncInFlight sets the engine's count of the member's unacknowledged
// deliveries from Mochi's in-flight store.
func (h *SelectionHook) resyncInFlight(cl *mqtt.Client) {
	n := 0
	for _, p := range cl.State.Inflight.GetAll(false) {
		if p.FixedHeader.Type == packets.Publish {
			n++
		}
	}
	h.cfg.Engine.SetInFlight(cl.ID, n)
}

// unclashPacketID returns pk, a SUBSCRIBE or UNSUBSCRIBE, under a packet
// identifier free in Mochi's in-flight table if its own is taken there by
// a delivery to the client (see OnPacketRead). The free identifier is
// looked for half the identifier space away from the newest delivery's, so
// that a delivery started meanwhile does not take it.
func (h *SelectionHook) unclashPacketID(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	if _, taken := cl.State.Inflight.Get(pk.PacketID); !taken {
		return pk
	}
	from := pk.PacketID
	if last, ok := h.cfg.DeliveryOrder.LastPacketID(cl.ID); ok {
		from = last
	}
	for i := uint32(0); i < 1<<16; i++ {
		id := uint16(uint32(from) + 1<<15 + i)
		if id == 0 {
			continue
		}
		if _, taken := cl.State.Inflight.Get(id); !taken {
			h.stateOf(cl).ackIDRemap.Store(1<<32 | uint64(id)<<16 | uint64(pk.PacketID))
			pk.PacketID = id
			return pk
		}
	}
	return pk // every identifier in use: Mochi answers 0x91
}
