// Package bridge joins a LuffyMQ site broker to the other sites through
// RabbitMQ.
//
// # Pub/sub path
//
// Every MQTT publish whose topic matches an exported filter (Config.Exports)
// is first delivered to local subscribers by Mochi as always, then
// published by the bridge to the site's RabbitMQ topic exchange named by
// ExchangeName (one publish per exchange), with the routing key
// MQTTToAMQP(topic) and these headers:
//
//	x-luffymq-origin   the publishing site (Config.Site)
//	x-luffymq-broker   the publishing broker (Config.BrokerID)
//	x-mqtt-qos         the publish QoS (0..2); QoS >= 1 is a persistent
//	                   message published with confirms and retried until
//	                   confirmed
//	x-mqtt-retain      the retain flag
//	x-mqtt-user        MQTT v5 user properties, as an array of [key, value]
//	x-mqtt-response-topic, x-mqtt-correlation-data, x-mqtt-payload-format
//	x-luffymq-work-groups
//	                   the exported groups whose work queues had the
//	                   message too (see Work queues), when there are any
//
// plus the AMQP properties message-id (unique per message), content-type,
// timestamp and expiration (from the message expiry interval).
//
// Each broker has one durable import queue, ImportQueueName(site,
// broker-id), bound to every pub/sub exchange with one binding key per
// local MQTT subscription that overlaps an export filter (their
// intersection, see IntersectFilters).
// Bindings follow subscriptions as clients subscribe, unsubscribe and
// their sessions end. Federation (ApplyFederation) propagates these bindings
// to the other sites' exchanges, so remote messages flow only where
// someone wants them. The importer injects each message from the queue into
// the local broker through Mochi's inline client, with the original QoS,
// retain flag and properties plus the user property
// luffymq-origin-site=<origin>.
//
// Loop and duplicate rules: messages this broker published are never
// injected (local subscribers already had them), nor are messages of this
// site that came back through federation (they carry RabbitMQ's
// x-received-from header; every broker of the site had them straight from
// the site's exchange); injected messages are never exported again, so a
// message crosses sites only as published by its origin broker; a message
// ID seen recently (Config.DedupWindow) is dropped, which removes the
// duplicates that at-least-once republishing and federation link restarts
// can create.
//
// # Work queues
//
// An exported shared group $share/<g>/<filter> (Config.ExportGroups) is
// served through the durable queue wq.<g> that every site of the group
// has. A local publish matching <filter> is published to wq.<g>
// (persistent, with confirms, through the outbox; the topic travels in the
// x-mqtt-topic header) instead of going to the group's members, whom the
// bridge's OnSelectSubscribers hook — attached before the selection hook —
// removes from the publish's recipients. Non-shared subscribers and other
// groups get the publish as usual.
//
// A topic both exported (Exports) and covered by an exported group is
// published to the pub/sub exchange too, with the header
// x-luffymq-work-groups naming the groups whose work queues got it. An
// importer (a broker of another site, or another broker of this site) gives
// such a message to its plain subscribers and non-exported groups but not
// to the groups named there: they get it once, through the work queue,
// wherever its overflow takes it. Imported messages without the header (a
// group the origin does not export, or another publisher) go to groups
// directly, as to any shared group.
//
// The bridge takes messages back with basic.get, one at a time, only while
// some online member of the group has room (no delivery waiting behind the
// one it works on and, if it reports, a predicted wait under one service
// time) and fewer than WorkQueueConfig.UnackedPerMember × online members
// are unacknowledged: the pull-based equivalent of a prefetch of that size
// that changes with the members. Each message is injected through Mochi's
// inline client with the user properties luffymq-origin-site and
// luffymq-message-id, so the selection hook picks the member, and reaches
// that group only. It is acknowledged to RabbitMQ when the member's PUBACK
// (QoS 1) or PUBCOMP (QoS 2) arrives, or when Mochi writes it (QoS 0); it
// is requeued when the member disconnects first, when Mochi drops it, or
// when no member took it within DeliveryTimeout. Delivery is at least
// once: members drop duplicates by luffymq-message-id, and the bridge drops
// a message whose ID is already pending or was completed recently.
//
// Overflow at publish (earlyoverflow.go): unless
// WorkQueueConfig.TTLOverflowOnly, a local publish that the broker's
// members would not start within the queue's TTL — by their predicted
// waits and the messages ready ahead of it, counted from basic.get's
// answers — is published to wq.<g>.dlx at once instead of waiting the TTL
// out in wq.<g>; while that happens the local intake's weight in the
// site's own wq.<g>.dlx drops to 1.
//
// Overflow. Every site retunes (through one of its brokers, see below),
// each RetuneInterval, the policy luffymq-wq:wq.<g> (message-ttl,
// max-length, overflow drop-head, dead-letter-exchange wq.<g>.dlx) by eq.
// 2.12 with ConsumerUtilisation × NumberOfConsumers / 100 taken as the sum
// over online members of 1/(1+q), q being the work queued ahead of a new
// message in service times (PredictedWait / ServiceEstimate, or in-flight
// deliveries beyond the first for members that do not report): an idle
// member counts 1, one with q service times queued 1/(1+q). What expires
// or overflows is dead-lettered into wq.<g>.dlx (x-consistent-hash,
// hashing message IDs), whose destinations are this site's intake queue
// luffymq.wqin.<g> with weight eq. 2.13 (MessagesInQueue = ready in wq.<g>
// and the intake plus our unacknowledged, eq. 2.14) and every other site
// whose wq.<g>.in exchange federates from it. A site binds its intake to
// its own wq.<g>.in with the same weight while it has online members;
// federation mirrors that binding onto the upstream's wq.<g>.dlx, so the
// upstream hashes overflow to each site in proportion to its spare
// capacity. Each rebinding stalls every link into the site for two round
// trips, so this weight moves only when it at least doubles or halves, or
// goes to or from 0 (intakeWeightMatters). Intake queues have no TTL and are never dead-lettered, so a
// message crosses sites at most once: no loop, no federation max-hops
// drop, no dead-letter cycle. Both hash exchanges have the local ring
// exchange as alternate exchange, so what the ring cannot route (while a
// weight is being replaced) stays local instead of being dropped. When
// local members keep up, nothing expires and nothing leaves the site.
//
// Site agent (with WorkQueueConfig.ManagementURL): the configuration agent
// applies each JSON message of luffymq.config.<site> (algorithms.md §2.6:
// entity -> [{"uri": ...}]) with ApplyFederation, a pubsub* entry
// federating that exchange and a wq.<g> entry federating wq.<g>.in from
// the upstreams' wq.<g>.dlx; the event agent watches amq.rabbitmq.event
// and gives every wq.<g> queue created by others its exchanges, intake
// queue and initial policy, removing them with the queue.
//
// Moves (reconfig.go): when a configuration removes an upstream (the
// exchange's sync site moved), the agent first adds the new links and
// waits until they run, then removes the old ones. Messages the removed
// link still held in its queue on the old upstream are not lost: the
// downstream asks the upstream's agent (luffymq.reconfig.conserve) to
// re-publish them into the exchange once the new links carry the old
// link's bindings, with their message IDs, so importers drop any copy
// that arrived both ways. FederationConfig.DiscardHeldOnMove
// (--federation-discard-held) deletes them instead, as the thesis did
// without conservation.
//
// # Several brokers at one site
//
// Several luffymq processes may serve one site, all bridged to the site's
// RabbitMQ node with the same Config.Site and each with its own
// Config.BrokerID (DefaultBrokerID when empty). Nothing else is shared
// between them; RabbitMQ does the rest:
//
//   - Pub/sub: each broker has its own import queue, bound for its own
//     subscriptions, and skips only what it published itself, so a publish
//     at one broker reaches the subscribers of every other broker of the
//     site through the site's exchange, once. The queue is durable with
//     x-expires (Config.QueueExpires) rather than exclusive or auto-delete:
//     it keeps what arrives while the bridge reconnects, and it is deleted
//     when the bridge closes; a broker that dies without closing leaves it
//     to expire. The first session of a process deletes a leftover queue
//     only if it has no consumer, and every session consumes it
//     exclusively: a second broker with the same ID is refused
//     (ImportQueueInUseError) instead of taking half of the other's
//     messages.
//   - Work queues: every broker takes wq.<g> and the intake queue with
//     basic.get at its own members' capacity, as above: they are competing
//     consumers of one queue, so a group whose members are spread over the
//     site's brokers is served as one group, each broker taking messages as
//     fast as its members finish them. A broker that stops (or loses its
//     connection) leaves its unacknowledged messages to RabbitMQ, which
//     requeues them for the others.
//   - Retune: the policy and the consistent-hash weights of wq.<g> are the
//     site's, so exactly one broker sets them from the sum of every
//     broker's capacity (eq. 2.12 with the site's Available and Online,
//     eq. 2.14 with every broker's unacknowledged messages). The owner is
//     the broker whose connection holds the exclusive queue
//     RetuneOwnerQueueName(g); each RetuneInterval the others publish their
//     share (online members, Available, unacknowledged, validity of three
//     retune intervals) to it, mandatory and confirmed. A share RabbitMQ
//     returns means nobody holds the queue: the sender then declares it,
//     and one declare wins (the others get RESOURCE_LOCKED and keep
//     sending). When the owner stops, RabbitMQ deletes the queue with its
//     connection and another broker takes over at its next turn, reading
//     the current weights back from the management API before changing
//     them, so that each ring exchange never gets a second binding; the
//     stopped broker's share expires from the sum. Letting every broker
//     retune from its own members instead would make the policy flap
//     between the brokers' values and corrupt the hash ring.
//   - Site agent: each broker's event agent has its own event queue. The
//     configuration queue has one active consumer, the first broker's
//     configuration agent (exclusive, so configurations apply one at a
//     time and in order); the others stand by, saying so once at INFO,
//     and look again every 250 ms to 2 s. When the active broker stops,
//     its consumer and unacknowledged message go back to RabbitMQ and a
//     standby agent takes over within about 2 s.
//
// A shared group that is not exported with ExportGroups gets pub/sub
// messages at each broker where it has members, as it does at each site.
//
// When RabbitMQ is unreachable the bridge logs one clear line, keeps
// retrying with backoff and keeps up to Config.OutboxSize messages to
// publish later; the MQTT side keeps serving local clients throughout.
package bridge

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	amqp "github.com/rabbitmq/amqp091-go"
)

