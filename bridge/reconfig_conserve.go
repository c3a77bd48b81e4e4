package bridge

// The upstream side of loss-free reconfiguration: the agent that takes what a
// removed link's queue holds and answers the downstream (see reconfig.go).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/luffymq/luffymq/internal/timeutil"
)

// conserveAgent serves this node's conservation requests until ctx ends.
func (b *Bridge) conserveAgent(ctx context.Context) {
	for ctx.Err() == nil {
		if err := b.serveConservation(ctx); err != nil && ctx.Err() == nil {
			b.log.Warn("bridge: conservation agent restarting", "error", err)
		}
		timeutil.Sleep(ctx, time.Second)
	}
}

// errTakeLater says a request nobody waits for could not be carried out
// yet (the new links do not carry the old one's bindings): it goes back to
// the queue after timings().RetryPause.
var errTakeLater = errors.New("other links do not carry the old link's bindings yet")

func (b *Bridge) serveConservation(ctx context.Context) error {
	conn, err := amqp.DialConfig(b.cfg.AMQPURL, amqp.Config{
		Heartbeat:  b.cfg.Heartbeat,
		Locale:     "en_US",
		Dial:       amqp.DefaultDial(5 * time.Second),
		Properties: amqp.Table{"connection_name": "luffymq-conserve-" + b.cfg.Site},
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(conserveParallel, 0, false); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(ConserveQueueName, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declaring %s: %w", ConserveQueueName, err)
	}
	msgs, err := ch.Consume(ConserveQueueName, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consuming %s: %w", ConserveQueueName, err)
	}
	// Requests run side by side (each may wait for other links for a
	// while), one at a time per queue; they stop with the session.
	var wg sync.WaitGroup
	defer wg.Wait()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	locks := &queueLocks{m: map[string]*sync.Mutex{}}
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-msgs:
			if !ok {
				return errors.New("conservation consumer cancelled")
			}
			var req conserveRequest
			if err := json.Unmarshal(d.Body, &req); err != nil || req.Exchange == "" || req.Downstream == "" {
				b.log.Error("bridge: dropping invalid conservation request", "error", err)
				_ = d.Ack(false)
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if hook := conserveTakeHook.Load(); hook != nil {
					(*hook)(req)
				}
				err := b.conserve(sctx, conn, locks, req, d.ReplyTo, d.CorrelationId)
				switch {
				case err == nil:
					b.stats.reconfig.requestsHandled.Add(1)
					_ = d.Ack(false)
				case errors.Is(err, errTakeLater) && req.GiveUpAt > 0 && time.Now().UnixMilli() > req.GiveUpAt:
					b.log.Warn("bridge: gave up conserving the queue of a removed federation link: other links never carried its bindings",
						"downstream_site", req.Site, "exchange", req.Exchange)
					_ = d.Ack(false)
				default:
					if !errors.Is(err, errTakeLater) && sctx.Err() == nil {
						b.log.Warn("bridge: conserving the queue of a removed federation link failed; will try again", "downstream_site", req.Site,
							"exchange", req.Exchange, "error", err)
					}
					pause := time.Second
					if errors.Is(err, errTakeLater) {
						pause = timings().RetryPause
					}
					timeutil.Sleep(sctx, pause)
					_ = d.Nack(false, true)
				}
			}()
		}
	}
}

// queueLocks serialises the work on one queue.
type queueLocks struct {
	mu sync.Mutex
	m  map[string]*sync.Mutex
}

