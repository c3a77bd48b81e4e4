// Package soak runs `luffy-bench soak`: connections in shared groups with
// churn for a long time against luffymq, recording lost, duplicated,
// latency, RSS and goroutines over time.
package soak

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// Command is the luffy-bench subcommand that runs the soak test.
const Command = "soak"

// SoakConfig configures a soak run: many MQTT connections in shared groups,
// a fixed publish rate of mixed QoS for a long time, members joining,
// leaving and crashing on a schedule.
type SoakConfig struct {
	// Connections is the number of MQTT connections: Publishers publishers,
	// the rest shared-group members spread evenly over Groups groups.
	Connections int
	Groups      int
	Publishers  int
	// Rate is the total publish rate in messages per second.
	Rate float64
	// QoS1Percent of the messages are published at QoS 1, the rest at QoS 0.
	QoS1Percent int
	Duration    time.Duration
	// ChurnEvery is the time between churn events; events alternate
	// between a member leaving (DISCONNECT) and a member crashing (TCP
	// closed without DISCONNECT). Each such member joins again (a new
	// connection with the same client ID and a clean start) RejoinAfter
	// later. 0 disables churn.
	ChurnEvery  time.Duration
	RejoinAfter time.Duration
	// ProcessTime is how long a member holds each message before
	// acknowledging it (paho acknowledges when the handler returns), so
	// members that leave or crash hold unacknowledged messages.
	ProcessTime time.Duration
	// SampleEvery is the time between samples of the time series.
	SampleEvery time.Duration
	// Grace is how long, after publishing ends, the run waits for QoS 1
	// messages acknowledged by the broker and not yet received.
	Grace time.Duration
	// OverdueAfter is the age after which an unreceived message counts as
	// lost in the time series (the final count waits for Grace instead).
	OverdueAfter time.Duration
	// StabilityWindow is the length of the first and last windows whose
	// RSS and goroutine medians are compared (0: min(5 min, Duration/3)).
	StabilityWindow time.Duration
	// Warmup is the start of the publishing phase left out of the
	// comparison: the first window begins after it (negative: none; 0:
	// min(5 min, Duration/6)). The broker's heap grows to its working
	// size there (the GC target, Mochi's per-client buffers).
	Warmup time.Duration
	// LiveHeapEvery is how often the broker's live heap is measured: its
	// heap allocated right after a forced garbage collection, read from
	// /debug/pprof/heap?gc=1 (the broker runs with --pprof); 0 disables.
	// Unlike RSS it does not depend on when the GC last ran, so it shows
	// a leak directly.
	LiveHeapEvery time.Duration
	LuffyMQ       string
	// BrokerArgs are extra flags for luffymq.
	BrokerArgs []string
	Out        string
	Seed       uint64
	Progress   io.Writer
}

// DefaultSoakConfig returns the defaults of `luffy-bench soak` (issue 9:
// 2 000 connections, 20 shared groups, mixed QoS, 30 min at a fixed rate).
func DefaultSoakConfig() SoakConfig {
	return SoakConfig{
		Connections: 2000, Groups: 20, Publishers: 20, Rate: 500, QoS1Percent: 50,
		Duration: 30 * time.Minute, ChurnEvery: time.Second, RejoinAfter: 10 * time.Second, ProcessTime: 100 * time.Millisecond,
		SampleEvery: 5 * time.Second, Grace: 30 * time.Second, OverdueAfter: 10 * time.Second, LiveHeapEvery: time.Minute,
		Out: filepath.Join("bench", "results", "soak"), Seed: 1,
	}
}

func (c SoakConfig) members() int { return c.Connections - c.Publishers }

