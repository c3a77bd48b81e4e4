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
//  4. asks the upstream node of every link it is about to remove to
//     conserve what the link holds there: a conservation request, published
//     through the link's own URI to that node's queue ConserveQueueName,
//     with confirms, and waits (at most 40 s) for the answer, which comes
//     on direct reply-to once the upstream has detached and drained the
//     link's queue;
//  5. removes the old links and waits until RabbitMQ has stopped them.
//
// A request that cannot be delivered (the upstream is cut off, which is
// also when the link could not deliver what it holds) is sent again in the
// background until it is, for as long as a link queue may live there
// (FederationConfig.Expires). A link removed while cut off leaves its queue
// on the upstream, still bound; one removed while connected has it deleted
// by RabbitMQ, which is why the request goes first.
//
// The site agent of the upstream node (conserveAgent) takes the requests.
// For each it finds the link's queue precisely through its own management
// API: the exchange of type x-federation-upstream whose x-downstream-name
// and x-downstream-vhost arguments name the requesting node and to which
// the requested exchange is bound, and the queue (argument
// x-internal-purpose "federation") bound to it. It then
//
//   - waits (up to 30 s) until other federation links of the exchange
//     carry what the removed one carried: for every binding of the old
//     link (routing key and the site it was made for, the last entry of
//     its x-bound-from argument), a binding of another link with the same
//     key made for the same site. The sites move one by one, each at its
//     own pace: the new links towards those sites may still be starting.
//     Bindings made for the requesting site itself are left out when that
//     site no longer federates the exchange at all;
//   - deletes the old link's exchange, so nothing more arrives in the
//     queue;
//   - with conservation on (the default), takes the queue's messages
//     (basic.get), re-publishes each into the exchange the link read,
//     with its properties and headers (x-luffymq-origin, message-id, …)
//     except x-received-from, federation's record of the links it crossed
//     (the message is routed as if published here, so it follows the new
//     links), waits for RabbitMQ's confirm and only then acknowledges it in
//     the old queue;
//   - answers the request;
//   - once no link consumes the queue any more and basic.get finds it
//     empty, deletes it if it is still empty, and drains on otherwise (a
//     link that was still connected takes part of the queue itself until
//     it is removed; RabbitMQ deletes the queue of a link it stops while
//     connected);
//   - with DiscardHeldOnMove, re-publishes nothing and deletes the queue
//     with what it holds once no link consumes it, counting the messages:
//     the behaviour the thesis measured without conservation.
//
// A re-published message can reach sites that already had it through the
// new links; their importers drop it by message ID (Config.DedupWindow).
// What is not covered: a message published before the new links existed
// that is still travelling towards the old upstream longer than
// OldLinkGrace after they run arrives after the detach and is not routed
// there any more; and one node must not be reachable under two URIs in one
// configuration (its two links would share one queue).

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
	directReplyTo                  = "amq.rabbitmq.reply-to"
)

const (
	// conserveCoverWait bounds how long the upstream waits for other links
	// to carry what a removed link carried before it detaches its queue.
	conserveCoverWait = 30 * time.Second
	// conserveReplyWait bounds how long a downstream waits for the answer
	// to a request before it removes the link anyway.
	conserveReplyWait = conserveCoverWait + 10*time.Second
	// conserveConsumedWait bounds how long the upstream waits for a link
	// to stop consuming a queue it was asked to conserve.
	conserveConsumedWait = 2 * time.Minute
	// conserveRetryMax is the longest pause between two attempts to
	// deliver a request.
	conserveRetryMax = 250 * time.Millisecond
	// republishWindow is how many messages are re-published before
	// waiting for their confirms.
	republishWindow = 64
)

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
	// Site, Upstream and LocalExchange say, for logs, who asks and which
	// link it removed.
	Site          string `json:"site"`
	Upstream      string `json:"upstream"`
	LocalExchange string `json:"local_exchange"`
}

// conserveReply answers a request once the queue is detached (and, with
// conservation, drained once).
type conserveReply struct {
	Found     bool   `json:"found"`
	Conserved uint64 `json:"conserved"`
	Discarded uint64 `json:"discarded"`
}

// ReconfigStats counts the work of loss-free reconfiguration at this site.
type ReconfigStats struct {
	// Moves counts configuration messages that removed federation links;
	// LinksAdded and LinksRemoved count the links they added and removed.
	Moves, LinksAdded, LinksRemoved uint64
	// RequestsSent counts conservation requests delivered to the upstream
	// of a removed link (RequestsAnswered of them answered in time);
	// RequestsPending those waiting for their upstream to be reachable.
	RequestsSent, RequestsAnswered uint64
	RequestsPending                int64
	// RequestsHandled counts the requests this site's node received;
	// QueuesRemoved the link queues they emptied and deleted here.
	RequestsHandled, QueuesRemoved uint64
	// Conserved counts held messages re-published into the exchange they
	// came from; Discarded those deleted (DiscardHeldOnMove).
	Conserved, Discarded uint64
}

