package sites

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/bridge/placement"
)

// Scenario set C of docs/scenarios.md (luffy-bench sites).
const (
	// SitesWQLocal: one work queue at every site, most messages
	// consumable where they are published.
	SitesWQLocal = "wq-local"
	// SitesWQBalanced: as many messages must be processed remotely as
	// locally.
	SitesWQBalanced = "wq-balanced"
	// SitesPSB, SitesPSP and SitesPSS: 6 pub/sub exchanges, 70 % of the
	// clients at one site; balanced, producer-heavy, subscriber-heavy.
	SitesPSB = "ps-B"
	SitesPSP = "ps-P"
	SitesPSS = "ps-S"
	// SitesPSDynamic: the producers change P→S→B→S→P→B.
	SitesPSDynamic = "ps-dynamic"
	// SitesReconfig: ps-dynamic with the synchronisation sites re-planned
	// every reconfiguration period, with and without message conservation.
	SitesReconfig = "reconfig"
)

// SitesScenarios lists set C in report order.
var SitesScenarios = []string{SitesWQLocal, SitesWQBalanced, SitesPSB, SitesPSP, SitesPSS, SitesPSDynamic, SitesReconfig}

// Architectures compared by luffy-bench sites.
const (
	// ArchLuffyMQ: one luffymq per site with the bridge on the site's
	// RabbitMQ node, with its default flags; pub/sub through one
	// synchronisation instance per exchange placed by placement.Improved,
	// work queues routed by the sites' group states (--wq-route nearest,
	// the default since 2026-11-27; results generated before then measured
	// the ring under this name, now ArchLuffyMQRing).
	ArchLuffyMQ = "luffymq"
	// ArchLuffyMQRing: the same with --wq-route ring, the thesis's
	// routing: a publish the site's members would not start within the
	// TTL goes to the dead-letter exchange's consistent-hash ring at once.
	ArchLuffyMQRing = "luffymq-ring"
	// ArchLuffyMQTTLOnly: the same with --wq-ttl-overflow-only, the
	// thesis's overflow rule (a message leaves wq.<g> only when its TTL
	// expires or the queue is full), measured beside overflow at publish.
	ArchLuffyMQTTLOnly = "luffymq-ttl-only"
	// ArchLuffyMQNearest: the same with --wq-route nearest given
	// explicitly: each publish goes straight to the site whose members
	// would start it soonest, one-way delay included, by the group states
	// the sites publish. On a current luffymq it is ArchLuffyMQ; it stays
	// for binaries older than the default's change.
	ArchLuffyMQNearest = "luffymq-nearest"
	// ArchQueueFederation: plain RabbitMQ, queue federation in a full mesh,
	// AMQP clients.
	ArchQueueFederation = "queue-federation"
	// ArchFullMesh: exchange federation in a full mesh between the sites
	// of each exchange (luffymq brokers at the edge): the latency lower
	// bound.
	ArchFullMesh = "fullmesh"
	// ArchStar: every synchronisation instance at one hub.
	ArchStar = "star"
	// ArchRandom: each synchronisation instance at a random site of its
	// exchange.
	ArchRandom = "random"
	// ArchCloud: one central RabbitMQ at the first site; every client
	// reaches it through the delay proxy (work queues: consumers there).
	ArchCloud = "cloud"
	// ArchCloudDist: central RabbitMQ, consumers stay at their edge
	// sites and reach it through the delay proxy.
	ArchCloudDist = "cloud-dist"
	// ArchReconfigConserve and ArchReconfigDiscard: luffymq re-planning
	// every reconfiguration period, keeping (conserve) or dropping
	// (discard) the messages held in a moved link's queue.
	ArchReconfigConserve = "luffymq-conserve"
	ArchReconfigDiscard  = "luffymq-discard"
)

// sitesOnRequest gives the architectures a scenario runs only when
// --architectures names them, after sitesArchitectures' in report order.
func sitesOnRequest(scenario string) []string {
	if isWorkQueue(scenario) {
		return []string{ArchLuffyMQNearest}
	}
	return nil
}

