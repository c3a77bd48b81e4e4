package bridge

import (
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// importResult says what became of a message taken from the import queue.
type importResult int

const (
	importDelivered  importResult = iota // injected into the local broker
	importLocal                          // published by this site: skipped
	importDuplicate                      // message ID seen recently: dropped
	importUnmappable                     // routing key has no MQTT form: dropped
	importFailed                         // injection failed: requeued
	numImportResults
)

var importResultNames = [numImportResults]string{"delivered", "local_origin", "duplicate", "unmappable", "failed"}

// stats counts the bridge's traffic.
type stats struct {
	b          *Bridge
	mu         sync.Mutex
	exports    map[string]uint64                    // by exchange
	imports    map[string]*[numImportResults]uint64 // by exchange
	wq         map[string]*wqCounters               // by group
	reconnects atomic.Uint64
	// configsApplied and events count the site agent's work.
	configsApplied, events atomic.Uint64
	// eventAgentFailures counts the errors that stopped the event agent
	// until the next connection.
	eventAgentFailures atomic.Uint64
	nacked             atomic.Uint64
	// reconfig counts loss-free reconfiguration (reconfig.go).
	reconfig reconfigCounters
	lastWarn atomic.Int64 // unix nanos of the last outbox-full warning
	descs    map[string]*prometheus.Desc
}

func newStats(b *Bridge) *stats {
	site := prometheus.Labels{"site": b.cfg.Site}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("luffymq_bridge_"+name, help, labels, site)
	}
	return &stats{
		b:       b,
		exports: map[string]uint64{},
		wq:      map[string]*wqCounters{},
		imports: map[string]*[numImportResults]uint64{},
		descs: map[string]*prometheus.Desc{
			"exported":               d("messages_exported_total", "MQTT messages published to a pub/sub exchange and confirmed by RabbitMQ.", "exchange"),
			"imported":               d("messages_imported_total", "Messages taken from the import queue, by exchange and outcome (delivered, local_origin, duplicate, unmappable, failed).", "exchange", "outcome"),
			"connected":              d("link_up", "1 when the bridge has a working connection to its RabbitMQ node, else 0."),
			"reconnects":             d("connection_failures_total", "RabbitMQ connection attempts that failed or sessions that were lost."),
			"outbox":                 d("outbox_messages", "Messages waiting to be published or confirmed."),
			"dropped":                d("messages_dropped_total", "Messages dropped before reaching RabbitMQ (outbox full or refused 5 times).", "reason"),
			"bindings":               d("bindings", "Bindings of the import queue (one per exchange and local subscription overlapping an export)."),
			"wq_received":            d("wq_messages_received_total", "Messages taken from a work queue, by source: local (wq.<g>), own_overflow (intake, published here), other_site (intake, published at another site).", "queue", "source"),
			"wq_settled":             d("wq_messages_settled_total", "Work-queue messages settled with RabbitMQ, by outcome: completed (acknowledged after the member's PUBACK), requeued, duplicate, unmappable.", "queue", "outcome"),
			"wq_overflow":            d("wq_overflow_received_total", "Messages that overflowed (TTL or max length) out of the work queue of origin site and were received here; origin equal to site means they came back.", "queue", "origin"),
			"wq_routed":              d("wq_routed_total", "Local publishes sent straight to another site's intake, because its members would start them sooner than the local ones, one-way delay included (--wq-route nearest).", "queue", "to"),
			"wq_reclaim_redelivered": d("wq_reclaimed_redelivered_total", "The part of wq_reclaimed_total that the site's federation link had taken and given back unacknowledged (its node died or its connection closed), taken back once the site was silent for 15 state intervals: the site may have kept a copy and process it too when it comes back (at-least-once).", "queue", "from"),
			"wq_reclaim":             d("wq_reclaimed_total", "Messages sent to another site that were taken back from this node's federation link queues towards it once its state had stopped arriving: routed ones into the local work queue, the hash ring's into the local intake (--wq-route nearest).", "queue", "from"),
			"wq_states":              d("wq_states_sent_total", "Group states this broker sent to another site while that site asked for them (--wq-route nearest); each crosses the WAN once.", "queue", "to"),
			"wq_states_why":          d("wq_states_sent_by_reason_total", "The states of wq_states_sent_total by why they were sent: change (what the other sites' routers read changed), idle (a member went idle with nothing left to take), heartbeat (nothing changed for 5 state intervals), lease (the first to a site that just asked).", "queue", "reason"),
			"wq_wants":               d("wq_state_requests_sent_total", "Requests for the other sites' group states this broker sent (--wq-route nearest); federation carries each to every other site.", "queue"),
			"wq_empty_gets":          d("wq_empty_gets_total", "basic.gets of the work queue's consume loop that found wq.<g> or the intake empty.", "queue"),
			"wq_at_pub":              d("wq_overflow_at_publish_total", "Local publishes sent to the work queue's dead-letter exchange at once, because the local members would not have started them within the queue's TTL (off with --wq-ttl-overflow-only).", "queue"),
			"wq_ttl":                 d("wq_ttl_seconds", "Current message TTL of the work queue's policy (eq. 2.12).", "queue"),
			"wq_maxlen":              d("wq_max_length", "Current max length of the work queue's policy (eq. 2.12).", "queue"),
			"wq_weight":              d("wq_weight", "Current consistent-hash weight of this site's intake (eq. 2.13).", "queue"),
			"wq_depth":               d("wq_messages_in_queue", "Messages ready or unacknowledged in the work queue and intake (eq. 2.14).", "queue"),
			"agent":                  d("agent_actions_total", "Site agent actions: configuration messages applied, queue events handled.", "kind"),
			"agent_fail":             d("agent_failures_total", "Errors that stopped a site agent until the next connection (events: the event agent).", "agent"),
			"fed_links":              d("federation_links_changed_total", "Federation links the configuration agent added or removed (new links run before old ones go).", "change"),
			"fed_moves":              d("federation_moves_total", "Configuration messages that removed federation links (a synchronisation site moved)."),
			"cons_req":               d("conservation_requests_total", "Conservation requests about removed links: sent to their upstream (confirmed), answered in time, handled at this node.", "state"),
			"cons_pend":              d("conservation_requests_pending", "Conservation requests waiting for the upstream of a removed link to be reachable."),
			"held":                   d("held_messages_total", "Messages a removed federation link left in its queue on this node: conserved (re-published into their exchange) or discarded (--federation-discard-held).", "outcome"),
			"held_queues":            d("held_queues_removed_total", "Queues of removed federation links emptied and deleted on this node."),
			"links_wait":             d("federation_old_links_waiting", "Old federation links a configuration removes that are still in place: during an attempt, or after one that kept them (new links not running yet, or old ones still running whose upstreams have not taken what they hold: no luffymq agent there, or it cannot close the link's connection); the configuration is retried until they go."),
			"cfg_fail":               d("config_apply_failures_total", "Attempts to apply a configuration message that failed; it is retried every second for its first 10 attempts, then with pauses doubling up to 30 s, until it applies or a newer one replaces it."),
			"cfg_retry":              d("config_retrying", "1 while the configuration agent holds a configuration message that failed and waits to retry it, else 0."),
		},
	}
}

