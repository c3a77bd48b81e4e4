package clientsdk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/luffymq/luffymq/clientsdk/report"
)

// maxAnnouncedInterval bounds a credible report interval from CONNACK.
const maxAnnouncedInterval = time.Hour

// Subscriber is a member of an MQTT v5 shared subscription that processes
// messages with a Handler on a fixed number of workers and reports its load
// (pending messages, processing time) to the broker, so that a load-aware
// broker such as LuffyMQ can send each message to the member that will start
// it soonest. Against any other MQTT v5 broker it works as a plain shared
// subscriber.
//
// Received messages enter a bounded pending queue; workers take them in
// order. QoS 1 and 2 messages are acknowledged only when their handler has
// returned, so the broker's count of unacknowledged messages is the work
// really outstanding. A failing message is retried and then sent to a
// dead-letter topic. The Subscriber reconnects by itself.
type Subscriber struct {
	cfg    SubscriberConfig
	urls   []*url.URL
	log    *slog.Logger
	topics []string // $share/<group>/<filter>

	queue  chan *delivery
	load   *loadTracker
	pinger *reportPinger

	announcedInterval atomic.Int64 // report interval from the last CONNACK, ns; 0 if none

	runCtx  context.Context // handlers' context; cancelled when Close gives up
	abandon context.CancelFunc
	drain   chan struct{} // closed when Close has stopped new deliveries
	intake  chan struct{} // closed when Close stops accepting messages
	workers sync.WaitGroup

	mu         sync.Mutex
	state      subscriberState
	cm         *autopaho.ConnectionManager
	subscribed chan struct{} // closed on the first successful subscription
	subOnce    sync.Once
	subErr     chan error // the first subscription's failure

	received       atomic.Uint64
	receivedOnConn atomic.Uint64
	processed      atomic.Uint64
	failed         atomic.Uint64
	retries        atomic.Uint64
	deadLettered   atomic.Uint64
	dropped        atomic.Uint64
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
	pub    *paho.Publish
	client *paho.Client
}

// Stats is a snapshot of a Subscriber's counters.
type Stats struct {
	// Pending is the number of messages received but not yet taken by a
	// worker.
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
	urls, err := parseBrokerURLs(cfg.Brokers)
	if err != nil {
		return nil, err
	}
	s := &Subscriber{
		cfg:        cfg,
		urls:       urls,
		log:        cfg.Logger.With("client_id", cfg.ClientID, "group", cfg.Group),
		queue:      make(chan *delivery, cfg.QueueCapacity),
		load:       newLoadTracker(cfg.Workers),
		drain:      make(chan struct{}),
		intake:     make(chan struct{}),
		subscribed: make(chan struct{}),
		subErr:     make(chan error, 1),
	}
	for _, f := range cfg.Filters {
		s.topics = append(s.topics, "$share/"+cfg.Group+"/"+f)
	}
	s.runCtx, s.abandon = context.WithCancel(context.Background())
	s.pinger = newReportPinger(s, cfg.ReportVia, s.reportInterval, s.log)
	return s, nil
}

// Start connects to the broker, subscribes and starts the workers. It
// returns once the first subscription is acknowledged, or with an error if
// that fails or ctx ends first (the Subscriber is then closed). After Start
// the Subscriber runs, reconnecting as needed, until Close.
func (s *Subscriber) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.state != stateNew {
		s.mu.Unlock()
		return errors.New("subscriber: Start called twice or after Close")
	}
	s.state = stateStarted
	for i := range s.cfg.Workers {
		s.workers.Add(1)
		go s.work(i)
	}
	cm, err := autopaho.NewConnection(context.Background(), s.clientConfig())
	if err != nil {
		s.mu.Unlock()
		s.teardown()
		return fmt.Errorf("subscriber: connecting to %v: %w", s.cfg.Brokers, err)
	}
	s.cm = cm
	s.mu.Unlock()

	select {
	case <-s.subscribed:
		return nil
	case err := <-s.subErr:
		s.teardown()
		return err
	case <-ctx.Done():
		s.teardown()
		return fmt.Errorf("subscriber: connecting to %v and subscribing: %w", s.cfg.Brokers, ctx.Err())
	case <-s.runCtx.Done():
		return errors.New("subscriber: closed while starting")
	}
}

