package clientsdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/eclipse/paho.golang/paho/log"

	"github.com/luffymq/luffymq/clientsdk/report"
)

// fallbackWindow is how soon after an extended PINGREQ a connection drop
// is blamed on it.
const fallbackWindow = 2 * time.Second

// plainPingreq is a standard PINGREQ packet.
var plainPingreq = []byte{report.PingreqType, 0x00}

// reportSource supplies the pinger with the Subscriber's load.
type reportSource interface {
	// loadSignal returns what decides when to report.
	loadSignal() loadSignal
	// takeReport returns the report to send at now and starts a new
	// report period.
	takeReport(now time.Time) report.Report
	// connectionStarted is called when a new connection starts.
	connectionStarted()
}

// reportPinger is a paho.Pinger that, besides keep-alive, sends load reports
// in extended PINGREQs or report PUBLISHes on the connection it is given.
// One reportPinger serves every connection of a LoadReporter (and so of a
// Subscriber).
type reportPinger struct {
	src      reportSource
	channel  ReportChannel // configured channel
	interval func() time.Duration
	now      func() time.Time
	log      *slog.Logger

	kick chan struct{} // a signal changed: re-evaluate the schedule
	// readPaused is set while the Subscriber holds paho's reader back (a
	// full pending queue); PINGRESPs cannot be read then, so their timeout
	// is suspended.
	readPaused atomic.Bool
	fellBack   atomic.Bool // the broker rejected extended PINGREQs: publish from now on
	closing    atomic.Bool // the Subscriber is closing: drops are not the broker's verdict

	reportsSent  atomic.Uint64
	lastPending  atomic.Int64 // pending count in the last report sent
	jumpSignaled atomic.Bool  // notePending signalled a jump since the last report

	mu           sync.Mutex
	running      bool
	lastSent     time.Time
	lastReceived time.Time
	pings        []pingRecord // PINGREQs awaiting a PINGRESP, oldest first
	extSent      time.Time    // first extended PINGREQ on this connection
	extLastSent  time.Time    // last extended PINGREQ on this connection
	extAnswered  bool         // a PINGRESP answered an extended PINGREQ on this connection
	pingTimedOut bool
	debug        log.Logger
}

type pingRecord struct {
	at       time.Time
	extended bool
}

var _ paho.Pinger = (*reportPinger)(nil)

func newReportPinger(src reportSource, channel ReportChannel, interval func() time.Duration, logger *slog.Logger) *reportPinger {
	return &reportPinger{
		src:      src,
		channel:  channel,
		interval: interval,
		now:      time.Now,
		log:      logger,
		kick:     make(chan struct{}, 1),
		debug:    log.NOOPLogger{},
	}
}

// via returns the channel reports use now.
func (p *reportPinger) via() ReportChannel {
	if p.channel == ReportViaPingreq && p.fellBack.Load() {
		return ReportViaPublish
	}
	return p.channel
}

// signal asks the pinger to re-evaluate its schedule soon.
func (p *reportPinger) signal() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// notePending wakes the pinger when the pending count moved far enough from
// the last report to warrant another one (once per report).
func (p *reportPinger) notePending(pending int) {
	if p.via() == ReportOff || !pendingJumped(int(p.lastPending.Load()), pending) {
		return
	}
	if !p.jumpSignaled.Swap(true) {
		p.signal()
	}
}

// pauseReading suspends the PINGRESP timeout while the connection is not
// being read because of back-pressure.
func (p *reportPinger) pauseReading() {
	p.readPaused.Store(true)
}

// resumeReading ends pauseReading; PINGREQs still unanswered get a full
// keep-alive period from now.
func (p *reportPinger) resumeReading() {
	now := p.now()
	p.mu.Lock()
	for i := range p.pings {
		p.pings[i].at = now
	}
	p.mu.Unlock()
	p.readPaused.Store(false)
	p.signal()
}

