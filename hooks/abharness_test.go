package hooks_test

// An in-process A/B harness: the same MQTT workload against vanilla Mochi
// MQTT and against Mochi with what LuffyMQ adds to it (the selection and
// publisher pacing hooks and the listener wrapper that lifts load reports
// off extended PINGREQs).
// Clients are paho.golang MQTT v5 clients over loopback TCP. The harness
// uses only exported APIs, so it keeps compiling while the internals of
// hooks/ and scoring/ change.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/broker"
	"github.com/luffymq/luffymq/broker/pingreq"
	"github.com/luffymq/luffymq/clientsdk/report"
	"github.com/luffymq/luffymq/hooks"
	"github.com/luffymq/luffymq/scoring"
)

// Systems and patterns compared by the harness.
const (
	abVanilla = "vanilla"
	abLuffyMQ = "luffymq"
	// abBroker is the luffymq broker itself (broker.New with the luffymq
	// binary's default flags): every hook and listener it adds, not only
	// the selection's.
	abBroker = "luffymq-broker"

	abFanout = "fanout"
	abShared = "shared"
)

var (
	abSystems  = []string{abVanilla, abLuffyMQ, abBroker}
	abPatterns = []string{abFanout, abShared}
	abQoS      = []byte{0, 1}
)

const (
	abSubscribers  = 3
	abPayloadSize  = 100
	abFanoutTopic  = "bench/fan"
	abSharedTopic  = "bench/shared"
	abSharedFilter = "$share/g/" + abSharedTopic

	// At QoS 1 a publish waits for its PUBACK, so one synchronous
	// publisher measures round trips rather than the broker. abPublishers
	// clients with abPublishWorkers goroutines each keep
	// abPublishers*abPublishWorkers publishes outstanding.
	abPublishers     = 4
	abPublishWorkers = 8

	// abStallAfter is how long deliveries may stop growing before a run
	// is declared stalled.
	abStallAfter = 10 * time.Second
	// abPoll is how often the waiter re-reads the server's drop counters
	// (deliveries wake it at once).
	abPoll = 2 * time.Millisecond
	// abShutdown bounds each step of stopping clients and the server.
	abShutdown = 5 * time.Second
)

// abConfig is one combination of the A/B matrix.
type abConfig struct {
	System   string // abVanilla, abLuffyMQ or abBroker
	Pattern  string // abFanout or abShared
	QoS      byte
	Messages int
}

func (c abConfig) String() string {
	return fmt.Sprintf("%s/%s/qos%d", c.System, c.Pattern, c.QoS)
}

func (c abConfig) topic() string {
	if c.Pattern == abShared {
		return abSharedTopic
	}
	return abFanoutTopic
}

func (c abConfig) filter() string {
	if c.Pattern == abShared {
		return abSharedFilter
	}
	return abFanoutTopic
}

// expected is the number of deliveries the run waits for when nothing is
// dropped: every subscriber gets every message in fan-out, one member of
// the group gets each message when shared.
func (c abConfig) expected() int64 {
	if c.Pattern == abShared {
		return int64(c.Messages)
	}
	return int64(c.Messages) * abSubscribers
}

// abResult is what one publish-and-wait produced.
type abResult struct {
	Elapsed   time.Duration
	Delivered int64
	// Drops counts deliveries Mochi gave up on: MessagesDropped (a
	// client's outbound queue was full) plus InflightDropped (a client's
	// in-flight store was full or out of packet IDs).
	Drops int64
	Stray int64 // deliveries the harness cannot attribute to a message
}