func (l *queueLocks) lock(queue string) (unlock func()) {
	l.mu.Lock()
	m := l.m[queue]
	if m == nil {
		m = &sync.Mutex{}
		l.m[queue] = m
	}
	l.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// heldQueue is a removed link's queue on this node and the exchanges that
// feed it.
type heldQueue struct {
	queue string
	feeds []string
}

// federationQueueName is the name RabbitMQ (rabbit_federation_exchange_link)
// gives the queue of a link of node downstream, federating exchange downX
// in vhost downVhost from exchange upX in vhost upVhost.
func federationQueueName(upX, upVhost, downstream, downX, downVhost string) string {
	suffix := ""
	switch {
	case downVhost != "" && downVhost != upVhost:
		suffix = ":" + downVhost + ":" + downX
	case downX != "" && downX != upX:
		suffix = ":" + downX
	}
	return federationQueuePrefix + upX + " -> " + downstream + suffix
}

// locateHeld finds the queues a link of req.Downstream declared here for
// req.Exchange: by their name, and, through the management API, behind
// the exchanges of type x-federation-upstream declared for that node and
// bound from req.Exchange. Each comes with the exchanges bound to it.
func (b *Bridge) locateHeld(ctx context.Context, req conserveRequest) ([]heldQueue, error) {
	vhost := b.vhost()
	names := map[string]bool{}
	if name := federationQueueName(req.Exchange, vhost, req.Downstream, req.LocalExchange, req.DownstreamVhost); req.LocalExchange != "" {
		q, err := getQueue(ctx, b.rh, vhost, name)
		switch {
		case err == nil && argString(q.Arguments, federationPurposeArg) == "federation":
			names[name] = true
		case err != nil && !isNotFound(err):
			return nil, fmt.Errorf("reading queue %s: %w", name, err)
		}
	}
	xs, err := b.rh.ListExchangesIn(vhost)
	if err != nil {
		return nil, fmt.Errorf("listing exchanges: %w", err)
	}
	for _, x := range xs {
		if x.Type != federationUpstreamExchangeType || argString(x.Arguments, federationDownstreamNameArg) != req.Downstream {
			continue
		}
		if v := argString(x.Arguments, federationDownstreamVhostArg); v != "" && req.DownstreamVhost != "" && v != req.DownstreamVhost {
			continue
		}
		in, err := b.rh.ListExchangeBindingsWithDestination(vhost, x.Name)
		if err != nil {
			return nil, fmt.Errorf("listing bindings to %s: %w", x.Name, err)
		}
		fed := false
		for _, bd := range in {
			fed = fed || bd.Source == req.Exchange
		}
		if !fed {
			continue
		}
		outb, err := b.rh.ListExchangeBindingsWithSource(vhost, x.Name)
		if err != nil {
			return nil, fmt.Errorf("listing bindings of %s: %w", x.Name, err)
		}
		for _, bd := range outb {
			if bd.DestinationType != "queue" || names[bd.Destination] {
				continue
			}
			q, err := getQueue(ctx, b.rh, vhost, bd.Destination)
			if err != nil {
				if isNotFound(err) {
					continue
				}
				return nil, fmt.Errorf("reading queue %s: %w", bd.Destination, err)
			}
			if argString(q.Arguments, federationPurposeArg) == "federation" {
				names[q.Name] = true
			}
		}
	}
	out := make([]heldQueue, 0, len(names))
	for name := range names {
		feeds, err := b.feedsOf(name)
		if err != nil {
			return nil, err
		}
		out = append(out, heldQueue{queue: name, feeds: feeds})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].queue < out[j].queue })
	return out, nil
}

// feedsOf lists the exchanges bound to queue (its link's upstream
// exchanges; the default exchange left out).
func (b *Bridge) feedsOf(queue string) ([]string, error) {
	bs, err := b.rh.ListQueueBindings(b.vhost(), queue)
	if err != nil {
		if isNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing bindings to %s: %w", queue, err)
	}
	var feeds []string
	for _, bd := range bs {
		if bd.Source != "" {
			feeds = append(feeds, bd.Source)
		}
	}
	sort.Strings(feeds)
	return feeds, nil
}