// Close stops taking new messages (it unsubscribes), lets the workers finish
// the messages already received, then disconnects. If ctx ends first, the
// handlers' context is cancelled and messages not yet finished are left
// unacknowledged, so the broker can deliver QoS 1/2 ones again; QoS 0 ones
// are lost and counted in Stats.Dropped. Close returns ctx's error then.
func (s *Subscriber) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.state != stateStarted {
		s.state = stateClosed
		s.mu.Unlock()
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
		if s.cfg.QoS > 0 {
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

// teardown abandons in-flight work and disconnects.
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
			s.discard(d)
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
}

// discard gives up on a received message without processing it: a QoS 1/2
// one stays unacknowledged for the broker to deliver again, a QoS 0 one is
// lost and counted.
func (s *Subscriber) discard(d *delivery) {
	if d.msg.QoS == 0 {
		s.dropped.Add(1)
	}
}

// Stats returns a snapshot of the Subscriber's counters.
func (s *Subscriber) Stats() Stats {
	mean, inFlight := s.load.meanProcessingTime()
	return Stats{
		Pending:            len(s.queue),
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
		ReportInterval:     s.reportInterval(),
	}
}

// reportInterval returns the report interval in force: the configured one,
// else the broker's, else DefaultReportInterval.
func (s *Subscriber) reportInterval() time.Duration {
	if s.cfg.ReportInterval > 0 {
		return s.cfg.ReportInterval
	}
	if d := time.Duration(s.announcedInterval.Load()); d > 0 {
		return d
	}
	return DefaultReportInterval
}

func (s *Subscriber) clientConfig() autopaho.ClientConfig {
	receiveMax := uint16(s.cfg.QueueCapacity)
	return autopaho.ClientConfig{
		ServerUrls:                    s.urls,
		TlsCfg:                        s.cfg.TLS,
		KeepAlive:                     s.cfg.keepAliveSeconds(),
		CleanStartOnInitialConnection: true,
		SessionExpiryInterval:         s.cfg.sessionExpirySeconds(),
		ReconnectBackoff:              reconnectBackoff(s.cfg.MaxReconnectWait),
		ConnectTimeout:                s.cfg.ConnectTimeout,
		ConnectUsername:               s.cfg.Username,
		ConnectPassword:               []byte(s.cfg.Password),
		OnConnectionUp:                s.onConnectionUp,
		OnConnectionDown: func() bool {
			s.log.Info("connection to broker lost; reconnecting")
			return true
		},
		OnConnectError: func(err error) {
			s.log.Warn("connection attempt failed", "error", err)
		},
		ConnectPacketBuilder: connectPacketBuilder(&receiveMax),
		ClientConfig: paho.ClientConfig{
			ClientID:                   s.cfg.ClientID,
			PingHandler:                s.pinger,
			OnPublishReceived:          []func(paho.PublishReceived) (bool, error){s.onPublish},
			EnableManualAcknowledgment: s.cfg.QoS > 0,
			SendAcksInterval:           s.cfg.AckFlushInterval,
			OnClientError: func(err error) {
				s.log.Debug("connection error", "error", err)
			},
			OnServerDisconnect: func(d *paho.Disconnect) {
				reason := ""
				if d.Properties != nil {
					reason = d.Properties.ReasonString
				}
				s.log.Info("broker disconnected the client", "reason_code", d.ReasonCode, "reason", reason)
			},
		},
	}
}

// onConnectionUp follows the broker's report interval and subscribes. It
// must not block.
func (s *Subscriber) onConnectionUp(cm *autopaho.ConnectionManager, ca *paho.Connack) {
	var announced time.Duration
	if ca.Properties != nil {
		if v := ca.Properties.User.Get(report.ReportIntervalProperty); v != "" {
			d, err := parseMillis(v)
			if err != nil {
				s.log.Warn("ignoring the broker's report interval", "property", report.ReportIntervalProperty, "value", v, "error", err)
			} else {
				announced = d
			}
		}
	}
	s.announcedInterval.Store(int64(announced))
	s.pinger.signal()
	s.log.Info("connected to broker", "report_interval", s.reportInterval(), "report_via", s.pinger.via())
	if s.pinger.closing.Load() {
		return
	}
	go s.subscribe(cm)
}

// subscribe subscribes on the current connection. A refusal is final and
// fails Start; other failures are retried while the connection is up (a new
// connection subscribes again anyway).
func (s *Subscriber) subscribe(cm *autopaho.ConnectionManager) {
	sub := &paho.Subscribe{}
	for _, t := range s.topics {
		sub.Subscriptions = append(sub.Subscriptions, paho.SubscribeOptions{Topic: t, QoS: s.cfg.QoS})
	}
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(s.runCtx, s.cfg.ConnectTimeout)
		suback, err := cm.Subscribe(ctx, sub)
		cancel()
		if suback != nil {
			for i, code := range suback.Reasons {
				if code >= 0x80 && i < len(s.topics) {
					err := fmt.Errorf("subscriber: broker refused subscription %q: reason code 0x%02x", s.topics[i], code)
					s.log.Error("subscription refused", "error", err)
					select {
					case s.subErr <- err:
					default:
					}
					return
				}
			}
		}
		if err == nil {
			s.subOnce.Do(func() { close(s.subscribed) })
			s.log.Debug("subscribed", "topics", s.topics, "qos", s.cfg.QoS)
			return
		}
		if errors.Is(err, autopaho.ConnectionDownError) || s.runCtx.Err() != nil {
			return
		}
		s.log.Warn("subscription not confirmed; retrying", "topics", s.topics, "attempt", attempt, "error", err)
		t := time.NewTimer(retryDelay(100*time.Millisecond, s.cfg.MaxReconnectWait, attempt))
		select {
		case <-t.C:
		case <-s.runCtx.Done():
			t.Stop()
			return
		}
	}
}