// AMQP header names and the MQTT user property set on imported messages.
const (
	HeaderOrigin          = "x-luffymq-origin"
	HeaderBroker          = "x-luffymq-broker"
	HeaderQoS             = "x-mqtt-qos"
	HeaderRetain          = "x-mqtt-retain"
	HeaderUserProperties  = "x-mqtt-user"
	HeaderResponseTopic   = "x-mqtt-response-topic"
	HeaderCorrelationData = "x-mqtt-correlation-data"
	HeaderPayloadFormat   = "x-mqtt-payload-format"
	OriginUserProperty    = "luffymq-origin-site"
	// HeaderWorkGroups lists, on a pub/sub message, the exported groups
	// (names <g>) whose work queue wq.<g> the origin broker also gave the
	// message to: importers keep it from those groups' members, who get it
	// through the work queue.
	HeaderWorkGroups = "x-luffymq-work-groups"
)

// ImportQueueName returns the name of the import queue of one broker of a
// site: "luffymq.import.<site>.<broker-id>".
func ImportQueueName(site, brokerID string) string {
	return "luffymq.import." + site + "." + brokerID
}

// Binding is one binding of the import queue.
type Binding struct {
	// Exchange is the pub/sub exchange.
	Exchange string
	// Key is the AMQP binding key.
	Key string
}