// sitesArchitectures gives each scenario's architectures in report order;
// the first baseline named by sitesReference is the ratio reference.
func sitesArchitectures(scenario string) []string {
	switch scenario {
	case SitesWQLocal, SitesWQBalanced:
		return []string{ArchLuffyMQ, ArchLuffyMQRing, ArchLuffyMQTTLOnly, ArchQueueFederation, ArchCloud, ArchCloudDist}
	case SitesReconfig:
		return []string{ArchReconfigConserve, ArchReconfigDiscard}
	}
	return []string{ArchLuffyMQ, ArchFullMesh, ArchStar, ArchRandom, ArchCloud}
}

// sitesReference is the full-mesh architecture a scenario's ratios are
// computed against (for reconfig: ps-dynamic's full mesh).
func sitesReference(scenario string) (refScenario, refArch string) {
	switch scenario {
	case SitesWQLocal, SitesWQBalanced:
		return scenario, ArchQueueFederation
	case SitesReconfig:
		return SitesPSDynamic, ArchFullMesh
	}
	return scenario, ArchFullMesh
}

// isWorkQueue reports whether scenario is a work-queue scenario.
func isWorkQueue(scenario string) bool {
	return scenario == SitesWQLocal || scenario == SitesWQBalanced
}

// wqGroup is the shared group (and work queue wq.<group>) of the work-queue
// scenarios.
const wqGroup = "jobs"

// wqWorkload is one work-queue scenario: Poisson arrivals at every site
// and a fixed number of consumers per site.
type wqWorkload struct {
	Sites []string `json:"sites"`
	// Hot is the (first) busy site.
	Hot int `json:"hot_site"`
	// Busy are all the busy sites (--busy-sites), Hot first; results
	// written before there could be more than one leave it out.
	Busy []int `json:"busy_sites,omitempty"`
	// Rates are the messages per second published at each site.
	Rates []float64 `json:"msgs_per_s"`
	// Consumers per site, each processing one message at a time.
	Consumers []int `json:"consumers"`
	// Service is each message's processing time.
	Service time.Duration `json:"service_ns"`
	// Duration is the publishing time.
	Duration time.Duration `json:"duration_ns"`
}

// wqArrival is one work-queue message.
type wqArrival struct {
	Seq  int
	Site int
	At   time.Duration
}

// Load factors of the work-queue scenarios, as fractions of a site's own
// capacity (consumers / service time), at the busy site (busySite) and
// the others.
const (
	wqLocalHotLoad   = 1.15 // wq-local: 15 % above its capacity
	wqLocalOtherLoad = 0.7
	// wq-balanced: the other sites publish wqBalancedOtherLoad of their
	// capacity; the busy site 2 + (n−1)·other, so that what must leave it
	// equals what is processed where it was published.
	wqBalancedOtherLoad = 0.1
	// With more than one busy site that rule would load all consumers
	// together past wqMaxUtilisation on up to 5 sites; the busy sites then
	// share what brings the total to wqBalancedMultiUtilisation.
	wqBalancedMultiUtilisation = 0.8
)

// wqBalancedBusyLoad is the load factor of each busy site in wq-balanced,
// busy of the n sites being busy: 2 + (n−1)·other for one busy site (what must leave it
// equals what is processed where it was published); for more, that rule
// generalised, 2 + (n−busy)·other/busy, but at most what loads all
// consumers together to wqBalancedMultiUtilisation.
func wqBalancedBusyLoad(n, busy int) float64 {
	quiet := float64(n-busy) * wqBalancedOtherLoad
	f := 2 + quiet/float64(busy)
	if busy == 1 {
		return f
	}
	return math.Min(f, (wqBalancedMultiUtilisation*float64(n)-quiet)/float64(busy))
}

