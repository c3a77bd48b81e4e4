package reliability

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// Modes of stuck-subscriber.
const (
	// StuckFanout: the stuck and the healthy subscriber both subscribe to
	// the topic; every message is owed to each.
	StuckFanout = "fanout"
	// StuckShared: the stuck and the healthy subscriber are the two
	// members of a shared group.
	StuckShared = "shared"
)

// StuckRun is one run of stuck-subscriber in one mode on one system.
type StuckRun struct {
	System       string `json:"system"`
	Repeat       int    `json:"repeat"`
	Mode         string `json:"mode"`
	Messages     int    `json:"messages"`
	PayloadBytes int    `json:"payload_bytes"`
	// Phase 1, the stuck client connected: publishes acknowledged, the
	// publisher's rate (acknowledged ÷ time from the first publish to the
	// last acknowledgement), whether it stalled and when it last made
	// progress, and the distinct messages the healthy subscriber got.
	Acked             int     `json:"publisher_acked"`
	PublisherMsgsPerS float64 `json:"publisher_msgs_per_s"`
	Stalled           bool    `json:"stalled,omitempty"`
	StalledAfterS     float64 `json:"stalled_after_s,omitempty"`
	HealthyDelivered  int     `json:"healthy_delivered"`
	Phase1S           float64 `json:"phase1_s"`
	// Phase 2, after the stuck client's connection was cut: publishes
	// acknowledged and distinct messages the healthy subscriber got, in
	// all.
	AckedAfterCut   int           `json:"publisher_acked_after_cut"`
	HealthyAfterCut int           `json:"healthy_delivered_after_cut"`
	Broker          BrokerFigures `json:"broker"`
	Seconds         float64       `json:"seconds"`
	Error           string        `json:"error,omitempty"`
}

// stuckClient is a raw MQTT v5 client that subscribes at QoS 1 with
// keep-alive 0 and then never reads its socket again.
type stuckClient struct{ conn net.Conn }

// dialStuck connects, subscribes to filter at QoS 1 and returns once the
// SUBACK arrived; after that nothing is read from the connection.
func dialStuck(addr, id, filter string) (*stuckClient, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, fmt.Errorf("stuck client: dial %s: %w", addr, err)
	}
	fail := func(err error) (*stuckClient, error) {
		_ = conn.Close()
		return nil, fmt.Errorf("stuck client: %w", err)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	connect := &packets.Connect{ProtocolName: "MQTT", ProtocolVersion: 5, ClientID: id, CleanStart: true, KeepAlive: 0,
		Properties: &packets.Properties{}}
	if _, err := connect.WriteTo(conn); err != nil {
		return fail(err)
	}
	cp, err := packets.ReadPacket(conn)
	if err != nil {
		return fail(fmt.Errorf("reading CONNACK: %w", err))
	}
	ca, ok := cp.Content.(*packets.Connack)
	if !ok || ca.ReasonCode != 0 {
		return fail(fmt.Errorf("CONNECT refused: %s", cp))
	}
	sub := &packets.Subscribe{PacketID: 1, Subscriptions: []packets.SubOptions{{Topic: filter, QoS: 1}}, Properties: &packets.Properties{}}
	if _, err := sub.WriteTo(conn); err != nil {
		return fail(err)
	}
	for {
		cp, err := packets.ReadPacket(conn)
		if err != nil {
			return fail(fmt.Errorf("reading SUBACK: %w", err))
		}
		if sa, ok := cp.Content.(*packets.Suback); ok {
			if len(sa.Reasons) == 0 || sa.Reasons[0] >= 0x80 {
				return fail(fmt.Errorf("SUBSCRIBE %s refused: %s", filter, cp))
			}
			break
		}
	}
	_ = conn.SetDeadline(time.Time{})
	return &stuckClient{conn: conn}, nil
}

// cut closes the connection without DISCONNECT.
func (s *stuckClient) cut() { _ = s.conn.Close() }

// distinctCounter counts distinct sequence numbers and when the last new
// one arrived.
type distinctCounter struct {
	mu   sync.Mutex
	seen map[int]struct{}
	last time.Time
}

func newDistinctCounter() *distinctCounter { return &distinctCounter{seen: map[int]struct{}{}} }

func (d *distinctCounter) add(payload []byte) {
	seq, _, ok := harness.DecodePayload(payload)
	if !ok {
		return
	}
	d.mu.Lock()
	if _, dup := d.seen[seq]; !dup {
		d.seen[seq] = struct{}{}
		d.last = time.Now()
	}
	d.mu.Unlock()
}

func (d *distinctCounter) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.seen)
}

// ackPublisher publishes n QoS 1 messages of size bytes to topic over
// inFlight lanes and counts the acknowledgements.
type ackPublisher struct {
	acked   atomic.Int64
	lastAck atomic.Int64 // unix ns
	failed  atomic.Int64
	done    chan struct{}
}

func startAckPublisher(ctx context.Context, c *paho.Client, topic string, n, size, inFlight int) *ackPublisher {
	p := &ackPublisher{done: make(chan struct{})}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				seq := int(next.Add(1) - 1)
				if seq >= n || ctx.Err() != nil {
					return
				}
				resp, err := c.Publish(ctx, &paho.Publish{Topic: topic, QoS: 1, Payload: seqPayload(seq, size)})
				if err != nil || (resp != nil && resp.ReasonCode >= 0x80) {
					p.failed.Add(1)
					continue
				}
				p.acked.Add(1)
				p.lastAck.Store(time.Now().UnixNano())
			}
		}()
	}
	go func() {
		wg.Wait()
		close(p.done)
	}()
	return p
}