// Bridge connects one site's Mochi server to its RabbitMQ node.
type Bridge struct {
	cfg       Config
	log       *slog.Logger
	exchanges []exchange
	queue     string
	bootID    string
	seq       atomic.Uint64

	server *mqtt.Server
	inline *mqtt.Client
	outbox *outbox
	dedup  *dedup
	dirty  chan struct{}
	stats  *stats

	groups   []*workGroup
	rh       *rabbithole.Client // management API, nil without WorkQueue.ManagementURL
	wqTrack  *wqTracker
	wqDone   *dedup // work-queue message IDs completed recently
	wakeMu   sync.Mutex
	wakeC    chan struct{} // closed and replaced by wake
	settles  chan settle
	wqGen    atomic.Uint64
	wqMu     sync.Mutex
	wqStates map[string]wqState

	// importMu makes pub/sub imports one at a time, so that importSkip,
	// set for the duration of one injection, belongs to it.
	importMu sync.Mutex
	// importSkip holds the exported groups the message being imported
	// must not reach (see skipQueuedGroups); nil outside an injection.
	importSkip atomic.Pointer[[]*workGroup]

	mu         sync.Mutex
	started    bool
	bound      map[Binding]struct{} // bindings that exist on the server
	connected  bool
	queueFresh bool // the import queue was recreated by this process
	cancel     context.CancelFunc
	done       chan struct{}
	closeOnce  sync.Once
}