func (s *stats) exported(exchange string) {
	s.mu.Lock()
	s.exports[exchange]++
	s.mu.Unlock()
}

func (s *stats) imported(exchange string, r importResult) {
	s.mu.Lock()
	c := s.imports[exchange]
	if c == nil {
		c = new([numImportResults]uint64)
		s.imports[exchange] = c
	}
	c[r]++
	s.mu.Unlock()
}

// reconfigCounters count the work of loss-free reconfiguration; see
// ReconfigStats.
type reconfigCounters struct {
	moves, linksAdded, linksRemoved atomic.Uint64
	requestsSent, requestsAnswered  atomic.Uint64
	requestsPending                 atomic.Int64
	requestsHandled, queuesRemoved  atomic.Uint64
	conserved, discarded            atomic.Uint64
	oldLinksWaiting                 atomic.Int64
	configFailures                  atomic.Uint64
	configRetrying                  atomic.Int64
}

// wqCounters counts one group's work-queue traffic.
type wqCounters struct {
	received [numWQSources]uint64
	// atPublish counts local publishes sent to the dead-letter exchange at
	// once (overflow at publish).
	atPublish uint64
	// routedTo counts local publishes routed to another site at once, by
	// site (--wq-route nearest).
	routedTo  map[string]uint64
	settled   map[string]uint64
	fromSites map[string]uint64
	// reclaimed counts, by the site they were routed to, the messages
	// taken back from this node's link queues towards a silent site.
	reclaimed map[string]uint64
	// reclaimedRedelivered is the part of reclaimed that the site's link
	// had taken and given back unacknowledged: the site may have it too.
	reclaimedRedelivered map[string]uint64
	// siblingsReclaimed splits the part of reclaimed that another broker
	// of this site had booked, by that broker and by site (State.Unbooked).
	siblingsReclaimed map[string]map[string]uint64
	// statesTo counts the states sent to each other site (on its
	// request); wants, the requests for states this broker sent.
	statesTo map[string]uint64
	// statesWhy counts the same states by why they were sent
	// (stateReason).
	statesWhy map[string]uint64
	wants     uint64
	// emptyGets counts the consume loop's basic.gets that found a queue
	// (wq.<g> or the intake) empty.
	emptyGets uint64
}