// newWQWorkload sizes a work-queue scenario for sites with consumers per
// site, busy of them busy (from the second site on: busySites).
func newWQWorkload(scenario string, sites []string, consumers, busy int, service, duration time.Duration) (wqWorkload, error) {
	if len(sites) < 2 {
		return wqWorkload{}, fmt.Errorf("%s needs at least 2 sites", scenario)
	}
	if busy < 1 || busy >= len(sites) {
		return wqWorkload{}, fmt.Errorf("%s on %d sites: %d busy sites, want 1 to %d", scenario, len(sites), busy, len(sites)-1)
	}
	w := wqWorkload{Sites: slices.Clone(sites), Busy: busySites(len(sites), busy), Service: service, Duration: duration}
	w.Hot = w.Busy[0]
	capacity := float64(consumers) / service.Seconds()
	for i := range sites {
		var f float64
		switch {
		case scenario == SitesWQLocal && w.IsBusy(i):
			f = wqLocalHotLoad
		case scenario == SitesWQLocal:
			f = wqLocalOtherLoad
		case scenario == SitesWQBalanced && w.IsBusy(i):
			f = wqBalancedBusyLoad(len(sites), busy)
		case scenario == SitesWQBalanced:
			f = wqBalancedOtherLoad
		default:
			return wqWorkload{}, fmt.Errorf("%s is not a work-queue scenario", scenario)
		}
		w.Rates = append(w.Rates, f*capacity)
		w.Consumers = append(w.Consumers, consumers)
	}
	total := 0.0
	for _, r := range w.Rates {
		total += r
	}
	if total > wqMaxUtilisation*w.Capacity() {
		return wqWorkload{}, fmt.Errorf("%s on %d sites would load the consumers to %.0f %% of their capacity (more than %.0f %%); use more sites", scenario, len(sites), 100*total/w.Capacity(), 100*wqMaxUtilisation)
	}
	return w, nil
}

// wqMaxUtilisation bounds the share of the consumers' total capacity a
// work-queue scenario may use: beyond it queues grow whatever the
// architecture.
const wqMaxUtilisation = 0.9

// BusySites are the busy sites: Busy, or Hot alone in results written
// before Busy.
func (w wqWorkload) BusySites() []int {
	if len(w.Busy) == 0 {
		return []int{w.Hot}
	}
	return w.Busy
}

// IsBusy reports whether site i is one of the busy sites.
func (w wqWorkload) IsBusy(i int) bool { return slices.Contains(w.BusySites(), i) }

// Capacity is the messages per second all consumers together process.
func (w wqWorkload) Capacity() float64 {
	total := 0
	for _, c := range w.Consumers {
		total += c
	}
	return float64(total) / w.Service.Seconds()
}

// MustMove is the rate that cannot be processed at the site where it is
// published (messages per second).
func (w wqWorkload) MustMove() float64 {
	sum := 0.0
	for i, r := range w.Rates {
		sum += math.Max(0, r-float64(w.Consumers[i])/w.Service.Seconds())
	}
	return sum
}

// Arrivals returns the messages of the scenario: independent Poisson
// arrivals at each site's rate over Duration, sorted by time, numbered
// from 0 in that order. The same seed gives the same arrivals.
func (w wqWorkload) Arrivals(seed uint64) []wqArrival {
	var out []wqArrival
	for i, rate := range w.Rates {
		rng := rand.New(rand.NewPCG(seed, uint64(i)+1))
		for t := time.Duration(0); ; {
			t += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
			if t >= w.Duration {
				break
			}
			out = append(out, wqArrival{Site: i, At: t})
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].At < out[b].At })
	for i := range out {
		out[i].Seq = i
	}
	return out
}

// psExchanges is the number of global pub/sub exchanges (scenarios.md §C).
const psExchanges = 6

// psHotShare is the share of the clients at the busy site ("70 % of the
// clients on 25 % of the sites").
const psHotShare = 0.7

// psClient is one pub/sub client.
type psClient struct {
	Exchange int  `json:"exchange"`
	Site     int  `json:"site"`
	Producer bool `json:"producer"`
}

// psPhase is a stretch of a pub/sub scenario with one set of producers.
type psPhase struct {
	// Kind is B, P or S.
	Kind     string        `json:"kind"`
	Start    time.Duration `json:"start_ns"`
	Duration time.Duration `json:"duration_ns"`
	// Producers index psWorkload.Producers.
	Producers []int `json:"producers"`
}

// psWorkload is one pub/sub scenario.
type psWorkload struct {
	Sites []string `json:"sites"`
	// Hot is the site holding 70 % of the clients.
	Hot int `json:"hot_site"`
	// Topics are the MQTT topic roots; exchange i is
	// bridge.ExchangeName(Topics[i]+"/#").
	Topics      []string   `json:"topics"`
	Subscribers []psClient `json:"subscribers"`
	// Producers are every producer of every phase.
	Producers []psClient `json:"producers"`
	Phases    []psPhase  `json:"phases"`
	// Rate is each active producer's messages per second.
	Rate float64 `json:"producer_msgs_per_s"`
}

