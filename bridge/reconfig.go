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
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"
	amqp "github.com/rabbitmq/amqp091-go"
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
	if !sleepCtx(ctx, fc.OldLinkGrace) {
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
		if !sleepCtx(ctx, 200*time.Millisecond) {
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
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}

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
			if !sleepCtx(ctx, 250*time.Millisecond) {
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
			if !sleepCtx(ctx, pause) {
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

// conserveAgent serves this node's conservation requests until ctx ends.
func (b *Bridge) conserveAgent(ctx context.Context) {
	for ctx.Err() == nil {
		if err := b.serveConservation(ctx); err != nil && ctx.Err() == nil {
			b.log.Warn("bridge: conservation agent restarting", "error", err)
		}
		sleepCtx(ctx, time.Second)
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
					sleepCtx(sctx, pause)
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
func (b *Bridge) locateHeld(req conserveRequest) ([]heldQueue, error) {
	vhost := b.vhost()
	names := map[string]bool{}
	if name := federationQueueName(req.Exchange, vhost, req.Downstream, req.LocalExchange, req.DownstreamVhost); req.LocalExchange != "" {
		q, err := b.rh.GetQueue(vhost, name)
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
			q, err := b.rh.GetQueue(vhost, bd.Destination)
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
	held, err := b.locateHeld(req)
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
			if err := b.closeConsumers(queue, conn); err != nil {
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
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return n, false, ctx.Err()
		}
	}
}

// closeConsumers closes the connections that consume queue, as the
// management API knows them, but own, the agent's connection: the
// statistics may lag behind by an interval and still list the consumer
// with which republishAll took the queue.
func (b *Bridge) closeConsumers(queue string, own *amqp.Connection) error {
	q, err := b.rh.GetQueue(b.vhost(), queue)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading queue %s: %w", queue, err)
	}
	if q.ConsumerDetails == nil {
		return nil
	}
	// RabbitMQ names a connection "<client address> -> <its address>".
	ownName := own.LocalAddr().String() + " -> "
	closed := map[string]bool{}
	for _, c := range *q.ConsumerDetails {
		name := c.ChannelDetails.ConnectionName
		if name == "" || closed[name] || strings.HasPrefix(name, ownName) {
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
		if !sleepCtx(ctx, 200*time.Millisecond) {
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
					if !sleepCtx(ctx, 100*time.Millisecond) {
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
			if !sleepCtx(ctx, 100*time.Millisecond) {
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
		if !sleepCtx(ctx, 200*time.Millisecond) {
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

// withChannel runs fn on a channel of its own, closed afterwards (an
// operation RabbitMQ refuses closes its channel).
func withChannel(conn *amqp.Connection, fn func(*amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	return fn(ch)
}

// inspectQueue declares queue passively on a channel of its own (a
// missing queue closes the channel); nil means the queue is gone.
func inspectQueue(conn *amqp.Connection, queue string) (*amqp.Queue, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	defer func() { _ = ch.Close() }()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if isAMQPCode(err, amqp.NotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &q, nil
}

// deleteQueue deletes queue on a channel of its own (a refused delete
// closes the channel) and returns how many messages it held. With
// ifUnused, RabbitMQ refuses while the queue has a consumer (whose
// unacknowledged messages an if-empty delete would not count).
func deleteQueue(conn *amqp.Connection, queue string, ifUnused, ifEmpty bool) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.Close() }()
	n, err := ch.QueueDelete(queue, ifUnused, ifEmpty, false)
	if isAMQPCode(err, amqp.NotFound) {
		return 0, nil
	}
	return n, err
}

func isAMQPCode(err error, code int) bool {
	var e *amqp.Error
	return errors.As(err, &e) && e.Code == code
}

// isNotFound reports whether the management API answered 404.
func isNotFound(err error) bool {
	var e rabbithole.ErrorResponse
	return errors.As(err, &e) && e.StatusCode == http.StatusNotFound
}

func argString(args map[string]interface{}, k string) string {
	s, _ := args[k].(string)
	return s
}

// sleepCtx waits d; false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
