package bridge

// Taking back what waits for a dead site (issue 22): by the states with
// --wq-route nearest, by the links with the ring (ringReclaimLoop, below).
//
// A message routed to another site waits, until that site's federation
// link takes it, in the link's queue on this site's node
// ("federation: wq.<g>.to -> <its node>"), bound to wq.<g>.to with the
// site's name as key. Only that site's link consumes it: when the site
// dies, nothing else would, and the queue drops it after the federation's
// MessageTTL. Once a site's state has not arrived for
// reclaimStaleIntervals, the broker that retunes the group for this site
// (RetuneOwner: one at a time, so that they do not all ask the management
// API; two at once would not duplicate anything either) takes back,
// with basic.get, what waits there: the states of this site are dropped,
// each work message is published into the local work queue wq.<g>
// (publisher confirm), and only then acknowledged in the link queue. From
// wq.<g> it is started here, dispatched to the site that would start it
// soonest as the states arrive (dispatchHeld), or sent on by the hash ring
// after its TTL, as any local publish. The hash ring still counts the dead
// site's weight: what it sends there waits likewise, in the link queue of
// the dead-letter exchange wq.<g>.dlx towards the site's node, and is
// taken back into the local intake. The router of the broker that booked a
// message unbooks it (headerBookedBy; another broker of the site reads
// what to unbook in this one's states, State.Unbooked). basic.get hands
// each message to one taker: if the site's link comes back meanwhile,
// each message goes either to the link or here, never to both. A failure
// between the confirm and the acknowledgement leaves the message in the
// link queue as well as its copy here (at-least-once).