// psKinds is the sequence of ps-dynamic's phases.
var psKinds = []string{"P", "S", "B", "S", "P", "B"}

// psProducerShare is the share of an exchange's clients that publish in
// each kind of phase.
func psProducerShare(kind string) float64 {
	switch kind {
	case "P":
		return 2.0 / 3
	case "S":
		return 1.0 / 3
	}
	return 0.5
}

// newPSWorkload builds a pub/sub scenario for sites. Each of the 6
// exchanges lives at the busy site and at 1 to n−1 other sites drawn at
// random; it has one client at each other site and ⌈7/3·(k−1)⌉ at the busy
// one (k sites: 70 % there), shuffled and split into producers and
// subscribers by the phase's kind (B: half, P: two thirds producers, S:
// one third; at least one of each). ps-dynamic keeps the subscribers of a
// B split for the whole run and draws fresh producers for each phase
// P→S→B→S→P→B, phase j putting its busy-site producers at site
// (hot + j) mod n instead, so that where publications come from moves.
func newPSWorkload(scenario string, sites []string, seed uint64, phase time.Duration, rate float64) (psWorkload, error) {
	n := len(sites)
	if n < 2 {
		return psWorkload{}, fmt.Errorf("%s needs at least 2 sites", scenario)
	}
	rng := rand.New(rand.NewPCG(seed, 0x5ca1ab1e))
	w := psWorkload{Sites: slices.Clone(sites), Hot: busySite(n), Rate: rate}
	// Instance sites of each exchange.
	members := make([][]int, psExchanges)
	for i := range psExchanges {
		w.Topics = append(w.Topics, fmt.Sprintf("t%d", i))
		others := make([]int, 0, n-1)
		for s := range n {
			if s != w.Hot {
				others = append(others, s)
			}
		}
		rng.Shuffle(len(others), func(a, b int) { others[a], others[b] = others[b], others[a] })
		k := 1 + rng.IntN(n-1) // other sites
		members[i] = append([]int{w.Hot}, others[:k]...)
	}
	// slots returns the sites of an exchange's clients, with the busy
	// site's share at hot, in random order.
	slots := func(i, hot int) []int {
		others := members[i][1:]
		hotCount := int(math.Ceil(psHotShare / (1 - psHotShare) * float64(len(others))))
		var out []int
		for range hotCount {
			out = append(out, hot)
		}
		out = append(out, others...)
		if hot != w.Hot {
			// The busy site of a dynamic phase takes the place of one of
			// the exchange's other sites; the usual busy site keeps one.
			for j := hotCount; j < len(out); j++ {
				if out[j] == hot {
					out[j] = w.Hot
				}
			}
		}
		rng.Shuffle(len(out), func(a, b int) { out[a], out[b] = out[b], out[a] })
		return out
	}
	split := func(kind string, sites []int) (producers, subscribers []int) {
		p := int(math.Round(psProducerShare(kind) * float64(len(sites))))
		p = min(max(p, 1), len(sites)-1)
		return sites[:p], sites[p:]
	}
	addProducers := func(ph *psPhase, i int, sites []int) {
		for _, s := range sites {
			ph.Producers = append(ph.Producers, len(w.Producers))
			w.Producers = append(w.Producers, psClient{Exchange: i, Site: s, Producer: true})
		}
	}
	switch scenario {
	case SitesPSB, SitesPSP, SitesPSS:
		kind := scenario[len(scenario)-1:]
		ph := psPhase{Kind: kind, Duration: phase}
		for i := range psExchanges {
			prods, subs := split(kind, slots(i, w.Hot))
			addProducers(&ph, i, prods)
			for _, s := range subs {
				w.Subscribers = append(w.Subscribers, psClient{Exchange: i, Site: s})
			}
		}
		w.Phases = []psPhase{ph}
	case SitesPSDynamic, SitesReconfig:
		for i := range psExchanges {
			_, subs := split("B", slots(i, w.Hot))
			for _, s := range subs {
				w.Subscribers = append(w.Subscribers, psClient{Exchange: i, Site: s})
			}
		}
		for j, kind := range psKinds {
			ph := psPhase{Kind: kind, Start: time.Duration(j) * phase, Duration: phase}
			hot := (w.Hot + j) % n
			for i := range psExchanges {
				prods, _ := split(kind, slots(i, hot))
				addProducers(&ph, i, prods)
			}
			w.Phases = append(w.Phases, ph)
		}
	default:
		return psWorkload{}, fmt.Errorf("%s is not a pub/sub scenario", scenario)
	}
	return w, nil
}

