package sites

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// sitesPayloadBytes is the size of every message of set C.
const sitesPayloadBytes = 256

// probeBit marks a warm-up message, which is not measured.
const probeBit = uint64(1) << 63

// sitesMsgID numbers a message: the probe bit, the publishing client (bits
// 32–62) and its sequence number (bits 0–31).
func sitesMsgID(probe bool, client, seq int) uint64 {
	id := uint64(client)<<32 | uint64(uint32(seq))
	if probe {
		id |= probeBit
	}
	return id
}

// sitesMsgClient returns the publishing client of a message ID.
func sitesMsgClient(id uint64) int { return int(id &^ probeBit >> 32) }

// encodeSitesPayload returns a payload of sitesPayloadBytes carrying id and
// the send time.
func encodeSitesPayload(id uint64, sent time.Time) []byte {
	b := make([]byte, sitesPayloadBytes)
	binary.BigEndian.PutUint64(b[0:8], id)
	binary.BigEndian.PutUint64(b[8:16], uint64(sent.UnixNano()))
	for i := 16; i < len(b); i++ {
		b[i] = 'x'
	}
	return b
}

// decodeSitesPayload reads what encodeSitesPayload wrote.
func decodeSitesPayload(b []byte) (id uint64, sent time.Time, ok bool) {
	if len(b) < 16 {
		return 0, time.Time{}, false
	}
	return binary.BigEndian.Uint64(b[0:8]), time.Unix(0, int64(binary.BigEndian.Uint64(b[8:16]))), true
}

// receipt is one delivery of a measured message to a receiver
// (subscriber, or work-queue consumer at the start of processing).
type receipt struct {
	ID       uint64
	Receiver int
	Sent, At time.Time
}

// sitesRecorder collects what every receiver of a run got.
type sitesRecorder struct {
	mu       sync.Mutex
	receipts []receipt
	probes   map[[2]int]bool // (receiver, publishing client) → a probe arrived
	last     time.Time       // latest measured receipt
}

func newSitesRecorder() *sitesRecorder { return &sitesRecorder{probes: map[[2]int]bool{}} }

// record notes that receiver got payload at at.
func (r *sitesRecorder) record(receiver int, payload []byte, at time.Time) {
	id, sent, ok := decodeSitesPayload(payload)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if id&probeBit != 0 {
		r.probes[[2]int{receiver, sitesMsgClient(id)}] = true
		return
	}
	r.receipts = append(r.receipts, receipt{ID: id, Receiver: receiver, Sent: sent, At: at})
	r.last = at
}

// probed reports whether receiver got a probe from client.
func (r *sitesRecorder) probed(receiver, client int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.probes[[2]int{receiver, client}]
}

// anyProbeFrom reports whether any receiver got a probe from client.
func (r *sitesRecorder) anyProbeFrom(client int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.probes {
		if k[1] == client {
			return true
		}
	}
	return false
}

// progress returns the number of measured receipts and the time of the
// latest.
func (r *sitesRecorder) progress() (int, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.receipts), r.last
}

// snapshot returns a copy of the measured receipts.
func (r *sitesRecorder) snapshot() []receipt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]receipt(nil), r.receipts...)
}

// publishLedger records which measured messages their broker accepted
// (MQTT PUBACK, AMQP confirm) and which failed.
type publishLedger struct {
	mu       sync.Mutex
	accepted map[uint64]bool
	failed   int
	lastErr  error
	wg       sync.WaitGroup
}

func newPublishLedger() *publishLedger { return &publishLedger{accepted: map[uint64]bool{}} }

func (l *publishLedger) settle(id uint64, err error) {
	if id&probeBit != 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.failed++
		l.lastErr = err
		return
	}
	l.accepted[id] = true
}

// wait waits up to timeout for every outstanding publish to settle; it
// reports whether all did.
func (l *publishLedger) wait(timeout time.Duration) bool {
	return harness.Within(timeout, l.wg.Wait)
}

