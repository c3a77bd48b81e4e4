package clientsdk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
)

// maxAnnouncedInterval bounds a credible report interval from CONNACK.
const maxAnnouncedInterval = time.Hour

// maxSubscriptionID is the largest MQTT v5 Subscription Identifier. The
// Subscriber identifies group i's subscriptions by maxSubscriptionID − i,
// far from the small numbers applications pick for their own.
const maxSubscriptionID = 268_435_455

// Subscriber is a member of MQTT v5 shared subscriptions that processes
// messages with a Handler on a fixed number of workers and reports its load
// (pending messages, processing time) to the broker, so that a load-aware
// broker such as LuffyMQ can send each message to the member that will start
// it soonest. Against any other MQTT v5 broker it works as a plain shared
// subscriber.
//
// It joins one shared group or several (SubscriberConfig.Groups) on one
// connection, configured by ConnectionConfig or by an existing
// autopaho.ClientConfig (SubscriberConfig.Autopaho). Received messages enter
// a bounded pending queue; workers take them in order. QoS 1 and 2 messages
// are acknowledged only when their handler has returned, so the broker's
// count of unacknowledged messages is the work really outstanding. A failing
// message is retried and then sent to a dead-letter topic. The Subscriber
// reconnects by itself; Done and Err tell when it has stopped for good.
type Subscriber struct {
	cfg    SubscriberConfig
	urls   []*url.URL
	log    *slog.Logger
	groups []*subscriberGroup
	topics []string // every group's $share/<group>/<filter>

	queue chan *delivery
	// waiting counts the messages received and not yet begun: from before
	// they enter queue until their first handler call has begun (or they
	// are discarded). A message is thus always waiting or in progress,
	// never neither, so a load report cannot show an idle member while a
	// worker is between taking a message and starting it.
	waiting  atomic.Int64
	reporter *LoadReporter
	pinger   *reportPinger // reporter's

	runCtx  context.Context // handlers' context; cancelled when Close gives up
	abandon context.CancelFunc
	drain   chan struct{} // closed when Close has stopped new deliveries
	intake  chan struct{} // closed when Close stops accepting messages
	workers sync.WaitGroup

	mu         sync.Mutex
	state      subscriberState
	cm         *autopaho.ConnectionManager
	subscribed chan struct{} // closed when every group was first subscribed
	subOnce    sync.Once
	// firstUp is closed when the first connection's OnConnectionUp
	// callbacks (the Subscriber's and the application's) have returned.
	firstUp     chan struct{}
	firstUpOnce sync.Once
	failure     error         // why the Subscriber stopped for good; nil if it did not
	stopped     chan struct{} // closed when the Subscriber has stopped
	stopOnce    sync.Once

	received     atomic.Uint64
	processed    atomic.Uint64
	failed       atomic.Uint64
	retries      atomic.Uint64
	deadLettered atomic.Uint64
	dropped      atomic.Uint64
}

// subscriberGroup is one joined group.
type subscriberGroup struct {
	GroupSubscription
	topics         []string // $share/<group>/<filter>
	subscriptionID int
}

// matches says whether topic matches one of the group's filters.
func (g *subscriberGroup) matches(topic string) bool {
	for _, f := range g.Filters {
		if topicMatches(f, topic) {
			return true
		}
	}
	return false
}

type subscriberState int

const (
	stateNew subscriberState = iota
	stateStarted
	stateClosed
)

// delivery is a received message with what is needed to acknowledge it.
type delivery struct {
	msg    *Message
	group  *subscriberGroup
	pub    *paho.Publish
	client *paho.Client
}

// Stats is a snapshot of a Subscriber's counters.
type Stats struct {
	// Pending is the number of messages received and not yet started by a
	// worker (one whose hand-over to a full queue blocks counts too).
	Pending int
	// InFlight is the number of handlers running now.
	InFlight int
	// Received counts messages received since Start.
	Received uint64
	// Processed counts messages whose handler succeeded.
	Processed uint64
	// Failed counts messages whose every attempt failed.
	Failed uint64
	// Retries counts handler calls after a failed one.
	Retries uint64
	// DeadLettered counts failed messages published to the dead-letter
	// topic.
	DeadLettered uint64
	// Dropped counts QoS 0 messages discarded because Close gave up before
	// they were processed.
	Dropped uint64
	// MeanProcessingTime is the running mean handler duration.
	MeanProcessingTime time.Duration
	// ReportsSent counts load reports sent.
	ReportsSent uint64
	// ReportVia is the report channel in use (it becomes ReportViaPublish
	// after a fallback).
	ReportVia ReportChannel
	// ReportInterval is the report interval in force.
	ReportInterval time.Duration
}

