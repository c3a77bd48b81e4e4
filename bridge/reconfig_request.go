package bridge

// Asking an upstream node to conserve what a removed link holds there (step 4
// of the loss-free reconfiguration described in reconfig.go).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/luffymq/luffymq/internal/timeutil"
)

// sendConservation delivers req to the node at uri (with confirms) and,
// when replyWait is positive, waits that long for an agent to consume the
// requests there and then for its answer.
func (b *Bridge) sendConservation(ctx context.Context, uri string, req conserveRequest, replyWait time.Duration) (conserveOutcome, error) {
	conn, err := amqp.DialConfig(uri, amqp.Config{
		Heartbeat:  b.cfg.Heartbeat,
		Locale:     "en_US",
		Dial:       amqp.DefaultDial(5 * time.Second),
		Properties: amqp.Table{"connection_name": "luffymq-reconfig-" + b.cfg.Site},
	})
	if err != nil {
		return conserveUndelivered, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return conserveUndelivered, err
	}
	if err := ch.Confirm(false); err != nil {
		return conserveUndelivered, err
	}
	q, err := ch.QueueDeclare(ConserveQueueName, true, false, false, false, nil)
	if err != nil {
		return conserveUndelivered, fmt.Errorf("declaring %s: %w", ConserveQueueName, err)
	}
	var replies <-chan amqp.Delivery
	replyTo := ""
	if replyWait > 0 {
		// Nobody would answer: the link stays (or goes if it does not
		// run, and the request follows in the background).
		deadline := time.Now().Add(timings().AgentWait)
		for q.Consumers == 0 {
			if time.Now().After(deadline) {
				return conserveNoAgent, fmt.Errorf("no agent consumes %s", ConserveQueueName)
			}
			if !timeutil.Sleep(ctx, 250*time.Millisecond) {
				return conserveNoAgent, ctx.Err()
			}
			if q, err = ch.QueueDeclarePassive(ConserveQueueName, true, false, false, false, nil); err != nil {
				return conserveUndelivered, fmt.Errorf("declaring %s: %w", ConserveQueueName, err)
			}
		}
		if replies, err = ch.Consume(directReplyTo, "", true, false, false, false, nil); err != nil {
			return conserveUndelivered, fmt.Errorf("consuming %s: %w", directReplyTo, err)
		}
		replyTo = directReplyTo
	}
	body, err := json.Marshal(req)
	if err != nil {
		return conserveUndelivered, err
	}
	id := b.cfg.Site + "-" + randomHex(8)
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", ConserveQueueName, false, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, ReplyTo: replyTo,
		CorrelationId: id, MessageId: id, Timestamp: time.Now(), AppId: "luffymq", Body: body,
	})
	if err != nil {
		return conserveUndelivered, err
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		return conserveUndelivered, errors.Join(errors.New("request not confirmed"), err)
	}
	b.stats.reconfig.requestsSent.Add(1)
	if replyWait <= 0 {
		return conserveDelivered, nil
	}
	t := time.NewTimer(replyWait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return conserveNotTaken, ctx.Err()
		case <-t.C:
			return conserveNotTaken, fmt.Errorf("no answer within %v", replyWait)
		case d, ok := <-replies:
			if !ok {
				return conserveNotTaken, errors.New("connection to the upstream lost before the answer")
			}
			if d.CorrelationId != id {
				continue
			}
			var r conserveReply
			if err := json.Unmarshal(d.Body, &r); err != nil {
				return conserveNotTaken, fmt.Errorf("invalid answer: %w", err)
			}
			if !r.Taken {
				return conserveNotTaken, errors.New("the upstream's agent has not taken the link's queue (other links do not carry its bindings yet, or the link kept consuming it)")
			}
			b.stats.reconfig.requestsAnswered.Add(1)
			return conserveTaken, nil
		}
	}
}

// retryConservation sends req to uri in the background until it is
// delivered, the bridge closes, or giveUp has passed (no link queue lives
// longer on the upstream).
func (b *Bridge) retryConservation(uri string, req conserveRequest, giveUp time.Duration) {
	b.mu.Lock()
	done := b.done
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), giveUp)
	b.stats.reconfig.requestsPending.Add(1)
	go func() {
		defer b.stats.reconfig.requestsPending.Add(-1)
		defer cancel()
		go func() {
			select {
			case <-done:
				cancel()
			case <-ctx.Done():
			}
		}()
		pause := 100 * time.Millisecond
		for {
			if !timeutil.Sleep(ctx, pause) {
				b.log.Warn("bridge: gave up asking an upstream to conserve a removed link's queue", "upstream", req.Upstream, "uri", redact(uri))
				return
			}
			pause = min(2*pause, conserveRetryMax)
			if o, _ := b.sendConservation(ctx, uri, req, 0); o == conserveDelivered {
				b.log.Info("bridge: conservation request delivered", "upstream", req.Upstream, "uri", redact(uri))
				return
			}
		}
	}()
}