import (
	"context"
	"fmt"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// reclaimStaleIntervals is how many StateIntervals a site's state must be
// missing before what waits for it is taken back: longer than the
// staleness after which it is no longer routed to (3 s at the default
// 100 ms, against 2.5 s; three heartbeats of a site to a lease holder). A
// link blip, a stalled node or a federation link's reconnection (1 s
// apart) is over by then and its link drains the queue itself; a dead
// site's messages wait 3 s more than need be, not an hour.
const reclaimStaleIntervals = 3 * stateHolderHeartbeatIntervals

// reclaimRedeliveredIntervals is how many StateIntervals a site's state
// must be missing before a redelivered message is taken back from a link
// queue towards it (15 s at the default 100 ms). Its link took it before
// and gave it back (its connection closed, by a cut or a dead node) without
// acknowledging it, perhaps after the site had it already: a link that
// comes back within that time takes it again, and the site's broker
// recognises a copy it completed (DedupWindow) where a copy taken back
// would be processed a second time elsewhere. A site silent longer is
// dead, and the message is taken back (at-least-once).
const reclaimRedeliveredIntervals = 150

// headerBookedBy names the broker whose router booked a routed message to
// its site: the one that unbooks it if it is taken back.
const headerBookedBy = "x-luffymq-booked-by"

// headerReclaimedFrom marks a message taken back from the link queue of
// the site it was routed to (for tracing; nothing reads it).
const headerReclaimedFrom = "x-luffymq-reclaimed-from"

// maxReclaimPass bounds the messages one pass takes from one queue.
const maxReclaimPass = 10_000

// reclaimCount is what a pass took back from the queues towards a site.
type reclaimCount struct {
	work, states, unbooked uint64
	// heldBack counts the redelivered messages left for the link (see
	// reclaimRedeliveredIntervals).
	heldBack int
	queues   []string
}

// maxReclaimEvery bounds the pause between two passes for a site that
// stays silent: each pass that takes nothing doubles it, from
// reclaimStaleIntervals StateIntervals (the management API is asked for the site's link queues at
// every pass).
const maxReclaimEvery = 15 * time.Second

// reclaimLoop takes back, while this broker retunes group g, what waits
// in this node's link queues for a site whose state stopped arriving: a
// first pass reclaimStaleIntervals StateIntervals after its last state,
// then more while it stays silent (see maxReclaimEvery).
func (b *Bridge) reclaimLoop(ctx context.Context, conn *amqp.Connection, g *workGroup) error {
	interval := b.cfg.WorkQueue.StateInterval
	after := reclaimStaleIntervals * interval
	tick := time.NewTicker(stateHeartbeatIntervals * interval)
	defer tick.Stop()
	last := map[string]time.Time{}      // a site's last pass
	every := map[string]time.Duration{} // and the pause until its next
	var silent []string
	for {
		owner, ok := b.ownerTick(ctx, tick, g)
		if !ok {
			return nil
		}
		if !owner {
			clear(last)
			clear(every)
			continue
		}
		now := time.Now()
		silent = g.router.StaleSites(now, after, silent[:0])
		for site := range last {
			if !slices.Contains(silent, site) {
				delete(last, site) // heard again: its next silence starts afresh
				delete(every, site)
			}
		}
		for _, site := range silent {
			if now.Sub(last[site]) < max(every[site], after) {
				continue
			}
			last[site] = now
			takeRedelivered := g.router.StaleSites(now, reclaimRedeliveredIntervals*interval, nil)
			c, err := b.reclaimSite(ctx, conn, g, site, slices.Contains(takeRedelivered, site))
			every[site] = min(2*max(every[site], after), maxReclaimEvery)
			if c.heldBack > 0 {
				every[site] = after // until they are taken back too
			}
			if c.work > 0 {
				every[site] = after
				b.log.Info("bridge: took back what waited for a silent site in this node's federation link queues", "queue", g.queue(),
					"site", site, "reclaimed", c.work, "states_dropped", c.states, "unbooked", c.unbooked, "redelivered_left", c.heldBack,
					"still_booked", g.router.Outstanding(site), "link_queues", c.queues)
				b.wake()
			}
			if err != nil {
				if conn.IsClosed() {
					return err
				}
				b.log.Warn("bridge: taking back what waits for a silent site failed; will try again", "queue", g.queue(), "site", site, "error", err)
			}
		}
	}
}

// reclaimSite takes back what waits for site in this node's link queues
// of g: those of the route exchange into g's work queue, those of the
// dead-letter exchange (sent there by the hash ring) into g's intake,
// where they are served here as the ring's own overflow (put back into
// the ring, they could be sent to the dead site again).
func (b *Bridge) reclaimSite(ctx context.Context, conn *amqp.Connection, g *workGroup, site string, redelivered bool) (reclaimCount, error) {
	var c reclaimCount
	links, err := b.linksTo(RouteExchangeName(g.name), site)
	if err != nil {
		return c, err
	}
	for _, l := range links {
		routed, err := b.locateHeld(ctx, l)
		if err != nil {
			return c, err
		}
		ring, err := b.locateHeld(ctx, conserveRequest{Exchange: DeadLetterExchangeName(g.name), LocalExchange: IntakeExchangeName(g.name),
			Downstream: l.Downstream, DownstreamVhost: l.DownstreamVhost})
		if err != nil {
			return c, err
		}
		for _, h := range routed {
			c.queues = append(c.queues, h.queue)
			if err := b.reclaimQueue(ctx, conn, g, site, h.queue, g.queue(), redelivered, &c); err != nil {
				return c, err
			}
		}
		for _, h := range ring {
			c.queues = append(c.queues, h.queue)
			if err := b.reclaimQueue(ctx, conn, g, site, h.queue, IntakeQueueName(g.name), redelivered, &c); err != nil {
				return c, err
			}
		}
	}
	return c, nil
}

// linksTo names the links that carry what x routes to site: the
// downstream nodes of the x-federation-upstream exchanges bound from x
// with site's name as key, as requests for locateHeld, which finds their
// queues on this node as the conservation agent finds a removed link's.
func (b *Bridge) linksTo(x, site string) ([]conserveRequest, error) {
	vhost := b.vhost()
	bs, err := b.rh.ListExchangeBindingsWithSource(vhost, x)
	if err != nil {
		return nil, fmt.Errorf("listing bindings of %s: %w", x, err)
	}
	var out []conserveRequest
	for _, bd := range bs {
		if bd.DestinationType != "exchange" || bd.RoutingKey != site {
			continue
		}
		ux, err := b.rh.GetExchange(vhost, bd.Destination)
		if isNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading exchange %s: %w", bd.Destination, err)
		}
		if ux.Type != federationUpstreamExchangeType {
			continue
		}
		l := conserveRequest{Exchange: x, LocalExchange: x,
			Downstream: argString(ux.Arguments, federationDownstreamNameArg), DownstreamVhost: argString(ux.Arguments, federationDownstreamVhostArg)}
		if !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out, nil
}

// reclaimQueue takes what queue (a link's towards site) holds, one message
// at a time, on a channel of its own (a queue deleted meanwhile closes
// it): states are dropped, work is published into queue into and
// acknowledged once confirmed, and unbooked by the broker that booked it
// if it was routed. A redelivered message is taken back only with
// redelivered; otherwise it is held unacknowledged until the end of the
// pass (so that basic.get moves past it) and returned to the queue with
// the channel.
func (b *Bridge) reclaimQueue(ctx context.Context, conn *amqp.Connection, g *workGroup, site, queue, into string, redelivered bool, c *reclaimCount) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }() // returns what is not acknowledged to queue
	if err := ch.Confirm(false); err != nil {
		return err
	}
	for range maxReclaimPass {
		if ctx.Err() != nil {
			return nil
		}
		d, ok, err := ch.Get(queue, false)
		if isAMQPCode(err, amqp.NotFound) {
			return nil // deleted (it expired, or its link removed it)
		}
		if err != nil {
			return fmt.Errorf("taking from %s: %w", queue, err)
		}
		if !ok {
			return nil
		}
		if isControlKey(d.RoutingKey) {
			if err := d.Ack(false); err != nil {
				return err
			}
			c.states++
			continue
		}
		if d.Redelivered && !redelivered {
			c.heldBack++
			continue
		}
		p := republished(d, "")
		for _, h := range []string{conservedHeader, headerRouted, headerBookedBy} {
			delete(p.Headers, h)
		}
		p.Headers[headerReclaimedFrom] = site
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", into, false, false, p)
		if err == nil {
			if ok, werr := conf.WaitContext(ctx); werr != nil || !ok {
				err = fmt.Errorf("RabbitMQ refused the publish (%v)", werr)
			}
		}
		if err != nil {
			_ = d.Nack(false, true)
			return fmt.Errorf("putting a message of %s back into %s: %w", queue, into, err)
		}
		if err := d.Ack(false); err != nil {
			return fmt.Errorf("acknowledging in %s: %w", queue, err)
		}
		c.work++
		// The broker that booked it unbooks it: this one now, another
		// one of the site once it reads the count in this one's state.
		switch by, _ := d.Headers[headerBookedBy].(string); by {
		case "":
			b.stats.wqReclaimed(g.name, site, d.Redelivered, "")
		case b.cfg.BrokerID:
			g.router.Unbook(site)
			c.unbooked++
			b.stats.wqReclaimed(g.name, site, d.Redelivered, "")
		default:
			b.stats.wqReclaimed(g.name, site, d.Redelivered, by)
		}
	}
	return nil
}

