package shared

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/clientsdk"
	"github.com/luffymq/luffymq/internal/timeutil"
)

// SubscriberResult is one member's share of a run.
type SubscriberResult struct {
	Member  int    `json:"member"` // 1-based, as in scenarios.md
	Service string `json:"service"`
	harness.LatencyStats
	MsgsPerSec float64 `json:"msgs_per_sec"`
	// ReportVia is the report channel the member used at the end
	// ("publish" after the SDK's fallback from extended PINGREQs, "none"
	// for a member that does not report).
	ReportVia   string `json:"report_via,omitempty"`
	ReportsSent uint64 `json:"reports_sent,omitempty"`
}

// RunResult is one run of one scenario on one system with one subscriber
// kind; results are keyed by (Scenario, Subscriber, System).
type RunResult struct {
	Scenario string `json:"scenario"`
	// Subscriber is the subscriber kind (KindSDK, …); for the oracle, the
	// kind whose runs it is the reference of.
	Subscriber string               `json:"subscriber"`
	System     string               `json:"system"`
	Repeat     int                  `json:"repeat"`
	Params     ScenarioParams       `json:"parameters"`
	Overall    harness.LatencyStats `json:"overall"`
	PerSub     []SubscriberResult   `json:"per_subscriber"`
	Sent       int                  `json:"sent"`
	Dequeued   int                  `json:"dequeued"` // distinct messages taken for processing
	Lost       int                  `json:"lost"`
	Duplicated int                  `json:"duplicated"`
	// DrainTimedOut says the run stopped waiting before every message was
	// dequeued.
	DrainTimedOut bool    `json:"drain_timed_out,omitempty"`
	WallSeconds   float64 `json:"wall_s"`
	// PublisherMaxLagMs is how far the publisher fell behind its schedule
	// at worst (latency counts from the scheduled time).
	PublisherMaxLagMs float64  `json:"publisher_max_lag_ms"`
	Notes             []string `json:"notes,omitempty"`
	// Adaptation is set for scenarios with an event (step, join, crash).
	Adaptation *Adaptation `json:"adaptation,omitempty"`
	// OracleSameDelaysMean is, for a live run, the mean latency of the
	// perfect-information oracle replayed with this run's measured
	// delivery delays (OracleWithDelays): what no policy can beat on the
	// network the run had. A live system's excess over the plain oracle
	// that this also shows is the network's, not the policy's.
	OracleSameDelaysMean float64 `json:"oracle_with_run_delays_mean_ms,omitempty"`
	// Series holds the per-message data the plots need; not written to JSON.
	Deliveries []Delivery `json:"-"`
}

// runKey identifies what a result is of: results are keyed by scenario,
// subscriber kind and system.
type runKey struct {
	Scenario, Subscriber, System string
}

func (r RunResult) key() runKey {
	return runKey{Scenario: r.Scenario, Subscriber: normKind(r.Subscriber), System: r.System}
}

// ScenarioParams records a scenario's parameters in results.
type ScenarioParams struct {
	GapMs          float64  `json:"gap_ms"`
	Poisson        bool     `json:"poisson,omitempty"`
	DurationS      float64  `json:"duration_s"`
	Members        []string `json:"members"`
	QoS            byte     `json:"qos"`
	ReportInterval string   `json:"report_interval"`
	PayloadBytes   int      `json:"payload_bytes"`
	Messages       int      `json:"messages"`
	Seed           uint64   `json:"seed"`
	Notes          string   `json:"notes,omitempty"`
}

func paramsOf(s Scenario, kind string, msgs int, seed uint64) ScenarioParams {
	p := ScenarioParams{GapMs: harness.Millis(s.Gap), Poisson: s.Poisson, DurationS: s.Duration.Seconds(), QoS: kindQoS(s, kind),
		ReportInterval: s.ReportInterval.String(), PayloadBytes: harness.PayloadSize, Messages: msgs, Seed: seed, Notes: s.Notes}
	for _, m := range s.Members {
		p.Members = append(p.Members, m.describe())
	}
	return p
}

