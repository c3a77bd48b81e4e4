package bridge

// Re-publishing what a removed link held into its exchange, so that it follows
// the new links (see reconfig.go).

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// republishAll moves every message of queue into exchange. It consumes the
// queue (at most republishWindow messages unacknowledged), publishes each
// message (marked as re-published by node self) and acknowledges it in
// queue once RabbitMQ has confirmed the publish, the longest confirmed
// run at a time. A consumer streams the messages where basic.get costs a
// round trip each (a few ms a message on a loaded node: seconds for a
// link's backlog). It takes as many messages as the queue holds, looks
// again, and returns at a moment when the queue holds none ready (it may
// keep filling: its feeds stay bound until the downstream removes the
// link). Copies this node re-published at since or
// later are acknowledged without being published again. gone reports that
// the queue no longer exists.
func republishAll(ctx context.Context, conn *amqp.Connection, queue, exchange, self string, since time.Time) (n uint64, gone bool, err error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = ch.Close() }() // returns what is not acknowledged to queue
	// The queue may keep filling (its feeds stay bound until the
	// downstream removes the link): take what it holds now, then look
	// again, and stop at a moment when it holds nothing ready.
	info, err := inspectQueue(conn, queue)
	if err != nil {
		return 0, false, err
	}
	if info == nil {
		return 0, true, nil
	}
	want := info.Messages
	if want == 0 {
		return 0, false, nil
	}
	if err := ch.Confirm(false); err != nil {
		return 0, false, err
	}
	if err := ch.Qos(republishWindow, 0, false); err != nil {
		return 0, false, err
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if isAMQPCode(err, amqp.NotFound) {
		return 0, true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("consuming %s: %w", queue, err)
	}
	// pending are the messages taken and not yet acknowledged, in
	// delivery order; confirm is nil for a copy that is not published.
	type taken struct {
		d       amqp.Delivery
		confirm *amqp.DeferredConfirmation
	}
	var pending []taken
	// settle acknowledges the longest run of pending whose publishes are
	// confirmed: those confirmed already, or with wait every one.
	settle := func(wait bool) error {
		k, published := 0, uint64(0)
		for ; k < len(pending); k++ {
			c := pending[k].confirm
			if c == nil {
				continue
			}
			if !wait && !isDone(c) {
				break
			}
			if ok, err := c.WaitContext(ctx); err != nil || !ok {
				_ = pending[len(pending)-1].d.Nack(true, true)
				pending = nil
				return errors.Join(fmt.Errorf("re-publishing into %s: not confirmed", exchange), err)
			}
			published++
		}
		if k == 0 {
			return nil
		}
		if err := pending[k-1].d.Ack(true); err != nil {
			return fmt.Errorf("acknowledging in %s: %w", queue, err)
		}
		n += published
		pending = pending[k:]
		return nil
	}
	// drained settles everything taken and reports whether queue holds
	// nothing ready; if it does, want grows by what it holds.
	drained := func() (done, gone bool, err error) {
		if err := settle(true); err != nil {
			return false, false, err
		}
		info, err := inspectQueue(conn, queue)
		if err != nil || info == nil {
			return false, info == nil && err == nil, err
		}
		want += info.Messages
		return info.Messages == 0, false, nil
	}
	got := 0
	idle := time.NewTimer(republishIdle)
	defer idle.Stop()
	for {
		if len(pending) >= republishWindow {
			if err := settle(true); err != nil {
				return n, false, err
			}
		}
		if got >= want {
			done, gone, err := drained()
			if err != nil || gone || done {
				return n, gone, err
			}
		}
		select {
		case <-ctx.Done():
			return n, false, ctx.Err()
		case d, ok := <-deliveries:
			if !ok {
				// RabbitMQ cancelled the consumer (the queue was deleted,
				// with its link) or closed the channel: what was taken and
				// not acknowledged is re-published already or back in
				// the queue.
				for _, p := range pending {
					if p.confirm != nil {
						if ok, _ := p.confirm.WaitContext(ctx); ok {
							n++
						}
					}
				}
				info, err := inspectQueue(conn, queue)
				if err == nil && info == nil {
					return n, true, nil
				}
				return n, false, errors.Join(fmt.Errorf("consuming %s: cancelled", queue), err)
			}
			t := taken{d: d}
			if !ownCopy(d, self, since) {
				mark := self + " " + strconv.FormatInt(time.Now().UnixNano(), 10)
				if t.confirm, err = ch.PublishWithDeferredConfirmWithContext(ctx, exchange, d.RoutingKey, false, false, republished(d, mark)); err != nil {
					return n, false, fmt.Errorf("re-publishing into %s: %w", exchange, err)
				}
			}
			pending = append(pending, t)
			got++
			if err := settle(false); err != nil {
				return n, false, err
			}
			idle.Reset(republishIdle)
		case <-idle.C:
			// Fewer messages came than the queue held (a link still
			// consuming took some, or they expired).
			done, gone, err := drained()
			if err != nil || gone || done {
				return n, gone, err
			}
			idle.Reset(republishIdle)
		}
	}
}

// isDone reports whether RabbitMQ has answered c.
func isDone(c *amqp.DeferredConfirmation) bool {
	select {
	case <-c.Done():
		return true
	default:
		return false
	}
}

// republished is d as it was published, without federation's record of
// the links it crossed and with mark in conservedHeader. The user ID is
// left out: RabbitMQ accepts only the publishing connection's own.
func republished(d amqp.Delivery, mark string) amqp.Publishing {
	h := amqp.Table{}
	for k, v := range d.Headers {
		if k != federationReceivedFromHeader {
			h[k] = v
		}
	}
	h[conservedHeader] = mark
	return amqp.Publishing{
		Headers: h, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: d.DeliveryMode,
		Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: d.Expiration,
		MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
	}
}
