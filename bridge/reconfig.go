package bridge

// Loss-free reconfiguration of federation links (algorithms.md §2.5).
//
// When a configuration message changes the upstreams of an exchange (its
// synchronisation site moved), the configuration agent of the downstream
// site, applyConfiguration:
//
//  1. keeps the upstream name of every link whose upstream URI and
//     exchange did not change and gives each new upstream a free slot
//     (ExchangeUpstreamSlots), so no kept link restarts;
//  2. adds the new links beside the old ones and waits
//     (FederationConfig.LinkWait) until every new link of an exchange that
//     exists here runs; until then nothing is removed, and a message whose
//     new links do not come up is retried with both sets running
//     (duplicates, which importers drop by message ID, but no loss);
//  3. waits FederationConfig.OldLinkGrace, so that messages already on
//     their way through the old links arrive;
//  4. asks the upstream node of every link it is about to remove to take
//     what the link holds there: a conservation request, published
//     through the link's own URI to that node's queue ConserveQueueName,
//     with confirms, and waits for the answer on direct reply-to;
//  5. removes an old link only when it may: its upstream answered that it
//     took what the link's queue held, or the link is not running (not
//     connected, so RabbitMQ cannot delete its queue: the request is then
//     sent again in the background until it is delivered, for as long as
//     a link queue may live there, FederationConfig.Expires). Every other
//     old link stays: the configuration fails and is applied again a
//     second later (both sets run meanwhile: duplicates, no loss).
//
// Why the downstream must not remove a running link before the answer:
// RabbitMQ (3.10) stops a removed link with reason shutdown, and a link
// stopped that way while connected deletes its queue on the upstream
// (queue.delete, not if-empty) with what is still in it and with what the
// link has received and not yet forwarded. The same happens when a running
// link restarts ({shutdown, restart}) while connected: after a 404 on a
// binding command (its upstream exchange is gone) or when its periodic
// check misses that exchange. A link queue's name depends only on the
// upstream exchange and the downstream node and exchange, not on the
// upstream's name: a later link from the same downstream for the same
// exchange uses the same queue.
//
// The site agent of the upstream node (conserveAgent) takes the requests,
// several at once, one at a time per queue. For each it finds the link's
// queue by the name RabbitMQ gives it, and through its own management API
// by the exchanges of type x-federation-upstream whose x-downstream-name
// and x-downstream-vhost arguments name the requesting node and to which
// the requested exchange is bound (the link's "feeds"). It then
//
//   - waits (up to 30 s) until other federation links of the exchange
//     carry what the removed one carried: for every binding of the old
//     link (routing key and the site it was made for, the last entry of
//     its x-bound-from argument), a binding of another link with the same
//     key made for the same site. The sites move one by one, each at its
//     own pace: the new links towards those sites may still be starting.
//     Bindings made for the requesting site itself are left out when that
//     site no longer federates the exchange at all. If they are not there
//     in time, it touches nothing and answers "not taken" (the downstream
//     keeps its link and asks again); a request nobody waits for is taken
//     again a few seconds later;
//   - takes custody of what the queue holds, without deleting anything
//     the link uses (so the link does not restart and delete its queue):
//     it closes the connection of any consumer of the queue (the link's),
//     which gives what the link had received and not yet forwarded back to
//     the queue, takes the queue's messages (basic.get) and re-publishes
//     each into the exchange the link read, with its properties and
//     headers (x-luffymq-origin, message-id, …) except x-received-from,
//     federation's record of the links it crossed (the message is routed
//     as if published here, so it follows the new links), waits for
//     RabbitMQ's confirm and only then acknowledges it in the old queue. A
//     link that reconnects is closed again (RabbitMQ delays its restarts
//     after the first one by the link's reconnect delay), until the queue
//     is empty with no consumer;
//   - answers the request ("taken"); the downstream removes its link;
//   - once no link has consumed the queue for a while (2 s, longer than
//     a link's reconnect delay; at once when the downstream removed the
//     link already), deletes the queue's feeds, re-publishes what reached
//     the queue meanwhile and deletes the queue if it is still unused and
//     empty;
//   - with DiscardHeldOnMove, re-publishes nothing: it deletes the feeds,
//     answers, and deletes the queue with what it holds once no link
//     consumes it, counting the messages: the behaviour the thesis
//     measured without conservation.
//
// Every re-published message carries x-luffymq-conserved (this node's
// cluster name and the time): a copy of it that comes back into a queue
// in custody here (still bound to its feed) is dropped there, since the
// links that cover that queue carried it. A re-published message can also
// reach sites that already had it through the new links; their importers
// drop it by message ID (Config.DedupWindow). Requests and every step are
// idempotent: an agent that stops half-way leaves the request
// unacknowledged, and the next one finds the queue again by its name.
//
// Bounds: messages are kept as long as RabbitMQ keeps them in the link
// queue (FederationConfig.MessageTTL, and Expires for a queue nobody
// uses); a downstream that cannot reach its upstream removes a link that
// does not run, leaving the queue, which is taken once the request gets
// through. What is not covered: a message that crossed the old link before
// the agent took custody and is still on its way on to another site
// through the old synchronisation site may be stopped there by max-hops
// once that site's own old links are gone; and one node must not be
// reachable under two URIs in one configuration (its two links would share
// one queue).

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"

	"github.com/luffymq/luffymq/internal/timeutil"
)

