package bridge

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/luffymq/luffymq/scoring"
	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	amqp "github.com/rabbitmq/amqp091-go"
)

// wqSource says which queue a work-queue message was taken from.
type wqSource int

const (
	fromWorkQueue   wqSource = iota // wq.<g>: published at this site
	fromOwnOverflow                 // intake, published at this site
	fromOtherSite                   // intake, published at another site
	numWQSources
)

var wqSourceNames = [numWQSources]string{"local", "own_overflow", "other_site"}

// hashArgs are the arguments of both consistent-hash exchanges of group
// g: identical, so a federation link may declare either. Hashing on the
// message ID spreads messages that share a routing key. The alternate
// exchange catches what the hash ring cannot route — while the intake
// exchange's only binding is being replaced, or if the ring were ever
// inconsistent — and hands it to the local intake queue: nothing
// dead-lettered is dropped.
func hashArgs(g string) amqp.Table {
	return amqp.Table{"hash-property": "message_id", "alternate-exchange": ringExchange(g, 0)}
}

// declareWorkTopology creates the entities of group g at this node: the
// work queue, its dead-letter and intake exchanges and the intake queue,
// bound to the dead-letter exchange with weight w.
func declareWorkTopology(ch *amqp.Channel, g string) error {
	if _, err := ch.QueueDeclare(WorkQueueName(g), true, false, false, false, nil); err != nil {
		return fmt.Errorf("declaring queue %s: %w", WorkQueueName(g), err)
	}
	return declareOverflowTopology(ch, g, 0)
}

// adoptBindings reads the weights bound by an earlier process, so that no
// destination of a consistent-hash exchange ever gets a second binding:
// RabbitMQ 3.10's ring removes a destination's buckets assuming one
// contiguous binding, and a second one would corrupt the ring. Without an
// earlier binding the local intake is bound with weight 1 through ring 0.
func (b *Bridge) adoptBindings(ch *amqp.Channel, g string) (wqState, error) {
	var st wqState
	bound, err := b.dlxRingBindings(g)
	if err != nil {
		return st, err
	}
	for _, x := range bound {
		if w, err := strconv.Atoi(x.weight); err == nil && w > 0 && st.weight == 0 {
			st.weight, st.ring = w, x.ring
		}
	}
	if st.weight == 0 {
		if err := ch.ExchangeBind(ringExchange(g, 0), "1", DeadLetterExchangeName(g), false, nil); err != nil {
			return st, fmt.Errorf("binding %s to %s: %w", ringExchange(g, 0), DeadLetterExchangeName(g), err)
		}
		st.weight = 1
	}
	in, err := b.rh.ListExchangeBindingsWithSource(b.vhost(), IntakeExchangeName(g))
	if err != nil {
		return st, fmt.Errorf("listing bindings of %s on %s: %w", IntakeExchangeName(g), b.cfg.WorkQueue.ManagementURL, err)
	}
	for _, x := range in {
		if x.Destination == IntakeQueueName(g) && x.DestinationType == "queue" && st.inWeight == 0 {
			if w, err := strconv.Atoi(x.RoutingKey); err == nil && w > 0 {
				st.inWeight = w
			}
		}
	}
	return st, nil
}

// ringBinding is one binding of a group's dead-letter exchange to one of
// its ring exchanges: the local intake's weight in the hash ring.
type ringBinding struct {
	ring   int
	weight string // the binding key
}

// dlxRingBindings lists the bindings of group g's dead-letter exchange to
// its ring exchanges, read through the management API.
func (b *Bridge) dlxRingBindings(g string) ([]ringBinding, error) {
	all, err := b.rh.ListExchangeBindingsWithSource(b.vhost(), DeadLetterExchangeName(g))
	if err != nil {
		return nil, fmt.Errorf("listing bindings of %s on %s: %w", DeadLetterExchangeName(g), b.cfg.WorkQueue.ManagementURL, err)
	}
	var out []ringBinding
	for _, x := range all {
		for i := 0; i < 2; i++ {
			if x.Destination == ringExchange(g, i) && x.DestinationType == "exchange" {
				out = append(out, ringBinding{ring: i, weight: x.RoutingKey})
			}
		}
	}
	return out, nil
}

