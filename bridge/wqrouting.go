package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/luffymq/luffymq/bridge/wqroute"
)

// Routing each publish to the site that starts it soonest (RouteNearest).
//
// Every broker that exports group g publishes the group's state (its
// members' predicted waits and service times, the other sites' messages
// ready in its intake, the time it sent it) on wq.<g>.to with the key
// StateRoutingKey: at most every StateInterval while it changes, and every
// stateHeartbeatIntervals intervals while it does not. Federation carries
// it to every other site (each one's wq.<g>.to federates from the
// others'), where the brokers of g read it into g's router. A local
// publish then goes to the site — this one or another — where a member
// would start it soonest, one-way delay included (overflowView.decide):
// to another site by a publish on the local wq.<g>.to with that site's
// name as routing key, which its federation link carries to its intake
// queue. wq.<g>.to's alternate exchange is the local intake's ring
// exchange: a message whose site's link is not bound (yet) is served
// here rather than dropped.

// headerRouted marks a message routed to a site by its state: that site
// counts the ones it takes, by origin, in its states (State.Taken). What
// reaches it through the hash ring is not counted: its origin did not
// count it as sent there.
const headerRouted = "x-luffymq-routed"

// headerDue is when the origin's router expects a routed message at its
// site (Unix nanoseconds, the origin's clock): the site compares its
// members' waits with what that router predicts from it (Extrapolates).
const headerDue = "x-luffymq-due"

// stateHeartbeatIntervals is how many StateIntervals at most pass between
// two states of a broker that saw no change, to the site's other brokers
// (on the LAN).
const stateHeartbeatIntervals = 5

// stateHolderHeartbeatIntervals is how many StateIntervals at most pass
// between two states to another site holding a lease, when all that
// changed since the last one its router works out for itself
// (Extrapolates): such a state says only that the site is alive. It is
// also how long after a site's last state its router still counts what it
// sends there as started on arrival (wqroute.Config.Credit).
const stateHolderHeartbeatIntervals = 10

// stateStaleIntervals is how many StateIntervals a state counts after it
// arrived: two holder heartbeats and a half, so that a late or lost one
// leaves the site routed to.
const stateStaleIntervals = 5 * stateHolderHeartbeatIntervals / 2

// wantSustainedRenewIntervals is how many StateIntervals pass between two
// Wants of a broker whose local publishes are sustained (demandInputs), and
// wantLeaseIntervals how long each one asks for the states: two renewals,
// so a lost Want costs nothing. Otherwise (messages held or routed, a rare
// publish that asked for the states itself) a Want asks for
// wantShortLeaseIntervals, renewed every wantRenewIntervals: one renewal
// and a half, so that the states stop soon after the demand does; a lost
// Want then costs a gap of half a renewal, which the states' staleness
// (stateStaleIntervals) covers. Each Want is a WAN message to every other
// site: a sustained demand renews half as often as a short one.
const (
	wantRenewIntervals          = 10
	wantSustainedRenewIntervals = 2 * wantRenewIntervals
	wantLeaseIntervals          = 2 * wantSustainedRenewIntervals
	wantShortLeaseIntervals     = 3 * wantRenewIntervals / 2
)

// demandRecentIntervals is how many StateIntervals after its last local
// publish a broker may still have something to route (demandInputs).
const demandRecentIntervals = 30

// wantNudgeGapIntervals is how many StateIntervals at least pass between
// two Wants of publishes that found no state fresh (decide's askStates):
// a site that does not answer is not asked at every publish.
const wantNudgeGapIntervals = 5

// maxWantLease bounds the lease a Want obtains, whatever it asks.
const maxWantLease = time.Minute

// stateTTL bounds how long a state waits in a federation link's queue
// while the link is down: an older one would be ignored anyway.
const stateTTL = "1000"

// newGroupRouter returns the router of an exported group of site, or nil
// when c does not route by the other sites' states.
func newGroupRouter(c WorkQueueConfig, site, broker string) *wqroute.Router {
	if c.Route != RouteNearest || c.TTLOverflowOnly {
		return nil
	}
	return wqroute.NewRouter(wqroute.Config{Site: site, Broker: broker, StaleAfter: stateStaleIntervals * c.StateInterval,
		Credit: stateHolderHeartbeatIntervals * c.StateInterval})
}

// declareRouteTopology creates group g's route exchange and binds the
// local intake to it with this site's name.
func declareRouteTopology(ch *amqp.Channel, g, site string) error {
	x := RouteExchangeName(g)
	args := amqp.Table{"alternate-exchange": ringExchange(g, 0)}
	if err := ch.ExchangeDeclare(x, amqp.ExchangeDirect, true, false, false, false, args); err != nil {
		return fmt.Errorf("declaring exchange %s: %w", x, err)
	}
	if err := ch.QueueBind(IntakeQueueName(g), site, x, false, nil); err != nil {
		return fmt.Errorf("binding %s to %s: %w", IntakeQueueName(g), x, err)
	}
	return nil
}

