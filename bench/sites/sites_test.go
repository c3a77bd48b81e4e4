package sites

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/bridge/controller"
	"github.com/luffymq/luffymq/bridge/placement"
	"github.com/luffymq/luffymq/internal/rabbitharness"
)

var testSites = []string{"berlin", "tunis", "montreal", "tokyo"}

func TestSitesWQWorkloadRates(t *testing.T) {
	service := 100 * time.Millisecond
	local, err := newWQWorkload(SitesWQLocal, testSites, 2, 1, service, 10*time.Second)
	require.NoError(t, err)
	// 2 consumers of 100 ms: 20 msg/s per site; the second site is busy.
	require.Equal(t, 1, local.Hot)
	for i, r := range local.Rates {
		if i == 1 {
			require.InDelta(t, 23, r, 1e-9)
		} else {
			require.InDelta(t, 14, r, 1e-9)
		}
	}
	require.InDelta(t, 80, local.Capacity(), 1e-9)
	require.InDelta(t, 3, local.MustMove(), 1e-9, "only the busy site's 15 % above capacity must move")

	bal, err := newWQWorkload(SitesWQBalanced, testSites, 2, 1, service, 10*time.Second)
	require.NoError(t, err)
	total, localCap := 0.0, 0.0
	for i, r := range bal.Rates {
		total += r
		localCap += math.Min(r, 20)
		require.Equal(t, 2, bal.Consumers[i])
	}
	require.InDelta(t, bal.MustMove(), total-localCap, 1e-9)
	require.InDelta(t, localCap, bal.MustMove(), 1e-9, "wq-balanced: as much must move as can stay")
	require.Less(t, total, bal.Capacity(), "the sites together keep up")

	_, err = newWQWorkload(SitesPSB, testSites, 2, 1, service, time.Second)
	require.Error(t, err)
	_, err = newWQWorkload(SitesWQLocal, testSites[:1], 2, 1, service, time.Second)
	require.Error(t, err)
	_, err = newWQWorkload(SitesWQBalanced, testSites[:2], 2, 1, service, time.Second)
	require.ErrorContains(t, err, "use more sites", "2 sites cannot absorb the busy one's double load")
	_, err = newWQWorkload(SitesWQBalanced, testSites[:3], 2, 1, service, time.Second)
	require.NoError(t, err)
}

// TestSitesWQWorkloadSeveralBusySites: --busy-sites 2 makes the second and
// third sites busy; one busy site keeps the rates it always had, and more
// busy sites never load all consumers past 80 % of their capacity.
func TestSitesWQWorkloadSeveralBusySites(t *testing.T) {
	service := 100 * time.Millisecond
	five := append(slices.Clone(testSites), "mexico-city")
	one, err := newWQWorkload(SitesWQBalanced, five, 2, 1, service, time.Second)
	require.NoError(t, err)
	require.Equal(t, []int{1}, one.BusySites())
	require.InDelta(t, 20*(2+4*wqBalancedOtherLoad), one.Rates[1], 1e-9, "one busy site: 2 + (n−1)·other, as before")

	two, err := newWQWorkload(SitesWQBalanced, five, 2, 2, service, time.Second)
	require.NoError(t, err)
	require.Equal(t, []int{1, 2}, two.BusySites())
	require.Equal(t, 1, two.Hot)
	require.True(t, two.IsBusy(2))
	require.False(t, two.IsBusy(0))
	total := 0.0
	for i, r := range two.Rates {
		total += r
		if two.IsBusy(i) {
			require.Greater(t, r, 20.0, "a busy site gets more than its consumers can do")
		} else {
			require.InDelta(t, 20*wqBalancedOtherLoad, r, 1e-9)
		}
	}
	require.InDelta(t, wqBalancedMultiUtilisation*two.Capacity(), total, 1e-9)
	require.InDelta(t, two.Rates[1], two.Rates[2], 1e-9)

	local, err := newWQWorkload(SitesWQLocal, five, 2, 2, service, time.Second)
	require.NoError(t, err)
	require.InDelta(t, 2*0.15*20, local.MustMove(), 1e-9, "each busy site 15 % above its capacity")

	// An old results file names the busy site in hot_site only.
	require.Equal(t, []int{3}, wqWorkload{Hot: 3}.BusySites())

	for _, busy := range []int{0, 5} {
		_, err := newWQWorkload(SitesWQBalanced, five, 2, busy, service, time.Second)
		require.ErrorContains(t, err, "busy sites", busy)
	}
}