// Run sends load reports and keep-alive PINGREQs on conn until ctx is done.
// Unlike paho's default pinger it keeps running when keepAlive is 0, since
// reports do not depend on keep-alive; PINGRESP timeouts are then not
// checked. It returns an error when a PINGRESP is overdue or a write fails,
// which makes paho drop the connection.
func (p *reportPinger) Run(ctx context.Context, conn net.Conn, keepAlive uint16) error {
	if conn == nil {
		return errors.New("report pinger: conn is nil")
	}
	now := p.now()
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return errors.New("report pinger: Run already in progress")
	}
	p.running = true
	p.lastSent, p.lastReceived = now, now
	p.pings = p.pings[:0]
	p.extSent, p.extLastSent, p.extAnswered, p.pingTimedOut = time.Time{}, time.Time{}, false, false
	p.mu.Unlock()
	p.lastPending.Store(0)
	p.jumpSignaled.Store(false)
	p.src.connectionStarted()

	w := startPacketWriter(conn)
	defer func() {
		w.stop()
		p.mu.Lock()
		p.running = false
		p.mu.Unlock()
		p.judgeDrop()
	}()

	keepAliveEvery := time.Duration(keepAlive) * time.Second
	sched := newReportSchedule(now, p.interval())
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := p.now()
		sched.interval = p.interval()
		var wake time.Time
		pingDue := false
		if keepAliveEvery > 0 {
			p.mu.Lock()
			var oldest time.Time
			if len(p.pings) > 0 {
				oldest = p.pings[0].at
			}
			idleSince := p.lastSent
			if p.lastReceived.Before(idleSince) {
				idleSince = p.lastReceived
			}
			p.mu.Unlock()
			if !oldest.IsZero() && p.readPaused.Load() {
				wake = now.Add(keepAliveEvery) // resumeReading restarts the clock
			} else if !oldest.IsZero() {
				deadline := oldest.Add(keepAliveEvery)
				if !now.Before(deadline) {
					p.mu.Lock()
					p.pingTimedOut = true
					p.mu.Unlock()
					p.debug.Printf("report pinger: PINGRESP timed out")
					return fmt.Errorf("PINGRESP not received within %s", keepAliveEvery)
				}
				wake = deadline
			} else {
				due := idleSince.Add(keepAliveEvery)
				if !now.Before(due) {
					pingDue = true
				} else {
					wake = due
				}
			}
		}

		via := p.via()
		if via != ReportOff {
			reason, at := sched.next(now, p.src.loadSignal())
			if reason == reasonNone && pingDue && via == ReportViaPingreq {
				reason = reasonPeriodic // the keep-alive PINGREQ carries a report
			}
			if reason != reasonNone {
				if err := p.sendReport(w, sched, now, via, reason); err != nil {
					return err
				}
				continue
			}
			wake = earliest(wake, at)
		}
		if pingDue {
			if err := p.enqueue(w, plainPingreq, pingRecord{at: now}); err != nil {
				return err
			}
			continue
		}

		if wake.IsZero() {
			wake = now.Add(time.Hour)
		}
		timer.Reset(max(wake.Sub(now), 0))
		select {
		case <-ctx.Done():
			return nil
		case err := <-w.errs:
			return err
		case <-p.kick:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// sendReport writes one report on the connection and records it.
func (p *reportPinger) sendReport(w *packetWriter, sched *reportSchedule, now time.Time, via ReportChannel, reason reportReason) error {
	r := p.src.takeReport(now)
	// Pending jumps are measured from this report from now on, before the
	// writer has it: once written, the broker (or a test reading the
	// connection) may act on it, and a jump noted meanwhile against the
	// report before would ask for a second one at once. Should the write
	// fail, the connection ends, and the next starts again from 0.
	p.lastPending.Store(int64(r.Pending))
	p.jumpSignaled.Store(false)
	var err error
	if via == ReportViaPingreq {
		err = p.enqueue(w, report.EncodePingreq(r), pingRecord{at: now, extended: true})
	} else {
		err = p.enqueue(w, encodeLoadPublish(report.Encode(r)), pingRecord{})
	}
	if err != nil {
		return err
	}
	sched.sent(now, r.Pending, r.InProgress, r.Received, r.Processed)
	p.reportsSent.Add(1)
	p.log.Debug("load report sent", "via", via, "reason", reason.String(), "pending", r.Pending,
		"processing_time", r.ProcessingTime, "backlog", r.Backlog, "in_progress", r.InProgress, "received", r.Received)
	return nil
}

// enqueue records a packet as sent and hands it to the writer; a PINGREQ
// (rec.at set) is recorded as awaiting its PINGRESP first, since the answer
// can arrive before the writer has even returned.
func (p *reportPinger) enqueue(w *packetWriter, pkt []byte, rec pingRecord) error {
	p.mu.Lock()
	p.lastSent = p.now()
	if !rec.at.IsZero() {
		if len(p.pings) < 64 {
			p.pings = append(p.pings, rec)
		}
		if rec.extended {
			if p.extSent.IsZero() {
				p.extSent = rec.at
			}
			p.extLastSent = rec.at
		}
	}
	p.mu.Unlock()
	return w.write(pkt)
}

// judgeDrop runs when a connection ends. If the broker never answered an
// extended PINGREQ on it and dropped it soon after one (or let a PINGRESP
// time out), it does not accept them: report by PUBLISH from now on.
func (p *reportPinger) judgeDrop() {
	if p.closing.Load() || p.channel != ReportViaPingreq || p.fellBack.Load() {
		return
	}
	p.mu.Lock()
	extSent, extLast, answered, timedOut := p.extSent, p.extLastSent, p.extAnswered, p.pingTimedOut
	p.mu.Unlock()
	if extSent.IsZero() || answered {
		return
	}
	if !timedOut && p.now().Sub(extLast) > fallbackWindow {
		return
	}
	if p.fellBack.CompareAndSwap(false, true) {
		p.log.Warn("broker closed the connection after an extended PINGREQ; reporting load by PUBLISH to " +
			report.LoadTopic + " from now on")
	}
}

// PacketSent records that paho sent a packet.
func (p *reportPinger) PacketSent() {
	p.mu.Lock()
	p.lastSent = p.now()
	p.mu.Unlock()
}

// PacketReceived records that paho received a packet.
func (p *reportPinger) PacketReceived() {
	p.mu.Lock()
	p.lastReceived = p.now()
	p.mu.Unlock()
}

// PingResp records a PINGRESP: it answers the oldest outstanding PINGREQ.
func (p *reportPinger) PingResp() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.pings) == 0 {
		return
	}
	if p.pings[0].extended {
		p.extAnswered = true
	}
	p.pings = append(p.pings[:0], p.pings[1:]...)
}

