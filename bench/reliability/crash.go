package reliability

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/internal/timeutil"
)

// CrashRun is one run of crash-qos1 on one system.
type CrashRun struct {
	System string `json:"system"`
	Repeat int    `json:"repeat"`
	// Published counts the publishes the broker acknowledged (PUBACK);
	// only those are owed to the group.
	Published     int `json:"published"`
	PublishFailed int `json:"publish_failed"`
	// Processed counts the distinct acknowledged messages some member
	// processed to the end; Lost those no member processed; Duplicated
	// the processings beyond the first of a message.
	Processed  int `json:"processed"`
	Lost       int `json:"lost"`
	Duplicated int `json:"duplicated"`
	// LostSample lists up to 20 lost sequence numbers.
	LostSample    []int         `json:"lost_sample,omitempty"`
	Members       []CrashMember `json:"members"`
	DrainTimedOut bool          `json:"drain_timed_out,omitempty"`
	Broker        BrokerFigures `json:"broker"`
	Seconds       float64       `json:"seconds"`
	Error         string        `json:"error,omitempty"`
}

// CrashMember is one member's part in a crash-qos1 run.
type CrashMember struct {
	Member    int     `json:"member"` // 1-based
	ServiceMs float64 `json:"service_ms"`
	Crashed   bool    `json:"crashed"`
	// Processed counts the messages it processed to the end (duplicates
	// included); Redelivered those it received with the DUP flag.
	Processed   int `json:"processed"`
	Redelivered int `json:"received_dup_flag"`
}

// ackAfterMember is a plain paho.golang shared-group member with one
// worker: it processes each QoS 1 message for its service time and only
// then acknowledges it. crash closes its TCP connection under paho, with
// no DISCONNECT, and abandons its queue and the message in progress.
type ackAfterMember struct {
	index   int
	service time.Duration
	queue   chan *paho.Publish
	client  *paho.Client
	conn    net.Conn
	logger  *slog.Logger
	// processed is called when a message was processed to the end.
	processed func(member, seq int)

	ctx         context.Context
	cancel      context.CancelFunc
	crashed     atomic.Bool
	busy        atomic.Bool
	redelivered atomic.Int64
	workerDone  chan struct{}
}

func startAckAfterMember(ctx context.Context, addr, id, filter string, index int, service time.Duration,
	processed func(member, seq int), logger *slog.Logger) (*ackAfterMember, error) {
	m := &ackAfterMember{index: index, service: service, queue: make(chan *paho.Publish, harness.PahoQueueCapacity),
		processed: processed, logger: logger, workerDone: make(chan struct{})}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	c, conn, _, err := harness.DialPaho(ctx, addr, id, 30, paho.ClientConfig{
		OnPublishReceived:          []func(paho.PublishReceived) (bool, error){m.onPublish},
		EnableManualAcknowledgment: true,
		OnClientError: func(err error) {
			if !m.crashed.Load() && m.ctx.Err() == nil {
				logger.Warn("connection error", "error", err)
			}
		},
	})
	if err != nil {
		m.cancel()
		return nil, err
	}
	m.client, m.conn = c, conn
	go m.work()
	if err := harness.Subscribe(ctx, c, filter, 1); err != nil {
		m.close()
		return nil, err
	}
	return m, nil
}

func (m *ackAfterMember) onPublish(pr paho.PublishReceived) (bool, error) {
	if pr.Packet.Duplicate() {
		m.redelivered.Add(1)
	}
	select {
	case m.queue <- pr.Packet:
	case <-m.ctx.Done():
	}
	return true, nil
}

func (m *ackAfterMember) work() {
	defer close(m.workerDone)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case p := <-m.queue:
			m.busy.Store(true)
			timer.Reset(m.service)
			select {
			case <-m.ctx.Done():
				return // crashed or closing mid-message: not processed
			case <-timer.C:
			}
			if m.crashed.Load() {
				return
			}
			if seq, _, ok := harness.DecodePayload(p.Payload); ok {
				m.processed(m.index, seq)
			}
			if err := m.client.Ack(p); err != nil && m.ctx.Err() == nil {
				m.logger.Warn("ack failed", "error", err)
			}
			m.busy.Store(false)
		}
	}
}

// idle reports whether nothing is queued or in progress.
func (m *ackAfterMember) idle() bool {
	return m.crashed.Load() || (len(m.queue) == 0 && !m.busy.Load())
}

// crash drops the connection without DISCONNECT and abandons the queue.
func (m *ackAfterMember) crash() {
	m.crashed.Store(true)
	m.cancel()
	_ = m.conn.Close()
}

// close stops the worker and disconnects.
func (m *ackAfterMember) close() {
	m.cancel()
	<-m.workerDone
	if !m.crashed.Load() {
		_ = m.client.Disconnect(&paho.Disconnect{})
	}
	_ = m.conn.Close()
}