func TestSitesWQArrivalsArePoissonAndReproducible(t *testing.T) {
	w, err := newWQWorkload(SitesWQLocal, testSites, 2, 1, 100*time.Millisecond, 60*time.Second)
	require.NoError(t, err)
	a := w.Arrivals(7)
	require.Equal(t, a, w.Arrivals(7), "same seed, same arrivals")
	require.NotEqual(t, a, w.Arrivals(8))
	perSite := make([]int, len(testSites))
	for i, x := range a {
		require.Equal(t, i, x.Seq)
		require.Less(t, x.At, w.Duration)
		if i > 0 {
			require.GreaterOrEqual(t, x.At, a[i-1].At)
		}
		perSite[x.Site]++
	}
	for i, n := range perSite {
		want := w.Rates[i] * 60
		require.InDelta(t, want, float64(n), 4*math.Sqrt(want), "site %d: Poisson count within 4 σ", i)
	}
}

func TestSitesPSWorkloadShape(t *testing.T) {
	for _, sc := range []string{SitesPSB, SitesPSP, SitesPSS} {
		w, err := newPSWorkload(sc, testSites, 3, 5*time.Second, 10)
		require.NoError(t, err, sc)
		require.Len(t, w.Topics, psExchanges)
		require.Len(t, w.Phases, 1)
		require.Equal(t, 5*time.Second, w.Duration())
		inst := w.InstanceSites()
		clients, hot := 0, 0
		prods, subs := map[int]int{}, map[int]int{}
		for _, c := range w.Subscribers {
			subs[c.Exchange]++
			clients++
			if c.Site == w.Hot {
				hot++
			}
		}
		for _, c := range w.Producers {
			prods[c.Exchange]++
			clients++
			if c.Site == w.Hot {
				hot++
			}
		}
		for i := range w.Topics {
			require.GreaterOrEqual(t, len(inst[i]), 2, "%s: exchange %d on at least 2 sites", sc, i)
			require.Contains(t, inst[i], w.Hot)
			require.Positive(t, prods[i], "%s: exchange %d has a producer", sc, i)
			require.Positive(t, subs[i], "%s: exchange %d has a subscriber", sc, i)
			switch sc {
			case SitesPSP:
				require.Greater(t, prods[i], subs[i]-1, "%s: producer-heavy", sc)
			case SitesPSS:
				require.Greater(t, subs[i], prods[i]-1, "%s: subscriber-heavy", sc)
			}
		}
		share := float64(hot) / float64(clients)
		require.InDelta(t, psHotShare, share, 0.08, "%s: 70 %% of the clients at the busy site", sc)
		w2, err := newPSWorkload(sc, testSites, 3, 5*time.Second, 10)
		require.NoError(t, err)
		require.Equal(t, w, w2, "deterministic")
	}
	var total, producer int
	for _, sc := range []string{SitesPSP, SitesPSS} {
		w, _ := newPSWorkload(sc, testSites, 3, time.Second, 10)
		total += len(w.Producers) + len(w.Subscribers)
		if sc == SitesPSP {
			producer = len(w.Producers)
		} else {
			require.Less(t, len(w.Producers), producer, "S has fewer producers than P")
		}
	}
	require.Positive(t, total)
}