// SetDebug sets paho's debug logger.
func (p *reportPinger) SetDebug(l log.Logger) {
	p.mu.Lock()
	p.debug = l
	p.mu.Unlock()
}

// packetWriter writes whole packets to a connection from its own goroutine,
// so a write blocked by a slow network does not stop the pinger from
// noticing a PINGRESP timeout (paho's default pinger does the same). Each
// packet goes out in a single Write, under the connection's lock when it
// has one (the lock paho takes for its own packets), so packets never
// interleave.
type packetWriter struct {
	conn net.Conn
	in   chan []byte
	errs chan error
	quit chan struct{}
}

func startPacketWriter(conn net.Conn) *packetWriter {
	w := &packetWriter{
		conn: conn,
		in:   make(chan []byte, 8),
		errs: make(chan error, 1),
		quit: make(chan struct{}),
	}
	go w.loop()
	return w
}

func (w *packetWriter) loop() {
	for {
		select {
		case <-w.quit:
			return
		case pkt := <-w.in:
			if err := writePacket(w.conn, pkt); err != nil {
				w.errs <- err
				return
			}
		}
	}
}

// write queues pkt; it fails when the writer is backed up, which means the
// connection is not draining.
func (w *packetWriter) write(pkt []byte) error {
	select {
	case w.in <- pkt:
		return nil
	default:
		return errors.New("report pinger: connection not accepting writes")
	}
}

// stop ends the writer without waiting: a Write blocked on the connection
// ends when paho closes the connection, which paho may do only after Run
// has returned.
func (w *packetWriter) stop() {
	close(w.quit)
}

// writePacket writes one complete packet in a single Write, holding the
// connection's lock if it has one.
func writePacket(conn net.Conn, pkt []byte) error {
	if l, ok := conn.(sync.Locker); ok {
		l.Lock()
		defer l.Unlock()
	}
	if _, err := conn.Write(pkt); err != nil {
		return fmt.Errorf("writing %d-byte packet: %w", len(pkt), err)
	}
	return nil
}

// encodeLoadPublish returns a QoS 0 PUBLISH of payload to report.LoadTopic.
func encodeLoadPublish(payload []byte) []byte {
	var buf bytes.Buffer
	pub := &packets.Publish{Topic: report.LoadTopic, Payload: payload, Properties: &packets.Properties{}}
	_, _ = pub.WriteTo(&buf) // a bytes.Buffer does not fail
	return buf.Bytes()
}

// earliest returns the earlier of two times, ignoring zero ones.
func earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero():
		return a
	case b.Before(a):
		return b
	}
	return a
}