// New validates cfg and returns a bridge. Nothing connects until Start.
func New(cfg Config) (*Bridge, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	b := &Bridge{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "bridge", "site", cfg.Site, "broker_id", cfg.BrokerID),
		exchanges: groupExports(cfg.Exports),
		queue:     ImportQueueName(cfg.Site, cfg.BrokerID),
		bootID:    randomHex(6),
		outbox:    newOutbox(cfg.OutboxSize),
		dedup:     newDedup(cfg.DedupWindow),
		dirty:     make(chan struct{}, 1),
		bound:     map[Binding]struct{}{},
	}
	for _, s := range cfg.ExportGroups {
		g, err := parseExportGroup(s)
		if err != nil {
			return nil, err
		}
		g.router = newGroupRouter(cfg.WorkQueue, cfg.Site, cfg.BrokerID)
		b.groups = append(b.groups, g)
	}
	b.wqTrack = newWQTracker()
	b.wqDone = newDedup(cfg.DedupWindow)
	b.wakeC = make(chan struct{})
	b.settles = make(chan settle, 4096)
	b.wqStates = map[string]wqState{}
	if cfg.WorkQueue.ManagementURL != "" {
		if b.rh, err = managementClient(cfg.WorkQueue.ManagementURL, cfg.WorkQueue.Username, cfg.WorkQueue.Password); err != nil {
			return nil, err
		}
	}
	b.stats = newStats(b)
	return b, nil
}

// Exchanges returns the pub/sub exchanges this site publishes to and
// imports from.
func (b *Bridge) Exchanges() []string {
	out := make([]string, len(b.exchanges))
	for i, x := range b.exchanges {
		out[i] = x.name
	}
	return out
}

// ImportQueue returns the name of this broker's import queue.
func (b *Bridge) ImportQueue() string { return b.queue }

// ExportsGroup reports whether share ($share/<group>/<filter>) is one of
// the groups this bridge serves as a work queue. Their members get
// messages only from the bridge, which puts back in RabbitMQ what a member
// leaves unacknowledged: the selection hook's re-dispatch must leave them
// alone (hooks.SelectionConfig.RequeuedElsewhere).
func (b *Bridge) ExportsGroup(share string) bool {
	for _, g := range b.groups {
		if g.share == share {
			return true
		}
	}
	return false
}

// Attach adds the bridge's hook to s, which must have been created with
// mqtt.Options{InlineClient: true}. Call it before s.Serve and, with
// export groups, before adding the selection hook; then add WakeHook after
// the selection hook, so the work-queue pull loops are woken once the
// selection engine has counted a member's acknowledgement.
func (b *Bridge) Attach(s *mqtt.Server) error {
	inline, ok := s.Clients.Get(mqtt.InlineClientId)
	if !ok || !s.Options.InlineClient {
		return errors.New("bridge: the Mochi server needs its inline client (mqtt.Options{InlineClient: true}) to inject remote messages")
	}
	b.server, b.inline = s, inline
	if err := s.AddHook(&hook{b: b}, nil); err != nil {
		return fmt.Errorf("bridge: adding hook: %w", err)
	}
	return nil
}

// Start connects to RabbitMQ in the background and returns at once: an
// unreachable RabbitMQ is logged and retried, never fatal.
func (b *Bridge) Start(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.server == nil {
		return errors.New("bridge: Start before Attach")
	}
	if b.started {
		return errors.New("bridge: already started")
	}
	b.started = true
	ctx, b.cancel = context.WithCancel(ctx)
	b.done = make(chan struct{})
	b.markDirty()
	go func() {
		defer close(b.done)
		b.run(ctx)
	}()
	b.log.Info("bridge starting", "amqp", redact(b.cfg.AMQPURL), "exchanges", b.Exchanges(), "import_queue", b.queue)
	return nil
}