func (c SoakConfig) validate() error {
	switch {
	case c.Groups < 1:
		return fmt.Errorf("--groups %d: want at least 1", c.Groups)
	case c.Publishers < 1:
		return fmt.Errorf("--publishers %d: want at least 1", c.Publishers)
	case c.members() < 2*c.Groups:
		return fmt.Errorf("--connections %d: want at least publishers + 2 members per group (%d)", c.Connections, c.Publishers+2*c.Groups)
	case c.Rate <= 0 || c.Rate > 100000:
		return fmt.Errorf("--rate %g: want more than 0 and at most 100000 msg/s", c.Rate)
	case c.QoS1Percent < 0 || c.QoS1Percent > 100:
		return fmt.Errorf("--qos1-percent %d: want 0 to 100", c.QoS1Percent)
	case c.Duration < 10*time.Second || c.Duration > 24*time.Hour:
		return fmt.Errorf("--duration %s: want 10s to 24h", c.Duration)
	case c.ChurnEvery < 0 || c.RejoinAfter < 0:
		return errors.New("--churn-every and --rejoin-after must not be negative")
	case c.ProcessTime < 0 || c.ProcessTime > 10*time.Second:
		return fmt.Errorf("--process-time %s: want 0 to 10s", c.ProcessTime)
	case c.SampleEvery < 100*time.Millisecond || c.SampleEvery > c.Duration/2:
		return fmt.Errorf("--sample-every %s: want 100ms to half the duration", c.SampleEvery)
	case c.Grace < 0 || c.OverdueAfter <= 0:
		return errors.New("--grace must not be negative and --overdue-after must be positive")
	case c.Out == "":
		return errors.New("--out DIR is required")
	case c.LiveHeapEvery < 0:
		return errors.New("--live-heap-every must not be negative")
	case c.warmup()+2*c.stabilityWindow() > c.Duration:
		return fmt.Errorf("--warmup %s and two --stability-window %s do not fit in --duration %s", c.warmup(), c.stabilityWindow(), c.Duration)
	}
	return nil
}

func (c SoakConfig) stabilityWindow() time.Duration {
	if c.StabilityWindow > 0 {
		return c.StabilityWindow
	}
	return min(5*time.Minute, c.Duration/3)
}

func (c SoakConfig) warmup() time.Duration {
	switch {
	case c.Warmup < 0:
		return 0
	case c.Warmup > 0:
		return c.Warmup
	}
	return min(5*time.Minute, c.Duration/6)
}

// Main runs `luffy-bench soak` with args (after the subcommand) and
// returns the exit code: 0 when the run completed and lost no QoS 1
// message, 1 otherwise.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := parseSoakFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err == nil {
		cfg.Progress = stdout
		var res *SoakResults
		res, err = RunSoak(ctx, cfg)
		if err == nil && res.Final.LostQoS1 > 0 {
			err = fmt.Errorf("%d QoS 1 messages lost (see %s)", res.Final.LostQoS1, filepath.Join(cfg.Out, "summary.md"))
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "luffy-bench soak:", err)
		return 1
	}
	return 0
}