func (l *publishLedger) result() (accepted map[uint64]bool, failed int, lastErr error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[uint64]bool, len(l.accepted))
	for k, v := range l.accepted {
		out[k] = v
	}
	return out, l.failed, l.lastErr
}

// sitesPublisher sends messages without waiting for the broker's answer;
// the ledger learns the outcome.
type sitesPublisher interface {
	// Publish sends message id now on the publisher's topic or routing
	// key.
	Publish(ctx context.Context, id uint64)
	Close()
}

// mqttPublisher publishes QoS 1 to one topic, up to maxInFlight at once.
type mqttPublisher struct {
	c      *paho.Client
	conn   net.Conn
	topic  string
	ledger *publishLedger
	sem    chan struct{}
}

const mqttPublisherInFlight = 256

func dialMQTTPublisher(ctx context.Context, addr, id, topic string, ledger *publishLedger) (*mqttPublisher, error) {
	c, conn, _, err := harness.DialPaho(ctx, addr, id, 30, paho.ClientConfig{})
	if err != nil {
		return nil, err
	}
	return &mqttPublisher{c: c, conn: conn, topic: topic, ledger: ledger, sem: make(chan struct{}, mqttPublisherInFlight)}, nil
}

func (p *mqttPublisher) Publish(ctx context.Context, id uint64) {
	payload := encodeSitesPayload(id, time.Now())
	select {
	case p.sem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	p.ledger.wg.Add(1)
	go func() {
		defer p.ledger.wg.Done()
		defer func() { <-p.sem }()
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		res, err := p.c.Publish(pctx, &paho.Publish{Topic: p.topic, QoS: 1, Payload: payload})
		if err == nil && res != nil && res.ReasonCode >= 0x80 {
			err = fmt.Errorf("PUBACK reason code 0x%02x", res.ReasonCode)
		}
		p.ledger.settle(id, err)
	}()
}

func (p *mqttPublisher) Close() {
	_ = harness.Within(2*time.Second, func() { _ = p.c.Disconnect(&paho.Disconnect{}) })
	_ = p.conn.Close()
}

// amqpPublisher publishes persistent messages with publisher confirms.
type amqpPublisher struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	exchange string
	key      string
	ledger   *publishLedger
	mu       sync.Mutex
}

func dialAMQPPublisher(url, exchange, key string, ledger *publishLedger) (*amqpPublisher, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{Heartbeat: 10 * time.Second, Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return nil, fmt.Errorf("AMQP %s: %w", redactURL(url), err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("AMQP channel: %w", err)
	}
	return &amqpPublisher{conn: conn, ch: ch, exchange: exchange, key: key, ledger: ledger}, nil
}

func (p *amqpPublisher) Publish(ctx context.Context, id uint64) {
	p.mu.Lock()
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, p.exchange, p.key, false, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: encodeSitesPayload(id, time.Now())})
	p.mu.Unlock()
	if err != nil {
		p.ledger.settle(id, err)
		return
	}
	p.ledger.wg.Add(1)
	go func() {
		defer p.ledger.wg.Done()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		ok, err := dc.WaitContext(wctx)
		if err == nil && !ok {
			err = errors.New("nacked by RabbitMQ")
		}
		p.ledger.settle(id, err)
	}()
}

func (p *amqpPublisher) Close() { _ = p.conn.Close() }

// sitesReceiver is a subscriber or a work-queue consumer.
type sitesReceiver interface{ Close() }

// mqttReceiver subscribes to a filter; with service > 0 it is a work-queue
// member that processes one message at a time (recording the start of
// processing) and acknowledges after processing.
type mqttReceiver struct {
	c      *paho.Client
	conn   net.Conn
	closed atomic.Bool
}

