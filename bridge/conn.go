package bridge

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// run keeps a RabbitMQ session alive until ctx ends, reconnecting with
// exponential backoff.
func (b *Bridge) run(ctx context.Context) {
	backoff := b.cfg.ReconnectMin
	failures := 0
	var lastLog time.Time
	for {
		start := time.Now()
		err := b.session(ctx, func() {
			if failures > 0 {
				b.log.Info("bridge connected to RabbitMQ", "amqp", redact(b.cfg.AMQPURL), "after_attempts", failures+1)
			} else {
				b.log.Info("bridge connected to RabbitMQ", "amqp", redact(b.cfg.AMQPURL))
			}
			failures = 0
			backoff = b.cfg.ReconnectMin
		})
		b.setConnected(false)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > time.Minute {
			backoff = b.cfg.ReconnectMin
		}
		failures++
		b.stats.reconnects.Add(1)
		// One clear line on the first failure, then a reminder at most
		// once a minute.
		if failures == 1 || time.Since(lastLog) > time.Minute {
			lastLog = time.Now()
			b.log.Error("bridge: "+describe(err, b.cfg.AMQPURL)+"; local MQTT clients are still served; retrying",
				"attempt", failures, "next_retry", backoff)
		} else {
			b.log.Debug("bridge: reconnect failed", "attempt", failures, "error", err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, b.cfg.ReconnectMax)
	}
}

// describe turns a session error into a message that says what to check.
func describe(err error, rawURL string) string {
	u := redact(rawURL)
	var opErr *net.OpError
	var amqpErr *amqp.Error
	var inUse *ImportQueueInUseError
	switch {
	case errors.As(err, &inUse):
		return inUse.Error()
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return fmt.Sprintf("RabbitMQ unreachable at %s (%v): is the node running and is --amqp-url right?", u, opErr.Err)
	case errors.As(err, &amqpErr) && amqpErr.Code == amqp.AccessRefused:
		return fmt.Sprintf("RabbitMQ at %s refused the credentials: check the user and password in --amqp-url", u)
	case errors.Is(err, amqp.ErrCredentials):
		return fmt.Sprintf("RabbitMQ at %s refused the credentials: check the user and password in --amqp-url", u)
	case errors.Is(err, amqp.ErrVhost):
		return fmt.Sprintf("RabbitMQ at %s has no such virtual host: check the path of --amqp-url", u)
	default:
		return fmt.Sprintf("RabbitMQ connection to %s lost: %s", u, strings.ReplaceAll(fmt.Sprint(err), "\n", " "))
	}
}

func (b *Bridge) setConnected(v bool) {
	b.mu.Lock()
	b.connected = v
	b.mu.Unlock()
}

// session runs one connection: topology, publisher, importer and binder.
// It returns when the connection fails or ctx ends.
func (b *Bridge) session(ctx context.Context, onUp func()) error {
	conn, err := amqp.DialConfig(b.cfg.AMQPURL, amqp.Config{
		Heartbeat:  b.cfg.Heartbeat,
		Locale:     "en_US",
		Dial:       amqp.DefaultDial(5 * time.Second),
		Properties: amqp.Table{"connection_name": "luffymq-bridge-" + b.cfg.Site + "-" + b.cfg.BrokerID},
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))

	topo, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("opening topology channel: %w", err)
	}
	if err := b.declare(topo); err != nil {
		return err
	}
	pubCh, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("opening publisher channel: %w", err)
	}
	if err := pubCh.Confirm(false); err != nil {
		return fmt.Errorf("enabling publisher confirms: %w", err)
	}
	subCh, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("opening import channel: %w", err)
	}
	if err := subCh.Qos(b.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("setting prefetch %d: %w", b.cfg.Prefetch, err)
	}
	// Exclusive: a second broker with this ID is refused, not served half
	// of the messages.
	deliveries, err := subCh.Consume(b.queue, "luffymq-import-"+b.cfg.Site+"-"+b.cfg.BrokerID, false, true, false, false, nil)
	if err != nil {
		return b.queueInUse(fmt.Errorf("consuming %s: %w", b.queue, err), amqp.AccessRefused)
	}
	loops := []func(context.Context) error{
		func(c context.Context) error { return b.publishLoop(c, pubCh) },
		func(c context.Context) error { return b.importLoop(c, deliveries) },
		func(c context.Context) error { return b.bindLoop(c, topo) },
	}
	wqLoops, err := b.workQueueLoops(conn)
	if err != nil {
		return err
	}
	loops = append(loops, wqLoops...)
	b.setConnected(true)
	onUp()

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(loops))
	var wg sync.WaitGroup
	for _, loop := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := loop(sctx); err != nil && sctx.Err() == nil {
				errs <- err
			}
		}()
	}
	var result error
	select {
	case <-ctx.Done():
		b.deleteImportQueue(conn)
	case e, ok := <-closed:
		if ok && e != nil {
			result = e
		} else {
			result = errors.New("connection closed")
		}
	case result = <-errs:
	}
	cancel()
	_ = conn.Close() // unblocks the loops waiting on RabbitMQ
	wg.Wait()
	for g, n := range b.wqTrack.reset(b.wqGen.Load()) {
		for range n {
			b.stats.wqSettled(g, "requeued") // by RabbitMQ, with the channel
		}
	}
	return result
}