// ringExchange returns one of the two fanout exchanges through which the
// dead-letter exchange reaches the local intake queue. The
// consistent-hash exchange forgets every bucket of a destination when any
// of its bindings goes, so a new weight is bound to the other ring
// exchange before the old one is unbound: the local intake never drops
// out of the hash ring.
func ringExchange(g string, i int) string { return WorkQueuePrefix + g + ".ring" + strconv.Itoa(i) }

// declareOverflowTopology creates what a work queue wq.<g> needs around
// it (the site agent's reaction to queue.created); with w > 0 the local
// intake gets weight w through ring exchange 0.
func declareOverflowTopology(ch *amqp.Channel, g string, w int) error {
	for _, x := range []string{DeadLetterExchangeName(g), IntakeExchangeName(g)} {
		if err := ch.ExchangeDeclare(x, "x-consistent-hash", true, false, false, false, hashArgs(g)); err != nil {
			return fmt.Errorf("declaring consistent-hash exchange %s (is rabbitmq_consistent_hash_exchange enabled?): %w", x, err)
		}
	}
	if _, err := ch.QueueDeclare(IntakeQueueName(g), true, false, false, false, nil); err != nil {
		return fmt.Errorf("declaring queue %s: %w", IntakeQueueName(g), err)
	}
	for i := 0; i < 2; i++ {
		if err := ch.ExchangeDeclare(ringExchange(g, i), amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
			return fmt.Errorf("declaring exchange %s: %w", ringExchange(g, i), err)
		}
		if err := ch.QueueBind(IntakeQueueName(g), "", ringExchange(g, i), false, nil); err != nil {
			return fmt.Errorf("binding %s to %s: %w", IntakeQueueName(g), ringExchange(g, i), err)
		}
	}
	if w > 0 {
		if err := ch.ExchangeBind(ringExchange(g, 0), strconv.Itoa(w), DeadLetterExchangeName(g), false, nil); err != nil {
			return fmt.Errorf("binding %s to %s: %w", ringExchange(g, 0), DeadLetterExchangeName(g), err)
		}
	}
	return nil
}

// putWorkPolicy sets the TTL / max-length policy of wq.<g>.
func (b *Bridge) putWorkPolicy(g string, maxLength int, ttl time.Duration) error {
	q := WorkQueueName(g)
	policy := rabbithole.Policy{
		Pattern:  "^" + strings.ReplaceAll(q, ".", `\.`) + "$",
		ApplyTo:  "queues",
		Priority: 5,
		Definition: rabbithole.PolicyDefinition{
			"message-ttl":          ttl.Milliseconds(),
			"max-length":           maxLength,
			"overflow":             "drop-head",
			"dead-letter-exchange": DeadLetterExchangeName(g),
		},
	}
	if err := checkResponse(b.rh.PutPolicy(b.vhost(), WorkQueuePolicyPrefix+q, policy)); err != nil {
		return fmt.Errorf("setting policy %s%s on %s: %w", WorkQueuePolicyPrefix, q, b.cfg.WorkQueue.ManagementURL, err)
	}
	return nil
}

func (b *Bridge) vhost() string {
	if v := b.cfg.WorkQueue.Federation.Vhost; v != "" {
		return v
	}
	return "/"
}

// strayCheckInterval is how often at most the retune loop looks for
// bindings of a group's hash ring that it did not make (see
// moveRingWeight). The race that makes them is at a queue's creation, so
// the first move after it (the check's zero time) always looks.
const strayCheckInterval = 5 * time.Second

// wqState is what the retune loop last applied to one group.
type wqState struct {
	strayCheck time.Time // when moveRingWeight last looked for strays
	maxLength  int
	ttl        time.Duration
	weight     int // bound to the dead-letter exchange through ring exchange ring
	ring       int
	inWeight   int // bound to the intake exchange (0: unbound)
	inQueue    int
	online     int
	owner      bool // this broker retunes the group for its site
}