// Close stops the bridge and closes its RabbitMQ connection. Messages not
// yet confirmed by RabbitMQ are lost.
func (b *Bridge) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		cancel, done := b.cancel, b.done
		b.mu.Unlock()
		if cancel != nil {
			cancel()
			<-done
		}
	})
	return nil
}

// Connected reports whether the bridge has a working RabbitMQ connection.
func (b *Bridge) Connected() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.connected
}

// Bindings returns the import queue's bindings, sorted.
func (b *Bridge) Bindings() []Binding {
	b.mu.Lock()
	out := make([]Binding, 0, len(b.bound))
	for k := range b.bound {
		out = append(out, k)
	}
	b.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Exchange != out[j].Exchange {
			return out[i].Exchange < out[j].Exchange
		}
		return out[i].Key < out[j].Key
	})
	return out
}

// markDirty asks for the bindings to be recomputed.
func (b *Bridge) markDirty() {
	select {
	case b.dirty <- struct{}{}:
	default:
	}
}

// export queues an MQTT publish for every exchange whose filters match it.
func (b *Bridge) export(cl *mqtt.Client, pk packets.Packet) {
	if pk.Ignore || strings.HasPrefix(pk.TopicName, "$") {
		return
	}
	if cl.Net.Inline && hasOriginProperty(pk.Properties.User) {
		return // imported from another site: never exported again
	}
	var queued []*workGroup
	if len(b.groups) > 0 {
		b.exportWork(pk)
		queued = b.matchGroups(pk.TopicName)
	}
	var pub *amqp.Publishing
	for _, x := range b.exchanges {
		matched := false
		for _, f := range x.filters {
			if MatchFilter(f, pk.TopicName) {
				matched = true
				break
			}
		}
		if !matched {
			continue
		}
		if pub == nil {
			pub = b.publishing(pk)
			if len(queued) > 0 {
				// The exported groups had it through their work
				// queues: importers must not give it to them again.
				names := make([]interface{}, len(queued))
				for i, g := range queued {
					names[i] = g.name
				}
				pub.Headers[HeaderWorkGroups] = names
			}
		}
		if !b.outbox.push(&outMsg{exchange: x.name, key: MQTTToAMQP(pk.TopicName), pub: *pub}) {
			b.stats.warnDropped(b.log)
		}
	}
}

func hasOriginProperty(props []packets.UserProperty) bool {
	for _, p := range props {
		if p.Key == OriginUserProperty {
			return true
		}
	}
	return false
}

// publishing builds the AMQP message for an MQTT publish.
func (b *Bridge) publishing(pk packets.Packet) *amqp.Publishing {
	h := amqp.Table{
		HeaderOrigin: b.cfg.Site,
		HeaderBroker: b.cfg.BrokerID,
		HeaderQoS:    int32(pk.FixedHeader.Qos),
		HeaderRetain: pk.FixedHeader.Retain,
	}
	if len(pk.Properties.User) > 0 {
		ups := make([]interface{}, len(pk.Properties.User))
		for i, u := range pk.Properties.User {
			ups[i] = []interface{}{u.Key, u.Val}
		}
		h[HeaderUserProperties] = ups
	}
	if pk.Properties.ResponseTopic != "" {
		h[HeaderResponseTopic] = pk.Properties.ResponseTopic
	}
	if len(pk.Properties.CorrelationData) > 0 {
		h[HeaderCorrelationData] = bytes.Clone(pk.Properties.CorrelationData)
	}
	if pk.Properties.PayloadFormatFlag {
		h[HeaderPayloadFormat] = int32(pk.Properties.PayloadFormat)
	}
	p := &amqp.Publishing{
		Headers:      h,
		ContentType:  pk.Properties.ContentType,
		DeliveryMode: amqp.Transient,
		MessageId:    b.cfg.Site + "-" + b.bootID + "-" + strconv.FormatUint(b.seq.Add(1), 10),
		Timestamp:    time.Now(),
		AppId:        "luffymq",
		Body:         bytes.Clone(pk.Payload),
	}
	if pk.FixedHeader.Qos > 0 {
		p.DeliveryMode = amqp.Persistent
	}
	if pk.Properties.MessageExpiryInterval > 0 {
		p.Expiration = strconv.FormatUint(uint64(pk.Properties.MessageExpiryInterval)*1000, 10)
	}
	return p
}