func TestSitesPSDynamicPhases(t *testing.T) {
	w, err := newPSWorkload(SitesPSDynamic, testSites, 1, 4*time.Second, 10)
	require.NoError(t, err)
	require.Len(t, w.Phases, len(psKinds))
	require.Equal(t, 24*time.Second, w.Duration())
	counts := map[string][]int{}
	for j, ph := range w.Phases {
		require.Equal(t, psKinds[j], ph.Kind)
		require.Equal(t, time.Duration(j)*4*time.Second, ph.Start)
		counts[ph.Kind] = append(counts[ph.Kind], len(ph.Producers))
	}
	require.Greater(t, counts["P"][0], counts["B"][0])
	require.Greater(t, counts["B"][0], counts["S"][0])
	// Producers publish only during their phase.
	inPhase := map[int]psPhase{}
	for _, ph := range w.Phases {
		for _, p := range ph.Producers {
			inPhase[p] = ph
		}
	}
	arr := w.Arrivals(1)
	require.NotEmpty(t, arr)
	for _, a := range arr {
		ph := inPhase[a.Producer]
		require.GreaterOrEqual(t, a.At, ph.Start)
		require.Less(t, a.At, ph.Start+ph.Duration)
	}
	// Where publications come from moves: the placement of some exchange
	// differs between two phases.
	delays := delayMatrix(testSites, rabbitharness.CityDelay)
	plans := map[string]bool{}
	for j := range w.Phases {
		res, err := placement.Improved(w.placementInput(w.ExpectedTraffic([]int{j}), delays, nil, 0, 1))
		require.NoError(t, err)
		plans[formatPlan(res.Plan)] = true
	}
	require.Greater(t, len(plans), 1, "the phases ask for different plans")
}

func TestSitesFederationLayouts(t *testing.T) {
	w, err := newPSWorkload(SitesPSB, testSites, 5, time.Second, 10)
	require.NoError(t, err)
	inst := w.InstanceSites()
	mesh := w.meshLayout()
	star := w.syncLayout(w.starPlan("berlin"))
	random := w.syncLayout(w.randomPlan(9))
	meshLinks, syncBound, starBound := 0, 0, 0
	for _, sites := range inst {
		n := len(sites)
		meshLinks += n * (n - 1)
		syncBound += 2 * (n - 1)
		starBound += 2 * n
	}
	require.Equal(t, meshLinks, mesh.Links())
	require.Equal(t, syncBound, random.Links(), "a sync site among the instances: 2·(N−1) links")
	require.LessOrEqual(t, star.Links(), starBound)
	require.GreaterOrEqual(t, star.Links(), syncBound)
	// In a sync layout every non-sync instance federates only from the
	// sync site, and the sync site from every other instance.
	plan := w.randomPlan(9)
	for i, sites := range inst {
		x := w.Exchange(i)
		sync := plan[x]
		require.Contains(t, sites, indexOf(testSites, sync), "random sync site holds an instance")
		for _, s := range sites {
			f := findFederation(random[testSites[s]], x)
			require.NotNil(t, f, "%s federated at %s", x, testSites[s])
			if testSites[s] == sync {
				require.Len(t, f.Upstreams, len(sites)-1)
				require.NotContains(t, f.Upstreams, sync)
			} else {
				require.Equal(t, []string{sync}, f.Upstreams)
			}
		}
	}
}

func indexOf(xs []string, x string) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return -1
}

func findFederation(fs []siteFederation, x string) *siteFederation {
	for i := range fs {
		if fs[i].Exchange == x {
			return &fs[i]
		}
	}
	return nil
}

func TestSitesMsgIDAndPayload(t *testing.T) {
	id := sitesMsgID(false, 37, 123456)
	require.Equal(t, 37, sitesMsgClient(id))
	require.Zero(t, id&probeBit)
	p := sitesMsgID(true, 5, 1)
	require.NotZero(t, p&probeBit)
	require.Equal(t, 5, sitesMsgClient(p))
	now := time.Unix(1700000000, 123456789)
	b := encodeSitesPayload(id, now)
	require.Len(t, b, sitesPayloadBytes)
	got, sent, ok := decodeSitesPayload(b)
	require.True(t, ok)
	require.Equal(t, id, got)
	require.True(t, sent.Equal(now))
	_, _, ok = decodeSitesPayload(b[:10])
	require.False(t, ok)
}