// membersOf returns group g's members from the load source.
func (b *Bridge) membersOf(g *workGroup) []scoring.MemberSnapshot {
	for _, s := range b.cfg.WorkQueue.Load.Snapshot() {
		if s.Filter == g.share {
			return s.Members
		}
	}
	return nil
}

// consumeLoop takes group g's messages from RabbitMQ at the rate its local
// members absorb: one basic.get whenever some online member has room and
// fewer than UnackedPerMember × online messages are unacknowledged. The
// intake queue goes first: its messages have waited longest. While members
// have room and both queues are empty, an arrivalBell on each hands the
// loop the next message the moment it arrives.
func (b *Bridge) consumeLoop(ctx context.Context, ch *amqp.Channel, g *workGroup, gen uint64) error {
	if err := ch.Qos(1, 0, false); err != nil {
		return fmt.Errorf("setting the arrival consumers' prefetch on %s: %w", g.queue(), err)
	}
	bells := [...]*arrivalBell{
		fromOwnOverflow: newArrivalBell(ch, IntakeQueueName(g.name), b.cfg.BrokerID),
		fromWorkQueue:   newArrivalBell(ch, g.queue(), b.cfg.BrokerID),
	}
	idle := 5 * time.Millisecond
	var lastIntake time.Time // when the intake last gave a message
	// take delivers one message the loop got from source, by basic.get or
	// from a bell.
	take := func(d amqp.Delivery, source wqSource) {
		idle = 5 * time.Millisecond
		if source == fromOwnOverflow {
			lastIntake = time.Now()
		}
		if origin, _ := d.Headers[HeaderOrigin].(string); source == fromOwnOverflow && origin != "" && origin != b.cfg.Site {
			source = fromOtherSite
		}
		if source == fromOtherSite {
			origin, _ := d.Headers[HeaderOrigin].(string)
			routed, _ := d.Headers[headerRouted].(bool)
			b.stats.wqFromSite(g.name, origin)
			if routed {
				due, _ := d.Headers[headerDue].(int64)
				g.view.tookRouted(origin, time.Now(), unixNanoTime(due))
			}
		}
		g.view.took()
		if !b.deliverWork(g, d, gen, source) {
			idle = 20 * time.Millisecond // no member after all: let scoring catch up
		}
	}
	// disarm disarms the bell of source and takes what it had.
	disarm := func(source wqSource) error {
		left, err := bells[source].disarm()
		for _, d := range left {
			take(d, source)
		}
		return err
	}
	// rang takes the message a bell rang with, and disarms it.
	rang := func(source wqSource, d amqp.Delivery, ok bool) error {
		if ok {
			take(d, source)
		}
		return disarm(source)
	}
	var woken <-chan struct{}
	wait := func(d time.Duration) (bool, error) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false, nil
		case <-woken:
		case <-t.C:
		case d, ok := <-bells[fromOwnOverflow].ringing():
			return true, rang(fromOwnOverflow, d, ok)
		case d, ok := <-bells[fromWorkQueue].ringing():
			return true, rang(fromWorkQueue, d, ok)
		}
		return true, nil
	}
	for {
		if ctx.Err() != nil {
			return nil
		}
		woken = b.wakeChan()
		members := b.membersOf(g)
		c := b.cfg.WorkQueue.capacity(members)
		g.view.setMembers(members, c.TTL, time.Now())
		if c.Online == 0 || b.wqTrack.count(g.name) >= c.Online*b.cfg.WorkQueue.UnackedPerMember || !hasRoom(members) {
			if err := errors.Join(disarm(fromOwnOverflow), disarm(fromWorkQueue)); err != nil {
				return err
			}
			if more, err := wait(10 * time.Millisecond); !more || err != nil {
				return err
			}
			continue
		}
		// An armed, silent bell says its queue is empty: it rings as soon
		// as a message reaches the queue, so a basic.get there would only
		// ask RabbitMQ what the bell already says. Only the queues whose
		// bells are disarmed (none armed yet, or one just rang) are looked
		// at, the intake first. With both armed the loop asks nothing and
		// still comes round every few milliseconds, to read the members
		// (the group state) and to notice a member gone idle. Before, it
		// looked at both queues each time: about a hundred empty
		// basic.gets a second per broker while members waited, and two
		// for every message that came unannounced.
		source := fromOwnOverflow
		var d amqp.Delivery
		var ok bool
		var err error
		if !bells[fromOwnOverflow].armed() {
			d, ok, err = ch.Get(IntakeQueueName(g.name), false)
			if err == nil && !ok {
				b.stats.wqEmptyGet(g.name)
			}
		}
		if err == nil && !ok && !bells[fromWorkQueue].armed() {
			source = fromWorkQueue
			d, ok, err = ch.Get(g.queue(), false)
			if err == nil && !ok {
				b.stats.wqEmptyGet(g.name)
			}
		}
		if err != nil {
			return fmt.Errorf("taking from work queue %s: %w", g.queue(), err)
		}
		switch {
		case !ok:
			g.view.setReady(0, 0)
			if g.view.idleRose() {
				g.nudgeIdle()
			}
		case source == fromOwnOverflow:
			g.view.setReady(-1, int(d.MessageCount))
		default:
			g.view.setReady(int(d.MessageCount), 0)
		}
		if ok {
			take(d, source)
			if idle > 5*time.Millisecond {
				if more, err := wait(idle); !more || err != nil {
					return err
				}
			}
			continue
		}
		for _, bell := range bells {
			if err := bell.arm(); err != nil {
				return err
			}
		}
		if more, err := wait(idle); !more || err != nil {
			return err
		}
		// Other sites' overflow reaches the intake queue unannounced
		// (this broker's own publishes wake the loop), and the bells ring
		// when it comes; the loop still comes round every 10 ms while
		// some has come lately, and every 50 ms otherwise, to read the
		// members.
		idle = min(2*idle, intakePollInterval(time.Since(lastIntake)))
	}
}

