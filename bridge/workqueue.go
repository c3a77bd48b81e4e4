package bridge

import (
	"context"
	"encoding/hex"
	"log/slog"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	amqp "github.com/rabbitmq/amqp091-go"
)

// pendingWork is a message taken from a work queue and not yet settled
// with RabbitMQ.
type pendingWork struct {
	id       string
	g        *workGroup
	d        amqp.Delivery
	gen      uint64
	started  time.Time
	qos      byte
	client   string // the member Mochi wrote it to (QoS >= 1)
	packetID uint16

	injecting bool // InjectPacket has not returned yet
	routed    bool // a member has it (QoS >= 1 in flight, QoS 0 written)
	failed    bool // no member could take it
	delivered bool // QoS 0 handed to the client while injecting
}

type packetKey struct {
	client string
	id     uint16
}

// settle is a decision to send to RabbitMQ.
type settle struct {
	p   *pendingWork
	ack bool
	why string // "completed", "duplicate", "requeued"
}

// wqTracker follows messages from a work queue through Mochi.
type wqTracker struct {
	mu       sync.Mutex
	byID     map[string]*pendingWork
	byPacket map[packetKey]*pendingWork
	perGroup map[string]int
	// wakeDue holds the packets whose end the bridge hook settled and
	// whose wake the wake hook sends, later in the same hook chain.
	wakeDue map[packetKey]struct{}
	// wakeHooked is set once the wake hook is attached: from then on it,
	// not the bridge hook, wakes the consume loops.
	wakeHooked atomic.Bool
}

func newWQTracker() *wqTracker {
	return &wqTracker{byID: map[string]*pendingWork{}, byPacket: map[packetKey]*pendingWork{}, perGroup: map[string]int{}, wakeDue: map[packetKey]struct{}{}}
}

// takeWake reports whether the end of (client, packetID) settled a
// work-queue message whose wake is still due, and clears it.
func (t *wqTracker) takeWake(client string, packetID uint16) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	k := packetKey{client, packetID}
	if _, ok := t.wakeDue[k]; !ok {
		return false
	}
	delete(t.wakeDue, k)
	return true
}

// start registers p; it reports false when a message with the same ID is
// already pending.
func (t *wqTracker) start(p *pendingWork) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.byID[p.id]; ok {
		return false
	}
	p.injecting = true
	t.byID[p.id] = p
	t.perGroup[p.g.name]++
	return true
}

// removeLocked forgets p; callers hold t.mu.
func (t *wqTracker) removeLocked(p *pendingWork) {
	if t.byID[p.id] != p {
		return
	}
	delete(t.byID, p.id)
	if p.client != "" {
		delete(t.byPacket, packetKey{p.client, p.packetID})
	}
	t.perGroup[p.g.name]--
}

func (t *wqTracker) get(id string) *pendingWork {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byID[id]
}

func (t *wqTracker) count(group string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.perGroup[group]
}

// reset forgets every message of session gen: RabbitMQ requeued them when
// the channel closed. It returns how many it forgot, by group.
func (t *wqTracker) reset(gen uint64) map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	forgot := map[string]int{}
	for _, p := range t.byID {
		if p.gen == gen {
			t.removeLocked(p)
			forgot[p.g.name]++
		}
	}
	return forgot
}

func userProperty(props []packets.UserProperty, key string) string {
	for _, p := range props {
		if p.Key == key {
			return p.Val
		}
	}
	return ""
}

// sendSettle hands a decision to the session's settle loop.
func (b *Bridge) sendSettle(s settle) {
	select {
	case b.settles <- s:
	default:
		// Cannot happen while pending messages are bounded; RabbitMQ
		// redelivers the message when the channel closes.
		b.log.Warn("bridge: work-queue settle backlog full", "message_id", s.p.id)
	}
}

// wake tells every consume loop that a member may have room.
func (b *Bridge) wake() {
	b.wakeMu.Lock()
	close(b.wakeC)
	b.wakeC = make(chan struct{})
	b.wakeMu.Unlock()
}

// wakeChan is closed by the next wake.
func (b *Bridge) wakeChan() <-chan struct{} {
	b.wakeMu.Lock()
	defer b.wakeMu.Unlock()
	return b.wakeC
}

// workGroupsFor returns the export groups whose filter matches topic.
func (b *Bridge) matchGroups(topic string) []*workGroup {
	var out []*workGroup
	for _, g := range b.groups {
		if MatchFilter(g.filter, topic) {
			out = append(out, g)
		}
	}
	return out
}