func (s *stats) wqGroup(g string) *wqCounters {
	c := s.wq[g]
	if c == nil {
		c = &wqCounters{settled: map[string]uint64{}, fromSites: map[string]uint64{}, routedTo: map[string]uint64{},
			reclaimed: map[string]uint64{}, reclaimedRedelivered: map[string]uint64{}, statesTo: map[string]uint64{}, statesWhy: map[string]uint64{}}
		s.wq[g] = c
	}
	return c
}

func (s *stats) wqReceived(g string, src wqSource) {
	s.mu.Lock()
	s.wqGroup(g).received[src]++
	s.mu.Unlock()
}

// wqEmptyGet counts a basic.get of the consume loop that found its queue
// empty.
func (s *stats) wqEmptyGet(g string) {
	s.mu.Lock()
	s.wqGroup(g).emptyGets++
	s.mu.Unlock()
}

func (s *stats) wqOverflowAtPublish(g string) {
	s.mu.Lock()
	s.wqGroup(g).atPublish++
	s.mu.Unlock()
}

// wqStateSent counts a state sent to another site, and why.
func (s *stats) wqStateSent(g, site, why string) {
	s.mu.Lock()
	c := s.wqGroup(g)
	c.statesTo[site]++
	c.statesWhy[why]++
	s.mu.Unlock()
}

// wqWantSent counts a request for the other sites' states.
func (s *stats) wqWantSent(g string) {
	s.mu.Lock()
	s.wqGroup(g).wants++
	s.mu.Unlock()
}

func (s *stats) wqRoutedTo(g, site string) {
	s.mu.Lock()
	s.wqGroup(g).routedTo[site]++
	s.mu.Unlock()
}

// wqReclaimed counts a message routed to site that was taken back;
// redelivered says the site's link had taken it and given it back
// unacknowledged; sibling names the other broker of this site that
// booked it, if any.
func (s *stats) wqReclaimed(g, site string, redelivered bool, sibling string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.wqGroup(g)
	c.reclaimed[site]++
	if redelivered {
		c.reclaimedRedelivered[site]++
	}
	if sibling == "" {
		return
	}
	if c.siblingsReclaimed == nil {
		c.siblingsReclaimed = map[string]map[string]uint64{}
	}
	if c.siblingsReclaimed[sibling] == nil {
		c.siblingsReclaimed[sibling] = map[string]uint64{}
	}
	c.siblingsReclaimed[sibling][site]++
}

// wqSiblingsReclaimed returns a copy of group g's counts of the messages
// other brokers of this site booked that were taken back here.
func (s *stats) wqSiblingsReclaimed(g string) map[string]map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[string]uint64{}
	for b, m := range s.wqGroup(g).siblingsReclaimed {
		out[b] = maps.Clone(m)
	}
	return out
}

// wqFromSite counts a message of another site taken from the intake.
func (s *stats) wqFromSite(g, origin string) {
	s.mu.Lock()
	c := s.wqGroup(g)
	c.fromSites[origin]++
	s.mu.Unlock()
}