// stateChange is what of a group's state makes a broker publish it before
// its heartbeat is due: its members, the intake, any message taken back
// for a sibling (State.Unbooked), and any message taken
// since (the other sites' routers book what they send until a state shows
// it; a member that took and finished a message between two looks would
// otherwise look unchanged, and the bookings would pile up).
type stateChange struct {
	online, idle, intake int
	taken, unbooked      uint64
}

func changeOf(st wqroute.State, taken uint64) stateChange {
	c := stateChange{online: len(st.Members), intake: st.Intake, taken: taken}
	for _, bySite := range st.Unbooked {
		for _, n := range bySite {
			c.unbooked += n
		}
	}
	for _, m := range st.Members {
		if m.Wait == 0 {
			c.idle++
		}
	}
	return c
}

// stateLoop publishes group g's state and reads the other brokers' into
// g's router, on a channel of its own. States go to this site's other
// brokers always, and to another site only while it holds a lease: while
// it asked for them with a Want (wqroute.Demand). This broker asks in turn
// while its router's Demand says so.
func (b *Bridge) stateLoop(ctx context.Context, conn *amqp.Connection, g *workGroup) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("opening work-queue state channel for %s: %w", g.queue(), err)
	}
	defer ch.Close()
	x := RouteExchangeName(g.name)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return fmt.Errorf("declaring work-queue state queue for %s: %w", g.queue(), err)
	}
	for _, key := range []string{StateRoutingKey(b.cfg.Site), WantRoutingKey} {
		if err := ch.QueueBind(q.Name, key, x, false, nil); err != nil {
			return fmt.Errorf("binding work-queue state queue to %s with %s: %w", x, key, err)
		}
	}
	states, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return fmt.Errorf("consuming work-queue states of %s: %w", g.queue(), err)
	}
	dch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("opening work-queue dispatch channel for %s: %w", g.queue(), err)
	}
	defer dch.Close()
	if err := dch.Confirm(false); err != nil {
		return fmt.Errorf("confirming work-queue dispatches of %s: %w", g.queue(), err)
	}
	interval := b.cfg.WorkQueue.StateInterval
	tick := time.NewTicker(interval)
	defer tick.Stop()
	s := stateSender{b: b, ch: ch, g: g, heartbeat: stateHeartbeatIntervals * interval,
		holderHeartbeat: stateHolderHeartbeatIntervals * interval, interval: interval}
	// lastWant is the last Want of the demand under way (zero when
	// there is none); lastAsk, the last Want at all; lastWantSustained
	// says lastWant asked for the long lease.
	var lastWant, lastAsk time.Time
	var lastWantSustained bool
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-states:
			if !ok {
				return fmt.Errorf("work-queue state consumer of %s cancelled", g.queue())
			}
			now := time.Now()
			if d.RoutingKey == WantRoutingKey {
				var w wqroute.Want
				if err := json.Unmarshal(d.Body, &w); err != nil || w.Site == "" || w.LeaseMs <= 0 {
					b.log.Debug("bridge: ignoring a malformed work-queue state request", "exchange", x, "error", err)
					continue
				}
				if w.Site == b.cfg.Site || !s.leases.Grant(w.Site, now, now.Add(min(w.Lease(), maxWantLease))) {
					continue
				}
				if err := s.send(ctx, now, w.Site, false); err != nil { // a new holder hears at once
					return err
				}
				continue
			}
			var st wqroute.State
			if err := json.Unmarshal(d.Body, &st); err != nil || st.Site == "" {
				b.log.Debug("bridge: ignoring a malformed work-queue state", "exchange", x, "error", err)
				continue
			}
			// The other brokers of this site publish here too: their
			// members count with this broker's for local messages.
			g.router.Observe(st, now)
			if st.Site != b.cfg.Site {
				if err := b.dispatchHeld(ctx, dch, g); err != nil {
					return err
				}
			}
		case <-g.idleNudge:
			// A member went idle with nothing left to take: the sites
			// that asked for states hear of it now, not at the next tick
			// (if the state changed), at most every tenth of an interval.
			// Their routers count that member free only from this state
			// on; a tick's wait would add up to an interval to each
			// message they could send it.
			// The consume loop found both queues empty just before: the
			// state is sent without reading their depths from RabbitMQ.
			now := time.Now()
			if now.Sub(s.lastSent) < interval/10 {
				continue
			}
			if err := s.send(ctx, now, "", true); err != nil {
				return err
			}
		case <-g.wantNudge:
			// A local publish waits in wq.<g> for states that are not
			// fresh (this broker's publishes are too rare to keep a
			// stream of them): ask now; the first to arrive dispatches it.
			now := time.Now()
			if !lastAsk.IsZero() && now.Sub(lastAsk) < wantNudgeGapIntervals*interval {
				continue
			}
			if err := s.ask(ctx, now, wantShortLeaseIntervals*interval); err != nil {
				return err
			}
			lastWant, lastAsk, lastWantSustained = now, now, false
		case now := <-tick.C:
			if err := s.send(ctx, now, "", false); err != nil {
				return err
			}
			// Held messages are weighed again as time passes, not only
			// when a state arrives: a member another site's router sees
			// freeing on time sends no state to say so (Extrapolates).
			if err := b.dispatchHeld(ctx, dch, g); err != nil {
				return err
			}
			start, held, sustained := g.view.demandInputs(now, g.router, demandRecentIntervals*interval, wantShortLeaseIntervals*interval)
			if !g.router.Demand(now, start, held) {
				lastWant = time.Time{}
				continue
			}
			renew := wantRenewIntervals * interval
			if sustained && lastWantSustained {
				renew = wantSustainedRenewIntervals * interval
			}
			if !lastWant.IsZero() && now.Sub(lastWant) < renew {
				continue
			}
			lease := wantShortLeaseIntervals * interval
			if sustained {
				lease = wantLeaseIntervals * interval
			}
			if err := s.ask(ctx, now, lease); err != nil {
				return err
			}
			lastWant, lastAsk, lastWantSustained = now, now, sustained
		}
	}
}