// abRun is a started broker with connected, subscribed clients, ready to
// publish cfg.Messages messages once.
type abRun struct {
	tb  testing.TB
	cfg abConfig

	server *mqtt.Server
	broker *broker.Broker // abBroker: the broker that runs server
	addr   string

	subs []*paho.Client
	pubs []*paho.Client
	// conns are every client's connection, closed if a client will not
	// disconnect in time.
	conns []net.Conn

	payloads [][]byte

	// counts[s][i] is how often subscriber s received message i.
	counts    [][]atomic.Int32
	delivered atomic.Int64
	stray     atomic.Int64
	// target is the delivery count at which a subscriber wakes the
	// waiter; the waiter lowers it as drops are counted.
	target   atomic.Int64
	progress chan struct{}

	baseDrops int64

	ctx       context.Context
	cancel    context.CancelFunc
	next      atomic.Int64 // next message index to publish (QoS 1)
	pubWG     sync.WaitGroup
	pubDone   chan struct{}
	pubErrMu  sync.Mutex
	pubErr    error
	start     time.Time // first publish
	closeOnce sync.Once
}

// newABRun starts the broker for cfg, connects and subscribes the
// subscribers and connects the publishers. Everything is stopped by a
// cleanup registered on tb.
func newABRun(tb testing.TB, cfg abConfig) *abRun {
	tb.Helper()
	require.Positive(tb, cfg.Messages)
	ctx, cancel := context.WithCancel(context.Background())
	r := &abRun{
		tb:       tb,
		cfg:      cfg,
		progress: make(chan struct{}, 1),
		ctx:      ctx,
		cancel:   cancel,
		pubDone:  make(chan struct{}),
	}
	tb.Cleanup(r.close)
	r.startServer()

	r.counts = make([][]atomic.Int32, abSubscribers)
	for s := range r.counts {
		r.counts[s] = make([]atomic.Int32, cfg.Messages)
	}
	r.target.Store(cfg.expected())

	// One backing array for every payload, allocated before the timed
	// part: each payload starts with its message index.
	buf := make([]byte, cfg.Messages*abPayloadSize)
	for i := range buf {
		buf[i] = 'x'
	}
	r.payloads = make([][]byte, cfg.Messages)
	for i := range r.payloads {
		p := buf[i*abPayloadSize : (i+1)*abPayloadSize : (i+1)*abPayloadSize]
		binary.BigEndian.PutUint64(p, uint64(i))
		r.payloads[i] = p
	}

	for s := range abSubscribers {
		cl := r.connect(fmt.Sprintf("sub-%d", s), r.onPublish(s))
		r.subs = append(r.subs, cl)
		sctx, scancel := context.WithTimeout(ctx, abShutdown)
		ack, err := cl.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: cfg.filter(), QoS: cfg.QoS}}})
		scancel()
		require.NoError(tb, err, "subscribing sub-%d to %s", s, cfg.filter())
		require.Len(tb, ack.Reasons, 1)
		require.Equal(tb, cfg.QoS, ack.Reasons[0], "granted QoS for sub-%d", s)
	}
	publishers := 1
	if cfg.QoS > 0 {
		publishers = abPublishers
	}
	for p := range publishers {
		r.pubs = append(r.pubs, r.connect(fmt.Sprintf("pub-%d", p), nil))
	}
	r.baseDrops = r.serverDrops()
	return r
}