// NewSubscriber validates cfg and returns a Subscriber; Start connects it.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var urls []*url.URL
	if cfg.Autopaho == nil {
		if urls, err = parseBrokerURLs(cfg.Brokers); err != nil {
			return nil, err
		}
	}
	logArgs := []any{"client_id", cfg.ClientID}
	if len(cfg.groups) == 1 {
		logArgs = append(logArgs, "group", cfg.groups[0].Group)
	}
	s := &Subscriber{
		cfg:        cfg,
		urls:       urls,
		log:        cfg.Logger.With(logArgs...),
		queue:      make(chan *delivery, cfg.QueueCapacity),
		drain:      make(chan struct{}),
		intake:     make(chan struct{}),
		subscribed: make(chan struct{}),
		firstUp:    make(chan struct{}),
		stopped:    make(chan struct{}),
	}
	for i, gs := range cfg.groups {
		g := &subscriberGroup{GroupSubscription: gs, subscriptionID: maxSubscriptionID - i}
		for _, f := range gs.Filters {
			g.topics = append(g.topics, "$share/"+gs.Group+"/"+f)
		}
		s.groups = append(s.groups, g)
		s.topics = append(s.topics, g.topics...)
	}
	s.reporter, err = NewLoadReporter(LoadReporterConfig{
		Workers:        cfg.Workers,
		Pending:        s.pendingCount,
		ReportVia:      cfg.ReportVia,
		ReportInterval: cfg.ReportInterval,
		Logger:         s.log,
	})
	if err != nil {
		return nil, fmt.Errorf("subscriber config: %w", err)
	}
	s.reporter.receivedCounted.Store(true)
	s.pinger = s.reporter.pinger
	s.runCtx, s.abandon = context.WithCancel(context.Background())
	return s, nil
}

// Start connects to the broker, subscribes and starts the workers. It
// returns once every group's subscription is acknowledged and the
// application's OnConnectionUp (if any) has returned for the first
// connection, or with an error if that fails or ctx ends first (the
// Subscriber is then closed). After
// Start the Subscriber runs, reconnecting as needed, until Close or a
// permanent failure (see Done).
func (s *Subscriber) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.state != stateNew {
		s.mu.Unlock()
		return errors.New("subscriber: Start called twice or after Close")
	}
	s.state = stateStarted
	for range s.cfg.Workers {
		s.workers.Add(1)
		go s.work()
	}
	cm, err := autopaho.NewConnection(context.Background(), s.clientConfig())
	if err != nil {
		s.mu.Unlock()
		s.stop(fmt.Errorf("subscriber: connecting to %s: %w", s.servers(), err))
		return s.Err()
	}
	s.cm = cm
	s.mu.Unlock()
	go s.watch(cm)

	for _, ready := range []<-chan struct{}{s.subscribed, s.firstUp} {
		select {
		case <-ready:
		case <-s.stopped:
			if err := s.Err(); err != nil {
				return err
			}
			return errors.New("subscriber: closed while starting")
		case <-ctx.Done():
			s.stop(fmt.Errorf("subscriber: connecting to %s and subscribing: %w", s.servers(), ctx.Err()))
			return s.Err()
		}
	}
	return nil
}

// Done returns a channel that is closed when the Subscriber has stopped for
// good: Close or a failed Start stopped it, or a permanent failure did (the
// broker refused a group's subscription on a reconnection, or the
// application's OnConnectionDown declined to reconnect). Err says which.
func (s *Subscriber) Done() <-chan struct{} {
	return s.stopped
}

// Err returns why the Subscriber stopped: nil while it runs and after a
// Close, the error otherwise.
func (s *Subscriber) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failure
}

// ConnectionManager returns the Subscriber's autopaho connection manager
// (nil before Start), to publish on the same connection: Publish, or
// PublishViaQueue through the configured session queue. Subscriptions made
// through it are the application's: their messages go to its own
// OnPublishReceived handlers.
func (s *Subscriber) ConnectionManager() *autopaho.ConnectionManager {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cm
}

