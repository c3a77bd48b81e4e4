package shared

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/log"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/clientsdk/report"
)

// pahoMemberConfig configures a shared-subscription member written with
// plain paho.golang instead of the LuffyMQ SDK.
type pahoMemberConfig struct {
	Kind     string
	Addr     string
	ClientID string
	// Filter is the shared subscription, $share/<group>/<topic>.
	Filter string
	QoS    byte
	// ReportInterval is used when the broker announces none in its CONNACK.
	ReportInterval time.Duration
	// AckInterval is paho's SendAcksInterval for manual acknowledgements
	// (0: paho's default).
	AckInterval time.Duration
	Worker      *memberWorker
	Logger      *slog.Logger
}

// queuedMsg is a message waiting in a paho member's FIFO.
type queuedMsg struct {
	pub *paho.Publish
	at  time.Time // received
}

// pahoMember is a plain paho.golang client with its own FIFO and one
// drift-free worker. The reporter kinds send the thesis's two-key load
// report in extended PINGREQs; paho-qos1-ackafter sends no reports and
// acknowledges each QoS 1 message once it is processed.
type pahoMember struct {
	cfg    pahoMemberConfig
	queue  chan queuedMsg
	pinger *thesisPinger // nil: paho's default pinger, no reports

	ctx    context.Context
	cancel context.CancelFunc

	client     *paho.Client
	inService  atomic.Bool
	closing    atomic.Bool
	lost       atomic.Bool // the connection ended while not closing
	started    atomic.Bool // the worker runs
	workerDone chan struct{}

	loadMu  sync.Mutex
	procSum time.Duration // processing time finished since the last report
	procN   int
	done    uint64 // messages processed on this connection
}

func newPahoMember(cfg pahoMemberConfig) (*pahoMember, error) {
	m := &pahoMember{cfg: cfg, queue: make(chan queuedMsg, harness.PahoQueueCapacity), workerDone: make(chan struct{})}
	switch cfg.Kind {
	case KindThesisReporter:
		m.pinger = newThesisPinger(m.takeReport, true)
	case KindTimerReporter:
		m.pinger = newThesisPinger(m.takeReport, false)
	case KindReceiptReporter:
		m.pinger = newThesisPinger(m.takeReport, true)
	case KindPahoQoS1AckAfter:
	default:
		return nil, fmt.Errorf("subscriber kind %q is not a paho kind", cfg.Kind)
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	return m, nil
}

// takeReport returns the thesis's report now and starts a new report
// period: msgsInQueue is the number of messages waiting in the FIFO (not
// yet started), processingTimePerMsg the mean processing time of the
// messages finished since the previous report (0 if none).
func (m *pahoMember) takeReport() report.Report {
	m.loadMu.Lock()
	defer m.loadMu.Unlock()
	r := report.Report{Pending: len(m.queue)}
	if m.procN > 0 {
		r.ProcessingTime = m.procSum / time.Duration(m.procN)
	}
	m.procSum, m.procN = 0, 0
	return r
}

// processingTime is what the member reports as the processing time of a
// message that took service, was received at receivedAt and ended at end:
// its service, or for receipt-reporter the time since its receipt.
func (m *pahoMember) processingTime(service time.Duration, receivedAt, end time.Time) time.Duration {
	if m.cfg.Kind == KindReceiptReporter {
		return end.Sub(receivedAt)
	}
	return service
}

// finished books a processed message.
func (m *pahoMember) finished(d time.Duration) {
	m.loadMu.Lock()
	m.procSum += d
	m.procN++
	m.done++
	first := m.done == 1
	m.loadMu.Unlock()
	if first && m.pinger != nil {
		m.pinger.firstProcessed()
	}
}

func (m *pahoMember) onPublish(pr paho.PublishReceived) (bool, error) {
	select {
	case m.queue <- queuedMsg{pub: pr.Packet, at: time.Now()}:
	case <-m.ctx.Done():
	}
	return true, nil
}

func (m *pahoMember) work() {
	defer close(m.workerDone)
	for {
		select {
		case <-m.ctx.Done():
			return
		case q := <-m.queue:
			m.inService.Store(true)
			d, err := m.cfg.Worker.serve(m.ctx, q.pub.Payload, q.at)
			if err != nil {
				m.inService.Store(false)
				return
			}
			m.finished(m.processingTime(d, q.at, time.Now()))
			if q.pub.QoS > 0 {
				// Acknowledged only now that it is processed (paho sends
				// acknowledgements in arrival order, every SendAcksInterval).
				if err := m.client.Ack(q.pub); err != nil && !m.closing.Load() {
					m.cfg.Logger.Warn("ack failed", "error", err)
				}
			}
			m.inService.Store(false)
		}
	}
}

// Start connects, starts the worker and subscribes.
func (m *pahoMember) Start(ctx context.Context) error {
	cc := paho.ClientConfig{
		OnPublishReceived:          []func(paho.PublishReceived) (bool, error){m.onPublish},
		EnableManualAcknowledgment: m.cfg.QoS > 0,
		SendAcksInterval:           m.cfg.AckInterval,
		OnClientError: func(err error) {
			if !m.closing.Load() {
				m.cfg.Logger.Warn("connection error", "error", err)
			}
		},
	}
	if m.pinger != nil {
		cc.PingHandler = m.pinger
	}
	client, _, ca, err := harness.DialPaho(ctx, m.cfg.Addr, m.cfg.ClientID, 30, cc)
	if err != nil {
		return err
	}
	m.client = client
	if m.pinger != nil {
		iv := m.cfg.ReportInterval
		if ca.Properties != nil {
			if v := ca.Properties.User.Get(report.ReportIntervalProperty); v != "" {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
					iv = time.Duration(n) * time.Millisecond
				} else {
					m.cfg.Logger.Warn("ignoring the broker's report interval", "value", v)
				}
			}
		}
		m.pinger.start(iv)
	}
	go func() {
		<-client.Done()
		if !m.closing.Load() {
			m.lost.Store(true)
			m.cfg.Logger.Warn("connection to the broker ended")
		}
	}()
	m.started.Store(true)
	go m.work()
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sa, err := client.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: m.cfg.Filter, QoS: m.cfg.QoS}}})
	if err != nil {
		m.Close(ctx)
		return fmt.Errorf("subscribe %s: %w", m.cfg.Filter, err)
	}
	if len(sa.Reasons) > 0 && sa.Reasons[0] >= 0x80 {
		m.Close(ctx)
		return fmt.Errorf("subscribe %s: reason code 0x%02x", m.cfg.Filter, sa.Reasons[0])
	}
	return nil
}