// startServer builds the broker as broker.New does for its system: Mochi
// with default options and allow-all authentication; for LuffyMQ the
// selection and publisher pacing hooks go before the allow hook and the
// TCP listener is wrapped by the PINGREQ reader.
func (r *abRun) startServer() {
	tb := r.tb
	tb.Helper()
	if r.cfg.System == abBroker {
		r.startBroker()
		return
	}
	server := mqtt.New(&mqtt.Options{
		InlineClient: false,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if r.cfg.System == abLuffyMQ {
		eng, err := scoring.NewEngine(scoring.Config{Strategy: "adaptive"})
		require.NoError(tb, err)
		sel, err := hooks.NewSelectionHook(hooks.SelectionConfig{Engine: eng, Server: server, ReportInterval: time.Second})
		require.NoError(tb, err)
		require.NoError(tb, server.AddHook(sel, nil))
		// Publisher pacing, as broker.New adds it: before the hook
		// that answers ACL checks.
		pacing, err := hooks.NewPacingHook(hooks.PacingConfig{Server: server})
		require.NoError(tb, err)
		require.NoError(tb, server.AddHook(pacing, nil))
	} else {
		require.Equal(tb, abVanilla, r.cfg.System, "unknown system")
	}
	require.NoError(tb, server.AddHook(new(auth.AllowHook), nil))

	// Port 0: Mochi's TCP listener binds in AddListener (Init) and then
	// reports the port it got, so there is no window in which another
	// process could take a port found free beforehand.
	tcp := listeners.NewTCP(listeners.Config{ID: "ab", Address: "127.0.0.1:0"})
	var l listeners.Listener = tcp
	if r.cfg.System == abLuffyMQ {
		l = pingreq.WrapListener(tcp, report.MaxPayload)
	}
	require.NoError(tb, server.AddListener(l))
	require.NoError(tb, server.Serve())
	r.server = server
	r.addr = tcp.Address()
}

// startBroker starts the luffymq broker as the binary does with its
// default flags, on free loopback ports, quiet.
func (r *abRun) startBroker() {
	tb := r.tb
	tb.Helper()
	cfg, err := broker.ConfigFromArgs([]string{"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log-level", "error"}, io.Discard, io.Discard)
	require.NoError(tb, err)
	b, err := broker.New(cfg)
	require.NoError(tb, err)
	require.NoError(tb, b.Start())
	r.broker = b // closed by close
	r.server = b.Server()
	r.addr = b.MQTTAddr()
}

// connect connects an MQTT v5 paho client with paho's defaults: QoS 1
// deliveries are acknowledged as soon as onPublish returns, and CONNECT
// carries no Receive Maximum. Mochi then keeps no send quota for the
// client (its quota is the announced Receive Maximum, 0 when absent), so
// vanilla Mochi never takes the path through Inflight.NextImmediate that
// deadlocks Mochi 2.7.9 under QoS 1 load (the LuffyMQ hook turns that
// quota off in OnSessionEstablished). Both systems therefore send QoS 1
// deliveries the same way. A subscriber that announces a Receive Maximum
// (8192 after Mochi's cap, or 100) makes vanilla Mochi stall in the QoS 1
// runs: the harness then fails the run after abStallAfter.
func (r *abRun) connect(clientID string, onPublish func(paho.PublishReceived) (bool, error)) *paho.Client {
	tb := r.tb
	tb.Helper()
	conn, err := net.DialTimeout("tcp", r.addr, abShutdown)
	require.NoError(tb, err)
	r.conns = append(r.conns, conn)
	cfg := paho.ClientConfig{ClientID: clientID, Conn: conn}
	if onPublish != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){onPublish}
	}
	cl := paho.NewClient(cfg)
	ctx, cancel := context.WithTimeout(r.ctx, abShutdown)
	defer cancel()
	ack, err := cl.Connect(ctx, &paho.Connect{ClientID: clientID, KeepAlive: 30, CleanStart: true})
	require.NoError(tb, err, "connecting %s", clientID)
	require.Equal(tb, byte(0), ack.ReasonCode, "CONNACK for %s", clientID)
	return cl
}

// onPublish returns subscriber s's message handler.
func (r *abRun) onPublish(s int) func(paho.PublishReceived) (bool, error) {
	topic := r.cfg.topic()
	return func(pr paho.PublishReceived) (bool, error) {
		pk := pr.Packet
		if pk.Topic != topic || len(pk.Payload) != abPayloadSize {
			r.stray.Add(1)
			r.wake()
			return true, nil
		}
		i := binary.BigEndian.Uint64(pk.Payload)
		if i >= uint64(len(r.counts[s])) {
			r.stray.Add(1)
			r.wake()
			return true, nil
		}
		r.counts[s][i].Add(1)
		if r.delivered.Add(1) >= r.target.Load() {
			r.wake()
		}
		return true, nil
	}
}

// wake wakes the waiter without blocking.
func (r *abRun) wake() {
	select {
	case r.progress <- struct{}{}:
	default:
	}
}

func (r *abRun) serverDrops() int64 {
	return atomic.LoadInt64(&r.server.Info.MessagesDropped) + atomic.LoadInt64(&r.server.Info.InflightDropped)
}