func parseSoakFlags(args []string, stderr io.Writer) (SoakConfig, error) {
	cfg := DefaultSoakConfig()
	fs := flag.NewFlagSet("luffy-bench soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.Connections, "connections", cfg.Connections, "MQTT connections in all: the publishers plus shared-group members")
	fs.IntVar(&cfg.Groups, "groups", cfg.Groups, "shared groups ($share/gNN/soak/gNN); members are spread evenly over them")
	fs.IntVar(&cfg.Publishers, "publishers", cfg.Publishers, "publisher connections; publisher i publishes to group i mod groups")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "total publish rate, messages per second (fixed schedule)")
	fs.IntVar(&cfg.QoS1Percent, "qos1-percent", cfg.QoS1Percent, "percentage of messages published at QoS 1 (the rest at QoS 0)")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "publishing time")
	fs.DurationVar(&cfg.ChurnEvery, "churn-every", cfg.ChurnEvery, "time between churn events (a member leaves with DISCONNECT, then the next one crashes without it, alternately; 0 disables)")
	fs.DurationVar(&cfg.RejoinAfter, "rejoin-after", cfg.RejoinAfter, "time after which a member that left or crashed joins again")
	fs.DurationVar(&cfg.ProcessTime, "process-time", cfg.ProcessTime, "time a member holds each message before acknowledging it")
	fs.DurationVar(&cfg.SampleEvery, "sample-every", cfg.SampleEvery, "time between samples of the time series")
	fs.DurationVar(&cfg.Grace, "grace", cfg.Grace, "after publishing ends, longest wait for acknowledged QoS 1 messages not yet received")
	fs.DurationVar(&cfg.OverdueAfter, "overdue-after", cfg.OverdueAfter, "in the time series, an acknowledged QoS 1 message unreceived this long counts as lost so far")
	fs.DurationVar(&cfg.StabilityWindow, "stability-window", 0, "length of the first and last windows whose RSS, live heap and goroutine medians are compared (default min(5m, duration/3))")
	fs.DurationVar(&cfg.Warmup, "warmup", 0, "start of the publishing phase left out of that comparison: the first window begins after it (default min(5m, duration/6); negative: none)")
	fs.DurationVar(&cfg.LiveHeapEvery, "live-heap-every", cfg.LiveHeapEvery, "how often to measure the broker's live heap after a forced GC (/debug/pprof/heap?gc=1; adds --pprof to the broker; 0 disables)")
	fs.StringVar(&cfg.LuffyMQ, "luffymq", "", "luffymq binary (default: build ./cmd/luffymq of the current module)")
	var brokerArgs harness.StringList
	fs.Var(&brokerArgs, "broker-arg", "extra flag for luffymq, repeatable (e.g. --broker-arg=--write-timeout=10s)")
	fs.StringVar(&cfg.Out, "out", cfg.Out, "output directory (soak.json, summary.md, PNG plots, broker.log)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the churn schedule's choices")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg.BrokerArgs = brokerArgs
	return cfg, cfg.validate()
}

// soakRun is the state of one soak run.
type soakRun struct {
	cfg     SoakConfig
	addr    string
	tracker *soakTracker
	members []*soakMember
	rng     *rand.Rand

	connected    atomic.Int64 // members connected now
	joins        atomic.Int64
	leaves       atomic.Int64
	crashes      atomic.Int64
	churnHeld    atomic.Int64 // leaves and crashes of members holding unacknowledged messages
	unexpected   atomic.Int64 // member connections that ended without our doing
	joinFailures atomic.Int64
	pubReconn    atomic.Int64
	lateSlots    atomic.Int64 // publish slots sent more than 1 s late
	maxLagNs     atomic.Int64
}

// soakMember is one shared-group member connection.
type soakMember struct {
	run   *soakRun
	id    string
	group int

	mu      sync.Mutex
	client  *paho.Client
	conn    net.Conn
	online  bool
	leaving bool // we are ending this connection on purpose
	gen     int  // connection generation, so a stale error does not count

	// holding counts messages received and not yet acknowledged.
	holding atomic.Int32
}

func soakGroupName(g int) string   { return fmt.Sprintf("g%02d", g) }
func soakTopic(g int) string       { return "soak/" + soakGroupName(g) }
func soakShareFilter(g int) string { return "$share/" + soakGroupName(g) + "/" + soakTopic(g) }

// soakReceiveMaximum is the Receive Maximum every soak client announces.
// paho sizes a buffered channel of each client by it: at MQTT's default
// (65 535) that is 512 KiB per connection, 1 GiB for 2 000 connections.
const soakReceiveMaximum uint16 = 64

