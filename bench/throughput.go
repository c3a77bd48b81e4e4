package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"

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
var ThroughputSystems = []string{"luffymq-adaptive", "luffymq-round-robin", SystemMochi, SystemMosquitto}

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
}

// ThroughputRun is one measurement.
type ThroughputRun struct {
	Test      string  `json:"test"`
	System    string  `json:"system"`
	Repeat    int     `json:"repeat"`
	Expected  int     `json:"expected"`
	Delivered int     `json:"delivered"`
	Dropped   int     `json:"dropped"`
	Seconds   float64 `json:"seconds"`
	MsgsPerS  float64 `json:"msgs_per_sec"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	TimedOut  bool    `json:"timed_out,omitempty"`
	Error     string  `json:"error,omitempty"`
}

// ThroughputResults is throughput.json.
type ThroughputResults struct {
	Generated time.Time        `json:"generated"`
	Machine   MachineInfo      `json:"machine"`
	Config    ThroughputConfig `json:"config"`
	Runs      []ThroughputRun  `json:"runs"`

	dir string // where it was read from
}

func loadThroughput(path string) (*ThroughputResults, error) {
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

// runThroughput measures one test on one running broker.
func runThroughput(ctx context.Context, t ThroughputTest, system string, repeat int, addr string, cfg ThroughputConfig, logger *slog.Logger) ThroughputRun {
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
		if _, sent, ok := decodePayload(payload); ok {
			latMu.Lock()
			lats = append(lats, ms(now.Sub(sent)))
			latMu.Unlock()
		}
		delivered.Add(1)
		lastRecv.Store(now.UnixNano())
	}
	var closers []func()
	defer func() {
		// A wedged broker (Mochi 2.7.9 can deadlock on a client's in-flight
		// lock under QoS 1 load) must not hang the whole benchmark.
		closed := within(cleanupTimeout, func() {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		})
		if !closed {
			logger.Warn("clients did not close in time; abandoning them", "timeout", cleanupTimeout)
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
					if _, err := c.Publish(rctx, &paho.Publish{Topic: topic, QoS: t.QoS, Payload: encodePayload(0, time.Now())}); err != nil {
						pubErrs.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	// Wait for deliveries: all expected, or nothing new for 2 s, or timeout.
	last := delivered.Load()
	idle := time.Now()
	for delivered.Load() < int64(run.Expected) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		if n := delivered.Load(); n != last {
			last, idle = n, time.Now()
		} else if time.Since(idle) > 2*time.Second {
			break
		}
	}
	run.TimedOut = time.Now().After(deadline)
	run.Delivered = int(delivered.Load())
	run.Dropped = run.Expected - run.Delivered
	end := time.Unix(0, lastRecv.Load())
	run.Seconds = end.Sub(start).Seconds()
	if run.Seconds > 0 {
		run.MsgsPerS = float64(run.Delivered) / run.Seconds
	}
	latMu.Lock()
	st := Summarise(lats)
	latMu.Unlock()
	run.P50Ms, run.P99Ms = st.P50, st.P99
	if n := pubErrs.Load(); n > 0 {
		run.Error = fmt.Sprintf("%d publishes failed", n)
	}
	return run
}

// pahoConnect opens a plain MQTT v5 client connection.
func pahoConnect(ctx context.Context, addr, id string, onPublish func(paho.PublishReceived) (bool, error)) (*paho.Client, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	cfg := paho.ClientConfig{ClientID: id, Conn: conn}
	if onPublish != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){onPublish}
	}
	c := paho.NewClient(cfg)
	rm := uint16(65535)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ca, err := c.Connect(cctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true,
		Properties: &paho.ConnectProperties{ReceiveMaximum: &rm, RequestProblemInfo: true}})
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	if ca.ReasonCode != 0 {
		_ = conn.Close()
		return nil, fmt.Errorf("connect to %s: reason code %d", addr, ca.ReasonCode)
	}
	return c, nil
}

// throughputAggregate returns the median msgs/s, p50, p99 and the summed
// drops of a test on a system.
func throughputAggregate(tp *ThroughputResults, test, system string) (rate, p50, p99 float64, dropped, runs int, errs []string) {
	var r, a, b []float64
	for _, x := range tp.Runs {
		if x.Test != test || x.System != system {
			continue
		}
		runs++
		if x.Error != "" {
			errs = append(errs, x.Error)
		}
		r = append(r, x.MsgsPerS)
		a = append(a, x.P50Ms)
		b = append(b, x.P99Ms)
		dropped += x.Dropped
	}
	return Median(r), Median(a), Median(b), dropped, runs, errs
}

func throughputMarkdown(tp *ThroughputResults) string {
	var b strings.Builder
	c := tp.Config
	fmt.Fprintf(&b, "## Throughput (set B)\n\n%d publishers × %d messages (shared) / %d messages (fan-out) of %d B → a shared group of %d members that ack immediately (LuffyMQ SDK subscribers), or %d plain subscribers (fan-out); QoS 1 publishers keep %d publishes in flight each. Medians of %d runs; msgs/s = messages delivered ÷ (last delivery − first publish); latency is end to end. Raw runs: `throughput.json`.\n\n",
		c.Publishers, c.SharedMessages, c.FanoutMessages, PayloadSize, c.Members, c.Members, c.InFlight, c.Repeat)
	b.WriteString("| test | system | msgs/s | p50 ms | p99 ms | dropped (all runs) | ÷ Mochi | ÷ Mosquitto |\n|---|---|---|---|---|---|---|---|\n")
	for _, t := range ThroughputTests {
		mochi, _, _, _, _, _ := throughputAggregate(tp, t.ID, SystemMochi)
		mosq, _, _, _, _, _ := throughputAggregate(tp, t.ID, SystemMosquitto)
		for _, s := range ThroughputSystems {
			rate, p50, p99, dropped, runs, errs := throughputAggregate(tp, t.ID, s)
			if runs == 0 {
				continue
			}
			extra := ""
			if len(errs) > 0 {
				extra = " ⚠ " + errs[0]
			}
			fmt.Fprintf(&b, "| %s | %s | %.0f | %s | %s | %d%s | %s | %s |\n", t.ID, s, rate, fmtMs(p50), fmtMs(p99), dropped, extra,
				fmtRatio(Ratio(rate, mochi)), fmtRatio(Ratio(rate, mosq)))
		}
	}
	b.WriteString("\n")
	if _, err := os.Stat(filepath.Join(tp.dir, "throughput.png")); tp.dir == "" || err == nil {
		b.WriteString("![throughput: messages per second per system](throughput.png)\n\n")
	}
	return b.String()
}

func throughputGoals(tp *ThroughputResults) []goal {
	if tp == nil {
		return []goal{{Text: "throughput: luffymq adaptive ≥ 95 % of vanilla Mochi and ≥ Mosquitto in shared fan-in (QoS 0 and 1)", Status: "not measured", Detail: "run luffy-bench throughput"}}
	}
	var gs []goal
	for _, test := range []string{"shared-qos0", "shared-qos1"} {
		ad, _, _, _, n, _ := throughputAggregate(tp, test, "luffymq-adaptive")
		mochi, _, _, _, _, _ := throughputAggregate(tp, test, SystemMochi)
		mosq, _, _, _, _, _ := throughputAggregate(tp, test, SystemMosquitto)
		if n == 0 || math.IsNaN(mochi) || math.IsNaN(mosq) {
			gs = append(gs, goal{Text: "throughput " + test, Status: "not measured", Detail: "needs luffymq-adaptive, mochi and mosquitto"})
			continue
		}
		gs = append(gs, goal{fmt.Sprintf("throughput %s: luffymq adaptive ≥ 95 %% of vanilla Mochi", test), metIf(ad >= 0.95*mochi),
			fmt.Sprintf("%.0f vs %.0f msgs/s (%.0f %%)", ad, mochi, 100*ad/mochi)})
		gs = append(gs, goal{fmt.Sprintf("throughput %s: luffymq adaptive ≥ Mosquitto", test), metIf(ad >= mosq),
			fmt.Sprintf("%.0f vs %.0f msgs/s (%.0f %%)", ad, mosq, 100*ad/mosq)})
	}
	return gs
}

// cleanupTimeout bounds closing the clients and the broker of one run.
const cleanupTimeout = 10 * time.Second

// within runs fn and reports whether it returned within d; if not, fn is
// left running in the background.
func within(d time.Duration, fn func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-done:
		return true
	case <-timer.C:
		return false
	}
}