func TestSitesSummariseAndQuantiles(t *testing.T) {
	var v []float64
	for i := 100; i >= 1; i-- {
		v = append(v, float64(i))
	}
	s := summariseSites(v)
	require.Equal(t, 100, s.Count)
	require.InDelta(t, 50.5, s.Mean, 1e-9)
	require.Equal(t, 50.0, s.P50)
	require.Equal(t, 75.0, s.P75)
	require.Equal(t, 99.0, s.P99)
	require.Equal(t, 100.0, s.Max)
	q := quantiles(v)
	require.Len(t, q, 101)
	require.Equal(t, 1.0, q[0])
	require.Equal(t, 50.0, q[50])
	require.Equal(t, 100.0, q[100])
	empty := summariseSites(nil)
	require.True(t, math.IsNaN(empty.Mean))
	require.Equal(t, -1.0, empty.finite().P75)
	require.True(t, math.IsNaN(empty.finite().unfinite().P75))
	require.Nil(t, quantiles(nil))
}

func TestSitesAnalysePubSub(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	// Receivers 0 (site 0) and 1 (site 1); message 1 from site 0 owed to
	// both, message 2 from site 1 owed to receiver 1 only.
	owed := map[uint64]sitesExpectation{1: {Origin: 0, Receivers: []int{0, 1}, Sent: at(0)}, 2: {Origin: 1, Receivers: []int{1}, Sent: at(600)}}
	rs := []receipt{
		{ID: 1, Receiver: 0, Sent: at(0), At: at(1)},
		{ID: 1, Receiver: 1, Sent: at(0), At: at(50)},
		{ID: 1, Receiver: 1, Sent: at(0), At: at(60)},    // duplicate
		{ID: 2, Receiver: 0, Sent: at(600), At: at(601)}, // not owed to receiver 0
		{ID: 9, Receiver: 1, Sent: at(0), At: at(5)},     // failed publish that arrived
	}
	a := analyseSites(owed, rs, []int{0, 1}, start, 500*time.Millisecond)
	require.Equal(t, 2, a.Published)
	require.Equal(t, 3, a.Expected)
	require.Equal(t, 2, a.Delivered)
	require.Equal(t, 1, a.Lost, "message 2 never reached receiver 1")
	require.Equal(t, map[int]int{1: 1}, a.LostByOrigin)
	require.Equal(t, []time.Duration{600 * time.Millisecond}, a.LostSent)
	require.Equal(t, 1, a.Duplicated)
	require.Equal(t, 2, a.Unexpected)
	require.Equal(t, 1, a.Remote)
	require.InDelta(t, 25.5, a.Latency.Mean, 1e-9)
	require.InDelta(t, 50, a.RemoteLatency.Mean, 1e-9)
	require.InDelta(t, 1, a.LocalLatency.Mean, 1e-9)
	require.Len(t, a.OverTime, 1)
	require.Equal(t, 0.5, a.OverTime[0].T)
	require.Equal(t, 2, a.OverTime[0].Count)
}

func TestSitesAnalyseWorkQueue(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	owed := map[uint64]sitesExpectation{1: {Origin: 0}, 2: {Origin: 0}, 3: {Origin: 1}}
	rs := []receipt{
		{ID: 1, Receiver: 0, Sent: at(0), At: at(10)},
		{ID: 2, Receiver: 1, Sent: at(0), At: at(100)}, // processed at the other site
		{ID: 2, Receiver: 0, Sent: at(0), At: at(300)}, // processed twice
	}
	a := analyseSites(owed, rs, []int{0, 1}, start, time.Second)
	require.Equal(t, 3, a.Expected)
	require.Equal(t, 2, a.Delivered)
	require.Equal(t, 1, a.Lost)
	require.Equal(t, 1, a.Duplicated)
	require.Equal(t, 1, a.Remote)
	require.InDelta(t, 55, a.Latency.Mean, 1e-9, "duplicates do not count in latency")
	require.Len(t, a.Routes, 2, "duplicates do not count in routes")
	require.Equal(t, routeSum{n: 1, sum: 10}, *a.Routes[[2]int{0, 0}])
	require.Equal(t, routeSum{n: 1, sum: 100}, *a.Routes[[2]int{0, 1}])
}