// ask publishes a Want for the other sites' states over lease.
func (s *stateSender) ask(ctx context.Context, now time.Time, lease time.Duration) error {
	b, g := s.b, s.g
	x := RouteExchangeName(g.name)
	body, err := json.Marshal(wqroute.Want{Site: b.cfg.Site, Broker: b.cfg.BrokerID, LeaseMs: lease.Milliseconds()})
	if err != nil {
		return fmt.Errorf("encoding work-queue state request: %w", err)
	}
	err = s.ch.PublishWithContext(ctx, x, WantRoutingKey, false, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Transient, Expiration: stateTTL,
		Timestamp: now, AppId: "luffymq", Body: body, Headers: amqp.Table{HeaderOrigin: b.cfg.Site, HeaderBroker: b.cfg.BrokerID},
	})
	if err != nil {
		return fmt.Errorf("asking for work-queue states on %s: %w", x, err)
	}
	b.stats.wqWantSent(g.name)
	return nil
}

// stateSender publishes one broker's states of a group: to the site's
// other brokers, and to each other site holding a lease.
type stateSender struct {
	b  *Bridge
	ch *amqp.Channel
	g  *workGroup
	// heartbeat is the longest between two states to the site's other
	// brokers; holderHeartbeat, between two states to a lease holder
	// whose router extrapolates them.
	heartbeat, holderHeartbeat time.Duration
	// interval is the state interval: it bounds how far the members'
	// waits may stray from what a lease holder's router predicts before
	// the holder is told (wqroute.ExtrapolationTolerance; 0: every change
	// is told).
	interval time.Duration
	leases   wqroute.Leases
	holders  []string
	last     stateChange
	lastSent time.Time
	// sentTo is, by lease holder, the last state sent to it and when.
	sentTo map[string]sentState
	// takes is scratch space for the times of a holder's messages taken
	// since its last state.
	takes []int64
}

// sentState is a state sent to one lease holder: when, and when the
// members it reports were read (its Taken counts the takes by then).
type sentState struct {
	st          wqroute.State
	at          time.Time
	membersRead time.Time
}