// conserve carries out one request (see this file's comment).
func (b *Bridge) conserve(ctx context.Context, conn *amqp.Connection, locks *queueLocks, req conserveRequest, replyTo, correlationID string) error {
	held, err := b.locateHeld(ctx, req)
	if err != nil {
		return err
	}
	reply := conserveReply{Found: len(held) > 0}
	answer := func() {
		if replyTo != "" {
			b.reply(ctx, conn, replyTo, correlationID, reply)
		}
	}
	if len(held) == 0 {
		b.log.Info("bridge: no federation queue left to conserve", "downstream_site", req.Site, "exchange", req.Exchange)
		reply.Taken = true
		answer()
		return nil
	}
	if req.Discard {
		return b.discardHeld(ctx, conn, req, held, &reply, answer)
	}
	if _, err := b.rh.GetExchange(b.vhost(), req.Exchange); isNotFound(err) {
		b.log.Warn("bridge: exchange of a removed federation link is gone; its queue is left to expire", "exchange", req.Exchange, "downstream_site", req.Site)
		reply.Taken = true
		answer()
		return nil
	} else if err != nil {
		return fmt.Errorf("reading exchange %s: %w", req.Exchange, err)
	}
	covered, err := b.waitCovered(ctx, req, held)
	if err != nil {
		return err
	}
	if !covered {
		// Re-published now, the messages would miss the sites whose new
		// links are not there: the link stays and carries them.
		if replyTo != "" {
			answer()
			return nil
		}
		return errTakeLater
	}
	self, err := b.rh.GetClusterName()
	if err != nil {
		return fmt.Errorf("reading the cluster name: %w", err)
	}
	since := time.Now()
	reply.Taken = true
	for _, h := range held {
		unlock := locks.lock(h.queue)
		n, taken, err := b.takeCustody(ctx, conn, h.queue, req.Exchange, self.Name, since)
		unlock()
		reply.Conserved += n
		if err != nil {
			return err
		}
		reply.Taken = reply.Taken && taken
	}
	answer() // the downstream may remove its link now
	if !reply.Taken {
		b.log.Warn("bridge: a link kept consuming the queue it was asked to conserve; it stays", "downstream_site", req.Site, "exchange", req.Exchange)
		if replyTo != "" {
			return nil
		}
		return errTakeLater
	}
	idle := timings().IdleBeforeDelete
	if req.Removed {
		idle = 0 // no link comes back for it
	}
	for _, h := range held {
		n, err := b.cleanupHeld(ctx, conn, h.queue, req.Exchange, self.Name, since, idle)
		reply.Conserved += n
		if err != nil {
			return err
		}
	}
	b.log.Info("bridge: queue of a removed federation link taken", "downstream_site", req.Site, "exchange", req.Exchange,
		"conserved", reply.Conserved, "queues", len(held))
	return nil
}

// takeCustody re-publishes what queue holds into exchange until the queue
// is empty with no consumer, closing the connection of any consumer (a
// link gives back what it has not forwarded). taken is false when a
// consumer was still there after timings().CustodyWait.
func (b *Bridge) takeCustody(ctx context.Context, conn *amqp.Connection, queue, exchange, self string, since time.Time) (n uint64, taken bool, err error) {
	deadline := time.Now().Add(timings().CustodyWait)
	for {
		info, err := inspectQueue(conn, queue)
		if err != nil || info == nil {
			return n, info == nil && err == nil, err
		}
		if info.Consumers > 0 {
			if err := b.closeConsumers(ctx, queue, conn); err != nil {
				return n, false, err
			}
		}
		m, gone, err := republishAll(ctx, conn, queue, exchange, self, since)
		n += m
		b.stats.reconfig.conserved.Add(m)
		if err != nil || gone {
			return n, gone, err
		}
		if info, err = inspectQueue(conn, queue); err != nil || info == nil {
			return n, info == nil && err == nil, err
		}
		if info.Consumers == 0 && info.Messages == 0 {
			return n, true, nil
		}
		if time.Now().After(deadline) {
			return n, false, nil
		}
		if !timeutil.Sleep(ctx, 100*time.Millisecond) {
			return n, false, ctx.Err()
		}
	}
}

// closeConsumers closes the connections that consume queue, as the
// management API knows them, but own, the agent's connection: the
// statistics may lag behind by an interval and still list the consumer
// with which republishAll took the queue.
func (b *Bridge) closeConsumers(ctx context.Context, queue string, own *amqp.Connection) error {
	q, err := getQueue(ctx, b.rh, b.vhost(), queue)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading queue %s: %w", queue, err)
	}
	// RabbitMQ names a connection "<client address> -> <its address>".
	ownName := own.LocalAddr().String() + " -> "
	closed := map[string]bool{}
	for _, name := range q.ConsumerConnections {
		if closed[name] || strings.HasPrefix(name, ownName) {
			continue
		}
		closed[name] = true
		res, err := b.rh.CloseConnection(name)
		if err != nil && (res == nil || res.StatusCode != http.StatusNotFound) {
			return fmt.Errorf("closing connection %s, consumer of %s: %w", name, queue, err)
		}
		b.log.Info("bridge: closed the connection of a removed federation link, which gives back what it has not forwarded", "queue", queue, "connection", name)
	}
	return nil
}