// ConserveQueueName is the durable queue on every node in which site
// agents of downstream nodes leave conservation requests for the agent of
// that node: after a configuration message removed a federation link, the
// agent of the link's upstream re-publishes what the link left there into
// the exchange it came from, so it follows the new links, or deletes it
// with FederationConfig.DiscardHeldOnMove (the procedure is described at
// the top of reconfig.go).
const ConserveQueueName = "luffymq.reconfig.conserve"

// Names RabbitMQ's exchange federation gives its entities on an upstream.
const (
	federationUpstreamExchangeType = "x-federation-upstream"
	federationDownstreamNameArg    = "x-downstream-name"
	federationDownstreamVhostArg   = "x-downstream-vhost"
	federationPurposeArg           = "x-internal-purpose"
	federationReceivedFromHeader   = "x-received-from"
	federationBoundFromArg         = "x-bound-from"
	federationQueuePrefix          = "federation: "
	directReplyTo                  = "amq.rabbitmq.reply-to"
)

// conservedHeader marks a re-published message: "<cluster name> <Unix
// time in ns>" of the node and moment it was re-published.
const conservedHeader = "x-luffymq-conserved"

const (
	// conserveParallel is how many requests an agent works on at once.
	conserveParallel = 16
	// conserveRetryMax is the longest pause between two attempts to
	// deliver a request.
	conserveRetryMax = 250 * time.Millisecond
	// republishWindow is how many messages re-publishing takes from a
	// queue before their publishes are confirmed and acknowledged there.
	republishWindow = 64
	// republishIdle is how long re-publishing waits for another message
	// before it looks whether the queue is empty.
	republishIdle = 50 * time.Millisecond
)

// conserveTimings bound the steps of loss-free reconfiguration.
type conserveTimings struct {
	// CoverWait bounds how long the upstream waits for other links to
	// carry what a removed link carried before it takes custody.
	CoverWait time.Duration
	// ReplyWait bounds how long a downstream waits for the answer to a
	// request; without it, a running link stays.
	ReplyWait time.Duration
	// AgentWait bounds how long a downstream waits for an agent to
	// consume the upstream's ConserveQueueName.
	AgentWait time.Duration
	// CustodyWait bounds the upstream's attempts to find the link's queue
	// empty with no consumer.
	CustodyWait time.Duration
	// ConsumedWait bounds how long the upstream waits, after answering,
	// for the link to stop consuming the queue.
	ConsumedWait time.Duration
	// IdleBeforeDelete is how long the queue has no consumer before the
	// upstream deletes its feeds and itself (longer than a link's
	// reconnect delay, so a link that is only reconnecting keeps them).
	IdleBeforeDelete time.Duration
	// RetryPause is how long a request nobody waits for is put aside when
	// the new links do not carry the old one's bindings yet.
	RetryPause time.Duration
}

func defaultConserveTimings() *conserveTimings {
	const cover = 30 * time.Second
	return &conserveTimings{
		CoverWait:        cover,
		ReplyWait:        cover + 20*time.Second,
		AgentWait:        10 * time.Second,
		CustodyWait:      15 * time.Second,
		ConsumedWait:     2 * time.Minute,
		IdleBeforeDelete: 2 * time.Second,
		RetryPause:       5 * time.Second,
	}
}

// Timings in use and the hook called as an agent takes a request; tests
// change them (reconfig_export_test.go).
var (
	conserveTimingsNow atomic.Pointer[conserveTimings]
	conserveTakeHook   atomic.Pointer[func(conserveRequest)]
)

