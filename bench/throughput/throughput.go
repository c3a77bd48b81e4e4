// Package throughput runs scenario set B of docs/scenarios.md: broker
// throughput, shared fan-in and plain fan-out, against vanilla Mochi and
// Mosquitto.
package throughput

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/clientsdk"
)

// ThroughputTest is one set-B measurement.
type ThroughputTest struct {
	ID     string `json:"id"`
	Shared bool   `json:"shared"` // shared group, else plain fan-out
	QoS    byte   `json:"qos"`
}

// ThroughputTests lists set B.
var ThroughputTests = []ThroughputTest{
	{"shared-qos0", true, 0}, {"shared-qos1", true, 1}, {"fanout-qos0", false, 0}, {"fanout-qos1", false, 1},
}

// ThroughputSystems are the systems set B compares.
var ThroughputSystems = []string{"luffymq-adaptive", "luffymq-round-robin", harness.SystemMochi, harness.SystemMosquitto}

// SystemLuffyMQPersist is luffymq (adaptive strategy) with --data-dir in a
// fresh temporary directory, to measure what persistence costs. It is not
// in ThroughputSystems; name it in --systems to run it.
const SystemLuffyMQPersist = "luffymq-adaptive-persist"

// SystemLuffyMQPersistFsync is SystemLuffyMQPersist with --fsync: every
// accepted QoS 1 publish reaches the disk before its PUBACK.
const SystemLuffyMQPersistFsync = "luffymq-adaptive-persist-fsync"

// ThroughputOptionalSystems can be named in --systems but are not run by
// default.
var ThroughputOptionalSystems = []string{SystemLuffyMQPersist, SystemLuffyMQPersistFsync}

