// Package hooks connects Mochi MQTT to LuffyMQ's load-aware selection: a
// hook that keeps the scoring engine informed of sessions, subscriptions,
// load reports and QoS flows, and picks the member of every shared group
// that receives a message.
package hooks

import (
	"bytes"
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

// SelectionConfig configures a SelectionHook.
type SelectionConfig struct {
	// Engine holds the load state and the strategy. Required.
	Engine *scoring.Engine
	// Server is used to disconnect clients that send oversized reports.
	// Required.
	Server *mqtt.Server
	// ReportInterval is announced to MQTT v5 clients in every CONNACK.
	ReportInterval time.Duration
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

	flowsMu sync.Mutex
	flows   map[string]*qosFlows // by client ID

	// Reports counts load reports.
	Reports ReportCounters
	// Fallbacks counts messages for which the engine knew no member of a
	// group Mochi matched (a race with subscribe/unsubscribe); Mochi's
	// own choice was kept.
	Fallbacks atomic.Uint64
}

// NewSelectionHook returns a hook for cfg.
func NewSelectionHook(cfg SelectionConfig) (*SelectionHook, error) {
	if cfg.Engine == nil || cfg.Server == nil {
		return nil, errors.New("selection hook needs an engine and a server")
	}
	if cfg.ReportInterval <= 0 {
		cfg.ReportInterval = cfg.Engine.Config().ReportInterval
	}
	return &SelectionHook{
		cfg: cfg,
		intervalProp: packets.UserProperty{
			Key: report.ReportIntervalProperty,
			Val: strconv.FormatInt(cfg.ReportInterval.Milliseconds(), 10),
		},
		flows: make(map[string]*qosFlows),
	}, nil
}

// ID identifies the hook to Mochi.
func (h *SelectionHook) ID() string { return "luffymq-selection" }

// Provides tells Mochi which events the hook handles.
func (h *SelectionHook) Provides(b byte) bool {
	return bytes.Contains([]byte{
		mqtt.OnSessionEstablished,
		mqtt.OnDisconnect,
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
		mqtt.OnACLCheck,
	}, []byte{b})
}

// OnACLCheck lets every authenticated client publish its own load report,
// whatever the ACL says of other topics: the report is consumed by the
// broker, applies only to the publisher and is never routed.
func (h *SelectionHook) OnACLCheck(_ *mqtt.Client, topic string, write bool) bool {
	return write && topic == report.LoadTopic
}

// OnSessionEstablished starts the client's load state and, for a resumed
// session, rejoins the shared groups it is still subscribed to.
//
// It also turns off Mochi's per-client send quota. Mochi 2.7.9 deadlocks
// under QoS 1/2 load through that quota: after each inbound packet, while
// the quota is positive and deliveries are in flight, the client's reader
// calls Inflight.NextImmediate, which takes the in-flight read lock twice
// (once more in GetAll); a publisher adding a delivery in between queues
// for the write lock, and both wait forever. Without the quota that call
// never happens. The client's Receive Maximum is then enforced by the
// selection engine for shared groups: a member at its limit is chosen only
// when every member is.
func (h *SelectionHook) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	e := h.cfg.Engine
	e.Connect(cl.ID)
	cl.State.Inflight.ResetSendQuota(0)
	e.SetReceiveMaximum(cl.ID, int(cl.Properties.Props.ReceiveMaximum))
	for filter := range cl.State.Subscriptions.GetAll() {
		if mqtt.IsSharedFilter(filter) {
			e.Join(filter, cl.ID)
		}
	}
	h.resyncInFlight(cl)
}

// OnDisconnect marks the client offline, or forgets it when its session
// ends. A connection replaced by a newer one with the same client ID
// changes nothing: the new session owns the state.
func (h *SelectionHook) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	if cl.IsTakenOver() {
		return
	}
	h.cfg.Engine.Disconnect(cl.ID, expire)
	if expire {
		h.flowsMu.Lock()
		delete(h.flows, cl.ID)
		h.flowsMu.Unlock()
	}
}

// OnSubscribed adds the client to every shared group it was granted.
func (h *SelectionHook) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	for i, sub := range pk.Filters {
		if i < len(reasonCodes) && reasonCodes[i] < packets.ErrUnspecifiedError.Code && mqtt.IsSharedFilter(sub.Filter) {
			h.cfg.Engine.Join(sub.Filter, cl.ID)
		}
	}
}