// Close stops taking new messages (it unsubscribes), lets the workers finish
// the messages already received, then disconnects. If ctx ends first, the
// handlers' context is cancelled and messages not yet finished are left
// unacknowledged, so the broker can deliver QoS 1/2 ones again; QoS 0 ones
// are lost and counted in Stats.Dropped. Close returns ctx's error then.
// After the Subscriber stopped by itself, Close returns nil (Err says why it
// stopped).
func (s *Subscriber) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.state != stateStarted {
		neverStarted := s.state == stateNew
		s.state = stateClosed
		s.mu.Unlock()
		if neverStarted {
			s.stopOnce.Do(func() { close(s.stopped) })
		}
		return nil
	}
	s.state = stateClosed
	cm := s.cm
	s.mu.Unlock()
	s.pinger.closing.Store(true)

	// Stop new deliveries.
	uctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	if _, err := cm.Unsubscribe(uctx, &paho.Unsubscribe{Topics: s.topics}); err != nil {
		s.log.Debug("unsubscribe before close failed", "error", err)
	}
	cancel()

	// Finish what was received.
	close(s.drain)
	finished := make(chan struct{})
	go func() {
		s.workers.Wait()
		close(finished)
	}()
	var closeErr error
	select {
	case <-finished:
		if s.anyQoS() {
			// Acknowledgements leave on paho's flush tick; let the last go out.
			t := time.NewTimer(3 * s.cfg.AckFlushInterval)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
	case <-ctx.Done():
		closeErr = fmt.Errorf("subscriber: close: unfinished messages left unacknowledged: %w", ctx.Err())
	}
	s.teardown()
	return closeErr
}

// stop records err as the reason the Subscriber stops, unless it is already
// closing or stopped, and tears it down.
func (s *Subscriber) stop(err error) {
	s.mu.Lock()
	if s.state == stateClosed {
		s.mu.Unlock()
		return
	}
	s.failure = err
	s.state = stateClosed
	s.mu.Unlock()
	s.log.Error("subscriber stopped", "error", err)
	s.teardown()
}

// watch stops the Subscriber if its connection manager ends while the
// Subscriber runs (the application called Disconnect on it).
func (s *Subscriber) watch(cm *autopaho.ConnectionManager) {
	<-cm.Done()
	s.stop(errors.New("subscriber: the autopaho connection manager was stopped (Disconnect) while the Subscriber ran"))
}

// teardown abandons in-flight work and disconnects. It may run more than
// once, concurrently.
func (s *Subscriber) teardown() {
	s.pinger.closing.Store(true)
	s.abandon()
	s.mu.Lock()
	select {
	case <-s.intake:
	default:
		close(s.intake)
	}
	cm := s.cm
	s.state = stateClosed
	s.mu.Unlock()
	unprocessed := 0
drain:
	for {
		select {
		case d := <-s.queue:
			s.discardWaiting(d)
			unprocessed++
		default:
			break drain
		}
	}
	if unprocessed > 0 {
		s.log.Warn("received messages left unprocessed at close; QoS 1/2 ones will be delivered again, QoS 0 ones are lost",
			"count", unprocessed)
	}
	if cm != nil {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := cm.Disconnect(dctx); err != nil {
			s.log.Warn("disconnect did not complete", "error", err)
		}
		cancel()
	}
	s.stopOnce.Do(func() { close(s.stopped) })
}

// servers names the broker URLs for error messages.
func (s *Subscriber) servers() string {
	if s.cfg.Autopaho != nil {
		urls := s.cfg.Autopaho.ServerUrls
		if len(urls) == 0 {
			urls = s.cfg.Autopaho.BrokerUrls
		}
		return fmt.Sprint(urls)
	}
	return fmt.Sprint(s.cfg.Brokers)
}

// anyQoS says whether a group subscribes above QoS 0.
func (s *Subscriber) anyQoS() bool {
	for _, g := range s.groups {
		if g.QoS > 0 {
			return true
		}
	}
	return false
}

// discard gives up on a received message without processing it: a QoS 1/2
// one stays unacknowledged for the broker to deliver again, a QoS 0 one is
// lost and counted.
func (s *Subscriber) discard(d *delivery) {
	if d.msg.QoS == 0 {
		s.dropped.Add(1)
	}
}

