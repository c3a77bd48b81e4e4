package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/luffymq/luffymq/scoring"
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
// intake queue goes first: its messages have waited longest.
func (b *Bridge) consumeLoop(ctx context.Context, ch *amqp.Channel, g *workGroup, gen uint64) error {
	idle := 5 * time.Millisecond
	var lastIntake time.Time // when the intake last gave a message
	var woken <-chan struct{}
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-woken:
			return true
		case <-t.C:
			return true
		}
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
			if !wait(10 * time.Millisecond) {
				return nil
			}
			continue
		}
		source := fromOwnOverflow
		d, ok, err := ch.Get(IntakeQueueName(g.name), false)
		if err == nil && !ok {
			source = fromWorkQueue
			d, ok, err = ch.Get(g.queue(), false)
		}
		if err != nil {
			return fmt.Errorf("taking from work queue %s: %w", g.queue(), err)
		}
		switch {
		case !ok:
			g.view.setReady(0, 0)
		case source == fromOwnOverflow:
			g.view.setReady(-1, int(d.MessageCount))
			g.view.took()
		default:
			g.view.setReady(int(d.MessageCount), 0)
			g.view.took()
		}
		if !ok {
			if !wait(idle) {
				return nil
			}
			// Other sites' overflow reaches the intake queue unannounced
			// (this broker's own publishes wake the loop): while some has
			// come lately, a poll of at most 10 ms bounds its wait here;
			// otherwise the loop polls every 50 ms, 40 basic.gets a
			// second per group instead of 200.
			idle = min(2*idle, intakePollInterval(time.Since(lastIntake)))
			continue
		}
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
			b.stats.wqFromSite(g.name, origin, routed)
		}
		if !b.deliverWork(g, d, gen, source) {
			if !wait(20 * time.Millisecond) { // no member after all: let scoring catch up
				return nil
			}
		}
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
				continue // its channel is gone: RabbitMQ requeued it
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
	if g.router != nil && predictable(b.membersOf(g)) {
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

// configMessage is algorithms.md §2.6's configuration message: global
// entity -> upstreams of this site for it.
type configMessage map[string][]struct {
	URI string `json:"uri"`
}

// federationFor turns a configuration message into per-exchange
// federations: a "pubsub*" exchange is federated as itself; "wq.<g>"
// federates wq.<g>.in from the upstreams' wq.<g>.dlx, and wq.<g>.to from
// theirs (states and messages routed to this site, see wqrouting.go).
func federationFor(m configMessage) ([]ExchangeFederation, error) {
	out := []ExchangeFederation{}
	for name, ups := range m {
		x := ExchangeFederation{Exchange: name}
		if g, ok := strings.CutPrefix(name, WorkQueuePrefix); ok {
			if !validName(g) {
				return nil, fmt.Errorf("%w: configuration entry %q: work queue group %q: use letters, digits, '-' or '_'", ErrInvalidConfig, name, g)
			}
			x = ExchangeFederation{Exchange: IntakeExchangeName(g), UpstreamExchange: DeadLetterExchangeName(g)}
		} else if !strings.HasPrefix(name, "pubsub") {
			return nil, fmt.Errorf("%w: configuration entry %q: only pubsub* exchanges and wq.* queues are global", ErrInvalidConfig, name)
		} else if len(name) > MaxAMQPNameLength {
			return nil, fmt.Errorf("%w: configuration entry %.32q…: longer than RabbitMQ's %d-byte names", ErrInvalidConfig, name, MaxAMQPNameLength)
		}
		for i, u := range ups {
			if !strings.HasPrefix(u.URI, "amqp://") && !strings.HasPrefix(u.URI, "amqps://") {
				return nil, fmt.Errorf("%w: configuration entry %q: uri %q is not amqp:// or amqps://", ErrInvalidConfig, name, redact(u.URI))
			}
			x.Upstreams = append(x.Upstreams, Upstream{Site: strconv.Itoa(i), URI: u.URI})
		}
		out = append(out, x)
		if g, ok := strings.CutPrefix(name, WorkQueuePrefix); ok {
			// One hop: wq.<g>.to is federated as itself, so with more a
			// state or message would come back through third sites, late
			// and duplicated.
			out = append(out, ExchangeFederation{Exchange: RouteExchangeName(g), Upstreams: x.Upstreams, MaxHops: 1})
		}
	}
	return out, nil
}

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
		if !sleepCtx(ctx, retry) {
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