func (s *stats) wqSettled(g, outcome string) {
	s.mu.Lock()
	s.wqGroup(g).settled[outcome]++
	s.mu.Unlock()
}

// WorkQueueStats is one work queue's traffic and tuning at this site.
type WorkQueueStats struct {
	// Received counts messages taken from RabbitMQ: Local from wq.<g>,
	// OwnOverflow and FromOtherSites from the intake queue.
	Local, OwnOverflow, FromOtherSites uint64
	// OverflowAtPublish counts local publishes sent to the dead-letter
	// exchange at once because the local members would not have started
	// them within the TTL.
	OverflowAtPublish uint64
	// Completed, Requeued and Duplicates count settlements.
	Completed, Requeued, Duplicates uint64
	// FromSite splits FromOtherSites by origin site: the overflow of each
	// other site that this site worked on.
	FromSite map[string]uint64
	// RoutedTo counts, by site, the local publishes sent straight to
	// another site because its members would start them sooner, delay
	// included (--wq-route nearest).
	RoutedTo map[string]uint64
	// Reclaimed counts, by site, the messages sent there (routed, or by
	// the hash ring) that were taken back from this node's federation link
	// queues once its state had stopped arriving: routed ones into the
	// local work queue, the ring's into the local intake.
	Reclaimed map[string]uint64
	// ReclaimedRedelivered is the part of Reclaimed that the site's
	// federation link had taken and given back unacknowledged (its
	// connection closed, the site's node died): taken back only once the
	// site was silent for reclaimRedeliveredIntervals, and the only
	// messages that may be processed twice, here and at the site when it
	// comes back with a copy it kept (at-least-once).
	ReclaimedRedelivered map[string]uint64
	// StatesFresh counts the other sites whose group state is fresh and
	// predictable: those --wq-route nearest may send publishes to.
	StatesFresh int
	// StatesWanted is true while this broker asks the other sites for
	// their states (wqroute.Router.Demand): they come only on demand.
	StatesWanted bool
	// StatesTo counts, by site, the states this broker sent to another
	// site at its request; WantsSent, the requests for states it sent.
	StatesTo  map[string]uint64
	WantsSent uint64
	// StatesWhy splits the states sent to other sites by why they were
	// sent: "change" (what the other sites' routers read changed),
	// "idle" (a member went idle with nothing left to take), "heartbeat"
	// (nothing the site's router could not work out for itself changed
	// for stateHolderHeartbeatIntervals) and "lease" (the first to a site
	// that just asked).
	StatesWhy map[string]uint64
	// EmptyGets counts the consume loop's basic.gets that found wq.<g> or
	// the intake empty: what looking for work cost the node while there
	// was none (the arrival bells stand in for them while members wait).
	EmptyGets uint64
	// MaxLength, TTL and Weight are what the last retune applied.
	MaxLength int
	TTL       time.Duration
	Weight    int
	// InQueue is eq. 2.14 at the last retune.
	InQueue int
}

// WorkQueueStats returns the stats of every exported group, by group name.
func (b *Bridge) WorkQueueStats() map[string]WorkQueueStats {
	out := map[string]WorkQueueStats{}
	b.wqMu.Lock()
	for _, g := range b.groups {
		st := b.wqStates[g.name]
		out[g.name] = WorkQueueStats{FromSite: map[string]uint64{}, MaxLength: st.maxLength, TTL: st.ttl, Weight: st.weight, InQueue: st.inQueue}
		if g.router != nil {
			w := out[g.name]
			w.StatesFresh = g.router.FreshSites(time.Now())
			w.StatesWanted = g.router.Wanting()
			out[g.name] = w
		}
	}
	b.wqMu.Unlock()
	s := b.stats
	s.mu.Lock()
	for g, c := range s.wq {
		w := out[g]
		w.Local, w.OwnOverflow, w.FromOtherSites = c.received[fromWorkQueue], c.received[fromOwnOverflow], c.received[fromOtherSite]
		w.OverflowAtPublish = c.atPublish
		w.Completed, w.Requeued, w.Duplicates = c.settled["completed"], c.settled["requeued"], c.settled["duplicate"]
		w.FromSite = map[string]uint64{}
		for o, n := range c.fromSites {
			w.FromSite[o] = n
		}
		w.RoutedTo = maps.Clone(c.routedTo)
		w.Reclaimed, w.ReclaimedRedelivered = maps.Clone(c.reclaimed), maps.Clone(c.reclaimedRedelivered)
		w.StatesTo, w.WantsSent, w.StatesWhy = maps.Clone(c.statesTo), c.wants, maps.Clone(c.statesWhy)
		w.EmptyGets = c.emptyGets
		out[g] = w
	}
	s.mu.Unlock()
	return out
}