func timings() conserveTimings {
	if t := conserveTimingsNow.Load(); t != nil {
		return *t
	}
	return *defaultConserveTimings()
}

// conserveRequest asks the agent of an upstream node to conserve the queue
// a removed federation link left there.
type conserveRequest struct {
	// Exchange is the upstream exchange the link read.
	Exchange string `json:"exchange"`
	// Downstream and DownstreamVhost name the downstream node as its
	// links do (cluster name and virtual host).
	Downstream      string `json:"downstream"`
	DownstreamVhost string `json:"downstream_vhost"`
	// Discard asks for the held messages to be deleted, not re-published.
	Discard bool `json:"discard"`
	// Left says the downstream no longer federates the exchange at all:
	// what the link carried for the downstream itself needs no other link.
	Left bool `json:"left"`
	// LocalExchange is the downstream exchange the link fed (part of the
	// name of the link's queue); Site and Upstream say, for logs, who
	// asks and which link it removed.
	Site          string `json:"site"`
	Upstream      string `json:"upstream"`
	LocalExchange string `json:"local_exchange"`
	// GiveUpAt (Unix ms) is when a request nobody waits for is dropped:
	// no link queue lives longer (FederationConfig.Expires).
	GiveUpAt int64 `json:"give_up_at,omitempty"`
	// Removed says the downstream removed the link already (it did not
	// run): the queue's feeds may go as soon as the queue is taken.
	Removed bool `json:"removed,omitempty"`
}

// conserveReply answers a request.
type conserveReply struct {
	// Found says the link's queue was there.
	Found bool `json:"found"`
	// Taken says the downstream may remove its link: nothing it holds is
	// lost with its queue (everything was re-published, or discarded on
	// request, or there was no queue).
	Taken bool `json:"taken"`
	// Conserved and Discarded count the messages.
	Conserved uint64 `json:"conserved"`
	Discarded uint64 `json:"discarded"`
}

// ReconfigStats counts the work of loss-free reconfiguration at this site.
type ReconfigStats struct {
	// Moves counts configuration messages that removed federation links;
	// LinksAdded and LinksRemoved count the links they added and removed.
	Moves, LinksAdded, LinksRemoved uint64
	// RequestsSent counts conservation requests delivered to the upstream
	// of a removed link (RequestsAnswered of them answered in time that
	// the upstream took what the link held); RequestsPending those
	// waiting for their upstream to be reachable.
	RequestsSent, RequestsAnswered uint64
	RequestsPending                int64
	// RequestsHandled counts the requests this site's node received;
	// QueuesRemoved the link queues they emptied and deleted here.
	RequestsHandled, QueuesRemoved uint64
	// Conserved counts held messages re-published into the exchange they
	// came from; Discarded those deleted (DiscardHeldOnMove).
	Conserved, Discarded uint64
	// OldLinksWaiting is how many old links the current or last
	// configuration attempt has not removed: new links not running yet,
	// or old ones still running whose upstreams have not taken what they
	// hold (the configuration is retried until they have).
	OldLinksWaiting int64
	// ConfigFailures counts attempts to apply a configuration message
	// that failed; ConfigRetrying is 1 while the current one waits for
	// its next attempt.
	ConfigFailures uint64
	ConfigRetrying int64
}

// ReconfigStats returns the reconfiguration counters.
func (b *Bridge) ReconfigStats() ReconfigStats {
	r := &b.stats.reconfig
	return ReconfigStats{
		Moves: r.moves.Load(), LinksAdded: r.linksAdded.Load(), LinksRemoved: r.linksRemoved.Load(),
		RequestsSent: r.requestsSent.Load(), RequestsAnswered: r.requestsAnswered.Load(), RequestsPending: r.requestsPending.Load(),
		RequestsHandled: r.requestsHandled.Load(), QueuesRemoved: r.queuesRemoved.Load(),
		Conserved: r.conserved.Load(), Discarded: r.discarded.Load(),
		OldLinksWaiting: r.oldLinksWaiting.Load(), ConfigFailures: r.configFailures.Load(), ConfigRetrying: r.configRetrying.Load(),
	}
}

// exchangeLink is one per-exchange federation link as configured on the
// node.
type exchangeLink struct {
	name             string // the upstream's name, luffymq-x:<exchange>:<slot>
	exchange         string // the local (downstream) exchange
	slot             string
	uri              string
	upstreamExchange string // "" when it is exchange
}