// Busy reports whether messages are waiting or being processed.
func (m *pahoMember) Busy() bool {
	return !m.lost.Load() && (len(m.queue) > 0 || m.inService.Load())
}

// Stats returns the member's report channel and count.
func (m *pahoMember) Stats() memberStats {
	st := memberStats{ReportVia: "none", Lost: m.lost.Load()}
	if m.pinger != nil {
		st.ReportVia = "pingreq"
		st.ReportsSent = m.pinger.sent.Load()
	}
	return st
}

// Close stops the worker and disconnects.
func (m *pahoMember) Close(context.Context) {
	m.closing.Store(true)
	m.cancel()
	if m.started.Load() {
		<-m.workerDone
	}
	if m.client != nil {
		_ = m.client.Disconnect(&paho.Disconnect{})
	}
}

// Crash stops the member without a DISCONNECT (its connection was cut);
// its queue is lost. paho ends its own goroutines when it sees the
// connection closed.
func (m *pahoMember) Crash() {
	m.closing.Store(true)
	m.cancel()
}

// thesisPinger is a paho.Pinger that sends the thesis's load report —
// only msgsInQueue and processingTimePerMsg, built by clientsdk/report —
// as an extended PINGREQ every report interval and, when early is set,
// once right after the first processed message. Each report goes out in a
// single Write on the connection, which a *net.TCPConn never interleaves
// with paho's own writes. It sends plain PINGREQs only when keep-alive
// needs them (report intervals longer than ¾ of the keep-alive).
type thesisPinger struct {
	take  func() report.Report
	early bool

	interval  atomic.Int64  // report interval (ns), set by start
	ready     chan struct{} // closed by start
	readyOnce sync.Once
	first     chan struct{} // closed by firstProcessed
	firstOnce sync.Once
	sent      atomic.Uint64 // reports sent

	mu       sync.Mutex
	running  bool
	lastSent time.Time
	awaiting []time.Time // PINGREQs awaiting a PINGRESP, oldest first
	debug    log.Logger
}

var _ paho.Pinger = (*thesisPinger)(nil)