// workQueueLoops declares the work queues and returns the loops of the
// work queues and the site agent for this connection.
func (b *Bridge) workQueueLoops(conn *amqp.Connection) ([]func(context.Context) error, error) {
	var loops []func(context.Context) error
	if b.rh == nil {
		return nil, nil
	}
	gen := b.wqGen.Add(1)
	if len(b.groups) > 0 {
		topo, err := conn.Channel()
		if err != nil {
			return nil, fmt.Errorf("opening work-queue topology channel: %w", err)
		}
		for _, g := range b.groups {
			if err := declareWorkTopology(topo, g.name); err != nil {
				return nil, err
			}
			if err := declareRouteTopology(topo, g.name, b.cfg.Site); err != nil {
				return nil, err
			}
			b.wqMu.Lock()
			b.wqStates[g.name] = wqState{} // the site's retune owner adopts the bindings and (re)applies the policy
			b.wqMu.Unlock()
		}
		rc, err := b.newRetuneCoordinator(conn)
		if err != nil {
			return nil, err
		}
		loops = append(loops,
			func(c context.Context) error { return b.retuneLoop(c, topo, rc) },
			func(c context.Context) error { return b.settleLoop(c, gen) })
		for _, g := range b.groups {
			ch, err := conn.Channel()
			if err != nil {
				return nil, fmt.Errorf("opening work-queue channel for %s: %w", g.queue(), err)
			}
			loops = append(loops, func(c context.Context) error { return b.consumeLoop(c, ch, g, gen) })
			if g.router != nil {
				loops = append(loops,
					func(c context.Context) error { return b.stateLoop(c, conn, g) },
					func(c context.Context) error { return b.reclaimLoop(c, conn, g) })
			} else if b.rh != nil {
				loops = append(loops, func(c context.Context) error { return b.ringReclaimLoop(c, conn, g) })
			}
		}
	}
	// The site agent: its failures are logged, never fatal to the bridge.
	agent := func(name string, run func(context.Context) error) func(context.Context) error {
		return func(c context.Context) error {
			if err := run(c); err != nil && c.Err() == nil {
				b.log.Error("bridge: site agent stopped until the next connection", "agent", name, "error", err)
			}
			return nil
		}
	}
	// The event agent opens its own channels: one to consume the events,
	// one for the topology work (see eventLoop).
	events := func(c context.Context) error { return b.eventLoop(c, conn) }
	// The configuration agent opens its own channels: it may stand by.
	config := func(c context.Context) error { return b.configLoop(c, conn) }
	loops = append(loops, agent("config", config), agent("events", events))
	return loops, nil
}

// declare creates the exchanges and the import queue. The first session of
// the process recreates the queue, dropping bindings and messages left by
// an earlier process (its sessions are gone too unless Mochi persists
// them, in which case the bindings are recomputed from the restored
// subscriptions); it refuses to delete a queue that has a consumer: that
// is another broker's with the same ID.
func (b *Bridge) declare(ch *amqp.Channel) error {
	for _, x := range b.exchanges {
		if err := ch.ExchangeDeclare(x.name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declaring exchange %s: %w", x.name, err)
		}
	}
	b.mu.Lock()
	fresh := b.queueFresh
	b.mu.Unlock()
	if !fresh {
		if _, err := ch.QueueDelete(b.queue, true, false, false); err != nil {
			return b.queueInUse(fmt.Errorf("deleting stale queue %s: %w", b.queue, err), amqp.PreconditionFailed)
		}
	}
	args := amqp.Table{
		"x-max-length": int64(b.cfg.QueueMaxLength),
		"x-overflow":   "drop-head",
		"x-expires":    b.cfg.QueueExpires.Milliseconds(),
	}
	if _, err := ch.QueueDeclare(b.queue, true, false, false, false, args); err != nil {
		return fmt.Errorf("declaring queue %s: %w", b.queue, err)
	}
	b.mu.Lock()
	if !b.queueFresh {
		b.queueFresh = true
		b.bound = map[Binding]struct{}{}
	}
	b.mu.Unlock()
	return nil
}

// maxUnconfirmed bounds the messages publishLoop has written and RabbitMQ
// has not confirmed yet.
const maxUnconfirmed = 1024

// unconfirmed is a published message awaiting its publisher confirm.
type unconfirmed struct {
	m       *outMsg
	confirm *amqp.DeferredConfirmation
}

// publishLoop publishes the outbox with confirms. It writes each message as
// soon as it is queued, without waiting for the confirms of the ones before
// it: RabbitMQ confirms a persistent message only once it is on disk,
// milliseconds after the message is in its queue, and a publish that waited
// for the previous batch's confirms reached a work queue that much later (a
// local member idle at the publish started it 3 to 25 ms after, median 6,
// in a run of luffy-bench sites at 1 s service). confirmLoop settles the
// confirms in order; unconfirmed messages go back to the outbox for the
// next session.
func (b *Bridge) publishLoop(ctx context.Context, ch *amqp.Channel) error {
	pending := make(chan unconfirmed, maxUnconfirmed)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.confirmLoop(ctx, ch, pending)
	}()
	err := b.publishOutbox(ctx, ch, pending)
	close(pending)
	<-done
	return err
}

