package bridge

// The site agent's event loop: RabbitMQ's events about the work queues of
// other brokers of the site, and the topology each needs when it appears.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// eventLoop is the event agent: it gives every wq.<g> queue that appears
// on the node its dead-letter and intake exchanges, intake queue and
// policy, and removes them when the queue goes. Groups this site exports
// are retuned by retuneLoop; others keep the initial policy (eq. 2.12 with
// one available member).
//
// Every broker of the site has an event agent, and each reacts to every
// event: they race to create and remove the same entities. What another
// agent already did counts as done, never as a failure (see
// workQueueAppeared and workQueueRemoved). The topology work runs on a
// channel of its own, so RabbitMQ closing it on an error never ends the
// consumer of the event queue; a closed topology channel is replaced at
// the next operation.
//
// A returned error (one RabbitMQ or the management API gave for another
// reason than an entity already gone) stops the agent until the next
// connection; it is counted in the agent_failures_total metric.
func (b *Bridge) eventLoop(ctx context.Context, conn *amqp.Connection) (err error) {
	defer func() {
		if err != nil && ctx.Err() == nil {
			b.stats.eventAgentFailures.Add(1)
		}
	}()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("opening event channel: %w", err)
	}
	defer ch.Close()
	topo := &topologyChannel{conn: conn}
	defer topo.close()
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return fmt.Errorf("declaring event queue: %w", err)
	}
	for _, key := range []string{"queue.created", "queue.deleted"} {
		if err := ch.QueueBind(q.Name, key, "amq.rabbitmq.event", false, nil); err != nil {
			return fmt.Errorf("binding to amq.rabbitmq.event (is rabbitmq_event_exchange enabled?): %w", err)
		}
	}
	msgs, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return fmt.Errorf("consuming queue events: %w", err)
	}
	own := map[string]bool{}
	for _, g := range b.groups {
		own[g.name] = true
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-msgs:
			if !ok {
				return errors.New("event consumer cancelled")
			}
			name, _ := d.Headers["name"].(string)
			vhost, _ := d.Headers["vhost"].(string)
			g, ok := strings.CutPrefix(name, WorkQueuePrefix)
			if !ok || !validName(g) || (vhost != "" && vhost != b.vhost()) {
				continue
			}
			if own[g] {
				continue // declared and retuned by this bridge's session
			}
			switch d.RoutingKey {
			case "queue.created":
				if err := b.workQueueAppeared(topo, g); err != nil {
					return err
				}
				b.stats.events.Add(1)
			case "queue.deleted":
				if err := b.workQueueRemoved(topo, g); err != nil {
					return err
				}
				b.stats.events.Add(1)
			}
		}
	}
}

// topologyChannel is the event agent's channel for declaring and deleting
// entities, opened on first use and again after RabbitMQ closed it.
type topologyChannel struct {
	conn *amqp.Connection
	ch   *amqp.Channel
}

// do runs op on the channel, opening one first if there is none open.
func (t *topologyChannel) do(op func(*amqp.Channel) error) error {
	if t.ch == nil || t.ch.IsClosed() {
		ch, err := t.conn.Channel()
		if err != nil {
			return fmt.Errorf("opening event agent topology channel: %w", err)
		}
		t.ch = ch
	}
	return op(t.ch)
}

func (t *topologyChannel) close() {
	if t.ch != nil {
		_ = t.ch.Close()
	}
}

// workQueueAppeared creates the overflow topology and the initial policy
// of a wq.<g> queue that appeared. Every agent of the site does the same
// declarations, which are idempotent. A NOT_FOUND while binding means an
// exchange declared a moment before is gone: another agent removed the
// topology because wq.<g> was deleted meanwhile. If wq.<g> is indeed gone
// there is nothing to do (this agent's own queue.deleted event follows);
// if it was re-created, the declarations are tried again.
func (b *Bridge) workQueueAppeared(topo *topologyChannel, g string) error {
	const attempts = 3
	for attempt := 1; ; attempt++ {
		err := topo.do(func(ch *amqp.Channel) error {
			if err := declareOverflowTopology(ch, g, 0); err != nil {
				return err
			}
			// The local intake joins the hash ring with weight 1 unless
			// it is in it already: a broker of the site that exports g
			// owns the binding, and a second one on its ring exchange
			// would corrupt the ring when it retunes (see adoptBindings).
			bound, err := b.dlxRingBindings(g)
			if err != nil || len(bound) > 0 {
				return err
			}
			return ch.ExchangeBind(ringExchange(g, 0), "1", DeadLetterExchangeName(g), false, nil)
		})
		if err == nil {
			break
		}
		if !isAMQPCode(err, amqp.NotFound) || attempt == attempts {
			return err
		}
		exists, qerr := queueExists(topo, WorkQueueName(g))
		if qerr != nil {
			return qerr
		}
		if !exists {
			b.log.Debug("bridge: work queue deleted while its overflow topology was being created; another agent removes it", "queue", WorkQueueName(g))
			return nil
		}
	}
	if err := b.putWorkPolicy(g, b.cfg.WorkQueue.MaxLengthPerMember, b.cfg.WorkQueue.TTLPerMember); err != nil {
		b.log.Warn("bridge: event agent could not set policy", "queue", WorkQueueName(g), "error", err)
	}
	b.log.Debug("bridge: work queue appeared; overflow topology created", "queue", WorkQueueName(g))
	return nil
}

// workQueueRemoved removes the policy and overflow topology of a deleted
// wq.<g> queue. An entity already gone — another broker's agent of the site
// removed it first — counts as removed. The intake queue is deleted only
// if empty, in one step (queue.delete with if-empty): what it holds stays.
func (b *Bridge) workQueueRemoved(topo *topologyChannel, g string) error {
	name := WorkQueueName(g)
	res, err := b.rh.DeletePolicy(b.vhost(), WorkQueuePolicyPrefix+name)
	if err != nil && (res == nil || res.StatusCode != http.StatusNotFound) {
		b.log.Warn("bridge: event agent could not remove policy", "queue", name, "error", err)
	}
	for _, x := range []string{DeadLetterExchangeName(g), IntakeExchangeName(g), ringExchange(g, 0), ringExchange(g, 1)} {
		err := topo.do(func(ch *amqp.Channel) error { return ch.ExchangeDelete(x, false, false) })
		if err != nil && !isAMQPCode(err, amqp.NotFound) {
			return fmt.Errorf("deleting exchange %s: %w", x, err)
		}
	}
	intake := IntakeQueueName(g)
	err = topo.do(func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(intake, false, true, false)
		return err
	})
	switch {
	case err == nil || isAMQPCode(err, amqp.NotFound):
		b.log.Debug("bridge: work queue removed; overflow topology removed", "queue", name)
	case isAMQPCode(err, amqp.PreconditionFailed):
		b.log.Info("bridge: work queue removed; its intake queue still holds messages and is kept", "queue", name, "intake", intake)
	default:
		return fmt.Errorf("deleting queue %s: %w", intake, err)
	}
	return nil
}

// queueExists reports whether queue q exists, asking on topo (a passive
// declaration of a missing queue closes the channel).
func queueExists(topo *topologyChannel, q string) (bool, error) {
	err := topo.do(func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		return err
	})
	switch {
	case err == nil:
		return true, nil
	case isAMQPCode(err, amqp.NotFound):
		return false, nil
	}
	return false, fmt.Errorf("reading queue %s: %w", q, err)
}