// cleanupHeld removes a queue in custody once no link has consumed it for
// idle: its feeds first, then what reached it meanwhile is re-published,
// then the queue if it is still unused and empty. A link that keeps
// consuming it (RabbitMQ deletes the queue when the downstream removes the
// link) is left after timings().ConsumedWait.
func (b *Bridge) cleanupHeld(ctx context.Context, conn *amqp.Connection, queue, exchange, self string, since time.Time, idle time.Duration) (uint64, error) {
	deadline := time.Now().Add(timings().ConsumedWait)
	var n uint64
	var idleSince time.Time
	for {
		info, err := inspectQueue(conn, queue)
		if err != nil || info == nil {
			return n, err
		}
		switch {
		case info.Consumers > 0:
			idleSince = time.Time{}
			if time.Now().After(deadline) {
				b.log.Warn("bridge: a link still consumes the queue it was asked to conserve; leaving it", "queue", queue)
				return n, nil
			}
		case idleSince.IsZero() && idle > 0:
			idleSince = time.Now()
		case time.Since(idleSince) >= idle:
			feeds, err := b.feedsOf(queue)
			if err != nil {
				return n, err
			}
			for _, f := range feeds {
				if err := withChannel(conn, func(ch *amqp.Channel) error { return ch.ExchangeDelete(f, false, false) }); err != nil && !isAMQPCode(err, amqp.NotFound) {
					return n, fmt.Errorf("deleting %s, feed of %s: %w", f, queue, err)
				}
			}
			m, gone, err := republishAll(ctx, conn, queue, exchange, self, since)
			n += m
			b.stats.reconfig.conserved.Add(m)
			if err != nil || gone {
				return n, err
			}
			if _, err := deleteQueue(conn, queue, true, true); err == nil {
				b.stats.reconfig.queuesRemoved.Add(1)
				return n, nil
			} else if !isAMQPCode(err, amqp.PreconditionFailed) {
				return n, err
			}
			// A link came back, or a message came in: look again.
		}
		if info.Messages > 0 {
			m, gone, err := republishAll(ctx, conn, queue, exchange, self, since)
			n += m
			b.stats.reconfig.conserved.Add(m)
			if err != nil || gone {
				return n, err
			}
		}
		if !timeutil.Sleep(ctx, 200*time.Millisecond) {
			return n, ctx.Err()
		}
	}
}

// discardHeld carries out a request with Discard: the held messages are
// deleted with the queue, and counted.
func (b *Bridge) discardHeld(ctx context.Context, conn *amqp.Connection, req conserveRequest, held []heldQueue, reply *conserveReply, answer func()) error {
	if _, err := b.waitCovered(ctx, req, held); err != nil {
		return err
	}
	for _, h := range held {
		for _, f := range h.feeds {
			if err := withChannel(conn, func(ch *amqp.Channel) error { return ch.ExchangeDelete(f, false, false) }); err != nil && !isAMQPCode(err, amqp.NotFound) {
				return fmt.Errorf("detaching %s: deleting %s: %w", h.queue, f, err)
			}
		}
	}
	reply.Taken = true
	answer()
	for _, h := range held {
		deadline := time.Now().Add(timings().ConsumedWait)
		for {
			info, err := inspectQueue(conn, h.queue)
			if err != nil {
				return err
			}
			if info == nil { // RabbitMQ deleted it with its link
				break
			}
			if info.Consumers == 0 {
				n, err := deleteQueue(conn, h.queue, true, false)
				if isAMQPCode(err, amqp.PreconditionFailed) { // a link came back
					if !timeutil.Sleep(ctx, 100*time.Millisecond) {
						return ctx.Err()
					}
					continue
				}
				if err != nil {
					return err
				}
				reply.Discarded += uint64(n)
				b.stats.reconfig.discarded.Add(uint64(n))
				b.stats.reconfig.queuesRemoved.Add(1)
				break
			}
			if time.Now().After(deadline) {
				b.log.Warn("bridge: a link still consumes the queue it was asked to discard; leaving it", "queue", h.queue, "downstream_site", req.Site)
				break
			}
			if !timeutil.Sleep(ctx, 100*time.Millisecond) {
				return ctx.Err()
			}
		}
	}
	b.log.Info("bridge: queue of a removed federation link deleted with what it held", "downstream_site", req.Site, "exchange", req.Exchange,
		"discarded", reply.Discarded, "queues", len(held))
	return nil
}