// intakePollInterval is the longest pause between two looks at an empty
// intake queue, sinceIntake after it last gave a message.
func intakePollInterval(sinceIntake time.Duration) time.Duration {
	if sinceIntake < 30*time.Second {
		return 10 * time.Millisecond
	}
	return 50 * time.Millisecond
}

// settleLoop acknowledges or requeues work-queue messages on the channel
// that took them.
func (b *Bridge) settleLoop(ctx context.Context, gen uint64) error {
	sweep := time.NewTicker(time.Second)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sweep.C:
			b.sweepStuck(gen)
		case s := <-b.settles:
			if s.p.gen != gen {
				// Its channel is gone: RabbitMQ requeued it whatever the
				// member did, and will deliver it again. If the member
				// finished it, the copy is acknowledged as a duplicate
				// when it comes, not processed again.
				if s.ack {
					b.wqDone.seen(s.p.id)
				}
				b.stats.wqSettled(s.p.g.name, "requeued")
				continue
			}
			var err error
			if s.ack {
				err = s.p.d.Ack(false)
				b.wqDone.seen(s.p.id)
			} else {
				err = s.p.d.Nack(false, true)
			}
			b.stats.wqSettled(s.p.g.name, s.why)
			if err != nil {
				return fmt.Errorf("settling work-queue message: %w", err)
			}
		}
	}
}