func (m Member) describe() string {
	s := m.Service.String()
	if m.ChangeAt > 0 {
		s += fmt.Sprintf("→%s@%s", m.NewService, m.ChangeAt)
	}
	if m.JoinAt > 0 {
		s += fmt.Sprintf(" joins@%s", m.JoinAt)
	}
	if m.CrashAt > 0 {
		s += fmt.Sprintf(" crashes@%s", m.CrashAt)
	}
	return s
}

// buildResult computes a run's statistics from its deliveries. Only the
// first dequeue of each message counts for latency; later ones are
// duplicates. trace is the run's arrival trace (the oracle replays it for
// the join comparison).
func buildResult(s Scenario, kind, system string, repeat int, trace []time.Duration, sent int, seed uint64, all []Delivery) RunResult {
	r := RunResult{Scenario: s.ID, Subscriber: kind, System: system, Repeat: repeat, Params: paramsOf(s, kind, sent, seed), Sent: sent}
	sorted := append([]Delivery(nil), all...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Start < sorted[j].Start })
	seen := make(map[int]bool, len(sorted))
	var first []Delivery
	for _, d := range sorted {
		if seen[d.Seq] {
			r.Duplicated++
			continue
		}
		seen[d.Seq] = true
		first = append(first, d)
	}
	r.Dequeued = len(first)
	r.Lost = sent - len(first)
	r.Deliveries = first
	var span time.Duration
	per := make([][]float64, len(s.Members))
	var overall []float64
	for _, d := range first {
		v := harness.Millis(d.Latency())
		overall = append(overall, v)
		if d.Member >= 0 && d.Member < len(per) {
			per[d.Member] = append(per[d.Member], v)
		}
		span = max(span, d.Start)
	}
	r.Overall = harness.Summarise(overall)
	// A system that holds messages back on purpose (late binding) makes
	// its policy's waits look like delivery delays: no such replay.
	if measured := DeliveryDelays(first, len(trace)); len(trace) > 0 && len(first) > 0 && first[0].Ready > 0 && system != harness.SystemAdaptiveHold {
		var lat []float64
		for _, d := range OracleWithDelays(s, trace, measured) {
			lat = append(lat, harness.Millis(d.Latency()))
		}
		r.OracleSameDelaysMean = harness.Summarise(lat).Mean
	}
	var oracle []Delivery
	if s.EventAt > 0 && len(trace) > 0 {
		oracle = Oracle(s, trace)
	}
	r.Adaptation = adaptation(s, first, oracle)
	for i, m := range s.Members {
		sr := SubscriberResult{Member: i + 1, Service: m.describe(), LatencyStats: harness.Summarise(per[i])}
		if span > 0 {
			sr.MsgsPerSec = float64(len(per[i])) / span.Seconds()
		}
		r.PerSub = append(r.PerSub, sr)
	}
	return r
}

// sharedOptions are the knobs of live runs.
type sharedOptions struct {
	brokers      harness.BrokerStarter
	drainTimeout time.Duration
	logDir       string
	// ackInterval is paho's SendAcksInterval for the paho kinds at QoS 1
	// (0: paho's default).
	ackInterval time.Duration
	// traceDir, when set, receives trace-<run>.csv of every live run, and
	// the client logs are written at debug level (the SDK logs each load
	// report it sends).
	traceDir string
}

// liveRun is the shared state of one live run: the clock, the deliveries
// and the notes.
type liveRun struct {
	s     Scenario
	trace []time.Duration

	workersMu sync.Mutex
	workers   []*memberWorker // by member index, once created

	mu   sync.Mutex
	t0   time.Time
	ds   []Delivery
	dead []bool

	notesMu sync.Mutex
	notes   []string
}

func (lr *liveRun) base() time.Time {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return lr.t0
}

func (lr *liveRun) note(format string, a ...any) {
	lr.notesMu.Lock()
	lr.notes = append(lr.notes, fmt.Sprintf(format, a...))
	lr.notesMu.Unlock()
}

