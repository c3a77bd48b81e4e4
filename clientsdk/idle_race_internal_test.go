package clientsdk

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"
)

// TestSubscriberNeverLooksIdleWithAMessageInHand checks that a load report
// cannot say "idle" (nothing pending, nothing in progress) while a worker
// holds a received message it has not started yet. Such a report tells the
// broker that this member is free, and at full utilisation the message the
// broker then sends it waits a whole service time while another member
// sits idle: capacity lost for good. In a live thesis-2 run the worker
// had taken the message from the queue and not yet called the handler
// when the idle report was written.
//
// An observer polls the report signal while messages flow through one
// worker whose handler returns at once. Whenever the signal shows idle,
// every message enqueued before it was read must have reached its handler.
func TestSubscriberNeverLooksIdleWithAMessageInHand(t *testing.T) {
	var entered atomic.Int64
	s, err := NewSubscriber(SubscriberConfig{
		ConnectionConfig: ConnectionConfig{Brokers: []string{"mqtt://127.0.0.1:1"}, ClientID: "idle-race"},
		Group:            "g",
		Filters:          []string{"t"},
		Handler: func(context.Context, *Message) error {
			entered.Add(1)
			return nil
		},
		Workers:       1,
		QueueCapacity: 64,
	})
	require.NoError(t, err)
	s.workers.Add(1)
	go s.work()
	defer func() {
		s.abandon()
		s.workers.Wait()
	}()

	var enqueued atomic.Int64
	stop := repeatUntilStopped(func() { // the network: one message at a time, as a worker catches up
		_, _ = s.onPublish(paho.PublishReceived{Packet: &paho.Publish{Topic: "t", QoS: 0}})
		enqueued.Add(1)
		for entered.Load() < enqueued.Load()-1 {
			runtime.Gosched() // keep at most one message queued behind the one running
		}
	})

	deadline := time.Now().Add(time.Second)
	idleSeen, falseIdle := 0, 0
	for time.Now().Before(deadline) {
		before := enqueued.Load()
		sig := s.reporter.loadSignal()
		if sig.pending != 0 || sig.inProgress != 0 {
			continue
		}
		idleSeen++
		if entered.Load() < before {
			falseIdle++
		}
	}
	stop()
	t.Logf("%d messages, %d idle signals, %d with a message in hand", enqueued.Load(), idleSeen, falseIdle)
	require.Positive(t, enqueued.Load())
	require.Zero(t, falseIdle, "the load signal said idle while a message was taken and not started")
}

// TestLoadReporterStartNeverLooksIdle is the same check for an
// application that counts its messages with Received and Start.
func TestLoadReporterStartNeverLooksIdle(t *testing.T) {
	r, err := NewLoadReporter(LoadReporterConfig{})
	require.NoError(t, err)
	var started, received atomic.Int64
	stop := repeatUntilStopped(func() {
		r.Received()
		received.Add(1)
		start := r.Start()
		started.Add(1)
		r.Done(start, nil)
	})
	deadline := time.Now().Add(500 * time.Millisecond)
	falseIdle := 0
	for time.Now().Before(deadline) {
		before := received.Load()
		sig := r.loadSignal()
		if sig.pending == 0 && sig.inProgress == 0 && started.Load() < before {
			falseIdle++
		}
	}
	stop()
	require.Positive(t, received.Load())
	require.Zero(t, falseIdle, "the load signal said idle between Received and the end of Start")
}

// repeatUntilStopped runs step over and over on a goroutine of its own
// until the returned stop is called; stop returns once step has.
func repeatUntilStopped(step func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			step()
		}
	}()
	return func() {
		close(done)
		wg.Wait()
	}
}