func (l exchangeLink) key() string { return l.uri + "\x00" + l.upstreamExchange }

func (l exchangeLink) readExchange() string {
	if l.upstreamExchange != "" {
		return l.upstreamExchange
	}
	return l.exchange
}

// readExchangeLinks lists the node's per-exchange upstreams by exchange.
func readExchangeLinks(rh *rabbithole.Client, vhost string) (map[string][]exchangeLink, error) {
	ups, err := rh.ListFederationUpstreamsIn(vhost)
	if err != nil {
		return nil, err
	}
	out := map[string][]exchangeLink{}
	for _, u := range ups {
		rest, ok := strings.CutPrefix(u.Name, ExchangeUpstreamPrefix)
		i := strings.LastIndexByte(rest, ':')
		if !ok || i <= 0 || len(u.Definition.Uri) == 0 {
			continue
		}
		l := exchangeLink{name: u.Name, exchange: rest[:i], slot: rest[i+1:], uri: u.Definition.Uri[0], upstreamExchange: u.Definition.Exchange}
		out[l.exchange] = append(out[l.exchange], l)
	}
	return out, nil
}

// assignSlots returns want with every upstream named: the name of the
// current link with the same URI and upstream exchange, or the lowest
// slot no current or assigned link uses.
func assignSlots(current map[string][]exchangeLink, want []ExchangeFederation) ([]ExchangeFederation, error) {
	out := make([]ExchangeFederation, len(want))
	for i, x := range want {
		byKey, used := map[string]string{}, map[string]bool{}
		for _, l := range current[x.Exchange] {
			byKey[l.key()] = l.slot
			used[l.slot] = true
		}
		x.Upstreams = append([]Upstream(nil), x.Upstreams...)
		next := 0
		for j, u := range x.Upstreams {
			if slot, ok := byKey[u.URI+"\x00"+x.UpstreamExchange]; ok {
				x.Upstreams[j].Site = slot
				delete(byKey, u.URI+"\x00"+x.UpstreamExchange) // a URI listed twice gets two links
				continue
			}
			for used[strconv.Itoa(next)] {
				next++
			}
			if next >= ExchangeUpstreamSlots {
				return nil, fmt.Errorf("%w: exchange %s: more than %d upstreams, old and new links together", ErrInvalidConfig, x.Exchange, ExchangeUpstreamSlots)
			}
			x.Upstreams[j].Site = strconv.Itoa(next)
			used[x.Upstreams[j].Site] = true
		}
		out[i] = x
	}
	return out, nil
}

// reconfigureTimeout bounds one applyConfiguration: the wait for new
// links, the graces, the answers to conservation requests, the removal and
// the management API calls.
func reconfigureTimeout(fc FederationConfig) time.Duration {
	fc, _ = fc.withDefaults()
	t := timings()
	return fc.LinkWait + 2*fc.OldLinkGrace + t.AgentWait + t.ReplyWait + time.Minute
}

// conserveOutcome is what a downstream learnt from one conservation
// request.
type conserveOutcome int

const (
	// conserveTaken: the upstream took what the link's queue held (or
	// there was no queue): the link may go.
	conserveTaken conserveOutcome = iota
	// conserveUndelivered: the request could not be delivered (the
	// upstream is cut off).
	conserveUndelivered
	// conserveNoAgent: the upstream is reachable but no agent consumes
	// its requests.
	conserveNoAgent
	// conserveNotTaken: the request was delivered and not answered in
	// time, or answered "not taken".
	conserveNotTaken
	// conserveDelivered: delivered, no answer asked for (background
	// retries).
	conserveDelivered
)

func (o conserveOutcome) String() string {
	switch o {
	case conserveTaken:
		return "taken"
	case conserveUndelivered:
		return "undelivered"
	case conserveNoAgent:
		return "no agent"
	case conserveNotTaken:
		return "not taken"
	case conserveDelivered:
		return "delivered"
	}
	return "outcome " + strconv.Itoa(int(o))
}

// decideRemoval says whether an old link may be removed after its
// conservation request had outcome o, and whether the request must then be
// sent again in the background. A running link is connected: removing it
// makes RabbitMQ delete its queue on the upstream, so it goes only once
// the upstream took what it holds. A link that does not run cannot delete
// its queue; it goes, and the upstream takes the queue when a request gets
// through.
func decideRemoval(o conserveOutcome, running bool) (remove, retry bool) {
	if o == conserveTaken {
		return true, false
	}
	if running {
		return false, false
	}
	return true, true
}