// ReconfigStats returns the reconfiguration counters.
func (b *Bridge) ReconfigStats() ReconfigStats {
	r := &b.stats.reconfig
	return ReconfigStats{
		Moves: r.moves.Load(), LinksAdded: r.linksAdded.Load(), LinksRemoved: r.linksRemoved.Load(),
		RequestsSent: r.requestsSent.Load(), RequestsAnswered: r.requestsAnswered.Load(), RequestsPending: r.requestsPending.Load(),
		RequestsHandled: r.requestsHandled.Load(), QueuesRemoved: r.queuesRemoved.Load(),
		Conserved: r.conserved.Load(), Discarded: r.discarded.Load(),
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
	return fc.LinkWait + 2*fc.OldLinkGrace + conserveReplyWait + time.Minute
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
		return nil
	}

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
	// 4. The old upstreams conserve what the old links hold.
	self, err := rh.GetClusterName()
	if err != nil {
		return fmt.Errorf("federation: reading the cluster name of %s: %w", fc.ManagementURL, err)
	}
	kept := map[string]bool{}
	for _, x := range want {
		kept[x.Exchange] = len(x.Upstreams) > 0
	}
	var wg sync.WaitGroup
	answered := false
	var mu sync.Mutex
	for _, l := range removed {
		req := conserveRequest{
			Exchange: l.readExchange(), Downstream: self.Name, DownstreamVhost: fc.Vhost, Discard: fc.DiscardHeldOnMove,
			Left: !kept[l.exchange], Site: b.cfg.Site, Upstream: l.name, LocalExchange: l.exchange,
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			delivered, replied, err := b.sendConservation(ctx, l.uri, req, conserveReplyWait)
			if !delivered {
				b.log.Warn("bridge: upstream of a removed federation link unreachable; will ask it to conserve the link's queue once it is reachable",
					"upstream", l.name, "uri", redact(l.uri), "exchange", l.exchange, "error", err)
				b.retryConservation(l.uri, req, fc.Expires)
				return
			}
			if replied {
				mu.Lock()
				answered = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if answered {
		// Let what a connected old link still carries be confirmed.
		if !sleepCtx(ctx, min(fc.OldLinkGrace, 500*time.Millisecond)) {
			return ctx.Err()
		}
	}
	// 5. The old links go.
	if err := ApplyFederation(ctx, final); err != nil {
		return err
	}
	b.stats.reconfig.moves.Add(1)
	b.stats.reconfig.linksRemoved.Add(uint64(len(removed)))
	names := make([]string, len(removed))
	for i, l := range removed {
		names[i] = l.name
	}
	if err := waitLinksGone(ctx, rh, names, 10*time.Second); err != nil {
		b.log.Warn("bridge: removed federation links still reported", "error", err)
	}
	b.log.Info("bridge: federation links moved", "added", added, "removed", names, "discard_held", fc.DiscardHeldOnMove)
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

// sendConservation delivers req to the node at uri (with confirms) and
// waits up to replyWait for its answer.
func (b *Bridge) sendConservation(ctx context.Context, uri string, req conserveRequest, replyWait time.Duration) (delivered, replied bool, err error) {
	conn, err := amqp.DialConfig(uri, amqp.Config{
		Heartbeat:  b.cfg.Heartbeat,
		Locale:     "en_US",
		Dial:       amqp.DefaultDial(5 * time.Second),
		Properties: amqp.Table{"connection_name": "luffymq-reconfig-" + b.cfg.Site},
	})
	if err != nil {
		return false, false, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, false, err
	}
	if err := ch.Confirm(false); err != nil {
		return false, false, err
	}
	if _, err := ch.QueueDeclare(ConserveQueueName, true, false, false, false, nil); err != nil {
		return false, false, fmt.Errorf("declaring %s: %w", ConserveQueueName, err)
	}
	var replies <-chan amqp.Delivery
	replyTo := ""
	if replyWait > 0 {
		if replies, err = ch.Consume(directReplyTo, "", true, false, false, false, nil); err != nil {
			return false, false, fmt.Errorf("consuming %s: %w", directReplyTo, err)
		}
		replyTo = directReplyTo
	}
	body, err := json.Marshal(req)
	if err != nil {
		return false, false, err
	}
	id := b.cfg.Site + "-" + randomHex(8)
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", ConserveQueueName, false, false, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, ReplyTo: replyTo,
		CorrelationId: id, MessageId: id, Timestamp: time.Now(), AppId: "luffymq", Body: body,
	})
	if err != nil {
		return false, false, err
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		return false, false, errors.Join(errors.New("request not confirmed"), err)
	}
	b.stats.reconfig.requestsSent.Add(1)
	if replyWait <= 0 {
		return true, false, nil
	}
	t := time.NewTimer(replyWait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return true, false, ctx.Err()
		case <-t.C:
			return true, false, nil
		case d, ok := <-replies:
			if !ok {
				return true, false, nil
			}
			if d.CorrelationId == id {
				b.stats.reconfig.requestsAnswered.Add(1)
				return true, true, nil
			}
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
			if delivered, _, _ := b.sendConservation(ctx, uri, req, 0); delivered {
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
	if err := ch.Qos(1, 0, false); err != nil {
		return err
	}
	if _, err := ch.QueueDeclare(ConserveQueueName, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declaring %s: %w", ConserveQueueName, err)
	}
	msgs, err := ch.Consume(ConserveQueueName, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consuming %s: %w", ConserveQueueName, err)
	}
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
			if err := b.conserve(ctx, conn, req, d.ReplyTo, d.CorrelationId); err != nil {
				_ = d.Nack(false, true)
				return fmt.Errorf("conserving the queue of %s's link from %s: %w", req.Site, req.Exchange, err)
			}
			b.stats.reconfig.requestsHandled.Add(1)
			_ = d.Ack(false)
		}
	}
}

// heldQueue is a removed link's queue on this node and the exchange that
// feeds it.
type heldQueue struct{ feed, queue string }

// locateHeld finds, through the management API, the queue and upstream
// exchange a link of req.Downstream declared here for req.Exchange.
func (b *Bridge) locateHeld(req conserveRequest) ([]heldQueue, error) {
	vhost := b.vhost()
	xs, err := b.rh.ListExchangesIn(vhost)
	if err != nil {
		return nil, fmt.Errorf("listing exchanges: %w", err)
	}
	var out []heldQueue
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
			if bd.DestinationType != "queue" {
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
				out = append(out, heldQueue{feed: x.Name, queue: q.Name})
			}
		}
	}
	return out, nil
}