// soakDial opens an MQTT v5 connection (clean start, session expiry 0,
// keep-alive 60 s, Receive Maximum soakReceiveMaximum) and returns the
// client and its TCP connection.
func soakDial(ctx context.Context, addr, id string, cc paho.ClientConfig) (*paho.Client, net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	cc.ClientID, cc.Conn = id, conn
	c := paho.NewClient(cc)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rm := soakReceiveMaximum
	ca, err := c.Connect(cctx, &paho.Connect{ClientID: id, KeepAlive: 60, CleanStart: true,
		Properties: &paho.ConnectProperties{ReceiveMaximum: &rm}})
	if err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("connect %s: %w", id, err)
	}
	if ca.ReasonCode != 0 {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("connect %s: reason code 0x%02x", id, ca.ReasonCode)
	}
	return c, conn, nil
}

// join connects the member and subscribes it to its group.
func (m *soakMember) join(ctx context.Context) error {
	m.mu.Lock()
	m.gen++
	gen := m.gen
	m.mu.Unlock()
	onPublish := func(pr paho.PublishReceived) (bool, error) {
		m.run.tracker.receive(pr.Packet.Payload, m.group, time.Now())
		if pt := m.run.cfg.ProcessTime; pt > 0 && pr.Packet.QoS > 0 {
			m.holding.Add(1)
			time.Sleep(pt) // paho acknowledges when this returns
			m.holding.Add(-1)
		}
		return true, nil
	}
	cc := paho.ClientConfig{
		OnPublishReceived:  []func(paho.PublishReceived) (bool, error){onPublish},
		OnClientError:      func(error) { m.ended(gen) },
		OnServerDisconnect: func(*paho.Disconnect) { m.ended(gen) },
	}
	c, conn, err := soakDial(ctx, m.run.addr, m.id, cc)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sa, err := c.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: soakShareFilter(m.group), QoS: 1}}})
	if err == nil && len(sa.Reasons) > 0 && sa.Reasons[0] >= 0x80 {
		err = fmt.Errorf("reason code 0x%02x", sa.Reasons[0])
	}
	if err != nil {
		_ = conn.Close()
		return fmt.Errorf("subscribe %s: %w", m.id, err)
	}
	m.mu.Lock()
	m.client, m.conn, m.online, m.leaving = c, conn, true, false
	m.mu.Unlock()
	m.run.connected.Add(1)
	return nil
}

// ended is called when a connection of generation gen ends; one we did
// not end ourselves counts as unexpected and the member is marked
// offline, for the churn loop to bring back.
func (m *soakMember) ended(gen int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if gen != m.gen || !m.online || m.leaving {
		return
	}
	m.online = false
	m.run.connected.Add(-1)
	m.run.unexpected.Add(1)
	_ = m.conn.Close()
}

// leave ends the member's connection: with a DISCONNECT, or, when crash is
// true, by closing the TCP connection without one. It returns false if the
// member was not online.
func (m *soakMember) leave(crash bool) bool {
	m.mu.Lock()
	if !m.online {
		m.mu.Unlock()
		return false
	}
	m.online, m.leaving = false, true
	c, conn := m.client, m.conn
	m.mu.Unlock()
	m.run.connected.Add(-1)
	if crash {
		_ = conn.Close()
	} else {
		_ = c.Disconnect(&paho.Disconnect{ReasonCode: 0})
	}
	return true
}

func (m *soakMember) isOnline() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.online
}