// publishOutbox writes the outbox's messages to ch as they come and hands
// each to confirmLoop. The consume loops are woken once a batch with work
// for them is written: the message is in its queue well before its confirm
// (which wakes them again, should they have looked too early).
func (b *Bridge) publishOutbox(ctx context.Context, ch *amqp.Channel, pending chan<- unconfirmed) error {
	for {
		batch, err := b.outbox.take(ctx, 256)
		if err != nil {
			return nil
		}
		wake := false
		for i, m := range batch {
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, m.exchange, m.key, false, false, m.pub)
			if err != nil {
				b.outbox.requeue(batch[i:])
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("publishing to %s: %w", m.exchange, err)
			}
			select {
			case pending <- unconfirmed{m: m, confirm: dc}:
			case <-ctx.Done():
				b.outbox.requeue(batch[i:])
				return nil
			}
			wake = wake || m.wakesWork
		}
		if wake {
			b.wake()
		}
	}
}

// confirmLoop waits for each published message's confirm, in publishing
// order, until pending is closed and drained. A message that is not
// confirmed (refused, or its channel or the session ended) goes back to the
// outbox, at its front and in order, once nothing older is pending: behind
// it are only messages published after it. Only a refusal by RabbitMQ, on
// a channel still open, counts as one of a message's 5 attempts.
func (b *Bridge) confirmLoop(ctx context.Context, ch *amqp.Channel, pending <-chan unconfirmed) {
	var retry []*outMsg
	wake := false
	for u := range pending {
		select {
		case <-u.confirm.Done():
		case <-ctx.Done():
		}
		m := u.m
		refused := ctx.Err() == nil && !ch.IsClosed()
		switch {
		case u.confirm.Acked():
			wake = wake || m.wakesWork
			if m.label != "" {
				b.stats.exported(m.label)
			} else {
				b.stats.exported(m.exchange)
			}
		case refused && m.attempts >= 4:
			b.stats.nacked.Add(1)
			b.log.Warn("bridge: RabbitMQ refused a message 5 times; dropped", "exchange", m.exchange, "routing_key", m.key)
		default:
			if refused {
				m.attempts++
			}
			retry = append(retry, m)
		}
		if len(pending) == 0 {
			if wake {
				b.wake()
				wake = false
			}
			if len(retry) > 0 && ctx.Err() == nil && !ch.IsClosed() {
				b.outbox.requeue(retry)
				retry = nil
			}
		}
	}
	b.outbox.requeue(retry)
	if wake {
		b.wake()
	}
}

// importLoop injects deliveries into the local broker and acknowledges
// them once injected.
func (b *Bridge) importLoop(ctx context.Context, deliveries <-chan amqp.Delivery) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("import consumer cancelled")
			}
			r := b.inject(d)
			b.stats.imported(d.Exchange, r)
			if r == importFailed {
				_ = d.Nack(false, true)
				continue
			}
			if err := d.Ack(false); err != nil {
				return fmt.Errorf("acknowledging import: %w", err)
			}
		}
	}
}

// bindLoop keeps the import queue's bindings equal to what local
// subscriptions need. Recomputations are at least 20 ms apart, so
// subscription storms cost a bounded amount of work.
func (b *Bridge) bindLoop(ctx context.Context, ch *amqp.Channel) error {
	first := true
	for {
		if !first {
			select {
			case <-ctx.Done():
				return nil
			case <-b.dirty:
			}
		}
		want := b.desiredBindings()
		b.mu.Lock()
		var add, del []Binding
		for k := range want {
			if _, ok := b.bound[k]; !ok || first {
				add = append(add, k)
			}
		}
		for k := range b.bound {
			if _, ok := want[k]; !ok {
				del = append(del, k)
			}
		}
		b.mu.Unlock()
		first = false
		for _, k := range add {
			if err := ch.QueueBind(b.queue, k.Key, k.Exchange, false, nil); err != nil {
				b.markDirty()
				return fmt.Errorf("binding %s to %s with %q: %w", b.queue, k.Exchange, k.Key, err)
			}
			b.mu.Lock()
			b.bound[k] = struct{}{}
			b.mu.Unlock()
		}
		for _, k := range del {
			if err := ch.QueueUnbind(b.queue, k.Key, k.Exchange, nil); err != nil {
				b.markDirty()
				return fmt.Errorf("unbinding %s from %s with %q: %w", b.queue, k.Exchange, k.Key, err)
			}
			b.mu.Lock()
			delete(b.bound, k)
			b.mu.Unlock()
		}
		if len(add)+len(del) > 0 {
			b.log.Debug("bridge bindings updated", "added", len(add), "removed", len(del))
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}