// busySite is the busy site of every scenario: the second site. The first
// is the cloud's central site and the star's hub, which would otherwise
// start with most clients local.
func busySite(n int) int { return 1 % n }

// busySites are the count busy sites of a work-queue scenario on n sites:
// busySite and the sites after it, so that the first (the cloud's) stays
// quiet.
func busySites(n, count int) []int {
	out := make([]int, 0, count)
	for i := range count {
		out = append(out, (busySite(n)+i)%n)
	}
	return out
}

// Exchange returns exchange i's RabbitMQ name.
func (w psWorkload) Exchange(i int) string { return bridge.ExchangeName(w.Topics[i] + "/#") }

// Duration is the publishing time of the whole scenario.
func (w psWorkload) Duration() time.Duration {
	var d time.Duration
	for _, p := range w.Phases {
		d = max(d, p.Start+p.Duration)
	}
	return d
}

// InstanceSites returns, for each exchange, the sites where any client of
// it lives at any time, sorted.
func (w psWorkload) InstanceSites() [][]int {
	set := make([]map[int]bool, len(w.Topics))
	for i := range set {
		set[i] = map[int]bool{}
	}
	for _, c := range w.Subscribers {
		set[c.Exchange][c.Site] = true
	}
	for _, c := range w.Producers {
		set[c.Exchange][c.Site] = true
	}
	out := make([][]int, len(set))
	for i, s := range set {
		for site := range s {
			out[i] = append(out[i], site)
		}
		sort.Ints(out[i])
	}
	return out
}

// psArrival is one publication.
type psArrival struct {
	Producer int
	Seq      int
	At       time.Duration
}

// Arrivals returns every publication: each producer of a phase publishes
// Poisson arrivals at Rate during its phase. Sorted by time; Seq counts
// each producer's publications from 0.
func (w psWorkload) Arrivals(seed uint64) []psArrival {
	var out []psArrival
	for _, ph := range w.Phases {
		for _, p := range ph.Producers {
			rng := rand.New(rand.NewPCG(seed, uint64(p)+1))
			seq := 0
			for t := ph.Start; ; seq++ {
				t += time.Duration(rng.ExpFloat64() / w.Rate * float64(time.Second))
				if t >= ph.Start+ph.Duration {
					break
				}
				out = append(out, psArrival{Producer: p, Seq: seq, At: t})
			}
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].At < out[b].At })
	return out
}

// delayMatrix is the placement delay matrix of sites.
func delayMatrix(sites []string, delay func(a, b string) time.Duration) placement.Delays {
	d := placement.Delays{}
	for _, a := range sites {
		d[a] = map[string]time.Duration{}
		for _, b := range sites {
			d[a][b] = delay(a, b)
		}
	}
	return d
}

// psTraffic is what each exchange instance carried, per exchange and site,
// in messages per second: local publications and local deliveries.
type psTraffic struct {
	Published [][]float64
	Consumed  [][]float64
}

// ExpectedTraffic returns the traffic of the phases in phases (all when
// nil) averaged over their time: each active producer publishes Rate and
// every subscriber of its exchange receives it.
func (w psWorkload) ExpectedTraffic(phases []int) psTraffic {
	t := psTraffic{Published: make([][]float64, len(w.Topics)), Consumed: make([][]float64, len(w.Topics))}
	for i := range w.Topics {
		t.Published[i] = make([]float64, len(w.Sites))
		t.Consumed[i] = make([]float64, len(w.Sites))
	}
	if phases == nil {
		for j := range w.Phases {
			phases = append(phases, j)
		}
	}
	var total time.Duration
	for _, j := range phases {
		total += w.Phases[j].Duration
	}
	if total <= 0 {
		return t
	}
	for _, j := range phases {
		ph := w.Phases[j]
		weight := float64(ph.Duration) / float64(total)
		for _, p := range ph.Producers {
			c := w.Producers[p]
			t.Published[c.Exchange][c.Site] += w.Rate * weight
			for _, s := range w.Subscribers {
				if s.Exchange == c.Exchange {
					t.Consumed[s.Exchange][s.Site] += w.Rate * weight
				}
			}
		}
	}
	return t
}