func TestFormatRoutes(t *testing.T) {
	got := formatRoutes([]SitesRoute{
		{From: "berlin", To: "berlin", Count: 3, MeanMs: 5},
		{From: "tunis", To: "tunis", Count: 10, MeanMs: 40},
		{From: "tunis", To: "berlin", Count: 4, MeanMs: 60.5},
	})
	require.Equal(t, "tunis → tunis 10 (40.0), tunis → berlin 4 (60.5), berlin → berlin 3 (5.00)", got, "busiest origin first, each origin's routes in the order given")
}

func TestSitesSteadyAndSpike(t *testing.T) {
	var pts []latencyPoint
	for i := range 100 {
		pts = append(pts, latencyPoint{Sent: time.Duration(i) * 100 * time.Millisecond, Latency: 50})
	}
	pts[31].Latency = 900 // right after the change at 3 s
	steady, spike, near := steadyAndSpike(pts, []time.Duration{3 * time.Second}, time.Second)
	require.Equal(t, 50.0, steady)
	require.Equal(t, 900.0, spike)
	require.Equal(t, 12, near, "a quarter period before (2.75 s) to a period after (4 s)")
	_, spike, near = steadyAndSpike(pts, nil, time.Second)
	require.True(t, math.IsNaN(spike))
	require.Zero(t, near)
}