// onPublish puts a received message in the pending queue. When the queue is
// full it blocks, which stops paho reading the connection: back-pressure.
func (s *Subscriber) onPublish(pr paho.PublishReceived) (bool, error) {
	d := &delivery{msg: messageFromPublish(pr.Packet, time.Now()), pub: pr.Packet, client: pr.Client}
	s.received.Add(1)
	s.receivedOnConn.Add(1)
	select {
	case <-s.intake:
		s.discard(d)
		return true, nil
	default:
	}
	select {
	case s.queue <- d:
	default:
		s.log.Debug("pending queue full; reading paused", "capacity", cap(s.queue))
		s.pinger.pauseReading()
		select {
		case s.queue <- d:
			s.pinger.resumeReading()
		case <-s.intake:
			s.pinger.resumeReading()
			s.discard(d)
			return true, nil
		}
	}
	s.pinger.notePending(len(s.queue))
	return true, nil
}

func messageFromPublish(p *paho.Publish, now time.Time) *Message {
	m := &Message{
		Topic:      p.Topic,
		Payload:    p.Payload,
		QoS:        p.QoS,
		Retain:     p.Retain,
		Duplicate:  p.Duplicate(),
		PacketID:   p.PacketID,
		ReceivedAt: now,
	}
	if p.Properties != nil {
		m.ContentType = p.Properties.ContentType
		m.ResponseTopic = p.Properties.ResponseTopic
		m.CorrelationData = p.Properties.CorrelationData
		if len(p.Properties.User) > 0 {
			m.UserProperties = make([]UserProperty, len(p.Properties.User))
			for i, u := range p.Properties.User {
				m.UserProperties[i] = UserProperty{Key: u.Key, Value: u.Value}
			}
		}
	}
	m.ID, _ = m.UserProperty(MessageIDProperty)
	return m
}

// work is one worker: it takes messages from the pending queue until Close
// drains it or abandons work.
func (s *Subscriber) work(slot int) {
	defer s.workers.Done()
	for {
		select {
		case d := <-s.queue:
			s.pinger.notePending(len(s.queue))
			s.process(slot, d)
		case <-s.drain:
			for s.runCtx.Err() == nil {
				select {
				case d := <-s.queue:
					s.process(slot, d)
				default:
					return
				}
			}
			return
		case <-s.runCtx.Done():
			return
		}
	}
}