// conserve carries out one request (see this file's comment).
func (b *Bridge) conserve(ctx context.Context, conn *amqp.Connection, req conserveRequest, replyTo, correlationID string) error {
	held, err := b.locateHeld(req)
	if err != nil {
		return err
	}
	reply := conserveReply{Found: len(held) > 0}
	replied := false
	answer := func() {
		if !replied && replyTo != "" {
			replied = true
			b.reply(ctx, conn, replyTo, correlationID, reply)
		}
	}
	defer answer()
	if len(held) == 0 {
		b.log.Info("bridge: no federation queue left to conserve", "downstream_site", req.Site, "exchange", req.Exchange)
		return nil
	}
	if !req.Discard {
		if _, err := b.rh.GetExchange(b.vhost(), req.Exchange); isNotFound(err) {
			b.log.Warn("bridge: exchange of a removed federation link is gone; its queue is left to expire", "exchange", req.Exchange, "downstream_site", req.Site)
			return nil
		} else if err != nil {
			return fmt.Errorf("reading exchange %s: %w", req.Exchange, err)
		}
	}
	if err := b.waitCovered(ctx, req, held); err != nil {
		return err
	}
	for _, h := range held {
		if err := withChannel(conn, func(ch *amqp.Channel) error { return ch.ExchangeDelete(h.feed, false, false) }); err != nil {
			return fmt.Errorf("detaching %s: deleting %s: %w", h.queue, h.feed, err)
		}
	}
	pending := make([]bool, len(held))
	for i, h := range held {
		pending[i] = true
		if !req.Discard {
			n, gone, err := republishAll(ctx, conn, h.queue, req.Exchange)
			reply.Conserved += n
			b.stats.reconfig.conserved.Add(n)
			if err != nil {
				return err
			}
			pending[i] = !gone
		}
	}
	answer() // the downstream may remove its link now
	for i, h := range held {
		if !pending[i] {
			continue
		}
		deadline := time.Now().Add(conserveConsumedWait)
		for {
			info, err := inspectQueue(conn, h.queue)
			if err != nil {
				return err
			}
			if info == nil { // RabbitMQ deleted it with its link
				break
			}
			if info.Consumers == 0 && req.Discard {
				n, err := deleteQueue(conn, h.queue, false)
				if err != nil {
					return err
				}
				reply.Discarded += uint64(n)
				b.stats.reconfig.discarded.Add(uint64(n))
				b.stats.reconfig.queuesRemoved.Add(1)
				break
			}
			if !req.Discard && info.Messages > 0 {
				n, gone, err := republishAll(ctx, conn, h.queue, req.Exchange)
				reply.Conserved += n
				b.stats.reconfig.conserved.Add(n)
				if err != nil {
					return err
				}
				if gone {
					break
				}
				continue
			}
			if info.Consumers == 0 {
				if _, err := deleteQueue(conn, h.queue, true); err == nil {
					b.stats.reconfig.queuesRemoved.Add(1)
					break
				} else if !isAMQPCode(err, amqp.PreconditionFailed) {
					return err
				}
				continue // a message came in between: drain on
			}
			if time.Now().After(deadline) {
				b.log.Warn("bridge: a link still consumes the queue it was asked to conserve; leaving it", "queue", h.queue, "downstream_site", req.Site)
				break
			}
			if !sleepCtx(ctx, 100*time.Millisecond) {
				return ctx.Err()
			}
		}
	}
	b.log.Info("bridge: queue of a removed federation link emptied and deleted", "downstream_site", req.Site, "exchange", req.Exchange,
		"conserved", reply.Conserved, "discarded", reply.Discarded, "queues", len(held))
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

// waitCovered waits until every binding of the held queues' exchanges has
// a counterpart on another federation link of req.Exchange (same key, made
// for the same site), at most conserveCoverWait.
func (b *Bridge) waitCovered(ctx context.Context, req conserveRequest, held []heldQueue) error {
	feeds := map[string]bool{}
	for _, h := range held {
		feeds[h.feed] = true
	}
	var need []boundFor
	deadline := time.Now().Add(conserveCoverWait)
	for first := true; ; first = false {
		bs, err := b.rh.ListExchangeBindingsWithSource(b.vhost(), req.Exchange)
		if err != nil {
			return fmt.Errorf("listing bindings of %s: %w", req.Exchange, err)
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
			return nil
		}
		if time.Now().After(deadline) {
			b.log.Warn("bridge: no other federation link carries what a removed link carried; conserving anyway", "exchange", req.Exchange,
				"downstream_site", req.Site, "uncovered", missing)
			return nil
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// republishAll moves every message of queue into exchange: basic.get,
// publish, and once RabbitMQ has confirmed a window of them, the
// acknowledgement in queue. gone reports that the queue no longer exists.
func republishAll(ctx context.Context, conn *amqp.Connection, queue, exchange string) (n uint64, gone bool, err error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, false, err
	}
	defer func() { _ = ch.Close() }()
	if err := ch.Confirm(false); err != nil {
		return 0, false, err
	}
	for {
		var last amqp.Delivery
		var confirms []*amqp.DeferredConfirmation
		for len(confirms) < republishWindow {
			d, ok, err := ch.Get(queue, false)
			if isAMQPCode(err, amqp.NotFound) {
				return n, true, nil // deleted with its link; what was taken and not acknowledged went with it
			}
			if err != nil {
				return n, false, fmt.Errorf("taking from %s: %w", queue, err)
			}
			if !ok {
				break
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, d.RoutingKey, false, false, republished(d))
			if err != nil {
				return n, false, fmt.Errorf("re-publishing into %s: %w", exchange, err)
			}
			last, confirms = d, append(confirms, dc)
		}
		if len(confirms) == 0 {
			return n, false, nil
		}
		for _, dc := range confirms {
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				_ = last.Nack(true, true)
				return n, false, errors.Join(fmt.Errorf("re-publishing into %s: not confirmed", exchange), err)
			}
		}
		if err := last.Ack(true); err != nil {
			return n, false, fmt.Errorf("acknowledging in %s: %w", queue, err)
		}
		n += uint64(len(confirms))
	}
}

// republished is d as it was published, without federation's record of
// the links it crossed. The user ID is left out: RabbitMQ accepts only the
// publishing connection's own.
func republished(d amqp.Delivery) amqp.Publishing {
	var h amqp.Table
	if len(d.Headers) > 0 {
		h = amqp.Table{}
		for k, v := range d.Headers {
			if k != federationReceivedFromHeader {
				h[k] = v
			}
		}
	}
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
// closes the channel) and returns how many messages it held.
func deleteQueue(conn *amqp.Connection, queue string, ifEmpty bool) (int, error) {
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.Close() }()
	n, err := ch.QueueDelete(queue, false, ifEmpty, false)
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