// retuneLoop applies eq. 2.12–2.14 to every exported group this broker
// retunes for its site, and sends its share of the capacity of the others
// to their owner (see rc).
func (b *Bridge) retuneLoop(ctx context.Context, ch *amqp.Channel, rc *retuneCoordinator) error {
	defer func() {
		b.wqMu.Lock()
		for g, st := range b.wqStates {
			st.owner = false // the ownership ends with the connection
			b.wqStates[g] = st
		}
		b.wqMu.Unlock()
	}()
	for {
		for _, g := range b.groups {
			if err := b.retune(ctx, ch, g, rc); err != nil {
				if errors.As(err, new(*amqp.Error)) {
					return err
				}
				b.log.Warn("bridge: retuning work queue failed", "queue", g.queue(), "error", err)
			}
		}
		t := time.NewTimer(b.cfg.WorkQueue.RetuneInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

func (b *Bridge) retune(ctx context.Context, ch *amqp.Channel, g *workGroup, rc *retuneCoordinator) error {
	own := b.cfg.WorkQueue.capacity(b.membersOf(g))
	turn, err := rc.turn(ctx, g, own, b.wqTrack.count(g.name))
	if err != nil {
		return err
	}
	b.wqMu.Lock()
	st := b.wqStates[g.name]
	b.wqMu.Unlock()
	if !turn.owner {
		// Another broker of the site retunes the group from the site's
		// sum; this one only takes messages at its members' capacity.
		st.owner, st.online = false, own.Online
		g.view.takeOverflowed() // weights are the owner's; should this broker become it, it starts afresh
		b.wqMu.Lock()
		b.wqStates[g.name] = st
		b.wqMu.Unlock()
		return nil
	}
	if turn.adopt {
		// A new owner: the previous one may have changed the weights; read
		// them back and apply the policy again.
		if st, err = b.adoptBindings(ch, g.name); err != nil {
			return err
		}
		rc.adopted(g.name)
	}
	st.owner = true
	c := turn.site
	work, intake, err := readReady(ch, g)
	if err != nil {
		return err
	}
	inQueue := turn.unacked + work + intake
	w := weight(c.MaxLength, inQueue)
	inW := w
	if c.Online == 0 {
		inW = 0 // nobody here to work on other sites' overflow
	}
	if g.view.takeOverflowed() > 0 {
		// The members were predicted too busy to start publishes within
		// the TTL since the last retune: what leaves this site's queue
		// should not come back to its intake, where it would be served
		// first and push the queue back. Eq. 2.13 cannot say so while
		// eq. 2.12's max length is far above what the members get through
		// in a TTL. Only the local ring's weight drops: the intake weight
		// that other sites see would flap with every quiet retune, and
		// each move stalls the links into this site.
		w = 1
	}
	ttl := c.TTL
	if g.router != nil && allTimed(b.membersOf(g)) {
		// See heldTTL. Members that cannot be predicted (no service
		// time) keep the thesis's rule: their publishes stay, and the TTL
		// sends them on.
		ttl = max(ttl, heldTTL)
	}
	if st.maxLength != c.MaxLength || st.ttl != ttl {
		if err := b.putWorkPolicy(g.name, c.MaxLength, ttl); err != nil {
			return err
		}
		st.maxLength, st.ttl = c.MaxLength, ttl
	}
	if st.weight != w {
		// Weights change at most every retune; looking for bindings this
		// bridge did not make costs a management API call, so it is done
		// at most every strayCheckInterval.
		checkStrays := time.Since(st.strayCheck) >= strayCheckInterval
		if err := b.moveRingWeight(ch, g.name, st.ring, st.weight, w, checkStrays); err != nil {
			return err
		}
		if checkStrays {
			st.strayCheck = time.Now()
		}
		st.ring, st.weight = 1-st.ring, w
	}
	if st.inWeight != inW && !intakeWeightMatters(st.inWeight, inW) {
		inW = st.inWeight
	}
	if st.inWeight != inW {
		// Federation mirrors these bindings on the other sites'
		// dead-letter exchanges, all to one link exchange there: remove the
		// old weight before adding the new one, or the removal would take
		// the new buckets too. Meanwhile those sites route to other
		// destinations, their own intake always among them.
		x := IntakeExchangeName(g.name)
		if st.inWeight > 0 {
			if err := ch.QueueUnbind(IntakeQueueName(g.name), strconv.Itoa(st.inWeight), x, nil); err != nil {
				return fmt.Errorf("unbinding %s from %s: %w", IntakeQueueName(g.name), x, err)
			}
		}
		if inW > 0 {
			if err := ch.QueueBind(IntakeQueueName(g.name), strconv.Itoa(inW), x, false, nil); err != nil {
				return fmt.Errorf("binding %s to %s: %w", IntakeQueueName(g.name), x, err)
			}
		}
	}
	st.inWeight, st.inQueue, st.online = inW, inQueue, c.Online
	b.wqMu.Lock()
	b.wqStates[g.name] = st
	b.wqMu.Unlock()
	return nil
}

// readReady reads the messages ready in group g's queue and intake queue
// and records them in g's overflow view.
func readReady(ch *amqp.Channel, g *workGroup) (work, intake int, err error) {
	var ready [2]int
	for i, q := range []string{g.queue(), IntakeQueueName(g.name)} {
		info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		if err != nil {
			return 0, 0, fmt.Errorf("reading depth of %s: %w", q, err)
		}
		ready[i] = info.Messages
	}
	g.view.setReady(ready[0], ready[1])
	return ready[0], ready[1], nil
}

// intakeWeightMatters reports whether the intake's weight should move
// from old to w. Federation carries every rebinding to each other site's
// dead-letter exchange, and each site's link stops delivering while it
// unbinds and binds over the WAN: two round trips per change. Measured in
// luffy-bench sites, wq-balanced: moving the weight at every 1 s retune
// (eq. 2.12's availability swings as members start and finish messages)
// added 100–400 ms to what crossed the 120 ms links; weights that never
// moved cost nothing. So the weight moves only when the site starts or
// stops taking overflow, or when it at least doubles or halves: the shares
// it sets are proportions, and smaller changes hardly move them.
func intakeWeightMatters(old, w int) bool {
	switch {
	case old == w:
		return false
	case old == 0 || w == 0:
		return true
	}
	return w >= 2*old || 2*w <= old
}

// moveRingWeight gives the local intake weight w in group g's hash ring,
// moving it from ring exchange ring (bound with weight old) to the other
// one: the new weight is bound first, then the old one goes, so the
// intake stays in the ring throughout. Bindings this bridge did not make
// (an event agent of another broker of the site that does not export g,
// racing this one's first binding) are removed with them: on the new
// ring before binding, so it ends with one binding; on the old ring with
// the old weight. Each ring exchange has at most one binding, which
// RabbitMQ 3.10's consistent-hash exchange needs (see adoptBindings).
// Without checkStrays it moves only its own binding.
func (b *Bridge) moveRingWeight(ch *amqp.Channel, g string, ring, old, w int, checkStrays bool) error {
	next := 1 - ring
	dlx := DeadLetterExchangeName(g)
	var bound []ringBinding
	if checkStrays {
		var err error
		if bound, err = b.dlxRingBindings(g); err != nil {
			return err
		}
	}
	unbind := func(r int, key string) error {
		if err := ch.ExchangeUnbind(ringExchange(g, r), key, dlx, false, nil); err != nil {
			return fmt.Errorf("unbinding %s from %s: %w", ringExchange(g, r), dlx, err)
		}
		return nil
	}
	var strays []ringBinding
	for _, x := range bound {
		switch {
		case x.ring == next:
			b.log.Warn("bridge: removing a binding this bridge did not make from the work queue's hash ring", "exchange", dlx, "ring", ringExchange(g, next), "weight", x.weight)
			if err := unbind(next, x.weight); err != nil {
				return err
			}
		case x.weight != strconv.Itoa(old):
			strays = append(strays, x)
		}
	}
	if err := ch.ExchangeBind(ringExchange(g, next), strconv.Itoa(w), dlx, false, nil); err != nil {
		return fmt.Errorf("binding %s to %s: %w", ringExchange(g, next), dlx, err)
	}
	if err := unbind(ring, strconv.Itoa(old)); err != nil {
		return err
	}
	for _, x := range strays {
		b.log.Warn("bridge: removing a binding this bridge did not make from the work queue's hash ring", "exchange", dlx, "ring", ringExchange(g, x.ring), "weight", x.weight)
		if err := unbind(x.ring, x.weight); err != nil {
			return err
		}
	}
	return nil
}

// unixNanoTime is the time of Unix nanoseconds ns; zero for 0.
func unixNanoTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