func TestSitesConfigValidation(t *testing.T) {
	c := DefaultSitesConfig()
	require.Error(t, c.validate(), "no --out")
	c.Out = t.TempDir()
	require.NoError(t, c.validate())
	for _, bad := range []func(*SitesConfig){
		func(c *SitesConfig) { c.Sites = []string{"berlin"} },
		func(c *SitesConfig) { c.Sites = []string{"berlin", "berlin"} },
		func(c *SitesConfig) { c.Scenarios = []string{"ps-X"} },
		func(c *SitesConfig) { c.Architectures = []string{"mesh"} },
		func(c *SitesConfig) { c.ServiceTime = time.Millisecond },
		func(c *SitesConfig) { c.ProducerRate = 0 },
		func(c *SitesConfig) { c.PhaseDuration = 0 },
		func(c *SitesConfig) { c.ReconfigPeriod = 0 },
		func(c *SitesConfig) { c.BusySites = 0 },
		func(c *SitesConfig) { c.BusySites = len(c.Sites) },
	} {
		cc := c
		bad(&cc)
		require.Error(t, cc.validate())
	}
	require.Contains(t, c.TimeScale(), "10× down")
	require.Contains(t, c.TimeScale(), "100ms per message instead of 1 s")
	require.Contains(t, c.TimeScale(), "10 msg/s instead of 1")
	thesis := c
	thesis.ServiceTime, thesis.ProducerRate = time.Second, 1
	require.Contains(t, thesis.TimeScale(), "at the thesis's own time scale: consumers take 1s per message, producers send 1 msg/s")
	require.NotContains(t, thesis.TimeScale(), "down from the thesis")
	require.Equal(t, []string{ArchLuffyMQ, ArchCloud}, SitesConfig{Architectures: []string{ArchCloud, ArchLuffyMQ}}.sitesRunsFor(SitesPSB))
	// luffymq-nearest runs only when named (it is luffymq's default now),
	// for binaries older than that.
	require.NotContains(t, SitesConfig{}.sitesRunsFor(SitesWQBalanced), ArchLuffyMQNearest)
	require.Equal(t, []string{ArchQueueFederation, ArchLuffyMQNearest}, SitesConfig{Architectures: []string{ArchLuffyMQNearest, ArchQueueFederation}}.sitesRunsFor(SitesWQBalanced))
	cfg := DefaultSitesConfig()
	cfg.Out, cfg.Architectures = t.TempDir(), []string{ArchLuffyMQNearest, ArchQueueFederation}
	require.NoError(t, cfg.validate())
	cfg.Architectures = []string{"luffymq-closest"}
	require.ErrorContains(t, cfg.validate(), `unknown architecture "luffymq-closest"`)

	// luffymq's work-queue constants: the TTL divided by the time scale,
	// counts and the retune interval kept; stated in the time scale and
	// the notes.
	wq := c.ScaledWQ()
	require.Equal(t, 50*time.Millisecond, wq.WQTTLPerMember)
	require.Equal(t, time.Second, wq.WQRetuneInterval)
	require.Equal(t, 3000, wq.WQMaxLengthPerMember)
	require.Equal(t, 2, wq.WQUnackedPerMember)
	require.Equal(t, []string{"--wq-ttl-per-member", "50ms", "--wq-max-length-per-member", "3000", "--wq-unacked-per-member", "2", "--wq-retune-interval", "1s"}, c.luffyMQWQFlags())
	require.Contains(t, c.TimeScale(), "wq TTL per member 50 ms at 10× scale (default 500 ms), retune interval 1 s (default 1 s), max length 3000 and unacked 2 per member")
	require.Contains(t, wqNote(c), "--wq-ttl-per-member 50ms")
	require.Contains(t, wqNote(c), "The retune interval stays the default 1 s")
	slow := c
	slow.ServiceTime = time.Second
	require.Equal(t, 500*time.Millisecond, slow.ScaledWQ().WQTTLPerMember, "the thesis's time: the defaults")
	require.Equal(t, time.Second, slow.ScaledWQ().WQRetuneInterval)
	fast := c
	fast.ServiceTime = 10 * time.Millisecond
	require.Equal(t, 5*time.Millisecond, fast.ScaledWQ().WQTTLPerMember)
	given := c
	given.WQTTLPerMember, given.WQUnackedPerMember, given.WQRetuneInterval = 80*time.Millisecond, 1, 100*time.Millisecond
	require.Equal(t, []string{"--wq-ttl-per-member", "80ms", "--wq-max-length-per-member", "3000", "--wq-unacked-per-member", "1", "--wq-retune-interval", "100ms"}, given.luffyMQWQFlags())
	require.Contains(t, wqNote(given), "retuned every 100 ms (the default is 1 s)")
	for _, bad := range []func(*SitesConfig){
		func(c *SitesConfig) { c.WQTTLPerMember = 500 * time.Microsecond },
		func(c *SitesConfig) { c.WQRetuneInterval = 5 * time.Millisecond },
		func(c *SitesConfig) { c.WQMaxLengthPerMember = -1 },
		func(c *SitesConfig) { c.WQUnackedPerMember = -1 },
		func(c *SitesConfig) { c.WQStateInterval = time.Millisecond },
		func(c *SitesConfig) { c.WQStateInterval = -time.Second },
	} {
		cc := c
		bad(&cc)
		require.ErrorContains(t, cc.validate(), "--wq-")
	}

	// The members' acknowledgement interval: 1 ms unless set, stated in
	// the notes.
	require.Contains(t, strings.Join(sitesNotes(c), "\n"), "sending their acknowledgements every 1ms (paho's SendAcksInterval; its default is 50ms)")
	paho := c
	paho.MemberAckInterval = PahoDefaultAckInterval
	require.NoError(t, paho.validate())
	require.Contains(t, strings.Join(sitesNotes(paho), "\n"), "sending their acknowledgements every 50ms")
	require.Equal(t, time.Millisecond, SitesConfig{}.memberAckInterval(), "results written before it could be set used 1 ms")
	paho.MemberAckInterval = -time.Millisecond
	require.ErrorContains(t, paho.validate(), "--member-ack-interval -1ms")
}