// OnUnsubscribed removes the client from the shared groups it left.
func (h *SelectionHook) OnUnsubscribed(cl *mqtt.Client, pk packets.Packet) {
	for _, sub := range pk.Filters {
		if mqtt.IsSharedFilter(sub.Filter) {
			h.cfg.Engine.Leave(sub.Filter, cl.ID)
		}
	}
}

// OnPacketRead applies the load reports lifted off the client's extended
// PINGREQs. A malformed report is counted and ignored (the PINGREQ still
// keeps the connection alive and is answered); an oversized one ends the
// connection with reason "packet too large".
func (h *SelectionHook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type != packets.Pingreq {
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
		h.Log.Debug("ignored malformed load report", "client", cl.ID, "via", via.String(), "error", err)
		return false
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
	})
	h.Reports.Accepted[via].Add(1)
	return true
}

// OnPacketEncode announces the report interval in successful MQTT v5
// CONNACKs as the User Property luffy-report-interval-ms.
//
// It also keeps User Properties on PUBLISH, CONNACK and DISCONNECT when the
// client asked for no problem information: Mochi strips them from every
// packet then, but MQTT-3.1.2-29 forbids them only on other packets, and
// paho clients send Request Problem Information = 0 whenever CONNECT has
// any property — they would lose the report interval and the properties of
// every message.
func (h *SelectionHook) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	switch pk.FixedHeader.Type {
	case packets.Publish, packets.Disconnect:
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
func (h *SelectionHook) OnSelectSubscribers(subs *mqtt.Subscribers, pk packets.Packet) *mqtt.Subscribers {
	msg := scoring.Message{PublisherID: pk.Origin, Topic: pk.TopicName}
	for filter, members := range subs.Shared {
		id, ok := h.cfg.Engine.SelectMember(filter, msg)
		sub, found := members[id]
		if !ok || !found {
			h.Fallbacks.Add(1)
			for cid, s := range members {
				id, sub = cid, s
				break
			}
		}
		if prev, ok := subs.SharedSelected[id]; ok {
			sub = prev.Merge(sub)
		}
		subs.SharedSelected[id] = sub
	}
	return subs
}

func (h *SelectionHook) flowsOf(clientID string) *qosFlows {
	h.flowsMu.Lock()
	defer h.flowsMu.Unlock()
	f, ok := h.flows[clientID]
	if !ok {
		f = &qosFlows{}
		h.flows[clientID] = f
	}
	return f
}

// OnQosPublish counts a new QoS≥1 delivery to the client as in flight.
func (h *SelectionHook) OnQosPublish(cl *mqtt.Client, pk packets.Packet, _ int64, resends int) {
	switch pk.FixedHeader.Type {
	case packets.Publish:
		if resends == 0 && h.flowsOf(cl.ID).startOutbound(pk.PacketID) {
			h.cfg.Engine.InFlightStarted(cl.ID)
		}
	case packets.Puback, packets.Pubrec:
		// The broker acknowledging the client's own QoS≥1 publish.
		h.flowsOf(cl.ID).startInbound(pk.PacketID)
	}
}

// OnQosComplete counts the client's acknowledgement of a delivery.
func (h *SelectionHook) OnQosComplete(cl *mqtt.Client, pk packets.Packet) {
	f := h.flowsOf(cl.ID)
	if f.finishInbound(pk.PacketID) || pk.FixedHeader.Type == packets.Pubrel {
		return
	}
	if f.finishOutbound(pk.PacketID) {
		h.cfg.Engine.InFlightAcknowledged(cl.ID)
	}
}

// OnQosDropped forgets a delivery that expired or failed.
func (h *SelectionHook) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if pk.FixedHeader.Type == packets.Publish && h.flowsOf(cl.ID).finishOutbound(pk.PacketID) {
		h.cfg.Engine.InFlightDropped(cl.ID)
	}
}

// OnPublishDropped resynchronises the in-flight count: Mochi rolls a
// dropped QoS≥1 delivery back without telling which packet it was.
func (h *SelectionHook) OnPublishDropped(cl *mqtt.Client, pk packets.Packet) {
	if pk.FixedHeader.Qos > 0 {
		h.resyncInFlight(cl)
	}
}

func (h *SelectionHook) resyncInFlight(cl *mqtt.Client) {
	var ids []uint16
	for _, p := range cl.State.Inflight.GetAll(false) {
		if p.FixedHeader.Type == packets.Publish {
			ids = append(ids, p.PacketID)
		}
	}
	n := h.flowsOf(cl.ID).resetOutbound(ids)
	h.cfg.Engine.SetInFlight(cl.ID, n)
}