// inject delivers a message from the import queue to local subscribers.
// It reports what became of it for the counters.
func (b *Bridge) inject(d amqp.Delivery) importResult {
	if b.localAlready(d.Headers) {
		return importLocal
	}
	origin, _ := d.Headers[HeaderOrigin].(string)
	topic, err := AMQPToMQTT(d.RoutingKey)
	if err != nil || !validTopic(topic) {
		b.log.Debug("bridge: dropping message with unmappable routing key", "exchange", d.Exchange, "routing_key", d.RoutingKey)
		return importUnmappable
	}
	if b.dedup.seen(d.MessageId) {
		return importDuplicate
	}
	qos := byte(0)
	if d.DeliveryMode == amqp.Persistent {
		qos = 1
	}
	if v, ok := asInt(d.Headers[HeaderQoS]); ok && v >= 0 && v <= 2 {
		qos = byte(v)
	}
	retain, _ := d.Headers[HeaderRetain].(bool)
	if origin == "" || !mqttString(origin) {
		origin = "amqp"
	}
	props := propertiesFromHeaders(d, OriginUserProperty)
	props.User = append(props.User, packets.UserProperty{Key: OriginUserProperty, Val: origin})
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos, Retain: retain},
		TopicName:   topic,
		Payload:     d.Body,
		Properties:  props,
	}
	if qos > 0 {
		pk.PacketID = 1 // the inline client never acknowledges; Mochi only checks it is set
	}
	skip := b.queuedGroups(d.Headers)
	b.importMu.Lock()
	if len(skip) > 0 {
		b.importSkip.Store(&skip)
	}
	err = b.server.InjectPacket(b.inline, pk)
	b.importSkip.Store(nil)
	b.importMu.Unlock()
	if err != nil {
		b.log.Warn("bridge: injecting remote message failed", "topic", topic, "error", err)
		return importFailed
	}
	return importDelivered
}