// sitesFixture is a small, hand-made result set.
func sitesFixture() *SitesResults {
	c := DefaultSitesConfig()
	c.Sites = []string{"berlin", "tunis"}
	lat := func(mean, p50 float64) SitesLatency {
		return SitesLatency{Count: 10, Mean: mean, P50: p50, P75: p50 * 1.5, P99: mean * 3, Max: mean * 4}
	}
	q := make([]float64, 101)
	for i := range q {
		q[i] = float64(i + 1)
	}
	ps, err := newPSWorkload(SitesPSB, c.Sites, 1, time.Second, 10)
	if err != nil {
		panic(err)
	}
	wq, err := newWQWorkload(SitesWQBalanced, append(slices.Clone(c.Sites), "montreal"), 2, 1, 100*time.Millisecond, time.Second)
	if err != nil {
		panic(err)
	}
	overlay := []SiteOverlay{{Site: "berlin", MessagesOut: 10, BytesOut: 4096, BytesIn: 2048}, {Site: "tunis", MessagesOut: 5, BytesOut: 2048, BytesIn: 4096}}
	res := &SitesResults{Generated: time.Unix(1700000000, 0).UTC(), Config: c, TimeScale: c.TimeScale(), RabbitMQ: "3.10.8",
		DelaysMs: map[string]map[string]float64{"berlin": {"berlin": 0, "tunis": 22}, "tunis": {"berlin": 22, "tunis": 0}},
		Notes:    []string{"a note"}, Workloads: []SitesWorkload{{Scenario: SitesPSB, PS: &ps}, {Scenario: SitesWQBalanced, WQ: &wq}}}
	res.Runs = []SitesRun{
		{Scenario: SitesWQBalanced, Architecture: ArchLuffyMQ, Published: 10, Expected: 10, Delivered: 10, Remote: 4, Latency: lat(20, 5), RemoteLatency: lat(40, 30), LocalLatency: lat(5, 2), Quantiles: q, Overlay: overlay},
		{Scenario: SitesWQBalanced, Architecture: ArchQueueFederation, Published: 10, Expected: 10, Delivered: 10, FederationLinks: 2, Latency: lat(100, 50), Quantiles: q, Overlay: overlay},
		{Scenario: SitesPSB, Architecture: ArchLuffyMQ, FederationLinks: 2, Published: 10, Expected: 20, Delivered: 19, Lost: 1, Latency: lat(30, 22), Quantiles: q, Overlay: overlay, Plan: map[string]string{"pubsub.t0": "tunis"}},
		{Scenario: SitesPSB, Architecture: ArchFullMesh, FederationLinks: 2, Published: 10, Expected: 20, Delivered: 20, Latency: lat(28, 22), Quantiles: q, Overlay: overlay},
		{Scenario: SitesPSB, Architecture: ArchStar, Error: "it broke\nbadly", Latency: summariseSites(nil)},
	}
	return res
}

func TestSitesSummaryRendering(t *testing.T) {
	res := sitesFixture()
	md := sitesMarkdown(res, t.TempDir())
	for _, want := range []string{
		"# Across sites: scenario set C",
		"**2 sites** (berlin, tunis)",
		"| berlin | — | 22 |",
		"- a note",
		"## wq-balanced", "## ps-B",
		"Ratios are against **queue-federation**", "Ratios are against **fullmesh**",
		"| luffymq | 0 | 10 | 10 | 0 | 0 | 4 | 20.0 | 5.00 | 7.50 | 60.0 | 80.0 | 0.20× | 0.10× | 0.20× | 15 | 6 / 6 |",
		"| luffymq | 2 | 10 | 20 | **1** | 0 | 0 | 30.0 | 22.0 |",
		"1.07×",
		"| star | — |",
		"**error**: it broke.",
		"sync sites pubsub.t0 → tunis",
		"all from the busy site tunis, cannot be processed where published",
		"70 % of the clients at tunis",
		"processed away from the publishing site: 4 (mean 40.0 ms, local mean 5.00 ms)",
		"| wq-balanced: mean ≤ 25 % and median ≤ 20 % of queue-federation full mesh | mean 20.0 %, median 10.0 % | yes |",
		"| wq-local: mean ≤ 50 % of queue-federation full mesh | not measured | — |",
		"| reconfig: 0 lost, held messages ≤ 2 s above steady state (with conservation) | not measured | — |",
	} {
		require.Contains(t, md, want)
	}
	// ps-B: luffymq is within 1.15× of the full mesh but star did not run.
	require.Regexp(t, `ps-B: mean ≤ 1\.15×.*\| mean 1\.07× of full mesh; links 2 \(bound \d+; full mesh 2\) \| yes \|`, md)
}