// exportWork queues a local publish for every matching work queue.
func (b *Bridge) exportWork(pk packets.Packet) {
	var pub *amqp.Publishing
	for _, g := range b.matchGroups(pk.TopicName) {
		if pub == nil {
			pub = b.publishing(pk)
			pub.DeliveryMode = amqp.Persistent
			pub.Headers[HeaderTopic] = pk.TopicName
		}
		p := *pub
		m := &outMsg{exchange: "", key: g.queue(), pub: p, label: g.queue(), wakesWork: true}
		if !b.cfg.WorkQueue.TTLOverflowOnly {
			now := time.Now()
			d := g.view.decide(now, g.router)
			if g.router != nil && b.log.Enabled(context.Background(), slog.LevelDebug) {
				b.traceRoute(g, now, "bridge: work-queue route", d, pk.Payload)
			}
			switch {
			case d.site != "":
				m.exchange, m.key, m.wakesWork = RouteExchangeName(g.name), d.site, false
				m.pub.Headers = maps.Clone(m.pub.Headers)
				m.pub.Headers[headerRouted] = true
				m.pub.Headers[headerDue] = d.due.UnixNano()
				m.pub.Headers[headerBookedBy] = b.cfg.BrokerID
				b.stats.wqRoutedTo(g.name, d.site)
			case d.overflow:
				m.exchange = DeadLetterExchangeName(g.name)
				b.stats.wqOverflowAtPublish(g.name)
			case d.askStates:
				g.nudgeWant()
			}
		}
		if !b.outbox.push(m) {
			b.stats.warnDropped(b.log)
		}
	}
}

// workPacket builds the MQTT publish of a work-queue message.
func (b *Bridge) workPacket(d amqp.Delivery, id string) (packets.Packet, bool) {
	topic, _ := d.Headers[HeaderTopic].(string)
	if !validTopic(topic) {
		return packets.Packet{}, false
	}
	qos := byte(1)
	if v, ok := asInt(d.Headers[HeaderQoS]); ok && v >= 0 && v <= 2 {
		qos = byte(v)
	}
	origin, _ := d.Headers[HeaderOrigin].(string)
	if origin == "" {
		origin = b.cfg.Site
	}
	if !mqttString(origin) {
		origin = b.cfg.Site
	}
	props := propertiesFromHeaders(d, OriginUserProperty, MessageIDUserProperty)
	props.User = append(props.User,
		packets.UserProperty{Key: OriginUserProperty, Val: origin},
		packets.UserProperty{Key: MessageIDUserProperty, Val: id})
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos},
		TopicName:   topic,
		Payload:     d.Body,
		Properties:  props,
	}
	if qos > 0 {
		pk.PacketID = 1 // the inline client never acknowledges; Mochi only checks it is set
	}
	return pk, true
}

// deliverWork injects one work-queue message into Mochi; it is settled
// later, when the member acknowledges it (or at once if it cannot be
// delivered). It reports false when no member took it.
func (b *Bridge) deliverWork(g *workGroup, d amqp.Delivery, gen uint64, source wqSource) bool {
	id := d.MessageId
	if id == "" || !mqttString(id) {
		id = "amqp-" + b.bootID + "-" + strconv.FormatUint(b.seq.Add(1), 10)
	}
	b.stats.wqReceived(g.name, source)
	p := &pendingWork{id: id, g: g, d: d, gen: gen, started: time.Now()}
	if b.wqDone.contains(id) || !b.wqTrack.start(p) {
		b.stats.wqSettled(g.name, "duplicate")
		_ = d.Ack(false)
		return true
	}
	pk, ok := b.workPacket(d, id)
	if !ok {
		b.log.Warn("bridge: dropping work-queue message without a valid x-mqtt-topic header", "queue", g.queue(), "message_id", id)
		b.wqTrack.mu.Lock()
		b.wqTrack.removeLocked(p)
		b.wqTrack.mu.Unlock()
		b.stats.wqSettled(g.name, "unmappable")
		_ = d.Ack(false)
		return true
	}
	p.qos = pk.FixedHeader.Qos
	err := b.server.InjectPacket(b.inline, pk)
	t := b.wqTrack
	t.mu.Lock()
	p.injecting = false
	var s *settle
	switch {
	case err != nil || p.failed || (!p.routed && !p.delivered && p.qos > 0):
		if t.byID[p.id] == p {
			t.removeLocked(p)
			s = &settle{p: p, why: "requeued"}
		}
	case p.delivered:
		if t.byID[p.id] == p {
			t.removeLocked(p)
			s = &settle{p: p, ack: true, why: "completed"}
		}
	}
	t.mu.Unlock()
	if s != nil {
		b.sendSettle(*s)
		return s.ack
	}
	return true
}