func (r *abRun) setPubErr(err error) {
	r.pubErrMu.Lock()
	defer r.pubErrMu.Unlock()
	if r.pubErr == nil {
		r.pubErr = err
	}
}

func (r *abRun) publishErr() error {
	r.pubErrMu.Lock()
	defer r.pubErrMu.Unlock()
	return r.pubErr
}

// publish starts publishing every message and returns at once. At QoS 0
// one publisher sends them in order from one goroutine; at QoS 1 every
// publisher's workers take the next message until none is left.
func (r *abRun) publish() {
	topic, qos := r.cfg.topic(), r.cfg.QoS
	r.start = time.Now()
	send := func(cl *paho.Client, i int) bool {
		_, err := cl.Publish(r.ctx, &paho.Publish{Topic: topic, QoS: qos, Payload: r.payloads[i]})
		if err != nil {
			if r.ctx.Err() == nil {
				r.setPubErr(fmt.Errorf("publishing message %d from %s: %w", i, cl.ClientID(), err))
			}
			return false
		}
		return true
	}
	if qos == 0 {
		r.pubWG.Go(func() {
			for i := range r.payloads {
				if !send(r.pubs[0], i) {
					return
				}
			}
		})
	} else {
		n := int64(len(r.payloads))
		for _, cl := range r.pubs {
			for range abPublishWorkers {
				r.pubWG.Go(func() {
					for {
						i := r.next.Add(1) - 1
						if i >= n || !send(cl, int(i)) {
							return
						}
					}
				})
			}
		}
	}
	go func() {
		r.pubWG.Wait()
		close(r.pubDone)
	}()
}

// wait, after publish, returns when the publishers have finished and every expected
// delivery has arrived or been dropped by the server. It returns an error
// if a publish failed, if the deliveries stop growing for abStallAfter,
// or if more arrived than expected.
func (r *abRun) wait() (abResult, error) {
	expected := r.cfg.expected()
	start := r.start
	tick := time.NewTicker(abPoll)
	defer tick.Stop()
	pubDone := r.pubDone
	published := false
	lastSeen, lastChange := int64(-1), start
	for {
		delivered, drops := r.delivered.Load(), r.serverDrops()-r.baseDrops
		res := abResult{Elapsed: time.Since(start), Delivered: delivered, Drops: drops, Stray: r.stray.Load()}
		if err := r.publishErr(); err != nil {
			return res, err
		}
		if published && delivered+drops >= expected {
			if delivered+drops > expected || res.Stray > 0 {
				return res, fmt.Errorf("%s: %d delivered + %d dropped > %d expected (%d stray)", r.cfg, delivered, drops, expected, res.Stray)
			}
			return res, nil
		}
		r.target.Store(expected - drops)
		if seen := delivered + drops + res.Stray; seen != lastSeen {
			lastSeen, lastChange = seen, time.Now()
		} else if time.Since(lastChange) >= abStallAfter {
			return res, fmt.Errorf("%s stalled: %d of %d deliveries arrived, %d dropped, publishers done: %t; nothing for %s",
				r.cfg, delivered, expected, drops, published, abStallAfter)
		}
		select {
		case <-r.progress:
		case <-tick.C:
		case <-pubDone:
			published, pubDone = true, nil
		}
	}
}

// missing checks every message reached every subscriber once (fan-out)
// or exactly one member of the group (shared) and describes the first
// few that did not.
func (r *abRun) missing() []string {
	var bad []string
	note := func(format string, args ...any) {
		if len(bad) < 10 {
			bad = append(bad, fmt.Sprintf(format, args...))
		}
	}
	for i := range r.cfg.Messages {
		if r.cfg.Pattern == abShared {
			total := int32(0)
			for s := range r.counts {
				total += r.counts[s][i].Load()
			}
			if total != 1 {
				note("message %d reached %d members of the group", i, total)
			}
			continue
		}
		for s := range r.counts {
			if n := r.counts[s][i].Load(); n != 1 {
				note("message %d reached sub-%d %d times", i, s, n)
			}
		}
	}
	return bad
}