func dialMQTTReceiver(ctx context.Context, addr, id, filter string, index int, service, ackInterval time.Duration, rec *sitesRecorder) (*mqttReceiver, error) {
	r := &mqttReceiver{}
	var client atomic.Pointer[paho.Client]
	cc := paho.ClientConfig{
		EnableManualAcknowledgment: service > 0,
		SendAcksInterval:           ackInterval,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			rec.record(index, pr.Packet.Payload, time.Now())
			if service > 0 {
				time.Sleep(service) // one message at a time: paho hands over the next one afterwards
				if c := client.Load(); c != nil && !r.closed.Load() {
					_ = c.Ack(pr.Packet)
				}
			}
			return true, nil
		}},
	}
	c, conn, _, err := harness.DialPaho(ctx, addr, id, 30, cc)
	if err != nil {
		return nil, err
	}
	client.Store(c)
	r.c, r.conn = c, conn
	if err := harness.Subscribe(ctx, c, filter, 1); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return r, nil
}

func (r *mqttReceiver) Close() {
	r.closed.Store(true)
	_ = harness.Within(2*time.Second, func() { _ = r.c.Disconnect(&paho.Disconnect{}) })
	_ = r.conn.Close()
}

// amqpReceiver consumes a queue: with service > 0 a work-queue consumer
// with prefetch 1 that acknowledges after processing, otherwise an
// auto-acknowledging subscriber of its own exclusive queue bound to an
// exchange.
type amqpReceiver struct {
	conn *amqp.Connection
	done chan struct{}
}

// dialAMQPReceiver connects to url. With exchange set it declares an
// exclusive queue bound to it with key "#"; otherwise it consumes queue.
func dialAMQPReceiver(url, exchange, queue string, index int, service time.Duration, rec *sitesRecorder) (*amqpReceiver, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{Heartbeat: 10 * time.Second, Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return nil, fmt.Errorf("AMQP %s: %w", redactURL(url), err)
	}
	fail := func(err error) (*amqpReceiver, error) {
		_ = conn.Close()
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fail(err)
	}
	if exchange != "" {
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			return fail(fmt.Errorf("declaring subscriber queue: %w", err))
		}
		if err := ch.QueueBind(q.Name, "#", exchange, false, nil); err != nil {
			return fail(fmt.Errorf("binding to %s: %w", exchange, err))
		}
		queue = q.Name
	} else if err := ch.Qos(1, 0, false); err != nil {
		return fail(err)
	}
	deliveries, err := ch.Consume(queue, "", service == 0, false, false, false, nil)
	if err != nil {
		return fail(fmt.Errorf("consuming %s: %w", queue, err))
	}
	r := &amqpReceiver{conn: conn, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for d := range deliveries {
			rec.record(index, d.Body, time.Now())
			if service > 0 {
				time.Sleep(service)
				_ = d.Ack(false)
			}
		}
	}()
	return r, nil
}

func (r *amqpReceiver) Close() {
	_ = r.conn.Close()
	<-r.done
}

// redactURL hides the password of an AMQP URL.
func redactURL(u string) string {
	for i := len("amqp://"); i < len(u); i++ {
		if u[i] == '@' {
			return "amqp://…@" + u[i+1:]
		}
	}
	return u
}

// declareAMQP declares durable queues and topic exchanges on the node at
// url.
func declareAMQP(url string, queues, exchanges []string) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	for _, q := range queues {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declaring queue %s: %w", q, err)
		}
	}
	for _, x := range exchanges {
		if err := ch.ExchangeDeclare(x, "topic", true, false, false, false, nil); err != nil {
			return fmt.Errorf("declaring exchange %s: %w", x, err)
		}
	}
	return nil
}

// publishToQueue publishes body to queue (declared durable) on the node at
// url.
func publishToQueue(ctx context.Context, url, queue string, body []byte) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		return err
	}
	return ch.PublishWithContext(ctx, "", queue, false, false, amqp.Publishing{ContentType: "application/json", Body: body})
}