// send publishes the state as of now, if it changed or a heartbeat is
// due, to the site's other brokers and to every lease holder; with only,
// to that site alone, whatever changed. readyKnown says the consume loop
// has just found both queues empty, so their depths need no reading.
func (s *stateSender) send(ctx context.Context, now time.Time, only string, readyKnown bool) error {
	b, g := s.b, s.g
	// The ready counts the consume loop saw at its last basic.get are old
	// while the members are busy: what arrived since would be missing from
	// the state, and the other sites would forget their bookings on the
	// strength of it.
	if !readyKnown {
		if _, _, err := readReady(s.ch, g); err != nil {
			return err
		}
	}
	st, taken, membersRead := g.view.state(b.cfg.Site, b.cfg.BrokerID, b.bootID, now)
	st.Unbooked = b.stats.wqSiblingsReclaimed(g.name) // for the siblings' routers
	c := changeOf(st, taken)
	why := "change"
	switch {
	case only != "":
		why = "lease"
	case c == s.last && now.Sub(s.lastSent) < s.heartbeat:
		return nil
	case c == s.last:
		why = "heartbeat"
	case readyKnown:
		why = "idle"
	}
	body, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encoding work-queue state: %w", err)
	}
	x := RouteExchangeName(g.name)
	s.holders = s.leases.Holders(now, append(s.holders[:0], b.cfg.Site))
	if only != "" {
		s.holders = append(s.holders[:0], only)
	}
	tolerance := wqroute.ExtrapolationTolerance(st.Members, s.interval)
	for _, site := range s.holders {
		siteWhy := why
		if site != b.cfg.Site && why != "lease" && s.interval > 0 {
			if prev, ok := s.sentTo[site]; ok {
				s.takes = g.view.takesFrom(site, prev.membersRead, s.takes[:0])
				if siteWhy = s.holderReason(prev, st, site, why, now, tolerance); siteWhy == "" {
					continue
				}
			}
		}
		err = s.ch.PublishWithContext(ctx, x, StateRoutingKey(site), false, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Transient, Expiration: stateTTL,
			Timestamp: now, AppId: "luffymq", Body: body,
			Headers: amqp.Table{HeaderOrigin: b.cfg.Site, HeaderBroker: b.cfg.BrokerID, "x-luffymq-sent": strconv.FormatInt(st.Sent, 10)},
		})
		if err != nil {
			return fmt.Errorf("publishing work-queue state on %s: %w", x, err)
		}
		if site != b.cfg.Site {
			if s.sentTo == nil {
				s.sentTo = map[string]sentState{}
			}
			s.sentTo[site] = sentState{st: st, at: now, membersRead: membersRead}
			b.stats.wqStateSent(g.name, site, siteWhy)
		}
	}
	if only == "" {
		s.last, s.lastSent = c, now
	}
	return nil
}

// holderReason says why st goes to lease holder site, which got prev last
// ("" if it need not): what a holder's router works out for itself (its
// own messages taken as it predicted, waits run down, Extrapolates over
// s.takes) is not sent, since a busy site would otherwise hear of every
// message its members take, until a holder heartbeat has passed without a
// state, which says then that the site is alive. Otherwise the state goes
// for why, the reason it is sent at all.
func (s *stateSender) holderReason(prev sentState, st wqroute.State, site, why string, now time.Time, tolerance time.Duration) string {
	if !wqroute.Extrapolates(prev.st, st, site, s.takes, tolerance) {
		return why
	}
	if now.Sub(prev.at) < s.holderHeartbeat {
		return ""
	}
	return "heartbeat"
}

// maxDispatch bounds the messages one state sends from wq.<g>: the
// router books each, so its predictions rise and it stops well before.
const maxDispatch = 64

// dispatchHeld sends the messages held in wq.<g> (heldTTL) that another
// site would now start sooner than the local members: taken from wq.<g>
// one at a time, published to that site's intake on the route exchange,
// acknowledged once RabbitMQ confirmed the publish. An idle site's state
// thus pulls as many as it has members free, as queue federation's idle
// consumers do, without the round trip of a pull.
func (b *Bridge) dispatchHeld(ctx context.Context, ch *amqp.Channel, g *workGroup) error {
	for range maxDispatch {
		now := time.Now()
		dec := g.view.dispatch(now, g.router)
		site, due := dec.site, dec.due
		if site == "" {
			if dec.ok && b.log.Enabled(ctx, slog.LevelDebug) {
				b.traceRoute(g, now, "bridge: work-queue held", dec, nil)
			}
			return nil
		}
		d, ok, err := ch.Get(g.queue(), false)
		if err != nil {
			g.router.Unbook(site)
			return fmt.Errorf("taking from work queue %s: %w", g.queue(), err)
		}
		if !ok {
			g.router.Unbook(site)
			g.view.undispatch()
			return nil
		}
		headers := maps.Clone(d.Headers)
		if headers == nil {
			headers = amqp.Table{}
		}
		headers[headerRouted] = true
		headers[headerDue] = due.UnixNano()
		headers[headerBookedBy] = b.cfg.BrokerID
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, RouteExchangeName(g.name), site, false, false, amqp.Publishing{
			Headers: headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: amqp.Persistent,
			Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, MessageId: d.MessageId,
			Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
		})
		if err == nil && !conf.Wait() {
			err = fmt.Errorf("RabbitMQ refused the publish")
		}
		if err != nil {
			g.router.Unbook(site)
			return fmt.Errorf("dispatching a held message of %s to %s: %w", g.queue(), site, err)
		}
		if err := d.Ack(false); err != nil {
			return fmt.Errorf("acknowledging a dispatched message of %s: %w", g.queue(), err)
		}
		b.stats.wqRoutedTo(g.name, site)
		if b.log.Enabled(ctx, slog.LevelDebug) {
			b.traceRoute(g, now, "bridge: work-queue dispatch", dec, d.Body)
		}
	}
	return nil
}