// warnDropped logs that the outbox overflowed, at most every 10 s.
func (s *stats) warnDropped(log *slog.Logger) {
	now := time.Now().UnixNano()
	last := s.lastWarn.Load()
	if now-last < int64(10*time.Second) || !s.lastWarn.CompareAndSwap(last, now) {
		return
	}
	log.Warn("bridge: outbox full, dropping the oldest messages; RabbitMQ is down or too slow",
		"outbox_size", s.b.cfg.OutboxSize, "dropped_total", s.b.outbox.droppedCount())
}

// Counts returns messages exported and delivered by import, by exchange.
func (b *Bridge) Counts() (exported, delivered map[string]uint64) {
	s := b.stats
	s.mu.Lock()
	defer s.mu.Unlock()
	exported, delivered = map[string]uint64{}, map[string]uint64{}
	for x, n := range s.exports {
		exported[x] = n
	}
	for x, c := range s.imports {
		delivered[x] = c[importDelivered]
	}
	return exported, delivered
}

// Collector returns a Prometheus collector of the bridge's metrics.
func (b *Bridge) Collector() prometheus.Collector { return b.stats }

// Describe implements prometheus.Collector.
func (s *stats) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range s.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *stats) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	for x, n := range s.exports {
		ch <- prometheus.MustNewConstMetric(s.descs["exported"], prometheus.CounterValue, float64(n), x)
	}
	for x, c := range s.imports {
		for r, n := range c {
			ch <- prometheus.MustNewConstMetric(s.descs["imported"], prometheus.CounterValue, float64(n), x, importResultNames[r])
		}
	}
	s.mu.Unlock()
	up := 0.0
	if s.b.Connected() {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(s.descs["connected"], prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(s.descs["reconnects"], prometheus.CounterValue, float64(s.reconnects.Load()))
	ch <- prometheus.MustNewConstMetric(s.descs["outbox"], prometheus.GaugeValue, float64(s.b.outbox.len()))
	ch <- prometheus.MustNewConstMetric(s.descs["dropped"], prometheus.CounterValue, float64(s.b.outbox.droppedCount()), "outbox_full")
	ch <- prometheus.MustNewConstMetric(s.descs["dropped"], prometheus.CounterValue, float64(s.nacked.Load()), "refused")
	ch <- prometheus.MustNewConstMetric(s.descs["bindings"], prometheus.GaugeValue, float64(len(s.b.Bindings())))
	ch <- prometheus.MustNewConstMetric(s.descs["agent"], prometheus.CounterValue, float64(s.configsApplied.Load()), "config_applied")
	ch <- prometheus.MustNewConstMetric(s.descs["agent"], prometheus.CounterValue, float64(s.events.Load()), "queue_event")
	ch <- prometheus.MustNewConstMetric(s.descs["agent_fail"], prometheus.CounterValue, float64(s.eventAgentFailures.Load()), "events")
	r := s.b.ReconfigStats()
	ch <- prometheus.MustNewConstMetric(s.descs["fed_links"], prometheus.CounterValue, float64(r.LinksAdded), "added")
	ch <- prometheus.MustNewConstMetric(s.descs["fed_links"], prometheus.CounterValue, float64(r.LinksRemoved), "removed")
	ch <- prometheus.MustNewConstMetric(s.descs["fed_moves"], prometheus.CounterValue, float64(r.Moves))
	ch <- prometheus.MustNewConstMetric(s.descs["cons_req"], prometheus.CounterValue, float64(r.RequestsSent), "sent")
	ch <- prometheus.MustNewConstMetric(s.descs["cons_req"], prometheus.CounterValue, float64(r.RequestsAnswered), "answered")
	ch <- prometheus.MustNewConstMetric(s.descs["cons_req"], prometheus.CounterValue, float64(r.RequestsHandled), "handled")
	ch <- prometheus.MustNewConstMetric(s.descs["cons_pend"], prometheus.GaugeValue, float64(r.RequestsPending))
	ch <- prometheus.MustNewConstMetric(s.descs["held"], prometheus.CounterValue, float64(r.Conserved), "conserved")
	ch <- prometheus.MustNewConstMetric(s.descs["held"], prometheus.CounterValue, float64(r.Discarded), "discarded")
	ch <- prometheus.MustNewConstMetric(s.descs["held_queues"], prometheus.CounterValue, float64(r.QueuesRemoved))
	ch <- prometheus.MustNewConstMetric(s.descs["links_wait"], prometheus.GaugeValue, float64(r.OldLinksWaiting))
	ch <- prometheus.MustNewConstMetric(s.descs["cfg_fail"], prometheus.CounterValue, float64(r.ConfigFailures))
	ch <- prometheus.MustNewConstMetric(s.descs["cfg_retry"], prometheus.GaugeValue, float64(r.ConfigRetrying))
	for g, w := range s.b.WorkQueueStats() {
		q := WorkQueueName(g)
		for src, n := range [numWQSources]uint64{w.Local, w.OwnOverflow, w.FromOtherSites} {
			ch <- prometheus.MustNewConstMetric(s.descs["wq_received"], prometheus.CounterValue, float64(n), q, wqSourceNames[src])
		}
		for outcome, n := range map[string]uint64{"completed": w.Completed, "requeued": w.Requeued, "duplicate": w.Duplicates} {
			ch <- prometheus.MustNewConstMetric(s.descs["wq_settled"], prometheus.CounterValue, float64(n), q, outcome)
		}
		ch <- prometheus.MustNewConstMetric(s.descs["wq_overflow"], prometheus.CounterValue, float64(w.OwnOverflow), q, s.b.cfg.Site)
		for o, n := range w.FromSite {
			ch <- prometheus.MustNewConstMetric(s.descs["wq_overflow"], prometheus.CounterValue, float64(n), q, o)
		}
		ch <- prometheus.MustNewConstMetric(s.descs["wq_at_pub"], prometheus.CounterValue, float64(w.OverflowAtPublish), q)
		ch <- prometheus.MustNewConstMetric(s.descs["wq_empty_gets"], prometheus.CounterValue, float64(w.EmptyGets), q)
		for site, n := range w.RoutedTo {
			ch <- prometheus.MustNewConstMetric(s.descs["wq_routed"], prometheus.CounterValue, float64(n), q, site)
		}
		for site, n := range w.StatesTo {
			ch <- prometheus.MustNewConstMetric(s.descs["wq_states"], prometheus.CounterValue, float64(n), q, site)
		}
		for why, n := range w.StatesWhy {
			ch <- prometheus.MustNewConstMetric(s.descs["wq_states_why"], prometheus.CounterValue, float64(n), q, why)
		}
		ch <- prometheus.MustNewConstMetric(s.descs["wq_wants"], prometheus.CounterValue, float64(w.WantsSent), q)
		for site, n := range w.Reclaimed {
			ch <- prometheus.MustNewConstMetric(s.descs["wq_reclaim"], prometheus.CounterValue, float64(n), q, site)
		}
		for site, n := range w.ReclaimedRedelivered {
			ch <- prometheus.MustNewConstMetric(s.descs["wq_reclaim_redelivered"], prometheus.CounterValue, float64(n), q, site)
		}
		ch <- prometheus.MustNewConstMetric(s.descs["wq_ttl"], prometheus.GaugeValue, w.TTL.Seconds(), q)
		ch <- prometheus.MustNewConstMetric(s.descs["wq_maxlen"], prometheus.GaugeValue, float64(w.MaxLength), q)
		ch <- prometheus.MustNewConstMetric(s.descs["wq_weight"], prometheus.GaugeValue, float64(w.Weight), q)
		ch <- prometheus.MustNewConstMetric(s.descs["wq_depth"], prometheus.GaugeValue, float64(w.InQueue), q)
	}
}