// startThroughputBroker starts system's broker for one set-B run: the
// persistent luffymq here, every other system through starter.
func startThroughputBroker(ctx context.Context, starter harness.BrokerStarter, system string, reportInterval time.Duration, logName string) (harness.RunningBroker, error) {
	if system != SystemLuffyMQPersist && system != SystemLuffyMQPersistFsync {
		return starter.Start(ctx, system, reportInterval, logName)
	}
	dir, err := os.MkdirTemp("", "luffy-bench-data-")
	if err != nil {
		return nil, fmt.Errorf("luffymq data dir: %w", err)
	}
	p, err := harness.StartProcess(ctx, starter.LuffyMQ, filepath.Join(starter.LogDir, logName+".broker.log"), func(addr string) ([]string, error) {
		args := []string{"--listen", addr, "--http", "", "--strategy", "adaptive", "--data-dir", dir,
			"--report-interval", reportInterval.String(), "--log-level", "warn"}
		if system == SystemLuffyMQPersistFsync {
			args = append(args, "--fsync")
		}
		return args, nil
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	p.Cleanup = func() { _ = os.RemoveAll(dir) }
	return p, nil
}

// ThroughputConfig sizes set B.
type ThroughputConfig struct {
	Publishers int `json:"publishers"`
	// Messages per publisher for shared tests and for fan-out tests.
	SharedMessages int `json:"shared_messages_per_publisher"`
	FanoutMessages int `json:"fanout_messages_per_publisher"`
	Members        int `json:"members"`
	// InFlight is the number of QoS 1 publishes each publisher keeps
	// outstanding (asynchronous publishing).
	InFlight int `json:"qos1_in_flight_per_publisher"`
	Repeat   int `json:"repeat"`
	// Timeout bounds one measurement.
	Timeout time.Duration `json:"timeout_ns"`
	// StallWindow is how long the delivered count may stay flat with
	// deliveries owed before the broker is said to have stalled
	// (DefaultStallWindow when 0).
	StallWindow time.Duration `json:"stall_window_ns"`
}

// ThroughputRun is one measurement.
type ThroughputRun struct {
	Test      string  `json:"test"`
	System    string  `json:"system"`
	Repeat    int     `json:"repeat"`
	Expected  int     `json:"expected"`
	Delivered int     `json:"delivered"`
	Dropped   int     `json:"dropped"`
	Seconds   float64 `json:"seconds,omitempty"`
	// MsgsPerS is the delivery rate; absent for a run that stalled.
	MsgsPerS float64 `json:"msgs_per_sec,omitempty"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	TimedOut bool    `json:"timed_out,omitempty"`
	// Stalled says the delivered count stopped growing, with deliveries
	// owed, for the stall window; StalledAfterS is when it last grew.
	Stalled       bool    `json:"stalled,omitempty"`
	StalledAfterS float64 `json:"stalled_after_s,omitempty"`
	Error         string  `json:"error,omitempty"`
}

// ThroughputResults is throughput.json.
type ThroughputResults struct {
	Generated time.Time           `json:"generated"`
	Machine   harness.MachineInfo `json:"machine"`
	Config    ThroughputConfig    `json:"config"`
	Runs      []ThroughputRun     `json:"runs"`

	dir string // where it was read from
}

// Load reads throughput.json at path, or returns nil when there is none.
func Load(path string) (*ThroughputResults, error) {
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r ThroughputResults
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r.dir = filepath.Dir(path)
	return &r, nil
}

// runThroughput measures one test on one running broker br. When the
// broker stalls it stops the measurement early and closes br.
func runThroughput(ctx context.Context, t ThroughputTest, system string, repeat int, br harness.RunningBroker, cfg ThroughputConfig, logger *slog.Logger) ThroughputRun {
	addr := br.Addr()
	perPub := cfg.FanoutMessages
	expectedFactor := cfg.Members
	if t.Shared {
		perPub = cfg.SharedMessages
		expectedFactor = 1
	}
	total := cfg.Publishers * perPub
	run := ThroughputRun{Test: t.ID, System: system, Repeat: repeat, Expected: total * expectedFactor}
	topic := fmt.Sprintf("tp/%s/%d/%d", t.ID, repeat, time.Now().UnixNano())

	var (
		delivered atomic.Int64
		lastRecv  atomic.Int64
		latMu     sync.Mutex
		lats      = make([]float64, 0, run.Expected)
	)
	record := func(payload []byte, now time.Time) {
		if _, sent, ok := harness.DecodePayload(payload); ok {
			latMu.Lock()
			lats = append(lats, harness.Millis(now.Sub(sent)))
			latMu.Unlock()
		}
		delivered.Add(1)
		lastRecv.Store(now.UnixNano())
	}
	var closers []func()
	defer func() {
		// A wedged broker must not hang the whole benchmark.
		closed := harness.Within(harness.CleanupTimeout, func() {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		})
		if !closed {
			logger.Warn("clients did not close in time; abandoning them", "timeout", harness.CleanupTimeout)
		}
	}()
	fail := func(err error) ThroughputRun {
		run.Error = err.Error()
		return run
	}
	for i := range cfg.Members {
		if t.Shared {
			sub, err := clientsdk.NewSubscriber(clientsdk.SubscriberConfig{
				ConnectionConfig: clientsdk.ConnectionConfig{Brokers: []string{"mqtt://" + addr}, ClientID: fmt.Sprintf("tp-sub-%d", i), Logger: logger},
				Group:            "tp", Filters: []string{topic}, QoS: t.QoS, Workers: 1, QueueCapacity: 10000,
				Handler: func(_ context.Context, m *clientsdk.Message) error { record(m.Payload, time.Now()); return nil },
			})
			if err != nil {
				return fail(err)
			}
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err = sub.Start(sctx)
			cancel()
			if err != nil {
				return fail(err)
			}
			closers = append(closers, func() {
				cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				_ = sub.Close(cctx)
				cancel()
			})
		} else {
			c, err := pahoConnect(ctx, addr, fmt.Sprintf("tp-fan-%d", i), func(pr paho.PublishReceived) (bool, error) {
				record(pr.Packet.Payload, time.Now())
				return true, nil
			})
			if err != nil {
				return fail(err)
			}
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = c.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: t.QoS}}})
			cancel()
			if err != nil {
				return fail(fmt.Errorf("subscribe: %w", err))
			}
			closers = append(closers, func() { _ = c.Disconnect(&paho.Disconnect{}) })
		}
	}
	pubs := make([]*paho.Client, cfg.Publishers)
	for i := range pubs {
		c, err := pahoConnect(ctx, addr, fmt.Sprintf("tp-pub-%d", i), nil)
		if err != nil {
			return fail(err)
		}
		pubs[i] = c
		closers = append(closers, func() { _ = c.Disconnect(&paho.Disconnect{}) })
	}
	time.Sleep(100 * time.Millisecond)

	deadline := time.Now().Add(cfg.Timeout)
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	var pubErrs atomic.Int64
	for _, c := range pubs {
		lanes := 1
		if t.QoS > 0 {
			lanes = cfg.InFlight
		}
		for l := range lanes {
			n := perPub / lanes
			if l < perPub%lanes {
				n++
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range n {
					if rctx.Err() != nil {
						return
					}
					if _, err := c.Publish(rctx, &paho.Publish{Topic: topic, QoS: t.QoS, Payload: harness.EncodePayload(0, time.Now())}); err != nil {
						pubErrs.Add(1)
					}
				}
			}()
		}
	}
	pubDone := make(chan struct{})
	go func() {
		wg.Wait()
		close(pubDone)
	}()
	// Watch the delivered count until every message arrived, the broker
	// stalled, QoS 0 deliveries ended short (drops), or the timeout.
	stallWindow := cfg.StallWindow
	if stallWindow <= 0 {
		stallWindow = harness.DefaultStallWindow
	}
	verdict, lastGrowth := harness.WatchDelivered(&delivered, int64(run.Expected), start, pubDone, t.QoS, stallWindow,
		func(now time.Time) bool { return !now.Before(deadline) })
	switch verdict {
	case harness.WaitStalled:
		run.Stalled = true
		run.StalledAfterS = lastGrowth.Sub(start).Seconds()
		// Stop the broker first: the clients' goodbyes would only wait on it.
		cancel()
		if !harness.Within(harness.CleanupTimeout, func() { _ = br.Close() }) {
			logger.Warn("stalled broker did not stop in time")
		}
	case harness.WaitTimedOut:
		run.TimedOut = true
	case harness.WaitComplete:
		// Publishers may still be collecting their last acknowledgements.
		select {
		case <-pubDone:
		case <-time.After(2 * time.Second):
		}
	}
	cancel()
	run.Delivered = int(delivered.Load())
	run.Dropped = run.Expected - run.Delivered
	if !run.Stalled {
		end := time.Unix(0, lastRecv.Load())
		run.Seconds = end.Sub(start).Seconds()
		if run.Seconds > 0 {
			run.MsgsPerS = float64(run.Delivered) / run.Seconds
		}
		latMu.Lock()
		st := harness.Summarise(lats)
		latMu.Unlock()
		run.P50Ms, run.P99Ms = st.P50, st.P99
		if n := pubErrs.Load(); n > 0 {
			run.Error = fmt.Sprintf("%d publishes failed", n)
		}
	} else {
		run.P50Ms, run.P99Ms = math.NaN(), math.NaN()
	}
	return run
}

// pahoConnect opens a plain MQTT v5 client connection.
func pahoConnect(ctx context.Context, addr, id string, onPublish func(paho.PublishReceived) (bool, error)) (*paho.Client, error) {
	var cc paho.ClientConfig
	if onPublish != nil {
		cc.OnPublishReceived = []func(paho.PublishReceived) (bool, error){onPublish}
	}
	c, _, _, err := harness.DialPaho(ctx, addr, id, 30, cc)
	return c, err
}

// throughputAgg is the aggregate of a test on a system over its repeats.
type throughputAgg struct {
	Runs    int
	Stalled int
	// Rate, P50 and P99 are medians over the runs that did not stall (NaN
	// if all did).
	Rate, P50, P99 float64
	// Dropped sums the drops of the runs that did not stall.
	Dropped  int
	TimedOut int
	Errs     []string
}

// throughputAggregate aggregates the runs of a test on a system.
func throughputAggregate(tp *ThroughputResults, test, system string) throughputAgg {
	var a throughputAgg
	var r, p50, p99 []float64
	for _, x := range tp.Runs {
		if x.Test != test || x.System != system {
			continue
		}
		a.Runs++
		if x.Stalled {
			a.Stalled++
			continue
		}
		if x.TimedOut {
			a.TimedOut++
		}
		if x.Error != "" {
			a.Errs = append(a.Errs, x.Error)
		}
		r = append(r, x.MsgsPerS)
		p50 = append(p50, x.P50Ms)
		p99 = append(p99, x.P99Ms)
		a.Dropped += x.Dropped
	}
	a.Rate, a.P50, a.P99 = harness.Median(r), harness.Median(p50), harness.Median(p99)
	return a
}

// rateText renders an aggregate's rate: the median, and the stalls.
func (a throughputAgg) rateText() string {
	switch {
	case a.Runs == 0:
		return "—"
	case a.Stalled == a.Runs:
		return fmt.Sprintf("stalled (%d of %d runs)", a.Stalled, a.Runs)
	case a.Stalled > 0:
		return fmt.Sprintf("%.0f; stalled (%d of %d runs)", a.Rate, a.Stalled, a.Runs)
	}
	return fmt.Sprintf("%.0f", a.Rate)
}

// Markdown is the section of summary.md on set B.
func Markdown(tp *ThroughputResults) string {
	var b strings.Builder
	c := tp.Config
	stall := c.StallWindow
	if stall <= 0 {
		stall = harness.DefaultStallWindow
	}
	fmt.Fprintf(&b, "## Throughput (set B)\n\n%d publishers × %d messages (shared) / %d messages (fan-out) of %d B → a shared group of %d members that ack immediately (LuffyMQ SDK subscribers), or %d plain subscribers (fan-out); QoS 1 publishers keep %d publishes in flight each. Every broker runs as a separate process on loopback. Medians of %d runs (runs that stalled excluded); msgs/s = messages delivered ÷ (last delivery − first publish); latency is end to end. A broker *stalled* when its delivered count stopped growing for %s while messages were still owed (publishers still sending or waiting for acknowledgements, or QoS 1); no rate is reported for such a run. Raw runs: `throughput.json`.\n\n",
		c.Publishers, c.SharedMessages, c.FanoutMessages, harness.PayloadSize, c.Members, c.Members, c.InFlight, c.Repeat, stall)
	b.WriteString("| test | system | msgs/s | p50 ms | p99 ms | dropped (runs not stalled) | ÷ Mochi | ÷ Mosquitto |\n|---|---|---|---|---|---|---|---|\n")
	for _, t := range ThroughputTests {
		mochi := throughputAggregate(tp, t.ID, harness.SystemMochi)
		mosq := throughputAggregate(tp, t.ID, harness.SystemMosquitto)
		for _, s := range append(slices.Clone(ThroughputSystems), ThroughputOptionalSystems...) {
			a := throughputAggregate(tp, t.ID, s)
			if a.Runs == 0 {
				continue
			}
			extra := ""
			if len(a.Errs) > 0 {
				extra = " ⚠ " + a.Errs[0]
			}
			if a.TimedOut > 0 {
				extra += fmt.Sprintf(" ⚠ timed out (%d of %d runs)", a.TimedOut, a.Runs)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %d%s | %s | %s |\n", t.ID, s, a.rateText(), harness.FmtMs(a.P50), harness.FmtMs(a.P99), a.Dropped, extra,
				harness.FmtRatio(harness.Ratio(a.Rate, mochi.Rate)), harness.FmtRatio(harness.Ratio(a.Rate, mosq.Rate)))
		}
	}
	b.WriteString("\n")
	if _, err := os.Stat(filepath.Join(tp.dir, "throughput.png")); tp.dir == "" || err == nil {
		b.WriteString("![throughput: messages per second per system](throughput.png)\n\n")
	}
	return b.String()
}

// throughputGoal is one set-B goal: luffymq adaptive's rate in test at
// least factor × the reference system's.
type throughputGoal struct {
	test, ref string
	factor    float64
}

var throughputGoalList = []throughputGoal{
	{"shared-qos0", harness.SystemMochi, 0.95}, {"fanout-qos0", harness.SystemMochi, 0.95},
	{"shared-qos1", harness.SystemMosquitto, 0.9}, {"fanout-qos1", harness.SystemMosquitto, 0.9},
}

// Goals evaluates set B's goals, each "not measured" when tp is nil.
func Goals(tp *ThroughputResults) []harness.Goal {
	var gs []harness.Goal
	for _, g := range throughputGoalList {
		text := fmt.Sprintf("throughput %s: luffymq adaptive ≥ %.2f× %s", g.test, g.factor, refName(g.ref))
		if tp == nil {
			gs = append(gs, harness.Goal{Text: text, Status: "not measured", Detail: "run luffy-bench throughput"})
			continue
		}
		ad := throughputAggregate(tp, g.test, "luffymq-adaptive")
		ref := throughputAggregate(tp, g.test, g.ref)
		switch {
		case ad.Runs == 0 || ref.Runs == 0:
			gs = append(gs, harness.Goal{Text: text, Status: "not measured", Detail: "needs luffymq-adaptive and " + g.ref})
		case ad.Stalled > 0:
			gs = append(gs, harness.Goal{Text: text, Status: "missed", Detail: fmt.Sprintf("luffymq adaptive stalled (%d of %d runs)", ad.Stalled, ad.Runs)})
		case math.IsNaN(ref.Rate):
			gs = append(gs, harness.Goal{Text: text, Status: "not measured", Detail: fmt.Sprintf("%s stalled (%d of %d runs); luffymq adaptive %s msgs/s", g.ref, ref.Stalled, ref.Runs, ad.rateText())})
		default:
			r := harness.Ratio(ad.Rate, ref.Rate)
			detail := fmt.Sprintf("%s vs %s msgs/s (%s, medians of %d and %d runs)", ad.rateText(), ref.rateText(), harness.FmtRatio(r), ad.Runs, ref.Runs)
			gs = append(gs, harness.Goal{Text: text, Status: harness.MetIf(r >= g.factor), Detail: detail})
		}
	}
	return gs
}

func refName(system string) string {
	if system == harness.SystemMochi {
		return "vanilla Mochi"
	}
	return "Mosquitto"
}