// wqPublish (OnPublish) refuses a work-queue message whose group has no
// subscriber at all, so it is requeued instead of lost.
func (b *Bridge) wqPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if !cl.Net.Inline || len(b.groups) == 0 {
		return pk, nil
	}
	id := userProperty(pk.Properties.User, MessageIDUserProperty)
	if id == "" {
		return pk, nil
	}
	p := b.wqTrack.get(id)
	if p == nil {
		return pk, nil
	}
	if len(b.server.Topics.Subscribers(pk.TopicName).Shared[p.g.share]) == 0 {
		b.wqTrack.mu.Lock()
		p.failed = true
		b.wqTrack.mu.Unlock()
		return pk, packets.ErrRejectPacket
	}
	return pk, nil
}

// wqSelect (OnSelectSubscribers, before the selection hook) keeps an
// exported group away from local publishes — they reach it through its
// work queue — and sends a work-queue message to its group only.
func (b *Bridge) wqSelect(subs *mqtt.Subscribers, pk packets.Packet) *mqtt.Subscribers {
	if len(b.groups) == 0 {
		return subs
	}
	if pk.Origin == mqtt.InlineClientId {
		if id := userProperty(pk.Properties.User, MessageIDUserProperty); id != "" {
			if p := b.wqTrack.get(id); p != nil {
				members := subs.Shared[p.g.share]
				subs.Shared = map[string]map[string]packets.Subscription{p.g.share: members}
				subs.Subscriptions = map[string]packets.Subscription{}
				subs.InlineSubscriptions = map[int]mqtt.InlineSubscription{}
				return subs
			}
		}
		if hasOriginProperty(pk.Properties.User) {
			return subs // imported pub/sub message: groups get it directly
		}
	}
	for _, g := range b.groups {
		delete(subs.Shared, g.share)
	}
	return subs
}

// wqQosPublish (OnQosPublish) records which member and packet ID carry a
// work-queue message.
func (b *Bridge) wqQosPublish(cl *mqtt.Client, pk packets.Packet, resends int) {
	if pk.FixedHeader.Type != packets.Publish || resends > 0 {
		return
	}
	id := userProperty(pk.Properties.User, MessageIDUserProperty)
	if id == "" {
		return
	}
	t := b.wqTrack
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.byID[id]
	if p == nil || p.client != "" {
		return
	}
	p.client, p.packetID, p.routed = cl.ID, pk.PacketID, true
	t.byPacket[packetKey{cl.ID, pk.PacketID}] = p
}

// wqEncode (OnPacketEncode) settles a QoS 0 work-queue message once Mochi
// writes it to the member.
func (b *Bridge) wqEncode(pk packets.Packet) {
	if pk.FixedHeader.Type != packets.Publish || pk.FixedHeader.Qos != 0 {
		return
	}
	id := userProperty(pk.Properties.User, MessageIDUserProperty)
	if id == "" {
		return
	}
	t := b.wqTrack
	t.mu.Lock()
	p := t.byID[id]
	if p == nil || p.routed {
		t.mu.Unlock()
		return
	}
	p.routed = true
	if p.injecting {
		p.delivered = true
		t.mu.Unlock()
		return
	}
	t.removeLocked(p)
	t.mu.Unlock()
	b.sendSettle(settle{p: p, ack: true, why: "completed"})
}

// wqComplete (OnQosComplete) settles a QoS >= 1 message once its member
// acknowledged it.
func (b *Bridge) wqComplete(cl *mqtt.Client, pk packets.Packet) {
	if pk.FixedHeader.Type != packets.Puback && pk.FixedHeader.Type != packets.Pubcomp {
		return
	}
	if still, ok := cl.State.Inflight.Get(pk.PacketID); ok && still.FixedHeader.Type == packets.Publish {
		return // the client's own publish being acknowledged, not our delivery
	}
	b.finishPacket(cl.ID, pk.PacketID, true)
}

// finishPacket settles the message carried by (client, packetID).
func (b *Bridge) finishPacket(client string, packetID uint16, ack bool) {
	t := b.wqTrack
	t.mu.Lock()
	p := t.byPacket[packetKey{client, packetID}]
	if p == nil {
		t.mu.Unlock()
		return
	}
	t.removeLocked(p)
	hooked := t.wakeHooked.Load()
	if hooked {
		t.wakeDue[packetKey{client, packetID}] = struct{}{}
	}
	t.mu.Unlock()
	if ack {
		b.sendSettle(settle{p: p, ack: true, why: "completed"})
	} else {
		b.sendSettle(settle{p: p, why: "requeued"})
	}
	if !hooked {
		b.wake()
	}
}

// wqDropped (OnPublishDropped) marks a message Mochi could not queue for
// its member.
func (b *Bridge) wqDropped(pk packets.Packet) {
	id := userProperty(pk.Properties.User, MessageIDUserProperty)
	if id == "" {
		return
	}
	t := b.wqTrack
	t.mu.Lock()
	p := t.byID[id]
	if p == nil {
		t.mu.Unlock()
		return
	}
	if p.injecting {
		p.failed = true
		t.mu.Unlock()
		return
	}
	t.removeLocked(p)
	t.mu.Unlock()
	b.sendSettle(settle{p: p, why: "requeued"})
}