// runCrash runs crash-qos1 once on system.
func (r *reliabilityRunner) runCrash(ctx context.Context, system string, repeat int) CrashRun {
	began := time.Now()
	cc := r.cfg.Crash
	run := CrashRun{System: system, Repeat: repeat, Broker: unknownFigures()}
	logName := fmt.Sprintf("%s-%s-r%d", ReliabilityCrash, system, repeat)
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
	defer func() {
		if note := closeBroker(br); note != "" {
			run.Error = harness.JoinErr(run.Error, note)
		}
		run.Seconds = time.Since(began).Seconds()
	}()

	var (
		mu        sync.Mutex
		counts    = map[int]int{}
		perMember = make([]int, len(cc.Services))
		acked     = map[int]bool{}
	)
	onProcessed := func(member, seq int) {
		mu.Lock()
		counts[seq]++
		perMember[member]++
		mu.Unlock()
	}
	members := make([]*ackAfterMember, len(cc.Services))
	var closers []func()
	defer func() {
		if !harness.Within(harness.CleanupTimeout, func() {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}) {
			run.Error = harness.JoinErr(run.Error, "clients did not close in time")
		}
	}()
	for i, svc := range cc.Services {
		m, err := startAckAfterMember(ctx, br.Addr(), fmt.Sprintf("crash-m%d", i+1), "$share/g/work", i, svc, onProcessed,
			logger.With("member", i+1))
		if err != nil {
			run.Error = fmt.Sprintf("member %d: %v", i+1, err)
			return run
		}
		members[i] = m
		closers = append(closers, m.close)
	}
	pub, pubConn, _, err := harness.DialPaho(ctx, br.Addr(), "crash-pub", 30, paho.ClientConfig{})
	if err != nil {
		run.Error = err.Error()
		return run
	}
	closers = append(closers, func() { _ = pub.Disconnect(&paho.Disconnect{}); _ = pubConn.Close() })
	time.Sleep(200 * time.Millisecond) // subscriptions settle

	t0 := time.Now().Add(50 * time.Millisecond)
	crashing := members[len(members)-1]
	crashDone := make(chan struct{})
	go func() {
		defer close(crashDone)
		if timeutil.SleepUntil(ctx, t0.Add(cc.CrashAt)) == nil {
			crashing.crash()
		}
	}()
	gap := time.Second / time.Duration(cc.Rate)
	n := int(cc.Duration / gap)
	var (
		wg     sync.WaitGroup
		failed atomic.Int64
		slots  = make(chan struct{}, 64) // publishes in flight
	)
	for seq := range n {
		if timeutil.SleepUntil(ctx, t0.Add(time.Duration(seq)*gap)) != nil {
			break
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			resp, err := pub.Publish(pctx, &paho.Publish{Topic: "work", QoS: 1, Payload: harness.EncodePayload(seq, time.Now())})
			if err != nil || (resp != nil && resp.ReasonCode >= 0x80) {
				failed.Add(1)
				return
			}
			mu.Lock()
			acked[seq] = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	<-crashDone

	// Drain: until every acknowledged message was processed, or nothing
	// is queued, in progress or arriving for 3 s, or the drain timeout.
	deadline := time.Now().Add(cc.DrainTimeout)
	idleSince, last := time.Now(), -1
	for {
		mu.Lock()
		done, total := 0, 0
		for seq := range acked {
			if counts[seq] > 0 {
				done++
			}
		}
		for _, c := range counts {
			total += c
		}
		owed := len(acked)
		mu.Unlock()
		if done >= owed {
			break
		}
		now := time.Now()
		busy := false
		for _, m := range members {
			busy = busy || !m.idle()
		}
		if busy || total != last {
			idleSince, last = now, total
		}
		if now.Sub(idleSince) > 3*time.Second {
			break
		}
		if now.After(deadline) {
			run.DrainTimedOut = true
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	run.Broker = br.figures(ctx)

	mu.Lock()
	defer mu.Unlock()
	run.Published, run.PublishFailed = len(acked), int(failed.Load())
	var lost []int
	for seq := range acked {
		switch c := counts[seq]; {
		case c == 0:
			lost = append(lost, seq)
		default:
			run.Processed++
			run.Duplicated += c - 1
		}
	}
	sort.Ints(lost)
	run.Lost = len(lost)
	run.LostSample = lost[:min(len(lost), 20)]
	for i, m := range members {
		run.Members = append(run.Members, CrashMember{Member: i + 1, ServiceMs: harness.Millis(cc.Services[i]), Crashed: m == crashing,
			Processed: perMember[i], Redelivered: int(m.redelivered.Load())})
	}
	return run
}
