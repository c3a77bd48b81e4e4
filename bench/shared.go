package bench

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"github.com/luffymq/luffymq/internal/timeutil"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/luffymq/luffymq/clientsdk"
)

// PayloadSize is the size of every benchmark message.
const PayloadSize = 100

// encodePayload writes the sequence number and send time into a 100 B
// payload.
func encodePayload(seq int, sent time.Time) []byte {
	b := make([]byte, PayloadSize)
	binary.BigEndian.PutUint64(b[0:8], uint64(seq))
	binary.BigEndian.PutUint64(b[8:16], uint64(sent.UnixNano()))
	for i := 16; i < len(b); i++ {
		b[i] = 'x'
	}
	return b
}

// decodePayload reads what encodePayload wrote.
func decodePayload(b []byte) (seq int, sent time.Time, ok bool) {
	if len(b) < 16 {
		return 0, time.Time{}, false
	}
	return int(binary.BigEndian.Uint64(b[0:8])), time.Unix(0, int64(binary.BigEndian.Uint64(b[8:16]))), true
}

// SubscriberResult is one member's share of a run.
type SubscriberResult struct {
	Member  int    `json:"member"` // 1-based, as in scenarios.md
	Service string `json:"service"`
	LatencyStats
	MsgsPerSec float64 `json:"msgs_per_sec"`
	// ReportVia is the report channel the member used at the end
	// ("publish" after the SDK's fallback from extended PINGREQs).
	ReportVia   string `json:"report_via,omitempty"`
	ReportsSent uint64 `json:"reports_sent,omitempty"`
}