// discardWaiting is discard for a message that was waiting (never begun).
func (s *Subscriber) discardWaiting(d *delivery) {
	s.waiting.Add(-1)
	s.discard(d)
}

// pendingCount is the pending count of load reports: the messages waiting.
func (s *Subscriber) pendingCount() int {
	return int(max(s.waiting.Load(), 0))
}

// Stats returns a snapshot of the Subscriber's counters.
func (s *Subscriber) Stats() Stats {
	mean, inFlight := s.reporter.load.meanProcessingTime()
	return Stats{
		Pending:            s.pendingCount(),
		InFlight:           inFlight,
		Received:           s.received.Load(),
		Processed:          s.processed.Load(),
		Failed:             s.failed.Load(),
		Retries:            s.retries.Load(),
		DeadLettered:       s.deadLettered.Load(),
		Dropped:            s.dropped.Load(),
		MeanProcessingTime: mean,
		ReportsSent:        s.pinger.reportsSent.Load(),
		ReportVia:          s.pinger.via(),
		ReportInterval:     s.reporter.ReportInterval(),
	}
}

// clientConfig returns the connection's configuration: the application's
// autopaho.ClientConfig, or one built from ConnectionConfig, with the
// Subscriber's pinger, handlers and callbacks added.
func (s *Subscriber) clientConfig() autopaho.ClientConfig {
	var cc autopaho.ClientConfig
	if s.cfg.Autopaho != nil {
		cc = *s.cfg.Autopaho
		cc.OnPublishReceived = slices.Clone(cc.OnPublishReceived)
	} else {
		cc = autopaho.ClientConfig{
			ServerUrls:                    s.urls,
			TlsCfg:                        s.cfg.TLS,
			KeepAlive:                     s.cfg.keepAliveSeconds(),
			CleanStartOnInitialConnection: true,
			SessionExpiryInterval:         s.cfg.sessionExpirySeconds(),
			ReconnectBackoff:              reconnectBackoff(s.cfg.MaxReconnectWait),
			ConnectTimeout:                s.cfg.ConnectTimeout,
			ConnectUsername:               s.cfg.Username,
			ConnectPassword:               []byte(s.cfg.Password),
		}
	}
	cc.ClientID = s.cfg.ClientID
	receiveMax := uint16(s.cfg.QueueCapacity)
	cc.ConnectPacketBuilder = chainConnectPacketBuilders(cc.ConnectPacketBuilder, connectPacketBuilder(&receiveMax))
	cc.PingHandler = s.pinger

	appUp, appDown, appConnectError := cc.OnConnectionUp, cc.OnConnectionDown, cc.OnConnectError
	cc.OnConnectionUp = func(cm *autopaho.ConnectionManager, ca *paho.Connack) {
		s.onConnectionUp(cm, ca)
		if appUp != nil {
			appUp(cm, ca)
		}
		s.firstUpOnce.Do(func() { close(s.firstUp) })
	}
	cc.OnConnectionDown = func() bool {
		if appDown != nil && !appDown() {
			s.log.Warn("connection to broker lost; OnConnectionDown declined to reconnect")
			// autopaho stops connecting but keeps running until
			// Disconnect, which must not be called from here.
			go s.stop(errors.New("subscriber: connection lost and OnConnectionDown declined to reconnect"))
			return false
		}
		s.log.Info("connection to broker lost; reconnecting")
		return true
	}
	cc.OnConnectError = func(err error) {
		s.log.Warn("connection attempt failed", "error", err)
		if appConnectError != nil {
			appConnectError(err)
		}
	}

	appAcks := cc.EnableManualAcknowledgment
	cc.EnableManualAcknowledgment = appAcks || s.anyQoS()
	cc.SendAcksInterval = s.cfg.AckFlushInterval
	handlers := append([]func(paho.PublishReceived) (bool, error){s.onPublish}, cc.OnPublishReceived...)
	if cc.EnableManualAcknowledgment && !appAcks {
		handlers = append(handlers, s.ackOthers)
	}
	cc.OnPublishReceived = handlers

	appClientError, appServerDisconnect := cc.OnClientError, cc.OnServerDisconnect
	cc.OnClientError = func(err error) {
		s.log.Debug("connection error", "error", err)
		if appClientError != nil {
			appClientError(err)
		}
	}
	cc.OnServerDisconnect = func(d *paho.Disconnect) {
		reason := ""
		if d.Properties != nil {
			reason = d.Properties.ReasonString
		}
		s.log.Info("broker disconnected the client", "reason_code", d.ReasonCode, "reason", reason)
		if appServerDisconnect != nil {
			appServerDisconnect(d)
		}
	}
	return cc
}