// wqDisconnect requeues every message a member had not acknowledged when
// its connection ended.
func (b *Bridge) wqDisconnect(client string) {
	t := b.wqTrack
	t.mu.Lock()
	var lost []*pendingWork
	for k, p := range t.byPacket {
		if k.client == client {
			lost = append(lost, p)
		}
	}
	for _, p := range lost {
		t.removeLocked(p)
	}
	t.mu.Unlock()
	for _, p := range lost {
		b.sendSettle(settle{p: p, why: "requeued"})
	}
	if len(lost) > 0 {
		b.log.Info("bridge: member left with unacknowledged work; requeued", "client", client, "messages", len(lost))
	}
	if !t.wakeHooked.Load() {
		b.wake()
	}
}

// sweepStuck requeues messages no member took within DeliveryTimeout.
func (b *Bridge) sweepStuck(gen uint64) {
	t := b.wqTrack
	limit := time.Now().Add(-b.cfg.WorkQueue.DeliveryTimeout)
	t.mu.Lock()
	var stuck []*pendingWork
	for _, p := range t.byID {
		if p.gen == gen && !p.injecting && p.client == "" && p.started.Before(limit) {
			stuck = append(stuck, p)
		}
	}
	for _, p := range stuck {
		t.removeLocked(p)
	}
	t.mu.Unlock()
	for _, p := range stuck {
		b.sendSettle(settle{p: p, why: "requeued"})
	}
}

// WakeHook returns the hook that wakes the work-queue consume loops when a
// member's PUBACK or PUBCOMP, a dropped delivery or a disconnection ended
// work the bridge handed out. Add it to the Mochi server after the
// selection hook (and after Attach): Mochi runs hooks in the order they
// were added, so the loops wake only once the selection engine has counted
// the event and see the member's room at once. Without it the bridge hook
// wakes them itself, before the selection hook has run: a loop that looks
// in between still sees the member busy and waits up to 10 ms more.
func (b *Bridge) WakeHook() mqtt.Hook { return &wakeHook{b: b} }

// wakeHook is the hook WakeHook returns.
type wakeHook struct {
	mqtt.HookBase
	b *Bridge
}

// ID identifies the hook to Mochi.
func (h *wakeHook) ID() string { return "luffymq-bridge-wake" }

// Init hands the consume loops' wakes over to this hook.
func (h *wakeHook) Init(any) error {
	h.b.wqTrack.wakeHooked.Store(true)
	return nil
}

// Provides tells Mochi which events the hook handles: those with which
// the bridge hook settles work-queue messages.
func (h *wakeHook) Provides(e byte) bool {
	switch e {
	case mqtt.OnQosComplete, mqtt.OnQosDropped, mqtt.OnDisconnect:
		return len(h.b.groups) > 0
	}
	return false
}

// OnQosComplete wakes the consume loops when the acknowledgement settled
// a work-queue message.
func (h *wakeHook) OnQosComplete(cl *mqtt.Client, pk packets.Packet) {
	if h.b.wqTrack.takeWake(cl.ID, pk.PacketID) {
		h.b.wake()
	}
}

// OnQosDropped wakes the consume loops when the dropped delivery was a
// work-queue message.
func (h *wakeHook) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if h.b.wqTrack.takeWake(cl.ID, pk.PacketID) {
		h.b.wake()
	}
}

// OnDisconnect wakes the consume loops: the member's requeued messages and
// the group's changed membership are for the others now.
func (h *wakeHook) OnDisconnect(*mqtt.Client, error, bool) { h.b.wake() }

// traceRoute logs, at debug level under msg, where a local publish went
// (or a held one, dispatched or kept: dispatchHeld) and what the router
// knew of each other site when it chose: the trace that explains a
// routing decision afterwards. head is the payload's first 16 bytes in
// hex, for matching the line with the publisher's own record of the
// message; a held message not dispatched has none (nil payload).
func (b *Bridge) traceRoute(g *workGroup, now time.Time, msg string, d decision, payload []byte) {
	to := b.cfg.Site
	switch {
	case d.site != "":
		to = d.site
	case d.overflow:
		to = "ring"
	}
	attrs := []any{"group", g.name, "at", now.UnixNano(), "to", to, "local", d.local, "cost", d.cost, "start", d.start, "predictable", d.ok, "head", hex.EncodeToString(payload[:min(len(payload), 16)])}
	for _, v := range g.router.Views(now, nil) {
		attrs = append(attrs, slog.Group(v.Site, "age", v.Age, "delay", v.Delay, "intake", v.Intake, "outstanding", v.Outstanding,
			"members", v.Members, "idle", v.Idle, "start", v.Start, "ok", v.OK))
	}
	b.log.Debug(msg, attrs...)
}
