package bridge

// A site agent's configuration: the messages a controller sends to the
// site's configuration queue, checked and applied as federation links.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/luffymq/luffymq/internal/timeutil"
)

// Standby of the configuration agent: how soon a broker whose site
// already has an active configuration agent looks again whether it is
// gone, doubling from the first to the second. A standby broker takes over
// at most configStandbyMaxRetry (plus one queue declaration) after the
// active one's consumer goes.
const (
	configStandbyFirstRetry = 250 * time.Millisecond
	configStandbyMaxRetry   = 2 * time.Second
)

// configLoop is the configuration agent: it applies every message of the
// site's configuration queue as federation upstreams and policies, moving
// links without losing messages (applyConfiguration), and runs the
// conservation agent beside it.
//
// One agent per site is active: it consumes the queue exclusively, so the
// messages are applied one at a time and in order. The agent of any other
// broker of the site is a standby: it sees the queue's consumer, says so
// once (INFO), and looks again with backoff; when the active broker's
// connection goes, its consumer goes with it (and its unacknowledged
// message back to the queue), and a standby takes over.
func (b *Bridge) configLoop(ctx context.Context, conn *amqp.Connection) error {
	q := ConfigQueueName(b.cfg.Site)
	retry := configStandbyFirstRetry
	standby := false
	for {
		ch, msgs, err := b.claimConfigQueue(conn, q)
		if err == nil {
			if standby {
				b.log.Info("bridge: configuration agent taking over: no other broker of the site consumes the configuration queue any more", "queue", q)
			}
			return b.applyConfigMessages(ctx, ch, q, msgs)
		}
		if !errors.Is(err, errConfigQueueTaken) {
			return err
		}
		if !standby {
			standby = true
			b.log.Info("bridge: configuration agent on standby: another broker of this site applies its configuration messages; this one takes over when that one goes",
				"queue", q, "checks_every", configStandbyMaxRetry)
		} else {
			b.log.Debug("bridge: configuration agent still on standby", "queue", q)
		}
		if !timeutil.Sleep(ctx, retry) {
			return nil
		}
		retry = min(2*retry, configStandbyMaxRetry)
	}
}

// errConfigQueueTaken says another connection consumes the site's
// configuration queue: this broker's agent stands by.
var errConfigQueueTaken = errors.New("configuration queue consumed by another broker of the site")

// claimConfigQueue declares the configuration queue q on a new channel and
// consumes it exclusively. It returns errConfigQueueTaken, having closed
// the channel, when the queue already has a consumer: it looks before it
// consumes, so that a standby does not make RabbitMQ log a refused
// exclusive consume at each look, and takes a refusal (two standbys
// looking at once) the same way.
func (b *Bridge) claimConfigQueue(conn *amqp.Connection, q string) (*amqp.Channel, <-chan amqp.Delivery, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, fmt.Errorf("opening configuration channel: %w", err)
	}
	info, err := ch.QueueDeclare(q, true, false, false, false, nil)
	if err != nil {
		_ = ch.Close()
		return nil, nil, fmt.Errorf("declaring configuration queue %s: %w", q, err)
	}
	if info.Consumers > 0 {
		_ = ch.Close()
		return nil, nil, errConfigQueueTaken
	}
	msgs, err := ch.Consume(q, "luffymq-config-"+b.cfg.Site+"-"+b.cfg.BrokerID, false, true, false, false, nil)
	if err != nil {
		_ = ch.Close() // the server closed it already
		if isAMQPCode(err, amqp.AccessRefused) {
			return nil, nil, errConfigQueueTaken
		}
		return nil, nil, fmt.Errorf("consuming configuration queue %s: %w", q, err)
	}
	return ch, msgs, nil
}