// memberWorker serves one member's messages on a drift-free virtual
// schedule (clientsdk.ServiceEmulator) and records their dequeue times.
// One goroutine uses it at a time: the member's single worker.
type memberWorker struct {
	run *liveRun
	i   int
	emu *clientsdk.ServiceEmulator

	// mu guards what the live oracle reads from the broker's goroutines:
	// the end of the last service, and the work booked for the member by
	// the live oracle and not yet started (per message, and its sum).
	mu      sync.Mutex
	lastEnd time.Time
	booked  map[int]time.Duration
	pending time.Duration
	// runStart is when its current (or last) message started, for the
	// informed live oracle, which knows that but not the message's size.
	runStart time.Time
}

// expectedStart returns when the member is expected to start a message
// handed to it at now, by what a broker could at best know: its exact
// queue (the message running, the messages sent to it and not started)
// and its mean service time, but not the size of any message.
func (w *memberWorker) expectedStart(now time.Time) time.Time {
	base := w.run.base()
	w.mu.Lock()
	defer w.mu.Unlock()
	start := now
	if w.lastEnd.After(now) {
		start = now.Add(w.run.s.ExpectedRemaining(w.i, w.runStart.Sub(base), now.Sub(w.runStart)))
	}
	mean := w.run.s.MeanServiceTime(w.i, now.Sub(base))
	return start.Add(time.Duration(len(w.booked)) * mean)
}

// predictedStart returns when the member would start a message handed to
// it at now: after its current service and the work booked before.
func (w *memberWorker) predictedStart(now time.Time) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	start := now
	if w.lastEnd.After(start) {
		start = w.lastEnd
	}
	return start.Add(w.pending)
}

// book records message seq as sent to the member, to start at start.
func (w *memberWorker) book(seq int, start time.Time) {
	d := w.run.s.ServiceTime(w.i, seq, start.Sub(w.run.base()))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.booked == nil {
		w.booked = make(map[int]time.Duration)
	}
	w.booked[seq] = d
	w.pending += d
}

// serve processes the message with payload, which became ready (was
// received) at ready, for the member's service time at its start, and
// returns that service time.
func (w *memberWorker) serve(ctx context.Context, payload []byte, ready time.Time) (time.Duration, error) {
	seq, sentAt, ok := harness.DecodePayload(payload)
	if !ok {
		return 0, nil
	}
	base := w.run.base()
	w.mu.Lock()
	start := ready
	if w.lastEnd.After(start) {
		start = w.lastEnd
	}
	d := w.run.s.ServiceTime(w.i, seq, start.Sub(base))
	if b, ok := w.booked[seq]; ok {
		delete(w.booked, seq)
		w.pending -= b
	}
	w.lastEnd, w.runStart = start.Add(d), start
	w.mu.Unlock()
	vstart, err := w.emu.Serve(ctx, ready, d)
	w.mu.Lock()
	w.lastEnd, w.runStart = vstart.Add(d), vstart
	w.mu.Unlock()
	// The publish time is the scheduled one: if the broker holds the
	// publisher back, that wait is part of the latency.
	sent := sentAt.Sub(base)
	if seq >= 0 && seq < len(w.run.trace) {
		sent = w.run.trace[seq]
	}
	w.run.mu.Lock()
	if !w.run.dead[w.i] {
		w.run.ds = append(w.run.ds, Delivery{Seq: seq, Member: w.i, Sent: sent, Start: vstart.Sub(base), Ready: ready.Sub(base)})
	}
	w.run.mu.Unlock()
	return d, err
}

// memberStats is what a run reports of a member at its end.
type memberStats struct {
	ReportVia   string
	ReportsSent uint64
	// Lost says the connection ended while the member was not closing
	// (paho kinds, which do not reconnect).
	Lost bool
}

// liveMember is one shared-subscription member of a live run, of any
// subscriber kind.
type liveMember interface {
	// Start connects and subscribes.
	Start(ctx context.Context) error
	// Busy reports whether messages are queued or being processed.
	Busy() bool
	Stats() memberStats
	// Close stops gracefully.
	Close(ctx context.Context)
	// Crash stops without a goodbye after the member's connection was cut.
	Crash()
}

