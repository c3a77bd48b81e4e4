package clientsdk

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/luffymq/luffymq/clientsdk/report"
)

// LoadReporterConfig configures a LoadReporter. The zero value is valid: one
// worker, reports in extended PINGREQs at the interval the broker announces.
type LoadReporterConfig struct {
	// Workers is how many messages the application processes at once;
	// DefaultWorkers when 0. The broker divides the backlog among them.
	Workers int
	// Pending, when set, returns how many messages the application has
	// received but not yet started processing (the length of its own
	// queue). When nil, pending is the number of Received calls not yet
	// followed by a Start. It is called from the reporter's goroutine and
	// must not block.
	Pending func() int
	// ReportVia is the load-report channel; ReportViaPingreq when "".
	ReportVia ReportChannel
	// ReportInterval is the period of load reports. When 0 the reporter
	// follows the interval the broker announces in CONNACK (see
	// ConnectionUp), else DefaultReportInterval.
	ReportInterval time.Duration
	// Logger receives the reporter's logs; slog.Default() when nil.
	Logger *slog.Logger
}

// LoadReporter reports an MQTT client's load (pending messages, processing
// time, its own estimate of the wait before a new message would start) to a
// load-aware broker such as LuffyMQ, for an application that keeps its own
// autopaho or paho client instead of using Subscriber.
//
// It has three parts, usable together or alone:
//
//   - Pinger, a paho.Pinger that keeps the connection alive and sends the
//     reports (in extended PINGREQs, or as PUBLISHes to report.LoadTopic);
//   - WrapOnPublishReceived, which measures handlers that process each
//     message before they return;
//   - Received, Start and Done, for applications that queue messages and
//     process them elsewhere.
//
// Adopt wires the first two into an autopaho.ClientConfig in one call;
// AdoptForManualProcessing wires the Pinger and leaves the handlers to
// Received, Start and Done. The reporter's methods are safe for concurrent
// use. One LoadReporter serves one connection at a time (its reconnections
// included).
type LoadReporter struct {
	cfg    LoadReporterConfig
	log    *slog.Logger
	load   *loadTracker
	pinger *reportPinger

	announcedInterval atomic.Int64 // report interval from the last CONNACK, ns; 0 if none

	pendingCount    atomic.Int64  // Received − Start, used when cfg.Pending is nil
	receivedOnConn  atomic.Uint64 // messages received on the current connection
	receivedCounted atomic.Bool   // Received was called: reports carry the received count
	received        atomic.Uint64
	processed       atomic.Uint64
	failed          atomic.Uint64
}

// LoadReporterStats is a snapshot of a LoadReporter's counters.
type LoadReporterStats struct {
	// Received counts Received calls (and messages the wrapped handlers
	// saw).
	Received uint64
	// Processed counts Done calls with a nil error.
	Processed uint64
	// Failed counts Done calls with an error.
	Failed uint64
	// Pending is the pending count the next report would carry.
	Pending int
	// InFlight is the number of messages started with Start and not yet
	// Done.
	InFlight int
	// MeanProcessingTime is the running mean processing time.
	MeanProcessingTime time.Duration
	// ReportsSent counts load reports sent.
	ReportsSent uint64
	// ReportVia is the report channel in use (it becomes ReportViaPublish
	// after a fallback).
	ReportVia ReportChannel
	// ReportInterval is the report interval in force.
	ReportInterval time.Duration
}