// applyConfigMessages is the active configuration agent: it applies the
// messages of q, consumed exclusively on ch, until ctx ends or the
// consumer is cancelled.
func (b *Bridge) applyConfigMessages(ctx context.Context, ch *amqp.Channel, q string, msgs <-chan amqp.Delivery) error {
	defer ch.Close()
	// The conservation agent serves the requests of downstream nodes that
	// removed a federation link from this one (reconfig.go).
	agentCtx, stopAgent := context.WithCancel(ctx)
	agentDone := make(chan struct{})
	go func() {
		defer close(agentDone)
		b.conserveAgent(agentCtx)
	}()
	defer func() {
		stopAgent()
		<-agentDone
	}()
	// A message that could not be applied is retried (configRetryPause)
	// until it is, or until a newer one (a whole configuration too)
	// replaces it.
	var failed *amqp.Delivery
	attempts := 0 // failed attempts of the current message
	var failingSince time.Time
	retrying := &b.stats.reconfig.configRetrying
	defer retrying.Store(0)
	for {
		var d amqp.Delivery
		var retry <-chan time.Time // nil: nothing to retry
		if failed != nil {
			retry = time.After(configRetryPause(attempts))
		}
		select {
		case <-ctx.Done():
			return nil
		case next, ok := <-msgs:
			if !ok {
				return errors.New("configuration consumer cancelled")
			}
			if failed != nil {
				b.log.Info("bridge: a newer configuration replaces the one that failed", "failed_attempts", attempts)
				_ = failed.Ack(false)
			}
			attempts = 0
			d = next
		case <-retry:
			d = *failed
		}
		failed = nil
		retrying.Store(0)
		var m configMessage
		xs, err := []ExchangeFederation(nil), json.Unmarshal(d.Body, &m)
		if err == nil {
			xs, err = federationFor(m)
		}
		if err != nil {
			b.log.Error("bridge: dropping invalid configuration message", "queue", q, "error", err)
			_ = d.Ack(false)
			continue
		}
		fc := b.cfg.WorkQueue.Federation
		fc.ManagementURL, fc.Username, fc.Password = b.cfg.WorkQueue.ManagementURL, b.cfg.WorkQueue.Username, b.cfg.WorkQueue.Password
		fc.Upstreams, fc.Exchanges = nil, xs
		actx, cancel := context.WithTimeout(ctx, reconfigureTimeout(fc))
		err = b.applyConfiguration(actx, fc)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil // unacknowledged: RabbitMQ gives it to the next session
			}
			attempts++
			b.stats.reconfig.configFailures.Add(1)
			if attempts == 1 {
				failingSince = time.Now()
			}
			if logConfigFailure(attempts) {
				b.log.Error("bridge: applying configuration failed; will retry", "error", err,
					"attempts", attempts, "failing_for", time.Since(failingSince).Round(time.Second), "next_attempt_in", configRetryPause(attempts))
			} else {
				b.log.Debug("bridge: applying configuration failed again", "error", err, "attempts", attempts)
			}
			failed = &d
			retrying.Store(1)
			continue
		}
		if attempts > 0 {
			b.log.Info("bridge: configuration applied after failed attempts", "failed_attempts", attempts, "failing_for", time.Since(failingSince).Round(time.Second))
			attempts = 0
		}
		b.stats.configsApplied.Add(1)
		b.log.Info("bridge: configuration applied", "exchanges", len(xs))
		_ = d.Ack(false)
	}
}

// configRetryPause is the pause before the next attempt at a configuration
// message that failed attempts times: a second for the first 10 (an old
// link waiting for its upstream's agent is normally let go within seconds),
// then doubling up to 30 s, so that a link that never goes (no luffymq
// agent at its upstream) costs RabbitMQ little.
func configRetryPause(attempts int) time.Duration {
	const quick, maxPause = 10, 30 * time.Second
	if attempts <= quick {
		return time.Second
	}
	pause := time.Second
	for i := quick; i < attempts && pause < maxPause; i++ {
		pause *= 2
	}
	return min(pause, maxPause)
}

// logConfigFailure says whether the attempts-th failure of one
// configuration message is logged at ERROR: the first, then at attempts
// that are powers of two, so that a message failing for hours logs a
// dozen lines, not thousands (the failures are counted in the metrics).
func logConfigFailure(attempts int) bool {
	return attempts > 0 && attempts&(attempts-1) == 0
}
