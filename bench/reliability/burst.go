package reliability

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/luffymq/luffymq/bench/internal/harness"
)

// BurstRun is one run of qos0-burst on one system.
type BurstRun struct {
	System string `json:"system"`
	// Variant names a non-default luffymq setting
	// ("max-pending-writes=N"), or is empty.
	Variant       string `json:"variant,omitempty"`
	PendingWrites int    `json:"max_pending_writes,omitempty"`
	Repeat        int    `json:"repeat"`
	Expected      int    `json:"expected"`
	Delivered     int    `json:"delivered"`
	Dropped       int    `json:"dropped"`
	PerSubscriber []int  `json:"per_subscriber"`
	// PublishSeconds is how long the publishers took to send everything;
	// DeliverySeconds the time from the first publish to the last
	// delivery.
	PublishSeconds  float64       `json:"publish_s"`
	DeliverySeconds float64       `json:"delivery_s"`
	PublishFailed   int           `json:"publish_failed,omitempty"`
	TimedOut        bool          `json:"timed_out,omitempty"`
	Broker          BrokerFigures `json:"broker"`
	Seconds         float64       `json:"seconds"`
	Error           string        `json:"error,omitempty"`
}

// Label names the run's system and variant.
func (b BurstRun) Label() string { return systemLabel(b.System, b.Variant) }

// runBurst runs qos0-burst once on system; pendingWrites > 0 starts
// luffymq with --max-pending-writes.
func (r *reliabilityRunner) runBurst(ctx context.Context, system string, pendingWrites, repeat int) BurstRun {
	began := time.Now()
	bc := r.cfg.Burst
	run := BurstRun{System: system, PendingWrites: pendingWrites, Repeat: repeat, Expected: bc.Publishers * bc.Messages * bc.Subscribers,
		Broker: unknownFigures()}
	if pendingWrites > 0 {
		run.Variant = fmt.Sprintf("max-pending-writes=%d", pendingWrites)
	}
	logName := fmt.Sprintf("%s-%s-r%d", ReliabilityBurst, system, repeat)
	if pendingWrites > 0 {
		logName = fmt.Sprintf("%s-%s-pw%d-r%d", ReliabilityBurst, system, pendingWrites, repeat)
	}
	logger, closeLog, err := r.clientLogger(logName)
	if err != nil {
		run.Error = err.Error()
		return run
	}
	defer closeLog()
	br, err := r.startBroker(ctx, system, pendingWrites, logName)
	if err != nil {
		run.Error = err.Error()
		return run
	}
	var closers []func()
	defer func() {
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

	const topic = "burst/t"
	counts := make([]atomic.Int64, bc.Subscribers)
	var delivered, lastRecv atomic.Int64
	for i := range bc.Subscribers {
		c, conn, _, err := harness.DialPaho(ctx, br.Addr(), fmt.Sprintf("burst-sub-%d", i+1), 30, paho.ClientConfig{
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(paho.PublishReceived) (bool, error) {
				counts[i].Add(1)
				delivered.Add(1)
				lastRecv.Store(time.Now().UnixNano())
				return true, nil
			}},
			OnClientError: func(err error) { logger.Warn("subscriber", "n", i+1, "error", err) },
		})
		if err != nil {
			run.Error = err.Error()
			return run
		}
		closers = append(closers, func() { _ = c.Disconnect(&paho.Disconnect{}); _ = conn.Close() })
		if err := harness.Subscribe(ctx, c, topic, 0); err != nil {
			run.Error = err.Error()
			return run
		}
	}
	pubs := make([]*paho.Client, bc.Publishers)
	for i := range pubs {
		c, conn, _, err := harness.DialPaho(ctx, br.Addr(), fmt.Sprintf("burst-pub-%d", i+1), 30, paho.ClientConfig{
			OnClientError: func(err error) { logger.Warn("publisher", "n", i+1, "error", err) },
		})
		if err != nil {
			run.Error = err.Error()
			return run
		}
		pubs[i] = c
		closers = append(closers, func() { _ = c.Disconnect(&paho.Disconnect{}); _ = conn.Close() })
	}
	time.Sleep(200 * time.Millisecond) // subscriptions settle

	rctx, cancel := context.WithTimeout(ctx, bc.Timeout)
	defer cancel()
	start := time.Now()
	var (
		wg        sync.WaitGroup
		failed    atomic.Int64
		pubEndsNs atomic.Int64
	)
	for _, c := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := range bc.Messages {
				if rctx.Err() != nil {
					return
				}
				if _, err := c.Publish(rctx, &paho.Publish{Topic: topic, QoS: 0, Payload: seqPayload(seq, bc.PayloadBytes)}); err != nil {
					failed.Add(1)
				}
			}
			end := time.Now().UnixNano()
			for {
				old := pubEndsNs.Load()
				if end <= old || pubEndsNs.CompareAndSwap(old, end) {
					break
				}
			}
		}()
	}
	pubDone := make(chan struct{})
	go func() {
		wg.Wait()
		close(pubDone)
	}()
	// A QoS 0 count that stops short once the publishers are done is
	// dropping, not a stall: the stall window is the publish timeout.
	verdict, _ := harness.WatchDelivered(&delivered, int64(run.Expected), start, pubDone, 0, bc.Timeout,
		func(time.Time) bool { return rctx.Err() != nil })
	if verdict == harness.WaitTimedOut || verdict == harness.WaitStalled {
		run.TimedOut = true
	}
	cancel()
	<-pubDone
	run.Broker = br.figures(ctx)
	run.Delivered = int(delivered.Load())
	run.Dropped = run.Expected - run.Delivered
	for i := range counts {
		run.PerSubscriber = append(run.PerSubscriber, int(counts[i].Load()))
	}
	if e := pubEndsNs.Load(); e > 0 {
		run.PublishSeconds = time.Unix(0, e).Sub(start).Seconds()
	}
	if l := lastRecv.Load(); l > 0 {
		run.DeliverySeconds = time.Unix(0, l).Sub(start).Seconds()
	}
	run.PublishFailed = int(failed.Load())
	if run.PublishFailed > 0 {
		run.Error = harness.JoinErr(run.Error, fmt.Sprintf("%d publishes failed", run.PublishFailed))
	}
	if run.TimedOut {
		run.Error = harness.JoinErr(run.Error, fmt.Sprintf("timed out after %s", bc.Timeout))
	}
	return run
}