// queuedGroups returns this broker's exported groups that the origin
// broker of a pub/sub message named in its HeaderWorkGroups: it gave the
// message to their work queues, through which they get it.
func (b *Bridge) queuedGroups(h amqp.Table) []*workGroup {
	names, _ := h[HeaderWorkGroups].([]interface{})
	var out []*workGroup
	for _, g := range b.groups {
		for _, n := range names {
			if s, _ := n.(string); s == g.name {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// skipQueuedGroups (OnSelectSubscribers, while a pub/sub message is
// imported) keeps the message from the exported groups that already had
// it through their work queues: at this site when another broker of the
// site published it, or at the origin site, whose work queue overflows to
// this one. Only the injection that set importSkip qualifies: an inline
// publish carrying the origin-site property that is not a work-queue
// message (imports are one at a time, under importMu).
func (b *Bridge) skipQueuedGroups(subs *mqtt.Subscribers, pk packets.Packet) *mqtt.Subscribers {
	skip := b.importSkip.Load()
	if skip == nil || pk.Origin != mqtt.InlineClientId || !hasOriginProperty(pk.Properties.User) {
		return subs
	}
	if id := userProperty(pk.Properties.User, MessageIDUserProperty); id != "" && b.wqTrack.get(id) != nil {
		return subs // a work-queue message, injected by another goroutine
	}
	for _, g := range *skip {
		delete(subs.Shared, g.share)
	}
	return subs
}

func asInt(v interface{}) (int64, bool) {
	switch n := v.(type) {
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case int16:
		return int64(n), true
	case int8:
		return int64(n), true
	case uint8:
		return int64(n), true
	case int:
		return int64(n), true
	}
	return 0, false
}

// desiredBindings computes the import queue's bindings from the local
// subscriptions.
func (b *Bridge) desiredBindings() map[Binding]struct{} {
	want := map[Binding]struct{}{}
	for id, cl := range b.server.Clients.GetAll() {
		if id == mqtt.InlineClientId {
			continue
		}
		for filter := range cl.State.Subscriptions.GetAll() {
			f := filter
			if mqtt.IsSharedFilter(f) {
				// $share/<group>/<filter>: the group wants each message once.
				parts := strings.SplitN(f, "/", 3)
				if len(parts) < 3 {
					continue
				}
				f = parts[2]
			}
			if f == "" || strings.HasPrefix(f, "$") {
				continue
			}
			for _, x := range b.exchanges {
				for _, e := range x.filters {
					if i, ok := IntersectFilters(f, e); ok {
						want[Binding{Exchange: x.name, Key: MQTTToAMQP(i)}] = struct{}{}
					}
				}
			}
		}
	}
	return want
}

func randomHex(n int) string {
	buf := make([]byte, n)
	_, _ = rand.Read(buf)
	return hex.EncodeToString(buf)
}

// hook feeds the bridge from Mochi events.
type hook struct {
	mqtt.HookBase
	b *Bridge
}

// ID identifies the hook to Mochi.
func (h *hook) ID() string { return "luffymq-bridge" }

// Provides tells Mochi which events the hook handles.
func (h *hook) Provides(e byte) bool {
	switch e {
	case mqtt.OnPublished, mqtt.OnSubscribed, mqtt.OnUnsubscribed, mqtt.OnSessionEstablished,
		mqtt.OnDisconnect, mqtt.OnClientExpired:
		return true
	case mqtt.OnPublish, mqtt.OnSelectSubscribers, mqtt.OnQosPublish, mqtt.OnQosComplete,
		mqtt.OnQosDropped, mqtt.OnPublishDropped, mqtt.OnPacketEncode:
		return len(h.b.groups) > 0
	}
	return false
}

// OnPublish refuses work-queue messages whose group has no subscriber.
func (h *hook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	return h.b.wqPublish(cl, pk)
}

// OnSelectSubscribers routes exported groups' messages through their work
// queues.
func (h *hook) OnSelectSubscribers(subs *mqtt.Subscribers, pk packets.Packet) *mqtt.Subscribers {
	return h.b.skipQueuedGroups(h.b.wqSelect(subs, pk), pk)
}

// OnQosPublish records which member carries a work-queue message.
func (h *hook) OnQosPublish(cl *mqtt.Client, pk packets.Packet, _ int64, resends int) {
	h.b.wqQosPublish(cl, pk, resends)
}

// OnQosComplete acknowledges a work-queue message to RabbitMQ.
func (h *hook) OnQosComplete(cl *mqtt.Client, pk packets.Packet) { h.b.wqComplete(cl, pk) }

// OnQosDropped requeues a work-queue message Mochi gave up on.
func (h *hook) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if pk.FixedHeader.Type == packets.Publish {
		h.b.finishPacket(cl.ID, pk.PacketID, false)
	}
}

// OnPublishDropped requeues a work-queue message Mochi could not queue.
func (h *hook) OnPublishDropped(_ *mqtt.Client, pk packets.Packet) { h.b.wqDropped(pk) }

// OnPacketEncode acknowledges a QoS 0 work-queue message once written.
func (h *hook) OnPacketEncode(_ *mqtt.Client, pk packets.Packet) packets.Packet {
	h.b.wqEncode(pk)
	return pk
}

// OnPublished exports a message once local subscribers have it.
func (h *hook) OnPublished(cl *mqtt.Client, pk packets.Packet) { h.b.export(cl, pk) }

// OnSubscribed updates the bindings.
func (h *hook) OnSubscribed(*mqtt.Client, packets.Packet, []byte) { h.b.markDirty() }

// OnUnsubscribed updates the bindings.
func (h *hook) OnUnsubscribed(*mqtt.Client, packets.Packet) { h.b.markDirty() }

// OnSessionEstablished updates the bindings (a resumed or replaced session).
func (h *hook) OnSessionEstablished(*mqtt.Client, packets.Packet) { h.b.markDirty() }

// OnDisconnect requeues the member's unacknowledged work-queue messages
// and updates the bindings when the session ends.
func (h *hook) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	if len(h.b.groups) > 0 {
		h.b.wqDisconnect(cl.ID)
	}
	if expire {
		h.b.markDirty()
	}
}

// OnClientExpired updates the bindings.
func (h *hook) OnClientExpired(*mqtt.Client) { h.b.markDirty() }