// process runs the handler on one message with retries, then acknowledges
// it or dead-letters it.
func (s *Subscriber) process(slot int, d *delivery) {
	var (
		firstFailure time.Time
		lastErr      error
		attempts     int
	)
	for attempts < s.cfg.MaxAttempts {
		if s.runCtx.Err() != nil {
			s.discard(d)
			return
		}
		attempts++
		d.msg.Attempt = attempts
		s.load.begin(slot, time.Now())
		err := s.callHandler(d.msg)
		end := time.Now()
		if n := s.load.end(slot, end); n&(n-1) == 0 && n <= warmupLimit {
			// Perhaps a first measurement, or enough new ones for a
			// warm-up report: let the schedule decide.
			s.pinger.signal()
		}
		if err == nil {
			s.processed.Add(1)
			s.ack(d)
			return
		}
		if s.runCtx.Err() != nil {
			s.discard(d)
			return
		}
		if firstFailure.IsZero() {
			firstFailure = end
		}
		lastErr = err
		s.log.Warn("handler failed", "topic", d.msg.Topic, "attempt", attempts, "of", s.cfg.MaxAttempts, "error", err)
		if attempts < s.cfg.MaxAttempts {
			s.retries.Add(1)
			t := time.NewTimer(retryDelay(s.cfg.RetryBackoff, s.cfg.MaxRetryBackoff, attempts))
			select {
			case <-t.C:
			case <-s.runCtx.Done():
			}
			t.Stop()
		}
	}
	s.failed.Add(1)
	if s.deadLetter(d, attempts, lastErr, firstFailure) {
		s.ack(d)
	}
}

func (s *Subscriber) callHandler(m *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return s.cfg.Handler(s.runCtx, m)
}

// ack acknowledges a QoS 1/2 message on the connection it came from. If that
// connection is gone the broker delivers the message again.
func (s *Subscriber) ack(d *delivery) {
	if d.pub.QoS == 0 || s.runCtx.Err() != nil {
		return
	}
	select {
	case <-d.client.Done():
		s.log.Debug("connection closed before acknowledgement; the broker will deliver again", "topic", d.msg.Topic)
		return
	default:
	}
	if err := d.client.Ack(d.pub); err != nil {
		s.log.Debug("acknowledgement not sent; the broker will deliver again", "topic", d.msg.Topic, "error", err)
	}
}

// deadLetter publishes a failed message to the dead-letter topic and says
// whether it was accepted.
func (s *Subscriber) deadLetter(d *delivery, attempts int, lastErr error, firstFailure time.Time) bool {
	pub := &paho.Publish{
		Topic:   s.cfg.DeadLetterTopic,
		QoS:     1,
		Payload: d.msg.Payload,
		Properties: &paho.PublishProperties{
			ContentType:     d.msg.ContentType,
			ResponseTopic:   d.msg.ResponseTopic,
			CorrelationData: d.msg.CorrelationData,
			User:            toPahoUser(deadLetterProperties(d.msg, attempts, lastErr, firstFailure)),
		},
	}
	ctx, cancel := context.WithTimeout(s.runCtx, 2*s.cfg.ConnectTimeout)
	defer cancel()
	s.mu.Lock()
	cm := s.cm
	s.mu.Unlock()
	var err error
	for try := 0; try < 3 && ctx.Err() == nil; try++ {
		if err = cm.AwaitConnection(ctx); err != nil {
			break
		}
		if _, err = cm.Publish(ctx, pub); err == nil {
			s.deadLettered.Add(1)
			s.log.Warn("message dead-lettered", "topic", d.msg.Topic, "dead_letter_topic", s.cfg.DeadLetterTopic, "attempts", attempts)
			return true
		}
		if !errors.Is(err, autopaho.ConnectionDownError) {
			break
		}
	}
	s.log.Error("dead-lettering failed; message left unacknowledged", "topic", d.msg.Topic,
		"dead_letter_topic", s.cfg.DeadLetterTopic, "error", err)
	return false
}

// loadSignal implements reportSource.
func (s *Subscriber) loadSignal() loadSignal {
	finished, known := s.load.signal()
	return loadSignal{pending: len(s.queue), finishedSinceReport: finished, meanKnown: known}
}

// takeReport implements reportSource.
func (s *Subscriber) takeReport(now time.Time) report.Report {
	pending := len(s.queue)
	snap := s.load.take(now, pending)
	return report.Report{
		Pending:        pending,
		ProcessingTime: snap.processingTime,
		Processed:      snap.processed,
		Workers:        s.cfg.Workers,
		InProgress:     snap.inFlight,
		Backlog:        snap.backlog,
		HasBacklog:     snap.backlogKnown,
		Received:       s.receivedOnConn.Load(),
		HasReceived:    true,
	}
}

// connectionStarted implements reportSource.
func (s *Subscriber) connectionStarted() {
	s.receivedOnConn.Store(0)
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