// NewLoadReporter validates cfg and returns a LoadReporter.
func NewLoadReporter(cfg LoadReporterConfig) (*LoadReporter, error) {
	if cfg.Workers < 0 {
		return nil, fmt.Errorf("load reporter config: Workers %d is negative", cfg.Workers)
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	var err error
	if cfg.ReportVia, err = ParseReportChannel(string(cfg.ReportVia)); err != nil {
		return nil, fmt.Errorf("load reporter config: %w", err)
	}
	if cfg.ReportInterval < 0 {
		return nil, fmt.Errorf("load reporter config: ReportInterval %s is negative", cfg.ReportInterval)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &LoadReporter{cfg: cfg, log: cfg.Logger, load: newLoadTracker(cfg.Workers)}
	r.pinger = newReportPinger(r, cfg.ReportVia, r.ReportInterval, r.log)
	return r, nil
}

// Pinger returns the paho.Pinger that sends the reports; set it as
// paho.ClientConfig.PingHandler. It also does keep-alive: it sends PINGREQs
// and ends a connection whose PINGRESP is overdue, as paho's default pinger
// does.
func (r *LoadReporter) Pinger() paho.Pinger {
	return r.pinger
}

// Adopt makes cfg report load through r: it sets cfg.PingHandler to
// r.Pinger() (replacing any set), wraps the handlers in
// cfg.OnPublishReceived with WrapOnPublishReceived so that their run time is
// the measured processing time, and chains cfg.OnConnectionUp and
// cfg.ConnectPacketBuilder as AdoptForManualProcessing does. Call it after
// setting OnPublishReceived. Handlers that hand messages to other goroutines
// and return at once should use AdoptForManualProcessing instead.
func (r *LoadReporter) Adopt(cfg *autopaho.ClientConfig) {
	r.AdoptForManualProcessing(cfg)
	if len(cfg.OnPublishReceived) > 0 {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){
			r.WrapOnPublishReceived(cfg.OnPublishReceived...),
		}
	}
}

// AdoptForManualProcessing makes cfg carry r's reports without measuring its
// handlers: it sets cfg.PingHandler to r.Pinger() (replacing any set),
// chains cfg.OnConnectionUp with ConnectionUp (which runs first, then the
// application's), and chains cfg.ConnectPacketBuilder so that CONNECT asks
// for problem information (paho otherwise asks for none whenever CONNECT has
// properties, and brokers then strip the CONNACK User Property that
// announces the report interval). The application reports each message with
// Received, Start and Done.
func (r *LoadReporter) AdoptForManualProcessing(cfg *autopaho.ClientConfig) {
	cfg.PingHandler = r.pinger
	appUp := cfg.OnConnectionUp
	cfg.OnConnectionUp = func(cm *autopaho.ConnectionManager, ca *paho.Connack) {
		r.ConnectionUp(ca)
		if appUp != nil {
			appUp(cm, ca)
		}
	}
	cfg.ConnectPacketBuilder = chainConnectPacketBuilders(cfg.ConnectPacketBuilder, connectPacketBuilder(nil))
}

// ConnectionUp follows the report interval the broker announces in ca (the
// report.ReportIntervalProperty User Property) and returns it (0 if none or
// invalid). Adopt calls it from OnConnectionUp; an application wiring the
// Pinger by hand calls it there itself.
func (r *LoadReporter) ConnectionUp(ca *paho.Connack) time.Duration {
	var announced time.Duration
	if ca != nil && ca.Properties != nil {
		if v := ca.Properties.User.Get(report.ReportIntervalProperty); v != "" {
			d, err := parseMillis(v)
			if err != nil {
				r.log.Warn("ignoring the broker's report interval", "property", report.ReportIntervalProperty, "value", v, "error", err)
			} else {
				announced = d
			}
		}
	}
	r.announcedInterval.Store(int64(announced))
	r.pinger.signal()
	return announced
}

// ReportInterval returns the report interval in force: the configured one,
// else the broker's, else DefaultReportInterval.
func (r *LoadReporter) ReportInterval() time.Duration {
	if r.cfg.ReportInterval > 0 {
		return r.cfg.ReportInterval
	}
	if d := time.Duration(r.announcedInterval.Load()); d > 0 {
		return d
	}
	return DefaultReportInterval
}

// WrapOnPublishReceived returns one OnPublishReceived handler that runs
// handlers in order, as paho does (each sees whether an earlier one handled
// the message and their errors), and reports the message as received, then
// processed over the time they took. It returns whether any handler handled
// the message and the first error. For handlers that finish a message's
// processing before they return; paho runs them one message at a time.
func (r *LoadReporter) WrapOnPublishReceived(handlers ...func(paho.PublishReceived) (bool, error)) func(paho.PublishReceived) (bool, error) {
	return func(pr paho.PublishReceived) (bool, error) {
		r.Received()
		start := r.Start()
		handled, errs := pr.AlreadyHandled, pr.Errs
		var first error
		for _, h := range handlers {
			ha, err := h(paho.PublishReceived{Packet: pr.Packet, Client: pr.Client, AlreadyHandled: handled, Errs: errs})
			handled = handled || ha
			errs = append(errs, err)
			if first == nil {
				first = err
			}
		}
		r.Done(start, first)
		return handled, first
	}
}

// Received records that a message arrived: it counts as pending (unless
// LoadReporterConfig.Pending counts pending messages) and as received on the
// connection, which lets the broker tell messages still on the wire from
// those the application holds. Call it when a message enters the
// application's queue.
func (r *LoadReporter) Received() {
	r.received.Add(1)
	r.receivedOnConn.Add(1)
	r.receivedCounted.Store(true)
	r.pendingCount.Add(1)
	r.pinger.notePending(r.pending())
}

// Start records that processing of a message starts now and returns the
// time to pass to Done. The message leaves the pending count (unless
// LoadReporterConfig.Pending counts pending messages) and counts as in
// progress until Done.
//
// The message counts as in progress before it leaves the pending count, so
// that a report written in between sees it twice rather than not at all
// (which would tell the broker this client is idle).
func (r *LoadReporter) Start() time.Time {
	start := r.begin()
	for { // take one pending message, if any (Start without Received takes none)
		n := r.pendingCount.Load()
		if n <= 0 || r.pendingCount.CompareAndSwap(n, n-1) {
			break
		}
	}
	r.pinger.notePending(r.pending())
	return start
}

// Done records that processing of a message that started at start ended
// now; err is its outcome (a failed message took its worker's time too, so
// it counts for the processing time). start is normally Start's result; any
// earlier time.Now() works as well, the message then not having counted as
// in progress.
func (r *LoadReporter) Done(start time.Time, err error) {
	if err != nil {
		r.failed.Add(1)
	} else {
		r.processed.Add(1)
	}
	r.finish(start, time.Now())
}

// Stats returns a snapshot of the reporter's counters.
func (r *LoadReporter) Stats() LoadReporterStats {
	mean, inFlight := r.load.meanProcessingTime()
	return LoadReporterStats{
		Received:           r.received.Load(),
		Processed:          r.processed.Load(),
		Failed:             r.failed.Load(),
		Pending:            r.pending(),
		InFlight:           inFlight,
		MeanProcessingTime: mean,
		ReportsSent:        r.pinger.reportsSent.Load(),
		ReportVia:          r.pinger.via(),
		ReportInterval:     r.ReportInterval(),
	}
}

// begin records a handler starting now and returns its start.
func (r *LoadReporter) begin() time.Time {
	start := time.Now()
	r.load.begin(start)
	return start
}

// finish records the handler that started at start ending at end.
func (r *LoadReporter) finish(start, end time.Time) {
	n, running := r.load.end(start, end)
	switch {
	case n&(n-1) == 0 && n <= warmupLimit:
		// Perhaps a first measurement, or enough new ones for a warm-up
		// report: let the schedule decide.
		r.pinger.signal()
	case running == 0 && r.pending() == 0:
		// Idle: perhaps the broker must be told.
		r.pinger.signal()
	}
}

// noteReceivedOnConnection counts a message received on the current
// connection, for a caller that counts pending messages itself.
func (r *LoadReporter) noteReceivedOnConnection() {
	r.receivedOnConn.Add(1)
	r.receivedCounted.Store(true)
}

// pending returns the pending count.
func (r *LoadReporter) pending() int {
	if r.cfg.Pending != nil {
		return max(r.cfg.Pending(), 0)
	}
	return int(max(r.pendingCount.Load(), 0))
}

// loadSignal implements reportSource.
// The pending count is read before the messages in progress: a message
// becomes in progress before it stops being pending, so in this order it
// is seen at least once.
func (r *LoadReporter) loadSignal() loadSignal {
	pending := r.pending()
	finished, running, known := r.load.signal()
	return loadSignal{pending: pending, inProgress: running, received: r.receivedOnConn.Load(), finishedSinceReport: finished, meanKnown: known}
}

// takeReport implements reportSource.
func (r *LoadReporter) takeReport(now time.Time) report.Report {
	pending := r.pending() // before the messages in progress (see loadSignal)
	snap := r.load.take(now, pending)
	return report.Report{
		Pending:        pending,
		ProcessingTime: snap.processingTime,
		Processed:      snap.processed,
		Workers:        r.cfg.Workers,
		InProgress:     snap.inFlight,
		Backlog:        snap.backlog,
		HasBacklog:     snap.backlogKnown,
		Received:       r.receivedOnConn.Load(),
		HasReceived:    r.receivedCounted.Load(),
	}
}

// connectionStarted implements reportSource.
func (r *LoadReporter) connectionStarted() {
	r.receivedOnConn.Store(0)
}

// chainConnectPacketBuilders returns a ConnectPacketBuilder that runs first
// (when not nil) and then second.
func chainConnectPacketBuilders(first, second func(*paho.Connect, *url.URL) (*paho.Connect, error)) func(*paho.Connect, *url.URL) (*paho.Connect, error) {
	if first == nil {
		return second
	}
	return func(cp *paho.Connect, u *url.URL) (*paho.Connect, error) {
		cp, err := first(cp, u)
		if err != nil {
			return nil, err
		}
		if cp == nil {
			return nil, errors.New("ConnectPacketBuilder returned no CONNECT packet")
		}
		return second(cp, u)
	}
}