// connectMembers joins every member, a few at a time.
func (r *soakRun) connectMembers(ctx context.Context) error {
	const parallel = 8
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	var firstErr error
	var errMu sync.Mutex
	for _, m := range r.members {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := m.join(ctx); err != nil {
				errMu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				errMu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// publisher publishes to group on a fixed drift-free schedule from start
// until end: slot k is at start + offset + k·interval. A late slot is sent
// at once (the schedule catches up); a broken connection is redialled.
func (r *soakRun) publisher(ctx context.Context, idx, group int, start, end time.Time, offset, interval time.Duration) {
	id := fmt.Sprintf("soak-pub-%03d", idx)
	topic := soakTopic(group)
	var c *paho.Client
	dial := func() bool {
		for ctx.Err() == nil && time.Now().Before(end) {
			cl, _, err := soakDial(ctx, r.addr, id, paho.ClientConfig{})
			if err == nil {
				c = cl
				return true
			}
			time.Sleep(500 * time.Millisecond)
		}
		return false
	}
	if !dial() {
		return
	}
	defer func() { _ = c.Disconnect(&paho.Disconnect{}) }()
	payload := make([]byte, soakPayloadSize)
	pub := &paho.Publish{Topic: topic}
	for k := 0; ; k++ {
		slot := start.Add(offset + time.Duration(k)*interval)
		if !slot.Before(end) || ctx.Err() != nil {
			return
		}
		if d := time.Until(slot); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		} else if -d > time.Second {
			r.lateSlots.Add(1)
		}
		r.noteLag(time.Since(slot))
		seq, ok := r.tracker.reserve(group)
		if !ok {
			return
		}
		qos := r.tracker.qosOf(seq)
		encodeSoakPayload(payload, seq, time.Now(), group, qos)
		pub.QoS, pub.Payload = qos, payload
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := c.Publish(pctx, pub)
		cancel()
		r.tracker.publishDone(seq, time.Now(), err)
		if err != nil {
			select {
			case <-c.Done():
				r.pubReconn.Add(1)
				if !dial() {
					return
				}
			default:
			}
		}
	}
}

// noteLag keeps the largest publisher lag behind its schedule.
func (r *soakRun) noteLag(lag time.Duration) {
	for {
		cur := r.maxLagNs.Load()
		if int64(lag) <= cur || r.maxLagNs.CompareAndSwap(cur, int64(lag)) {
			return
		}
	}
}

// churn makes members leave and crash alternately every cfg.ChurnEvery
// and brings each back RejoinAfter later, along with any member whose
// connection ended unexpectedly, until stop closes. It prefers members
// holding unacknowledged QoS 1 messages (up to 20 random draws), so churn
// exercises re-dispatch; withHeld counts the events that hit one.
func (r *soakRun) churn(ctx context.Context, stop <-chan struct{}) {
	type rejoin struct {
		at time.Time
		m  *soakMember
	}
	var due []rejoin
	pending := map[*soakMember]bool{}
	t := time.NewTicker(r.cfg.ChurnEvery)
	defer t.Stop()
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-t.C:
		}
		now := time.Now()
		// Members whose connection ended without our doing come back too.
		for _, m := range r.members {
			if !pending[m] && !m.isOnline() {
				pending[m] = true
				due = append(due, rejoin{now.Add(r.cfg.RejoinAfter), m})
			}
		}
		kept := due[:0]
		for _, d := range due {
			if now.Before(d.at) {
				kept = append(kept, d)
				continue
			}
			jctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			err := d.m.join(jctx)
			cancel()
			if err != nil {
				r.joinFailures.Add(1)
				kept = append(kept, rejoin{now.Add(time.Second), d.m})
				continue
			}
			delete(pending, d.m)
			r.joins.Add(1)
		}
		due = kept
		crash := k%2 == 1
		var victim, fallback *soakMember
		for range 20 {
			m := r.members[r.rng.IntN(len(r.members))]
			if pending[m] || !m.isOnline() {
				continue
			}
			if m.holding.Load() > 0 {
				victim = m
				break
			}
			if fallback == nil {
				fallback = m
			}
		}
		if victim != nil {
			r.churnHeld.Add(1)
		} else {
			victim = fallback
		}
		if victim == nil || !victim.leave(crash) {
			continue
		}
		if crash {
			r.crashes.Add(1)
		} else {
			r.leaves.Add(1)
		}
		pending[victim] = true
		due = append(due, rejoin{now.Add(r.cfg.RejoinAfter), victim})
	}
}

// closeAll ends every member connection with a DISCONNECT.
func (r *soakRun) closeAll() {
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for _, m := range r.members {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			m.leave(false)
		}()
	}
	wg.Wait()
}