// RunResult is one run of one scenario on one system.
type RunResult struct {
	Scenario   string             `json:"scenario"`
	System     string             `json:"system"`
	Repeat     int                `json:"repeat"`
	Params     ScenarioParams     `json:"parameters"`
	Overall    LatencyStats       `json:"overall"`
	PerSub     []SubscriberResult `json:"per_subscriber"`
	Sent       int                `json:"sent"`
	Dequeued   int                `json:"dequeued"` // distinct messages taken for processing
	Lost       int                `json:"lost"`
	Duplicated int                `json:"duplicated"`
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
	// Series holds the per-message data the plots need; not written to JSON.
	Deliveries []Delivery `json:"-"`
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

func paramsOf(s Scenario, msgs int, seed uint64) ScenarioParams {
	p := ScenarioParams{GapMs: ms(s.Gap), Poisson: s.Poisson, DurationS: s.Duration.Seconds(), QoS: s.QoS,
		ReportInterval: s.ReportInterval.String(), PayloadBytes: PayloadSize, Messages: msgs, Seed: seed, Notes: s.Notes}
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
// duplicates.
func buildResult(s Scenario, system string, repeat int, sent int, seed uint64, all []Delivery) RunResult {
	r := RunResult{Scenario: s.ID, System: system, Repeat: repeat, Params: paramsOf(s, sent, seed), Sent: sent}
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
		v := ms(d.Latency())
		overall = append(overall, v)
		if d.Member >= 0 && d.Member < len(per) {
			per[d.Member] = append(per[d.Member], v)
		}
		span = max(span, d.Start)
	}
	r.Overall = Summarise(overall)
	r.Adaptation = adaptation(s, first)
	for i, m := range s.Members {
		sr := SubscriberResult{Member: i + 1, Service: m.describe(), LatencyStats: Summarise(per[i])}
		if span > 0 {
			sr.MsgsPerSec = float64(len(per[i])) / span.Seconds()
		}
		r.PerSub = append(r.PerSub, sr)
	}
	return r
}

// sharedOptions are the knobs of live runs.
type sharedOptions struct {
	brokers      brokerStarter
	drainTimeout time.Duration
	logDir       string
}

// runLive runs scenario s once on a live system and returns its result.
func runLive(ctx context.Context, s Scenario, system string, repeat int, seed uint64, trace []time.Duration, o sharedOptions) (RunResult, error) {
	wallStart := time.Now()
	logName := fmt.Sprintf("%s-%s-r%d", s.ID, system, repeat)
	logFile, err := os.Create(filepath.Join(o.logDir, logName+".clients.log"))
	if err != nil {
		return RunResult{}, fmt.Errorf("client log: %w", err)
	}
	defer logFile.Close()
	logger := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo}))

	br, err := o.brokers.start(ctx, system, s.ReportInterval, logName)
	if err != nil {
		return RunResult{}, err
	}
	defer br.Close()

	var tag [4]byte
	_, _ = rand.Read(tag[:])
	runID := hex.EncodeToString(tag[:])
	topic := fmt.Sprintf("bench/%s/%s", s.ID, runID)

	var (
		mu     sync.Mutex
		ds     []Delivery
		t0     time.Time
		dead   = make([]bool, len(s.Members))
		subs   = make([]*clientsdk.Subscriber, len(s.Members))
		prox   = make([]*cutProxy, len(s.Members))
		notes  []string
		errsMu sync.Mutex
	)
	note := func(format string, a ...any) {
		errsMu.Lock()
		notes = append(notes, fmt.Sprintf(format, a...))
		errsMu.Unlock()
	}
	crash := false
	for _, m := range s.Members {
		crash = crash || m.CrashAt > 0
	}

	newSub := func(i int) (*clientsdk.Subscriber, error) {
		m := s.Members[i]
		addr := br.Addr()
		if crash {
			p, err := newCutProxy(br.Addr())
			if err != nil {
				return nil, err
			}
			prox[i] = p
			addr = p.Addr()
		}
		emu := &clientsdk.ServiceEmulator{Lanes: 1, Seed: seed + uint64(i)}
		var lastEnd time.Time
		handler := func(hctx context.Context, msg *clientsdk.Message) error {
			seq, sentAt, ok := decodePayload(msg.Payload)
			if !ok {
				return nil
			}
			mu.Lock()
			base := t0
			mu.Unlock()
			ready := msg.ReceivedAt
			start := ready
			if lastEnd.After(start) {
				start = lastEnd
			}
			d := m.serviceAt(start.Sub(base))
			vstart, err := emu.Serve(hctx, ready, d)
			lastEnd = vstart.Add(d)
			// The publish time is the scheduled one: if the broker holds the
			// publisher back, that wait is part of the latency.
			sent := sentAt.Sub(base)
			if seq >= 0 && seq < len(trace) {
				sent = trace[seq]
			}
			mu.Lock()
			if !dead[i] {
				ds = append(ds, Delivery{Seq: seq, Member: i, Sent: sent, Start: vstart.Sub(base)})
			}
			mu.Unlock()
			return err
		}
		return clientsdk.NewSubscriber(clientsdk.SubscriberConfig{
			ConnectionConfig: clientsdk.ConnectionConfig{
				Brokers:  []string{"mqtt://" + addr},
				ClientID: fmt.Sprintf("bench-%s-m%d", runID, i+1),
				Logger:   logger.With("member", i+1),
			},
			Group:         "g",
			Filters:       []string{topic},
			QoS:           s.QoS,
			Handler:       handler,
			Workers:       1,
			QueueCapacity: 10000,
			MaxAttempts:   1,
		})
	}
	startSub := func(i int) error {
		sub, err := newSub(i)
		if err != nil {
			return fmt.Errorf("member %d: %w", i+1, err)
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := sub.Start(sctx); err != nil {
			return fmt.Errorf("member %d: %w", i+1, err)
		}
		mu.Lock()
		subs[i] = sub
		mu.Unlock()
		return nil
	}
	closeAll := func() {
		var wg sync.WaitGroup
		mu.Lock()
		ss := append([]*clientsdk.Subscriber(nil), subs...)
		mu.Unlock()
		for i, sub := range ss {
			if sub == nil || dead[i] {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = sub.Close(cctx)
			}()
		}
		wg.Wait()
		for _, p := range prox {
			if p != nil {
				p.Kill()
			}
		}
	}
	defer closeAll()

	for i, m := range s.Members {
		if m.JoinAt == 0 {
			if err := startSub(i); err != nil {
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
	mu.Lock()
	t0 = time.Now().Add(50 * time.Millisecond)
	mu.Unlock()

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
				if err := startSub(i); err != nil {
					note("member %d could not join: %v", i+1, err)
				}
			}()
		case m.CrashAt > 0:
			events.Add(1)
			go func() {
				defer events.Done()
				if timeutil.SleepUntil(eventCtx, t0.Add(m.CrashAt)) != nil {
					return
				}
				mu.Lock()
				dead[i] = true
				sub := subs[i]
				mu.Unlock()
				prox[i].Kill()
				// The process is gone: its queue and unacknowledged work with it.
				cctx, cancel := context.WithCancel(context.Background())
				cancel()
				go func() { _ = sub.Close(cctx) }()
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
		err := pub.Publish(qctx, topic, encodePayload(seq, now), clientsdk.PublishOptions{QoS: s.QoS})
		cancel()
		if err != nil {
			pubErrs++
			continue
		}
		sent++
	}
	if pubErrs > 0 {
		note("%d publishes failed", pubErrs)
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
		mu.Lock()
		distinct := countDistinct(ds)
		n := len(ds)
		ss := append([]*clientsdk.Subscriber(nil), subs...)
		deadNow := append([]bool(nil), dead...)
		mu.Unlock()
		if distinct >= sent {
			break
		}
		busy := false
		for i, sub := range ss {
			if sub != nil && !deadNow[i] {
				st := sub.Stats()
				busy = busy || st.Pending > 0 || st.InFlight > 0
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
	mu.Lock()
	var via []string
	for i, sub := range subs {
		if sub == nil {
			continue
		}
		st := sub.Stats()
		if st.ReportVia != clientsdk.ReportViaPingreq {
			via = append(via, fmt.Sprintf("member %d: %s", i+1, st.ReportVia))
		}
	}
	stats := make([]clientsdk.Stats, len(subs))
	for i, sub := range subs {
		if sub != nil {
			stats[i] = sub.Stats()
		}
	}
	all := append([]Delivery(nil), ds...)
	mu.Unlock()

	r := buildResult(s, system, repeat, sent, seed, all)
	for i := range r.PerSub {
		r.PerSub[i].ReportVia = string(stats[i].ReportVia)
		r.PerSub[i].ReportsSent = stats[i].ReportsSent
	}
	r.DrainTimedOut = timedOut
	r.PublisherMaxLagMs = ms(maxLag)
	if maxLag > 100*time.Millisecond {
		note("the publisher fell up to %.0f ms behind its schedule (the broker held its PUBLISHes back); latency counts from the scheduled publish time", ms(maxLag))
	}
	if timedOut {
		note("drain timed out after %s with %d messages not dequeued", o.drainTimeout, r.Lost)
	}
	if len(via) == 0 && (system == SystemMosquitto || system == SystemMochi) {
		note("%s accepted the extended PINGREQs (PINGRESP, no disconnection): the SDK kept reporting over them and the broker ignored the reports", system)
	}
	if len(via) > 0 {
		note("reports fell back to PUBLISH (%s): the broker closed the connection on an extended PINGREQ", strings.Join(via, ", "))
	}
	errsMu.Lock()
	r.Notes = append(r.Notes, notes...)
	errsMu.Unlock()
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