func TestSitesReportFilesRoundTrip(t *testing.T) {
	dir := t.TempDir()
	res := sitesFixture()
	require.NoError(t, harness.WriteJSON(filepath.Join(dir, "sites.json"), res.finite()))
	require.NoError(t, WriteSitesSummary(dir))
	for _, f := range []string{"summary.md", "sites-ps-B-latency.png", "sites-ps-B-overlay.png", "sites-wq-balanced-latency.png", "sites-wq-balanced-overlay.png"} {
		info, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, f)
		require.Positive(t, info.Size(), f)
	}
	md, err := os.ReadFile(filepath.Join(dir, "summary.md"))
	require.NoError(t, err)
	require.True(t, strings.Contains(string(md), "![ps-B: latency distribution per architecture](sites-ps-B-latency.png)"))
	require.Contains(t, string(md), "| star | — |", "a failed run's NaNs survive the JSON round trip")
}

func TestSitesControllerSitesFileParses(t *testing.T) {
	sites := []string{"berlin", "tunis", "tokyo"}
	y, err := controllerSitesYAML(sites,
		func(s string) (string, string) {
			return "amqp://guest:guest@127.0.0.1:5672/%2F", "http://127.0.0.1:15672"
		},
		func(from, to string) (string, error) {
			return "amqp://" + from + "-to-" + to + ":pw@127.0.0.1:5672/%2F", nil
		},
		rabbitharness.CityDelay)
	require.NoError(t, err)
	parsed, err := controller.ParseSites("sites.yaml", []byte(y))
	require.NoError(t, err, y)
	require.Len(t, parsed.Sites, 3)
	require.Equal(t, "tunis", parsed.Sites[1].Name)
	require.Equal(t, "amqp://tunis-to-tokyo:pw@127.0.0.1:5672/%2F", parsed.Sites[1].UpstreamURLs["tokyo"])
	d, ok := parsed.Delays.Between("tokyo", "tunis")
	require.True(t, ok)
	require.Equal(t, 120*time.Millisecond, d)
}

func TestSitesLuffyMQFlagDetection(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "fake-luffymq")
	help := "Usage: luffymq [flags]\n  -federation-discard-held\n    \twhen ...\n  -federation-max-hops-other int\n  -site string\n"
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\ncat <<'X'\n"+help+"X\n"), 0o755))
	have := luffyMQFlags(bin, flagDiscardHeld, flagMaxHops, "--site")
	require.Equal(t, map[string]bool{flagDiscardHeld: true, flagMaxHops: false, "--site": true}, have)
	err := errReconfigUnsupported(bin)
	require.ErrorContains(t, err, flagMaxHops)
	require.NotContains(t, err.Error(), flagDiscardHeld)
}

// TestSitesLuffyMQWQFlagsRequired: a luffymq binary without the --wq-*
// flags is refused before anything starts.
func TestSitesLuffyMQWQFlagsRequired(t *testing.T) {
	dir := t.TempDir()
	fake := func(name, help string) string {
		bin := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\ncat <<'X'\n"+help+"X\n"), 0o755))
		return bin
	}
	old := fake("old-luffymq", "Usage: luffymq [flags]\n  -site string\n  -wq-ttl-per-member duration\n")
	err := errWQFlagsUnsupported(old)
	require.ErrorContains(t, err, "--wq-max-length-per-member, --wq-retune-interval, --wq-route, --wq-ttl-overflow-only, --wq-unacked-per-member")
	require.NotContains(t, err.Error(), "--wq-ttl-per-member,")
	current := fake("luffymq", "  -wq-max-length-per-member int\n  -wq-retune-interval duration\n  -wq-route string\n  -wq-ttl-overflow-only\n  -wq-ttl-per-member duration\n  -wq-unacked-per-member int\n")
	require.NoError(t, errWQFlagsUnsupported(current))
}

func TestSitesDescribeTimes(t *testing.T) {
	s := time.Second
	require.Equal(t, "1.0–1.4 s (3), 5.0 s (1)", describeTimes([]time.Duration{s, s + 200*time.Millisecond, s + 400*time.Millisecond, 5 * s}))
	var many []time.Duration
	for i := range 10 {
		many = append(many, time.Duration(i)*s)
	}
	require.Contains(t, describeTimes(many), "and 2 more stretches")
}