// perSubscriber returns how many deliveries each subscriber received.
func (r *abRun) perSubscriber() []int64 {
	out := make([]int64, len(r.counts))
	for s := range r.counts {
		for i := range r.counts[s] {
			out[s] += int64(r.counts[s][i].Load())
		}
	}
	return out
}

// close stops the publishers, disconnects every client, then the server.
// Every step is bounded, so a wedged broker cannot hang the test binary.
// As broker.Broker.Close does, clients are gone before Mochi's Close,
// which can otherwise deadlock with a client removing itself.
func (r *abRun) close() {
	r.closeOnce.Do(func() {
		r.cancel()
		clients := append(append([]*paho.Client(nil), r.pubs...), r.subs...)
		var wg sync.WaitGroup
		for _, cl := range clients {
			wg.Go(func() { _ = cl.Disconnect(&paho.Disconnect{ReasonCode: 0}) })
		}
		if !waitTimeout(&wg, abShutdown) {
			// A client blocked writing to a broker that stopped reading:
			// closing its connection unblocks it.
			for _, c := range r.conns {
				_ = c.Close()
			}
			if !waitTimeout(&wg, abShutdown) {
				r.tb.Errorf("%s: paho clients did not stop within %s", r.cfg, 2*abShutdown)
			}
		}
		for _, c := range r.conns {
			_ = c.Close() // clients that never got as far as Connect
		}
		if !waitTimeout(&r.pubWG, abShutdown) {
			r.tb.Errorf("%s: publishers did not stop within %s", r.cfg, abShutdown)
		}
		if r.server == nil {
			return
		}
		for _, cl := range r.server.Clients.GetAll() {
			cl.Stop(errABClosing)
		}
		if !waitTimeout(&r.server.Listeners.ClientsWg, abShutdown) {
			r.tb.Errorf("%s: broker clients did not finish within %s", r.cfg, abShutdown)
			return // Close would wait for them too
		}
		done := make(chan error, 1)
		go func() {
			if r.broker != nil {
				done <- r.broker.Close() // closes its Mochi server too
				return
			}
			done <- r.server.Close()
		}()
		select {
		case err := <-done:
			if err != nil {
				r.tb.Errorf("%s: closing the broker: %v", r.cfg, err)
			}
		case <-time.After(abShutdown):
			r.tb.Errorf("%s: the broker did not close within %s", r.cfg, abShutdown)
		}
	})
}

var errABClosing = errors.New("a/b run finished")

// waitTimeout waits for wg at most d and says whether it finished.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// TestABHarnessDeliversEverything runs every combination of the A/B
// benchmark with a few messages and checks that each was delivered
// exactly once to each expected receiver.
func TestABHarnessDeliversEverything(t *testing.T) {
	const messages = 200
	base := runtime.NumGoroutine()
	for _, system := range abSystems {
		for _, pattern := range abPatterns {
			for _, qos := range abQoS {
				cfg := abConfig{System: system, Pattern: pattern, QoS: qos, Messages: messages}
				t.Run(cfg.String(), func(t *testing.T) {
					r := newABRun(t, cfg)
					r.publish()
					res, err := r.wait()
					require.NoError(t, err)
					require.Zero(t, res.Drops, "the broker dropped deliveries")
					require.Zero(t, res.Stray, "deliveries not sent by the harness")
					require.Equal(t, cfg.expected(), res.Delivered)
					require.Empty(t, r.missing())
					t.Logf("%s: %d deliveries in %s, per subscriber %v", cfg, res.Delivered, res.Elapsed, r.perSubscriber())
				})
			}
		}
	}
	if !t.Failed() {
		requireNoGoroutineLeak(t, base)
	}
}

// requireNoGoroutineLeak waits, at most abShutdown, until no more than
// base goroutines are left, and otherwise fails with their stacks.
func requireNoGoroutineLeak(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(abShutdown)
	tick := time.NewTicker(abPoll)
	defer tick.Stop()
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		<-tick.C
	}
	if n := runtime.NumGoroutine(); n > base {
		var stacks strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		t.Fatalf("%d goroutines left, %d before the runs:\n%s", n, base, stacks.String())
	}
}