// sdkMember is a LuffyMQ SDK subscriber.
type sdkMember struct{ sub *clientsdk.Subscriber }

func (m sdkMember) Start(ctx context.Context) error { return m.sub.Start(ctx) }
func (m sdkMember) Busy() bool {
	st := m.sub.Stats()
	return st.Pending > 0 || st.InFlight > 0
}
func (m sdkMember) Stats() memberStats {
	st := m.sub.Stats()
	return memberStats{ReportVia: string(st.ReportVia), ReportsSent: st.ReportsSent}
}
func (m sdkMember) Close(ctx context.Context) { _ = m.sub.Close(ctx) }
func (m sdkMember) Crash() {
	// The process is gone: its queue and unacknowledged work with it.
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	go func() { _ = m.sub.Close(cctx) }()
}

// runLive runs scenario s once on a live system with subscribers of kind
// and returns its result.
func runLive(ctx context.Context, s Scenario, kind, system string, repeat int, seed uint64, trace []time.Duration, o sharedOptions) (RunResult, error) {
	wallStart := time.Now()
	qos := kindQoS(s, kind)
	logName := fmt.Sprintf("%s-%s-%s-r%d", s.ID, kind, system, repeat)
	logFile, err := os.Create(filepath.Join(o.logDir, logName+".clients.log"))
	if err != nil {
		return RunResult{}, fmt.Errorf("client log: %w", err)
	}
	defer logFile.Close()
	logLevel := slog.LevelInfo
	if o.traceDir != "" {
		logLevel = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: logLevel}))

	br, err := o.brokers.Start(ctx, system, s.ReportInterval, logName)
	if err != nil {
		return RunResult{}, err
	}
	defer br.Close()

	var tag [4]byte
	_, _ = rand.Read(tag[:])
	runID := hex.EncodeToString(tag[:])
	topic := fmt.Sprintf("bench/%s/%s", s.ID, runID)

	lr := &liveRun{s: s, trace: trace, dead: make([]bool, len(s.Members)), workers: make([]*memberWorker, len(s.Members))}
	memberIDPrefix := fmt.Sprintf("bench-%s-m", runID)
	if lo, ok := br.(interface{ attach(*liveRun, string) }); ok {
		lo.attach(lr, memberIDPrefix) // the live oracle routes on this run's members
	}
	var (
		membersMu sync.Mutex
		members   = make([]liveMember, len(s.Members))
		prox      = make([]*harness.TCPRelay, len(s.Members))
	)
	crash := false
	for _, m := range s.Members {
		crash = crash || m.CrashAt > 0
	}

	newMember := func(i int) (liveMember, error) {
		addr := br.Addr()
		if crash {
			p, err := harness.NewTCPRelay(br.Addr())
			if err != nil {
				return nil, err
			}
			prox[i] = p
			addr = p.Addr()
		}
		w := &memberWorker{run: lr, i: i, emu: &clientsdk.ServiceEmulator{Lanes: 1, Seed: seed + uint64(i)}}
		lr.setWorker(i, w)
		clientID := fmt.Sprintf("%s%d", memberIDPrefix, i+1)
		mlog := logger.With("member", i+1, "kind", kind)
		if kind != KindSDK {
			return newPahoMember(pahoMemberConfig{Kind: kind, Addr: addr, ClientID: clientID, Filter: "$share/g/" + topic,
				QoS: qos, ReportInterval: s.ReportInterval, AckInterval: o.ackInterval, Worker: w, Logger: mlog})
		}
		handler := func(hctx context.Context, msg *clientsdk.Message) error {
			_, err := w.serve(hctx, msg.Payload, msg.ReceivedAt)
			return err
		}
		sub, err := clientsdk.NewSubscriber(clientsdk.SubscriberConfig{
			ConnectionConfig: clientsdk.ConnectionConfig{
				Brokers:  []string{"mqtt://" + addr},
				ClientID: clientID,
				Logger:   mlog,
			},
			Group:         "g",
			Filters:       []string{topic},
			QoS:           qos,
			Handler:       handler,
			Workers:       1,
			QueueCapacity: 10000,
			MaxAttempts:   1,
		})
		if err != nil {
			return nil, err
		}
		return sdkMember{sub}, nil
	}
	startMember := func(i int) error {
		m, err := newMember(i)
		if err != nil {
			return fmt.Errorf("member %d: %w", i+1, err)
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := m.Start(sctx); err != nil {
			return fmt.Errorf("member %d: %w", i+1, err)
		}
		membersMu.Lock()
		members[i] = m
		membersMu.Unlock()
		return nil
	}
	snapshot := func() ([]liveMember, []bool) {
		membersMu.Lock()
		cur := append([]liveMember(nil), members...)
		membersMu.Unlock()
		lr.mu.Lock()
		dead := append([]bool(nil), lr.dead...)
		lr.mu.Unlock()
		return cur, dead
	}
	closeAll := func() {
		var wg sync.WaitGroup
		cur, dead := snapshot()
		for i, m := range cur {
			if m == nil || dead[i] {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				m.Close(cctx)
			}()
		}
		wg.Wait()
		for _, p := range prox {
			if p != nil {
				p.Close()
			}
		}
	}
	defer closeAll()

	for i, m := range s.Members {
		if m.JoinAt == 0 {
			if err := startMember(i); err != nil {
				return RunResult{}, err
			}
		}
	}
	pub, err := clientsdk.NewPublisher(clientsdk.PublisherConfig{ConnectionConfig: clientsdk.ConnectionConfig{
		Brokers: []string{"mqtt://" + br.Addr()}, ClientID: "bench-" + runID + "-pub", Logger: logger.With("client", "publisher"),
	}})
	if err != nil {
		return RunResult{}, err
	}
	pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
	err = pub.Start(pctx)
	pcancel()
	if err != nil {
		return RunResult{}, err
	}
	defer pub.Close(context.Background())

	// Let subscriptions settle on every broker before the clock starts.
	time.Sleep(200 * time.Millisecond)
	lr.mu.Lock()
	lr.t0 = time.Now().Add(50 * time.Millisecond)
	t0 := lr.t0
	lr.mu.Unlock()

	var events sync.WaitGroup
	eventCtx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	for i, m := range s.Members {
		switch {
		case m.JoinAt > 0:
			events.Add(1)
			go func() {
				defer events.Done()
				if timeutil.SleepUntil(eventCtx, t0.Add(m.JoinAt)) != nil {
					return
				}
				if err := startMember(i); err != nil {
					lr.note("member %d could not join: %v", i+1, err)
				}
			}()
		case m.CrashAt > 0:
			events.Add(1)
			go func() {
				defer events.Done()
				if timeutil.SleepUntil(eventCtx, t0.Add(m.CrashAt)) != nil {
					return
				}
				lr.mu.Lock()
				lr.dead[i] = true
				lr.mu.Unlock()
				membersMu.Lock()
				member := members[i]
				membersMu.Unlock()
				prox[i].Close()
				if member != nil {
					member.Crash()
				}
			}()
		}
	}

	sent := 0
	pubErrs := 0
	var maxLag time.Duration
	for seq, off := range trace {
		if err := timeutil.SleepUntil(ctx, t0.Add(off)); err != nil {
			return RunResult{}, err
		}
		now := time.Now()
		maxLag = max(maxLag, now.Sub(t0.Add(off)))
		qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := pub.Publish(qctx, topic, harness.EncodePayload(seq, now), clientsdk.PublishOptions{QoS: qos})
		cancel()
		if err != nil {
			pubErrs++
			continue
		}
		sent++
	}
	if pubErrs > 0 {
		lr.note("%d publishes failed", pubErrs)
	}
	stopEvents()
	events.Wait()

	// Drain: wait until every sent message was dequeued, or until nothing
	// moves any more (the rest is lost), or the timeout.
	drainDeadline := time.Now().Add(o.drainTimeout)
	var idleSince time.Time
	lastCount := -1
	timedOut := false
	for {
		lr.mu.Lock()
		distinct := countDistinct(lr.ds)
		n := len(lr.ds)
		lr.mu.Unlock()
		if distinct >= sent {
			break
		}
		cur, dead := snapshot()
		busy := false
		for i, m := range cur {
			if m != nil && !dead[i] {
				busy = busy || m.Busy()
			}
		}
		now := time.Now()
		if busy || n != lastCount {
			idleSince = now
			lastCount = n
		}
		if now.Sub(idleSince) > 3*time.Second {
			break // nothing queued anywhere and nothing arriving: the rest is lost
		}
		if now.After(drainDeadline) {
			timedOut = true
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	final, _ := snapshot()
	stats := make([]memberStats, len(final))
	var via, lost []string
	for i, m := range final {
		if m == nil {
			continue
		}
		stats[i] = m.Stats()
		if kind == KindSDK && stats[i].ReportVia != string(clientsdk.ReportViaPingreq) {
			via = append(via, fmt.Sprintf("member %d: %s", i+1, stats[i].ReportVia))
		}
		if stats[i].Lost && s.Members[i].CrashAt == 0 {
			lost = append(lost, fmt.Sprintf("member %d", i+1))
		}
	}
	lr.mu.Lock()
	all := append([]Delivery(nil), lr.ds...)
	lr.mu.Unlock()

	r := buildResult(s, kind, system, repeat, trace, sent, seed, all)
	if o.traceDir != "" {
		if err := writeDeliveryTrace(filepath.Join(o.traceDir, "trace-"+logName+".csv"), s, all); err != nil {
			return RunResult{}, err
		}
	}
	for i := range r.PerSub {
		r.PerSub[i].ReportVia = stats[i].ReportVia
		r.PerSub[i].ReportsSent = stats[i].ReportsSent
	}
	r.DrainTimedOut = timedOut
	r.PublisherMaxLagMs = harness.Millis(maxLag)
	if maxLag > 100*time.Millisecond {
		lr.note("the publisher fell up to %.0f ms behind its schedule (the broker held its PUBLISHes back); latency counts from the scheduled publish time", harness.Millis(maxLag))
	}
	if timedOut {
		lr.note("drain timed out after %s with %d messages not dequeued", o.drainTimeout, r.Lost)
	}
	reports := kind == KindSDK || sendsThesisReports(kind)
	if reports && len(via) == 0 && len(lost) == 0 && (system == harness.SystemMosquitto || system == harness.SystemMochi) {
		lr.note("%s accepted the extended PINGREQs (PINGRESP, no disconnection) and ignored the reports", system)
	}
	if len(via) > 0 {
		lr.note("reports fell back to PUBLISH (%s): the broker closed the connection on an extended PINGREQ", strings.Join(via, ", "))
	}
	if len(lost) > 0 {
		lr.note("the broker closed the connection of %s (a paho member does not reconnect)", strings.Join(lost, ", "))
	}
	if kind != KindSDK && qos > 0 {
		iv := "paho's default, 50 ms"
		if o.ackInterval > 0 {
			iv = o.ackInterval.String()
		}
		lr.note("paho sends the acknowledgements of processed messages in arrival order every SendAcksInterval (%s)", iv)
	}
	lr.notesMu.Lock()
	r.Notes = append(r.Notes, lr.notes...)
	lr.notesMu.Unlock()
	r.WallSeconds = time.Since(wallStart).Seconds()
	return r, nil
}

func countDistinct(ds []Delivery) int {
	seen := make(map[int]struct{}, len(ds))
	for _, d := range ds {
		seen[d.Seq] = struct{}{}
	}
	return len(seen)
}

func (lr *liveRun) setWorker(i int, w *memberWorker) {
	lr.workersMu.Lock()
	defer lr.workersMu.Unlock()
	lr.workers[i] = w
}

// worker returns member i's worker, or nil if it has none yet or was
// killed.
func (lr *liveRun) worker(i int) *memberWorker {
	if i < 0 || i >= len(lr.workers) {
		return nil
	}
	lr.mu.Lock()
	dead := lr.dead[i]
	lr.mu.Unlock()
	if dead {
		return nil
	}
	lr.workersMu.Lock()
	defer lr.workersMu.Unlock()
	return lr.workers[i]
}