// Taking back what waits for a dead site with the ring (--wq-route ring,
// the default). No states say that a site went silent, so its links
// say it: the hash ring keeps sending the site its share, into this
// node's link queue of wq.<g>.dlx towards the site's node, and only that
// site's federation link consumes the queue. Once every link queue
// towards a site has had no consumer for ringReclaimAfter — far longer
// than a link's reconnection (1 s apart) or a cut link's blip — the site
// is taken for dead and what waits for it is taken back into the local
// intake (reclaimSite), redelivered messages included: a link that took
// one and gave it back may have handed it over, and a copy processed
// twice carries one message ID (at-least-once).
const (
	ringReclaimAfter = 15 * time.Second
	// ringReclaimCheck is how often the link queues are looked at
	// (through the management API).
	ringReclaimCheck = 5 * time.Second
)

// ringReclaimLoop takes back, while this broker retunes group g and
// routes by the ring, what waits in this node's link queues for a site
// whose links stopped consuming them.
func (b *Bridge) ringReclaimLoop(ctx context.Context, conn *amqp.Connection, g *workGroup) error {
	tick := time.NewTicker(ringReclaimCheck)
	defer tick.Stop()
	unconsumedSince := map[string]time.Time{}
	for {
		owner, ok := b.ownerTick(ctx, tick, g)
		if !ok {
			return nil
		}
		if !owner {
			clear(unconsumedSince)
			continue
		}
		sites, err := b.linkedSites(RouteExchangeName(g.name))
		if err != nil {
			b.log.Warn("bridge: listing the sites linked to a work queue failed; will try again", "queue", g.queue(), "error", err)
			continue
		}
		now := time.Now()
		for site := range unconsumedSince {
			if !slices.Contains(sites, site) {
				delete(unconsumedSince, site)
			}
		}
		for _, site := range sites {
			consumed, err := b.linkQueuesConsumed(ctx, g, site)
			if err != nil {
				b.log.Warn("bridge: reading the link queues towards a site failed; will try again", "queue", g.queue(), "site", site, "error", err)
				continue
			}
			if consumed {
				delete(unconsumedSince, site)
				continue
			}
			since, seen := unconsumedSince[site]
			if !seen {
				unconsumedSince[site] = now
				continue
			}
			if now.Sub(since) < ringReclaimAfter {
				continue
			}
			c, err := b.reclaimSite(ctx, conn, g, site, true)
			if c.work > 0 {
				b.log.Info("bridge: took back what waited for a site whose federation links stopped consuming", "queue", g.queue(),
					"site", site, "reclaimed", c.work, "silent_for", now.Sub(since).Round(time.Second), "link_queues", c.queues)
				b.wake()
			}
			if err != nil {
				if conn.IsClosed() {
					return err
				}
				b.log.Warn("bridge: taking back what waits for a silent site failed; will try again", "queue", g.queue(), "site", site, "error", err)
			}
		}
	}
}