func (p *ackPublisher) finished() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// runStuck runs stuck-subscriber in mode once on system.
func (r *reliabilityRunner) runStuck(ctx context.Context, system, mode string, repeat int) StuckRun {
	began := time.Now()
	sc := r.cfg.Stuck
	run := StuckRun{System: system, Repeat: repeat, Mode: mode, Messages: sc.FanoutMessages, PayloadBytes: sc.FanoutBytes, Broker: unknownFigures()}
	topic, filter := "stuck/fanout", "stuck/fanout"
	if mode == StuckShared {
		run.Messages, run.PayloadBytes = sc.SharedMessages, sc.SharedBytes
		topic, filter = "stuck/shared", "$share/g/stuck/shared"
	}
	logName := fmt.Sprintf("%s-%s-%s-r%d", ReliabilityStuck, mode, system, repeat)
	logger, closeLog, err := r.clientLogger(logName)
	if err != nil {
		run.Error = err.Error()
		return run
	}
	defer closeLog()
	br, err := r.startBroker(ctx, system, 0, logName)
	if err != nil {
		run.Error = err.Error()
		return run
	}
	pctx, stopPublishing := context.WithCancel(ctx)
	var closers []func()
	defer func() {
		stopPublishing()
		// A wedged broker must not hang the benchmark: stop it first, the
		// clients' goodbyes would only wait on it.
		if note := closeBroker(br); note != "" {
			run.Error = harness.JoinErr(run.Error, note)
		}
		if !harness.Within(harness.CleanupTimeout, func() {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}) {
			run.Error = harness.JoinErr(run.Error, "clients did not close in time")
		}
		run.Seconds = time.Since(began).Seconds()
	}()

	stuck, err := dialStuck(br.Addr(), "stuck-reader", filter)
	if err != nil {
		run.Error = err.Error()
		return run
	}
	closers = append(closers, stuck.cut)
	healthy := newDistinctCounter()
	hc, hconn, _, err := harness.DialPaho(ctx, br.Addr(), "healthy-reader", 30, paho.ClientConfig{
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			healthy.add(pr.Packet.Payload)
			return true, nil
		}},
		OnClientError: func(err error) { logger.Warn("healthy subscriber", "error", err) },
	})
	if err != nil {
		run.Error = err.Error()
		return run
	}
	closers = append(closers, func() { _ = hc.Disconnect(&paho.Disconnect{}); _ = hconn.Close() })
	if err := harness.Subscribe(ctx, hc, filter, 1); err != nil {
		run.Error = err.Error()
		return run
	}
	pc, pconn, _, err := harness.DialPaho(ctx, br.Addr(), "stuck-publisher", 30, paho.ClientConfig{
		OnClientError: func(err error) { logger.Warn("publisher", "error", err) },
	})
	if err != nil {
		run.Error = err.Error()
		return run
	}
	closers = append(closers, func() { _ = pc.Disconnect(&paho.Disconnect{}); _ = pconn.Close() })
	time.Sleep(200 * time.Millisecond) // subscriptions settle

	start := time.Now()
	pub := startAckPublisher(pctx, pc, topic, run.Messages, run.PayloadBytes, sc.InFlight)

	// Phase 1: until the publisher is done and the healthy subscriber got
	// everything or nothing new for 2 s, the publisher stalls, or the
	// phase times out.
	lastAcked, lastProgress := int64(-1), start
	deadline := start.Add(sc.Timeout)
	for {
		time.Sleep(10 * time.Millisecond)
		now := time.Now()
		if a := pub.acked.Load(); a != lastAcked {
			lastAcked, lastProgress = a, now
		}
		got := healthy.count()
		if pub.finished() {
			healthy.mu.Lock()
			quiet := now.Sub(maxTime(healthy.last, lastProgress))
			healthy.mu.Unlock()
			if got >= run.Messages || quiet >= 2*time.Second {
				break
			}
		} else if now.Sub(lastProgress) >= r.cfg.StallWindow {
			run.Stalled = true
			run.StalledAfterS = lastProgress.Sub(start).Seconds()
			break
		}
		if now.After(deadline) {
			run.Error = harness.JoinErr(run.Error, fmt.Sprintf("phase 1 timed out after %s", sc.Timeout))
			break
		}
	}
	run.Phase1S = time.Since(start).Seconds()
	run.Acked = int(pub.acked.Load())
	run.HealthyDelivered = healthy.count()
	if last := pub.lastAck.Load(); last > 0 && run.Acked > 0 {
		if d := time.Unix(0, last).Sub(start).Seconds(); d > 0 {
			run.PublisherMsgsPerS = float64(run.Acked) / d
		}
	}

	// Phase 2: cut the stuck client (no DISCONNECT) and see what else the
	// healthy subscriber gets: a stalled publisher may resume, a broker
	// may give the stuck member's unacknowledged messages to the group.
	stuck.cut()
	deadline = time.Now().Add(sc.Timeout)
	cutAt := time.Now()
	for {
		time.Sleep(10 * time.Millisecond)
		now := time.Now()
		if pub.finished() {
			healthy.mu.Lock()
			quiet := now.Sub(maxTime(healthy.last, cutAt))
			healthy.mu.Unlock()
			if healthy.count() >= run.Messages || quiet >= 2*time.Second {
				break
			}
		}
		if now.After(deadline) {
			break
		}
	}
	run.AckedAfterCut = int(pub.acked.Load())
	run.HealthyAfterCut = healthy.count()
	if n := pub.failed.Load(); n > 0 {
		run.Error = harness.JoinErr(run.Error, fmt.Sprintf("%d publishes failed", n))
	}
	run.Broker = br.figures(ctx)
	return run
}

// maxTime returns the later of two times.
func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