// onConnectionUp follows the broker's report interval and subscribes. It
// must not block.
func (s *Subscriber) onConnectionUp(cm *autopaho.ConnectionManager, ca *paho.Connack) {
	s.reporter.ConnectionUp(ca)
	s.log.Info("connected to broker", "report_interval", s.reporter.ReportInterval(), "report_via", s.pinger.via())
	if s.pinger.closing.Load() {
		return
	}
	subscriptionIDs := ca.Properties == nil || ca.Properties.SubIDAvailable
	go s.subscribe(cm, subscriptionIDs)
}

// subscribe subscribes every group on the current connection, each in its
// own SUBSCRIBE with the group's Subscription Identifier when the broker
// supports them. A refusal stops the Subscriber (Start fails if it is still
// waiting); other failures are retried while the connection is up (a new
// connection subscribes again anyway).
func (s *Subscriber) subscribe(cm *autopaho.ConnectionManager, subscriptionIDs bool) {
	for _, g := range s.groups {
		if !s.subscribeGroup(cm, g, subscriptionIDs) {
			return
		}
	}
	s.subOnce.Do(func() { close(s.subscribed) })
}

// subscribeGroup subscribes one group and says whether it succeeded.
func (s *Subscriber) subscribeGroup(cm *autopaho.ConnectionManager, g *subscriberGroup, subscriptionIDs bool) bool {
	sub := &paho.Subscribe{}
	if subscriptionIDs {
		id := g.subscriptionID
		sub.Properties = &paho.SubscribeProperties{SubscriptionIdentifier: &id}
	}
	for _, t := range g.topics {
		sub.Subscriptions = append(sub.Subscriptions, paho.SubscribeOptions{Topic: t, QoS: g.QoS})
	}
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(s.runCtx, s.cfg.ConnectTimeout)
		suback, err := cm.Subscribe(ctx, sub)
		cancel()
		if suback != nil {
			for i, code := range suback.Reasons {
				if code >= 0x80 && i < len(g.topics) {
					s.stop(fmt.Errorf("subscriber: broker refused subscription %q: reason code 0x%02x", g.topics[i], code))
					return false
				}
			}
		}
		if err == nil {
			s.log.Debug("subscribed", "topics", g.topics, "qos", g.QoS)
			return true
		}
		if errors.Is(err, autopaho.ConnectionDownError) || s.runCtx.Err() != nil {
			return false
		}
		s.log.Warn("subscription not confirmed; retrying", "topics", g.topics, "attempt", attempt, "error", err)
		t := time.NewTimer(retryDelay(100*time.Millisecond, s.cfg.MaxReconnectWait, attempt))
		select {
		case <-t.C:
		case <-s.runCtx.Done():
			t.Stop()
			return false
		}
	}
}

// groupOf returns the group a received message belongs to, or nil if it
// belongs to none (an application's own subscription). A message carrying
// Subscription Identifiers belongs to the group whose identifier it
// carries; without, to the first group with a matching filter.
func (s *Subscriber) groupOf(p *paho.Publish) *subscriberGroup {
	if p.Properties != nil && p.Properties.SubscriptionIdentifier != nil {
		i := maxSubscriptionID - *p.Properties.SubscriptionIdentifier
		if i >= 0 && i < len(s.groups) {
			return s.groups[i]
		}
		return nil
	}
	for _, g := range s.groups {
		if g.matches(p.Topic) {
			return g
		}
	}
	return nil
}

// parseMillis parses a positive number of milliseconds.
func parseMillis(v string) (time.Duration, error) {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, fmt.Errorf("not a number of milliseconds: %w", err)
	}
	d := time.Duration(f * float64(time.Millisecond))
	if d <= 0 || d > maxAnnouncedInterval {
		return 0, fmt.Errorf("%s is outside (0, %s]", d, maxAnnouncedInterval)
	}
	return d, nil
}

func toPahoUser(props []UserProperty) paho.UserProperties {
	u := make(paho.UserProperties, len(props))
	for i, p := range props {
		u[i] = paho.UserProperty{Key: p.Key, Value: p.Value}
	}
	return u
}