// linkedSites lists the other sites that x's federation links carry
// messages to: the keys of its bindings to x-federation-upstream exchanges
// (each site's intake binds its own name).
func (b *Bridge) linkedSites(x string) ([]string, error) {
	bs, err := b.rh.ListExchangeBindingsWithSource(b.vhost(), x)
	if err != nil {
		return nil, fmt.Errorf("listing bindings of %s: %w", x, err)
	}
	var sites []string
	for _, bd := range bs {
		if bd.DestinationType == "exchange" && bd.RoutingKey != "" && bd.RoutingKey != b.cfg.Site && !isControlKey(bd.RoutingKey) &&
			!slices.Contains(sites, bd.RoutingKey) {
			sites = append(sites, bd.RoutingKey)
		}
	}
	return sites, nil
}

// linkQueuesConsumed reports whether some link queue of g towards site
// (routed work and the hash ring's) has a consumer; a site without any
// such queue counts as consumed: there is nothing to take back.
func (b *Bridge) linkQueuesConsumed(ctx context.Context, g *workGroup, site string) (bool, error) {
	links, err := b.linksTo(RouteExchangeName(g.name), site)
	if err != nil {
		return false, err
	}
	queues := 0
	for _, l := range links {
		for _, req := range []conserveRequest{l, {Exchange: DeadLetterExchangeName(g.name), LocalExchange: IntakeExchangeName(g.name),
			Downstream: l.Downstream, DownstreamVhost: l.DownstreamVhost}} {
			held, err := b.locateHeld(ctx, req)
			if err != nil {
				return false, err
			}
			for _, h := range held {
				q, err := getQueue(ctx, b.rh, b.vhost(), h.queue)
				if isNotFound(err) {
					continue
				}
				if err != nil {
					return false, err
				}
				queues++
				if q.Consumers > 0 {
					return true, nil
				}
			}
		}
	}
	return queues == 0, nil
}

// ownerTick waits for tick's next tick and reports whether this broker
// then retunes group g for its site (only that broker takes back); ok is
// false once ctx ends.
func (b *Bridge) ownerTick(ctx context.Context, tick *time.Ticker, g *workGroup) (owner, ok bool) {
	select {
	case <-ctx.Done():
		return false, false
	case <-tick.C:
	}
	return b.RetuneOwner(g.name), true
}