func newThesisPinger(take func() report.Report, early bool) *thesisPinger {
	return &thesisPinger{take: take, early: early, ready: make(chan struct{}), first: make(chan struct{}), debug: log.NOOPLogger{}}
}

// start sets the report interval and lets Run begin reporting.
func (p *thesisPinger) start(interval time.Duration) {
	p.interval.Store(int64(interval))
	p.readyOnce.Do(func() { close(p.ready) })
}

// firstProcessed signals the first processed message.
func (p *thesisPinger) firstProcessed() {
	p.firstOnce.Do(func() { close(p.first) })
}

// Run reports on conn until ctx ends. It returns an error when a write
// fails or a PINGRESP is overdue by a keep-alive period, which makes paho
// drop the connection.
func (p *thesisPinger) Run(ctx context.Context, conn net.Conn, keepAlive uint16) error {
	if conn == nil {
		return errors.New("thesis pinger: conn is nil")
	}
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return errors.New("thesis pinger: Run already in progress")
	}
	p.running = true
	p.lastSent = time.Now()
	p.awaiting = nil
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.running = false
		p.mu.Unlock()
	}()
	select {
	case <-ctx.Done():
		return nil
	case <-p.ready:
	}
	interval := time.Duration(p.interval.Load())
	keepAliveEvery := time.Duration(keepAlive) * time.Second
	next := time.Now().Add(interval)
	first := p.first
	if !p.early {
		first = nil // never fires
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		p.mu.Lock()
		lastSent := p.lastSent
		var oldest time.Time
		if len(p.awaiting) > 0 {
			oldest = p.awaiting[0]
		}
		p.mu.Unlock()
		if keepAliveEvery > 0 && !oldest.IsZero() && now.Sub(oldest) >= keepAliveEvery {
			return fmt.Errorf("PINGRESP not received within %s", keepAliveEvery)
		}
		if !now.Before(next) {
			if err := p.send(conn, true); err != nil {
				return err
			}
			if next = next.Add(interval); !next.After(now) {
				next = now.Add(interval)
			}
			continue
		}
		wake := next
		if keepAliveEvery > 0 {
			due := lastSent.Add(keepAliveEvery * 3 / 4)
			if !now.Before(due) {
				if err := p.send(conn, false); err != nil {
					return err
				}
				continue
			}
			wake = earlier(wake, due)
			if !oldest.IsZero() {
				wake = earlier(wake, oldest.Add(keepAliveEvery))
			}
		}
		timer.Reset(wake.Sub(now))
		select {
		case <-ctx.Done():
			return nil
		case <-first:
			first = nil
			if err := p.send(conn, true); err != nil {
				return err
			}
		case <-timer.C:
		}
	}
}

// send writes one PINGREQ: an extended one carrying the report, or a plain
// one (remaining length 0) for keep-alive.
func (p *thesisPinger) send(conn net.Conn, withReport bool) error {
	pkt := []byte{report.PingreqType, 0}
	if withReport {
		pkt = report.EncodePingreq(p.take())
	}
	now := time.Now()
	p.mu.Lock()
	p.lastSent = now
	if len(p.awaiting) < 64 {
		p.awaiting = append(p.awaiting, now)
	}
	debug := p.debug
	p.mu.Unlock()
	if _, err := conn.Write(pkt); err != nil {
		return fmt.Errorf("writing PINGREQ: %w", err)
	}
	if withReport {
		p.sent.Add(1)
	}
	debug.Printf("thesis pinger: sent %d-byte PINGREQ", len(pkt))
	return nil
}

// PacketSent records that paho sent a packet.
func (p *thesisPinger) PacketSent() {
	p.mu.Lock()
	p.lastSent = time.Now()
	p.mu.Unlock()
}

// PacketReceived is part of paho.Pinger; the PINGRESP timeout needs only
// PingResp.
func (p *thesisPinger) PacketReceived() {}

// PingResp records a PINGRESP: it answers the oldest outstanding PINGREQ.
func (p *thesisPinger) PingResp() {
	p.mu.Lock()
	if len(p.awaiting) > 0 {
		p.awaiting = p.awaiting[1:]
	}
	p.mu.Unlock()
}

// SetDebug sets paho's debug logger.
func (p *thesisPinger) SetDebug(l log.Logger) {
	p.mu.Lock()
	p.debug = l
	p.mu.Unlock()
}

// earlier returns the earlier of two times.
func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