// placementInput turns traffic into algorithm 2.1's input (unlimited
// bandwidth: the scenario's messages are small). Sites without traffic
// of an exchange hold no instance of it.
func (w psWorkload) placementInput(t psTraffic, delays placement.Delays, previous placement.Plan, lambda float64, seed uint64) placement.Input {
	in := placement.Input{Delays: delays, Previous: previous, Lambda: lambda, Seed: seed}
	for _, s := range w.Sites {
		in.Sites = append(in.Sites, placement.Site{Name: s})
	}
	for i := range w.Topics {
		x := placement.Exchange{Name: w.Exchange(i), MeanMessageSize: float64(sitesPayloadBytes)}
		for s, site := range w.Sites {
			if t.Published[i][s] > 0 || t.Consumed[i][s] > 0 {
				x.Instances = append(x.Instances, placement.Instance{Site: site, LocalPublished: t.Published[i][s], LocalConsumed: t.Consumed[i][s]})
			}
		}
		if len(x.Instances) == 0 {
			continue
		}
		if prev, ok := previous[x.Name]; ok && !slices.ContainsFunc(x.Instances, func(in placement.Instance) bool { return in.Site == prev }) {
			// The previous sync site lost its clients: it still holds the
			// instance (with no local traffic), so staying is allowed.
			x.Instances = append(x.Instances, placement.Instance{Site: prev})
		}
		in.Exchanges = append(in.Exchanges, x)
	}
	return in
}

// starPlan puts every exchange's synchronisation instance at hub.
func (w psWorkload) starPlan(hub string) placement.Plan {
	p := placement.Plan{}
	for i := range w.Topics {
		p[w.Exchange(i)] = hub
	}
	return p
}

// randomPlan puts each exchange's synchronisation instance at one of its
// instance sites drawn at random.
func (w psWorkload) randomPlan(seed uint64) placement.Plan {
	rng := rand.New(rand.NewPCG(seed, 0xfeed))
	p := placement.Plan{}
	for i, sites := range w.InstanceSites() {
		p[w.Exchange(i)] = w.Sites[sites[rng.IntN(len(sites))]]
	}
	return p
}

// federationLayout gives, per site, the exchanges it federates and from
// which sites.
type federationLayout map[string][]siteFederation

// siteFederation is one exchange of one site federated from upstream sites.
type siteFederation struct {
	Exchange  string
	Upstreams []string
}

// Links counts the federation links of the layout (one per exchange and
// upstream at each downstream site).
func (l federationLayout) Links() int {
	n := 0
	for _, xs := range l {
		for _, x := range xs {
			n += len(x.Upstreams)
		}
	}
	return n
}

// meshLayout federates each exchange between all its instance sites: N·(N−1)
// links per exchange.
func (w psWorkload) meshLayout() federationLayout {
	l := federationLayout{}
	for i, sites := range w.InstanceSites() {
		for _, a := range sites {
			var ups []string
			for _, b := range sites {
				if b != a {
					ups = append(ups, w.Sites[b])
				}
			}
			l[w.Sites[a]] = append(l[w.Sites[a]], siteFederation{Exchange: w.Exchange(i), Upstreams: ups})
		}
	}
	return l
}

// syncLayout joins each exchange's instances through its synchronisation
// site (algorithms.md §2.2): every other instance federates from the sync
// site and the sync site from every other instance, 2·(N−1) links (2·N
// when the sync site holds no client of the exchange).
func (w psWorkload) syncLayout(plan placement.Plan) federationLayout {
	l := federationLayout{}
	for i, sites := range w.InstanceSites() {
		x := w.Exchange(i)
		sync, ok := plan[x]
		if !ok {
			continue
		}
		var syncUps []string
		for _, s := range sites {
			if name := w.Sites[s]; name != sync {
				syncUps = append(syncUps, name)
				l[name] = append(l[name], siteFederation{Exchange: x, Upstreams: []string{sync}})
			}
		}
		if len(syncUps) > 0 {
			l[sync] = append(l[sync], siteFederation{Exchange: x, Upstreams: syncUps})
		}
	}
	for s := range l {
		sort.Slice(l[s], func(a, b int) bool { return l[s][a].Exchange < l[s][b].Exchange })
	}
	return l
}