// applyConfiguration applies a configuration message's federations with
// the procedure of this file's comment.
func (b *Bridge) applyConfiguration(ctx context.Context, fc FederationConfig) error {
	fc, err := fc.withDefaults()
	if err != nil {
		return err
	}
	rh, err := managementClient(fc.ManagementURL, fc.Username, fc.Password)
	if err != nil {
		return err
	}
	current, err := readExchangeLinks(rh, fc.Vhost)
	if err != nil {
		return fmt.Errorf("federation: listing upstreams on %s: %w", fc.ManagementURL, err)
	}
	want, err := assignSlots(current, fc.Exchanges)
	if err != nil {
		return err
	}
	wanted := map[string]bool{}
	var keep []string // names of wanted links, to wait for
	for _, x := range want {
		for _, u := range x.Upstreams {
			name := ExchangeUpstreamPrefix + x.Exchange + ":" + u.Site
			wanted[name] = true
			keep = append(keep, name)
		}
	}
	existing := map[string]bool{}
	var removed []exchangeLink
	for _, ls := range current {
		for _, l := range ls {
			existing[l.name] = true
			if !wanted[l.name] {
				removed = append(removed, l)
			}
		}
	}
	sort.Slice(removed, func(i, j int) bool { return removed[i].name < removed[j].name })
	added := 0
	for name := range wanted {
		if !existing[name] {
			added++
		}
	}
	final := fc
	final.Exchanges = want
	if len(removed) == 0 {
		if err := ApplyFederation(ctx, final); err != nil {
			return err
		}
		b.stats.reconfig.linksAdded.Add(uint64(added))
		b.stats.reconfig.oldLinksWaiting.Store(0)
		return nil
	}

	// Until they are removed, the old links wait (a failed attempt
	// leaves them all in place).
	b.stats.reconfig.oldLinksWaiting.Store(int64(len(removed)))
	// 2. New links beside the old ones.
	union := fc
	union.Exchanges = withLinks(want, removed)
	if err := ApplyFederation(ctx, union); err != nil {
		return err
	}
	b.stats.reconfig.linksAdded.Add(uint64(added))
	if err := waitLinksRunning(ctx, rh, fc, want, keep); err != nil {
		return fmt.Errorf("%w; the old links stay until they do", err)
	}
	// 3. What is on its way through the old links arrives.
	if !timeutil.Sleep(ctx, fc.OldLinkGrace) {
		return ctx.Err()
	}
	// 4. The old upstreams take what the old links hold.
	self, err := rh.GetClusterName()
	if err != nil {
		return fmt.Errorf("federation: reading the cluster name of %s: %w", fc.ManagementURL, err)
	}
	kept := map[string]bool{}
	for _, x := range want {
		kept[x.Exchange] = len(x.Upstreams) > 0
	}
	reqs := make([]conserveRequest, len(removed))
	outcomes := make([]conserveOutcome, len(removed))
	var wg sync.WaitGroup
	for i, l := range removed {
		reqs[i] = conserveRequest{
			Exchange: l.readExchange(), Downstream: self.Name, DownstreamVhost: fc.Vhost, Discard: fc.DiscardHeldOnMove,
			Left: !kept[l.exchange], Site: b.cfg.Site, Upstream: l.name, LocalExchange: l.exchange,
			GiveUpAt: time.Now().Add(fc.Expires).UnixMilli(),
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			outcomes[i], err = b.sendConservation(ctx, l.uri, reqs[i], timings().ReplyWait)
			if outcomes[i] != conserveTaken {
				b.log.Info("bridge: upstream of an old federation link did not take what the link holds", "upstream", l.name, "uri", redact(l.uri),
					"exchange", l.exchange, "outcome", outcomes[i].String(), "error", err)
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	// 5. The old links that may go, go.
	running := map[string]bool{}
	if slices.ContainsFunc(outcomes, func(o conserveOutcome) bool { return o != conserveTaken }) {
		links, err := FederationLinks(ctx, fc.ManagementURL, fc.Username, fc.Password)
		if err != nil {
			return fmt.Errorf("%w; the old links stay", err)
		}
		for _, l := range links {
			running[l.Upstream] = running[l.Upstream] || l.Status == "running"
		}
	}
	var gone, stay []exchangeLink
	for i, l := range removed {
		remove, retry := decideRemoval(outcomes[i], running[l.name])
		if !remove {
			stay = append(stay, l)
			continue
		}
		gone = append(gone, l)
		if retry {
			b.log.Warn("bridge: old federation link does not run and its upstream did not take what it holds; removing it (its queue stays there) and asking the upstream again in the background",
				"upstream", l.name, "uri", redact(l.uri), "exchange", l.exchange, "outcome", outcomes[i].String())
			reqs[i].Removed = true
			b.retryConservation(l.uri, reqs[i], fc.Expires)
		}
	}
	b.stats.reconfig.oldLinksWaiting.Store(int64(len(stay)))
	final.Exchanges = withLinks(want, stay)
	if err := ApplyFederation(ctx, final); err != nil {
		return err
	}
	names := make([]string, len(gone))
	for i, l := range gone {
		names[i] = l.name
	}
	if len(gone) > 0 {
		b.stats.reconfig.moves.Add(1)
		b.stats.reconfig.linksRemoved.Add(uint64(len(gone)))
		if err := waitLinksGone(ctx, rh, names, 10*time.Second); err != nil {
			b.log.Warn("bridge: removed federation links still reported", "error", err)
		}
		b.log.Info("bridge: federation links moved", "added", added, "removed", names, "discard_held", fc.DiscardHeldOnMove)
	}
	if len(stay) > 0 {
		left := make([]string, len(stay))
		for i, l := range stay {
			left[i] = l.name
		}
		return fmt.Errorf("federation: old links %v still run and their upstreams have not taken what they hold; they stay until they have", left)
	}
	return nil
}

// withLinks returns want plus the removed links, grouped by exchange.
func withLinks(want []ExchangeFederation, removed []exchangeLink) []ExchangeFederation {
	out := make([]ExchangeFederation, 0, len(want))
	at := map[string]int{}
	for _, x := range want {
		at[x.Exchange] = len(out)
		x.Upstreams = append([]Upstream(nil), x.Upstreams...)
		out = append(out, x)
	}
	for _, l := range removed {
		i, ok := at[l.exchange]
		if !ok {
			at[l.exchange] = len(out)
			i = len(out)
			out = append(out, ExchangeFederation{Exchange: l.exchange, UpstreamExchange: l.upstreamExchange})
		}
		out[i].Upstreams = append(out[i].Upstreams, Upstream{Site: l.slot, URI: l.uri})
	}
	return out
}

// waitLinksRunning waits until each named link of an exchange that exists
// on the node runs.
func waitLinksRunning(ctx context.Context, rh *rabbithole.Client, fc FederationConfig, want []ExchangeFederation, names []string) error {
	local := map[string]bool{}
	for _, x := range want {
		if _, err := rh.GetExchange(fc.Vhost, x.Exchange); err == nil {
			local[x.Exchange] = true
		} else if !isNotFound(err) {
			return fmt.Errorf("federation: reading exchange %s on %s: %w", x.Exchange, fc.ManagementURL, err)
		}
	}
	deadline := time.Now().Add(fc.LinkWait)
	for {
		links, err := FederationLinks(ctx, fc.ManagementURL, fc.Username, fc.Password)
		status := map[string]FederationLink{}
		for _, l := range links {
			status[l.Upstream] = l
		}
		var waiting []string
		for _, name := range names {
			rest := strings.TrimPrefix(name, ExchangeUpstreamPrefix)
			x := rest[:strings.LastIndexByte(rest, ':')]
			if l := status[name]; local[x] && l.Status != "running" {
				waiting = append(waiting, fmt.Sprintf("%s (%s %s)", name, l.Status, l.Error))
			}
		}
		if err == nil && len(waiting) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return err
			}
			return fmt.Errorf("federation: new links not running after %v: %s", fc.LinkWait, strings.Join(waiting, ", "))
		}
		if !timeutil.Sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// waitLinksGone waits until RabbitMQ no longer reports the named links.
func waitLinksGone(ctx context.Context, rh *rabbithole.Client, names []string, wait time.Duration) error {
	gone := map[string]bool{}
	for _, n := range names {
		gone[n] = true
	}
	deadline := time.Now().Add(wait)
	for {
		raw, err := rh.ListFederationLinks()
		var left []string
		for _, l := range raw {
			if up, _ := l["upstream"].(string); gone[up] {
				left = append(left, up)
			}
		}
		if err == nil && len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return err
			}
			return fmt.Errorf("links %v still running %v after their removal", left, wait)
		}
		if !timeutil.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}