// reply answers a request on the requester's direct reply-to.
func (b *Bridge) reply(ctx context.Context, conn *amqp.Connection, replyTo, correlationID string, r conserveReply) {
	body, _ := json.Marshal(r)
	_ = withChannel(conn, func(ch *amqp.Channel) error {
		return ch.PublishWithContext(ctx, "", replyTo, false, false, amqp.Publishing{ContentType: "application/json", CorrelationId: correlationID, Body: body})
	})
}

// boundFor is a binding's routing key and the site it was made for.
type boundFor struct{ key, site string }

// bindingSite returns the cluster that a federation binding was made for:
// the last (oldest) entry of its x-bound-from argument.
func bindingSite(args map[string]interface{}) (string, bool) {
	list, ok := args[federationBoundFromArg].([]interface{})
	if !ok || len(list) == 0 {
		return "", false
	}
	last, _ := list[len(list)-1].(map[string]interface{})
	site, _ := last["cluster-name"].(string)
	return site, site != ""
}

// waitCovered waits until every binding of the held queues' feeds has a
// counterpart on another federation link of req.Exchange (same key, made
// for the same site), at most timings().CoverWait; covered reports whether
// it came.
func (b *Bridge) waitCovered(ctx context.Context, req conserveRequest, held []heldQueue) (covered bool, err error) {
	feeds := map[string]bool{}
	for _, h := range held {
		for _, f := range h.feeds {
			feeds[f] = true
		}
	}
	var need []boundFor
	deadline := time.Now().Add(timings().CoverWait)
	for first := true; ; first = false {
		bs, err := b.rh.ListExchangeBindingsWithSource(b.vhost(), req.Exchange)
		if err != nil {
			return false, fmt.Errorf("listing bindings of %s: %w", req.Exchange, err)
		}
		have := map[boundFor]bool{}
		for _, bd := range bs {
			site, ok := bindingSite(bd.Arguments)
			if !ok || bd.DestinationType != "exchange" {
				continue
			}
			if feeds[bd.Destination] {
				if first && !(req.Left && site == req.Downstream) {
					need = append(need, boundFor{bd.RoutingKey, site})
				}
			} else {
				have[boundFor{bd.RoutingKey, site}] = true
			}
		}
		var missing []string
		for _, n := range need {
			if !have[n] {
				missing = append(missing, n.key+" for "+n.site)
			}
		}
		if len(missing) == 0 {
			return true, nil
		}
		if time.Now().After(deadline) {
			b.log.Warn("bridge: no other federation link carries what a removed link carried yet; its queue is not taken", "exchange", req.Exchange,
				"downstream_site", req.Site, "uncovered", missing)
			return false, nil
		}
		if !timeutil.Sleep(ctx, 200*time.Millisecond) {
			return false, ctx.Err()
		}
	}
}

// ownCopy reports whether d was re-published by node self at since or
// later (see conservedHeader).
func ownCopy(d amqp.Delivery, self string, since time.Time) bool {
	v, _ := d.Headers[conservedHeader].(string)
	i := strings.LastIndexByte(v, ' ')
	if i < 0 || v[:i] != self {
		return false
	}
	ns, err := strconv.ParseInt(v[i+1:], 10, 64)
	return err == nil && ns >= since.UnixNano()
}
