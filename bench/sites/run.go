package sites

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/luffymq/luffymq/bench/internal/harness"
	"github.com/luffymq/luffymq/bridge"
	"github.com/luffymq/luffymq/bridge/placement"
	"github.com/luffymq/luffymq/internal/timeutil"
)

// sitesRunner runs set C on one sitesEnv.
type sitesRunner struct {
	cfg      SitesConfig
	env      *sitesEnv
	delays   placement.Delays
	progress io.Writer
}

// teardown stops what a run started: the clients all at once, then the
// rest in reverse order.
type teardown struct {
	clients []func()
	serial  []func()
}

// client registers a client's Close.
func (t *teardown) client(f func()) { t.clients = append(t.clients, f) }

// add registers a cleanup run after the clients', in reverse order.
func (t *teardown) add(f func()) { t.serial = append(t.serial, f) }

func (t *teardown) run() {
	var wg sync.WaitGroup
	for _, f := range t.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f()
		}()
	}
	wg.Wait()
	for i := len(t.serial) - 1; i >= 0; i-- {
		t.serial[i]()
	}
	t.clients, t.serial = nil, nil
}

// dialer opens a run's clients concurrently: a client across a WAN link
// takes several round trips to connect.
type dialer struct {
	jobs []func() (closer func(), err error)
	// receiverSite is the site of each receiver added, by index.
	receiverSite []int
}

// addReceiver queues the dial of the run's next receiver, at site, and
// returns its index.
func (d *dialer) addReceiver(site int, dial func(index int) (sitesReceiver, error)) int {
	idx := len(d.receiverSite)
	d.receiverSite = append(d.receiverSite, site)
	d.add(func() (func(), error) {
		rc, err := dial(idx)
		if err != nil {
			return nil, err
		}
		return rc.Close, nil
	})
	return idx
}

// addPublisher queues the dial of publisher i, kept in pubs[i].
func (d *dialer) addPublisher(pubs []sitesPublisher, i int, dial func() (sitesPublisher, error)) {
	d.add(func() (func(), error) {
		p, err := dial()
		if err != nil {
			return nil, err
		}
		pubs[i] = p
		return p.Close, nil
	})
}

// add queues a dial that returns the client's Close.
func (d *dialer) add(job func() (func(), error)) { d.jobs = append(d.jobs, job) }

// dialConcurrency bounds the dials in progress.
const dialConcurrency = 16

// run dials everything queued, registers every client that connected with
// td and returns the errors.
func (d *dialer) run(td *teardown) error {
	closers := make([]func(), len(d.jobs))
	errs := make([]error, len(d.jobs))
	sem := make(chan struct{}, dialConcurrency)
	var wg sync.WaitGroup
	for i, job := range d.jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			closers[i], errs[i] = job()
		}()
	}
	wg.Wait()
	for _, c := range closers {
		if c != nil {
			td.client(c)
		}
	}
	d.jobs = nil
	return errors.Join(errs...)
}

// run measures one architecture on one scenario; failures are recorded in
// the run's Error.
func (r *sitesRunner) run(ctx context.Context, scenario, arch string) SitesRun {
	began := time.Now()
	run := SitesRun{Scenario: scenario, Architecture: arch}
	err := r.env.reset(ctx)
	run.ResetSeconds = time.Since(began).Seconds()
	if err == nil {
		if isWorkQueue(scenario) {
			var w wqWorkload
			if w, err = newWQWorkload(scenario, r.cfg.Sites, r.cfg.ConsumersPerSite, r.cfg.BusySites, r.cfg.ServiceTime, r.cfg.WQDuration); err == nil {
				err = r.runWQ(ctx, &run, w)
			}
		} else {
			var w psWorkload
			if w, err = r.psWorkload(scenario); err == nil {
				err = r.runPS(ctx, &run, w)
			}
		}
	}
	if err != nil {
		run.Error = err.Error()
	}
	run.WallSeconds = time.Since(began).Seconds()
	return run
}

// psWorkload builds a pub/sub scenario with the configured sizes.
func (r *sitesRunner) psWorkload(scenario string) (psWorkload, error) {
	phase := r.cfg.PSDuration
	if scenario == SitesPSDynamic || scenario == SitesReconfig {
		phase = r.cfg.PhaseDuration
	}
	return newPSWorkload(scenario, r.cfg.Sites, r.cfg.Seed, phase, r.cfg.ProducerRate)
}

// logName names a run's log files.
func logName(run *SitesRun) string { return "sites-" + run.Scenario + "-" + run.Architecture }

// measurement is what the publishing and draining of a run produced.
type measurement struct {
	start     time.Time
	owed      map[uint64]sitesExpectation
	failed    int
	lastErr   error
	maxLag    time.Duration
	receipts  []receipt
	overlayN  map[string]int64
	wanBytes  map[string]siteBytes
	drainNote string
	// queuedAtEnd is the work-queue backlog when the drain ended.
	queuedAtEnd int
}

// publishAll publishes arrivals on schedule through pub and waits for the
// broker's answers, then for the receivers: until expected(owed) receipts
// arrived, nothing arrived for quiet, or the drain timeout. during, when
// set, starts with the publisher (given the start time) and is stopped
// when the last message is sent. backlog, when set, counts messages still
// queued for the receivers: while it is above zero a quiet spell does not
// end the drain.
func (r *sitesRunner) publishAll(ctx context.Context, quiet time.Duration, n int, at func(i int) time.Duration, pub func(i int) (sitesPublisher, uint64, sitesExpectation),
	ledger *publishLedger, rec *sitesRecorder, expected func(map[uint64]sitesExpectation) int, during func(start time.Time) func(), backlog func(context.Context) int) measurement {
	m := measurement{}
	sampler := r.env.startOverlaySampler(ctx)
	bytes0 := r.env.wanBytes()
	pending := map[uint64]sitesExpectation{}
	m.start = time.Now()
	stopDuring := func() {}
	if during != nil {
		stopDuring = during(m.start)
	}
	for i := range n {
		due := m.start.Add(at(i))
		if d := time.Until(due); d > 0 && !timeutil.Sleep(ctx, d) {
			break
		}
		m.maxLag = max(m.maxLag, time.Since(due))
		p, id, exp := pub(i)
		exp.Sent = time.Now()
		pending[id] = exp
		p.Publish(ctx, id)
	}
	stopDuring()
	if !ledger.wait(30 * time.Second) {
		m.drainNote = "some publishes were still unanswered 30 s after the last one"
	}
	accepted, failed, lastErr := ledger.result()
	m.failed, m.lastErr = failed, lastErr
	m.owed = map[uint64]sitesExpectation{}
	for id, exp := range pending {
		if accepted[id] {
			m.owed[id] = exp
		}
	}
	want := expected(m.owed)
	deadline := time.Now().Add(r.cfg.DrainTimeout)
	for ctx.Err() == nil {
		got, last := rec.progress()
		if got >= want {
			timeutil.Sleep(ctx, 500*time.Millisecond) // late duplicates
			break
		}
		if time.Since(last) > quiet && time.Since(m.start.Add(at(max(n-1, 0)))) > quiet {
			if backlog == nil {
				break
			}
			if m.queuedAtEnd = backlog(ctx); m.queuedAtEnd == 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			m.drainNote = harness.JoinErr(m.drainNote, fmt.Sprintf("drain timed out after %s", r.cfg.DrainTimeout))
			if backlog != nil {
				m.queuedAtEnd = backlog(ctx)
			}
			break
		}
		timeutil.Sleep(ctx, 50*time.Millisecond)
	}
	m.receipts = rec.snapshot()
	m.overlayN = sampler.Stop(ctx)
	bytes1 := r.env.wanBytes()
	m.wanBytes = map[string]siteBytes{}
	for _, s := range r.cfg.Sites {
		m.wanBytes[s] = siteBytes{Out: bytes1[s].Out - bytes0[s].Out, In: bytes1[s].In - bytes0[s].In}
	}
	return m
}

// fill copies a measurement's analysis into run.
func (r *sitesRunner) fill(run *SitesRun, m measurement, receiverSite []int, cloudCentral int) {
	a := analyseSites(m.owed, m.receipts, receiverSite, m.start, r.cfg.Window)
	run.Published, run.PublishFailed = a.Published, m.failed
	if m.lastErr != nil {
		run.Notes = append(run.Notes, "last publish error: "+m.lastErr.Error())
	}
	if m.drainNote != "" {
		run.Notes = append(run.Notes, m.drainNote)
	}
	run.QueuedAtEnd = m.queuedAtEnd
	if m.queuedAtEnd > 0 {
		run.Notes = append(run.Notes, fmt.Sprintf("%d messages were still in the work queues' queues when the drain ended", m.queuedAtEnd))
	}
	run.Expected, run.Delivered, run.Lost, run.Duplicated, run.Unexpected, run.Remote = a.Expected, a.Delivered, a.Lost, a.Duplicated, a.Unexpected, a.Remote
	run.Latency, run.LocalLatency, run.RemoteLatency = a.Latency, a.LocalLatency, a.RemoteLatency
	run.Quantiles, run.OverTime = a.Quantiles, a.OverTime
	for k, sum := range a.Routes {
		run.Routes = append(run.Routes, SitesRoute{From: r.cfg.Sites[k[0]], To: r.cfg.Sites[k[1]], Count: sum.n, MeanMs: sum.sum / float64(sum.n)})
	}
	slices.SortFunc(run.Routes, func(x, y SitesRoute) int { return cmp.Or(cmp.Compare(x.From, y.From), cmp.Compare(y.Count, x.Count)) })
	run.PublisherLagMaxMs = harness.Millis(m.maxLag)
	for origin, n := range a.LostByOrigin {
		run.Notes = append(run.Notes, fmt.Sprintf("lost %d of the deliveries of messages published at %s", n, r.cfg.Sites[origin]))
	}
	slices.Sort(run.Notes)
	if len(a.LostSent) > 0 {
		run.Notes = append(run.Notes, "lost messages were sent at "+describeTimes(a.LostSent))
	}
	// Overlay messages: federation deliveries, or for the cloud the
	// messages clients exchange with the central site over the WAN.
	msgsOut := m.overlayN
	if cloudCentral >= 0 {
		msgsOut = map[string]int64{}
		for _, exp := range m.owed {
			if exp.Origin != cloudCentral {
				msgsOut[r.cfg.Sites[exp.Origin]]++
			}
		}
		for _, rc := range m.receipts {
			if rc.Receiver < len(receiverSite) && receiverSite[rc.Receiver] != cloudCentral {
				msgsOut[r.cfg.Sites[cloudCentral]]++
			}
		}
	}
	run.Overlay = nil
	for _, s := range r.cfg.Sites {
		run.Overlay = append(run.Overlay, SiteOverlay{Site: s, MessagesOut: msgsOut[s], BytesOut: m.wanBytes[s].Out, BytesIn: m.wanBytes[s].In})
	}
	run.points = a.points
}

// describeTimes summarises sorted send times as runs of close instants:
// "3.1–3.4 s (12), 9.0 s (1)".
func describeTimes(ts []time.Duration) string {
	var parts []string
	for i := 0; i < len(ts); {
		j := i
		for j+1 < len(ts) && ts[j+1]-ts[j] < 500*time.Millisecond {
			j++
		}
		if j == i {
			parts = append(parts, fmt.Sprintf("%.1f s (1)", ts[i].Seconds()))
		} else {
			parts = append(parts, fmt.Sprintf("%.1f–%.1f s (%d)", ts[i].Seconds(), ts[j].Seconds(), j-i+1))
		}
		i = j + 1
	}
	if len(parts) > 8 {
		parts = append(parts[:8], fmt.Sprintf("and %d more stretches", len(parts)-8))
	}
	return strings.Join(parts, ", ")
}

// waitUntil polls cond every 200 ms until it holds or timeout passes.
func waitUntil(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not ready after %s", what, timeout)
		}
		if !timeutil.Sleep(ctx, 200*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// endSetup lets the warm-up settle, then records the run's running
// federation links and how long its setup took from began.
func (r *sitesRunner) endSetup(ctx context.Context, run *SitesRun, began time.Time) error {
	timeutil.Sleep(ctx, settleTime)
	links, _, err := r.env.runningLinks(ctx)
	if err != nil {
		return err
	}
	run.FederationLinks = links
	run.SetupSeconds = time.Since(began).Seconds()
	return nil
}

// drainQuiet ends the wait for the last messages of a run once none
// arrived for this long after publishing; reconfigDrainQuiet is longer,
// for messages held by a link removed at the end of a reconfig run and
// conserved after it.
const (
	drainQuiet         = 3 * time.Second
	reconfigDrainQuiet = 10 * time.Second
)

// settleTime separates the warm-up from the measurement, so that
// measuring does not start on the tail of the warm-up's bursts.
const settleTime = 500 * time.Millisecond

// probe makes every publisher send warm-up messages, one every 300 ms, until
// done(i) holds for each, so that measuring starts on a topology that
// carries messages end to end.
func probe(ctx context.Context, pubs []sitesPublisher, done func(i int) bool, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for seq := 0; ; seq++ {
		waiting := 0
		for i, p := range pubs {
			if !done(i) {
				waiting++
				p.Publish(ctx, sitesMsgID(true, i, seq))
			}
		}
		if waiting == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d publishers still not heard by every receiver after %s of warm-up", waiting, len(pubs), timeout)
		}
		if !timeutil.Sleep(ctx, 300*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// runWQ measures a work-queue scenario on one architecture.
func (r *sitesRunner) runWQ(ctx context.Context, run *SitesRun, w wqWorkload) error {
	var td teardown
	defer func() {
		t0 := time.Now()
		td.run()
		run.TeardownSeconds = time.Since(t0).Seconds()
	}()
	rec, ledger := newSitesRecorder(), newPublishLedger()
	n := len(w.Sites)
	central := 0
	queue := bridge.WorkQueueName(wqGroup)
	pubs := make([]sitesPublisher, n)
	var dl dialer
	addReceiver := func(site int, dial func(index int) (sitesReceiver, error)) { dl.addReceiver(site, dial) }
	addPublisher := func(i int, dial func() (sitesPublisher, error)) { dl.addPublisher(pubs, i, dial) }
	setupBegan := time.Now()
	cloud := -1
	var siteBrokers []*siteBroker // luffymq's, whose state traffic is counted
	switch run.Architecture {
	case ArchLuffyMQ, ArchLuffyMQRing, ArchLuffyMQNearest, ArchLuffyMQTTLOnly:
		share := "$share/" + wqGroup + "/" + wqGroup + "/#"
		brokers := make([]*siteBroker, n)
		siteBrokers = brokers
		args := []string{"--export-group", share}
		switch run.Architecture {
		case ArchLuffyMQTTLOnly:
			args = append(args, flagWQTTLOnly)
		case ArchLuffyMQRing:
			args = append(args, flagWQRoute, bridge.RouteRing)
		case ArchLuffyMQNearest:
			args = append(args, flagWQRoute, bridge.RouteNearest)
		}
		if run.Architecture != ArchLuffyMQRing && run.Architecture != ArchLuffyMQTTLOnly && r.cfg.WQStateInterval > 0 {
			args = append(args, flagWQStateInterval, r.cfg.WQStateInterval.String())
		}
		for i, s := range w.Sites {
			b, err := r.env.startSiteBroker(ctx, s, logName(run), args...)
			if err != nil {
				return err
			}
			td.add(func() { _ = b.Close() })
			brokers[i] = b
		}
		// The controller's configuration messages (algorithms.md §2.6):
		// each site's intake federates from every other site's
		// dead-letter exchange.
		configs := map[string]bridge.SiteConfig{}
		for _, s := range w.Sites {
			configs[s] = bridge.SiteConfig{}
			for _, o := range w.Sites {
				if o != s {
					uri, err := r.env.amqpURL(s, o)
					if err != nil {
						return err
					}
					configs[s][queue] = append(configs[s][queue], uri)
				}
			}
		}
		if err := r.env.sendConfigs(ctx, configs); err != nil {
			return err
		}
		for i, s := range w.Sites {
			for k := range w.Consumers[i] {
				addReceiver(i, func(idx int) (sitesReceiver, error) {
					return dialMQTTReceiver(ctx, brokers[i].Addr(), fmt.Sprintf("wq-%s-%d", s, k), share, idx, w.Service, r.cfg.memberAckInterval(), rec)
				})
			}
			addPublisher(i, func() (sitesPublisher, error) {
				return dialMQTTPublisher(ctx, brokers[i].Addr(), "producer-"+s, wqGroup+"/"+s, ledger)
			})
		}
		if err := dl.run(&td); err != nil {
			return err
		}
		dlx, to := bridge.DeadLetterExchangeName(wqGroup), bridge.RouteExchangeName(wqGroup)
		if err := waitUntil(ctx, 60*time.Second, "overflow federation (each site's "+dlx+" and "+to+" bound to every other site's)", func() bool {
			for _, s := range w.Sites {
				if r.env.federatedBindingCount(s, dlx) < n-1 || r.env.federatedBindingCount(s, to) < n-1 {
					return false
				}
			}
			return true
		}); err != nil {
			return err
		}
		if err := r.env.waitLinks(ctx, 2*n*(n-1), 60*time.Second); err != nil {
			return err
		}
		run.Clients = "MQTT v5 (paho.golang) to the site's luffymq: one QoS 1 producer per site, members of $share/jobs/jobs/# that acknowledge after processing; luffymq bridges to wq.jobs on the site's RabbitMQ; each publish is routed straight to the site whose members would start it soonest, one-way delay included (luffymq-ring: overflow into the consistent-hash exchange at publish when the local members would not start a message within the queue's TTL; luffymq-ttl-only: by TTL / max length); intake and route exchanges federated from every other site (configuration messages through luffymq.config.<site>)"
	case ArchQueueFederation:
		for _, s := range w.Sites {
			if err := declareAMQP(r.env.node(s).AMQPURL(), []string{queue}, nil); err != nil {
				return err
			}
		}
		if err := r.env.applyQueueMesh(ctx, queue); err != nil {
			return err
		}
		for i, s := range w.Sites {
			url := r.env.node(s).AMQPURL()
			for range w.Consumers[i] {
				addReceiver(i, func(idx int) (sitesReceiver, error) { return dialAMQPReceiver(url, "", queue, idx, w.Service, rec) })
			}
			addPublisher(i, func() (sitesPublisher, error) { return dialAMQPPublisher(url, "", queue, ledger) })
		}
		if err := dl.run(&td); err != nil {
			return err
		}
		if err := r.env.waitLinks(ctx, n*(n-1), 60*time.Second); err != nil {
			return err
		}
		run.Clients = "AMQP 0-9-1 (amqp091-go) to the site's own RabbitMQ: persistent messages with publisher confirms to wq.jobs, consumers with prefetch 1 acknowledging after processing; wq.jobs federated from every other site (queue federation, full mesh)"
	case ArchCloud, ArchCloudDist:
		cloud = central
		centralURL := r.env.node(w.Sites[central]).AMQPURL()
		if err := declareAMQP(centralURL, []string{queue}, nil); err != nil {
			return err
		}
		for i, s := range w.Sites {
			at := i
			if run.Architecture == ArchCloud {
				at = central
			}
			url, err := r.env.amqpURL(w.Sites[at], w.Sites[central])
			if err != nil {
				return err
			}
			for range w.Consumers[i] {
				addReceiver(at, func(idx int) (sitesReceiver, error) { return dialAMQPReceiver(url, "", queue, idx, w.Service, rec) })
			}
			purl, err := r.env.amqpURL(s, w.Sites[central])
			if err != nil {
				return err
			}
			addPublisher(i, func() (sitesPublisher, error) { return dialAMQPPublisher(purl, "", queue, ledger) })
		}
		if err := dl.run(&td); err != nil {
			return err
		}
		where := "all consumers at " + w.Sites[central]
		if run.Architecture == ArchCloudDist {
			where = "consumers at their own sites, connected to " + w.Sites[central] + " over the WAN link"
		}
		run.Clients = "AMQP 0-9-1 (amqp091-go) to one RabbitMQ at " + w.Sites[central] + ", producers over their WAN link (persistent, publisher confirms); " + where + "; prefetch 1, acknowledge after processing"
	default:
		return fmt.Errorf("architecture %s does not run work queues", run.Architecture)
	}
	if err := probe(ctx, pubs, rec.anyProbeFrom, 60*time.Second); err != nil {
		return err
	}
	if err := r.endSetup(ctx, run, setupBegan); err != nil {
		return err
	}

	var traffic0 map[string]stateTraffic
	if siteBrokers != nil {
		var err error
		if traffic0, err = stateTrafficOf(ctx, siteBrokers); err != nil {
			return err
		}
	}
	arrivals := w.Arrivals(r.cfg.Seed)
	m := r.publishAll(ctx, drainQuiet, len(arrivals), func(i int) time.Duration { return arrivals[i].At },
		func(i int) (sitesPublisher, uint64, sitesExpectation) {
			a := arrivals[i]
			return pubs[a.Site], sitesMsgID(false, a.Site, a.Seq), sitesExpectation{Origin: a.Site}
		}, ledger, rec, func(owed map[uint64]sitesExpectation) int { return len(owed) }, nil, r.env.workQueueBacklog)
	r.fill(run, m, dl.receiverSite, cloud)
	if siteBrokers != nil {
		traffic1, err := stateTrafficOf(ctx, siteBrokers)
		if err != nil {
			return err
		}
		run.StateFlows, run.StateReasons = map[string]int64{}, map[string]int64{}
		for site, t1 := range traffic1 {
			t0 := traffic0[site]
			run.StatesSent += t1.States - t0.States
			run.StateRequestsSent += t1.Requests - t0.Requests
			for to, n := range t1.StatesTo {
				if d := n - t0.StatesTo[to]; d > 0 {
					run.StateFlows[site+" → "+to] = d
				}
			}
			for why, n := range t1.StatesWhy {
				if d := n - t0.StatesWhy[why]; d > 0 {
					run.StateReasons[why] += d
				}
			}
		}
	}
	run.Oracle = r.wqOracleLatency(w, m)
	if r.cfg.Trace {
		if err := writeWQTrace(filepath.Join(r.cfg.Out, "trace-"+logName(run)+".csv"), w.Sites, m, dl.receiverSite); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// wqOracleLatency summarises wqOracle on the publishes of m, with w's
// consumers where the scenario puts them (at their own sites).
func (r *sitesRunner) wqOracleLatency(w wqWorkload, m measurement) *SitesLatency {
	msgs := make([]wqOracleMessage, 0, len(m.owed))
	for _, exp := range m.owed {
		msgs = append(msgs, wqOracleMessage{Origin: exp.Origin, Sent: exp.Sent.Sub(m.start)})
	}
	delay := func(o, s int) time.Duration {
		d, _ := r.delays.Between(w.Sites[o], w.Sites[s])
		return d
	}
	lat := wqOracle(msgs, w.Consumers, delay, w.Service)
	if len(lat) == 0 {
		return nil
	}
	sum := summariseSites(lat)
	return &sum
}

// runPS measures a pub/sub scenario on one architecture.
func (r *sitesRunner) runPS(ctx context.Context, run *SitesRun, w psWorkload) error {
	var td teardown
	defer func() {
		t0 := time.Now()
		td.run()
		run.TeardownSeconds = time.Since(t0).Seconds()
	}()
	rec, ledger := newSitesRecorder(), newPublishLedger()
	central := 0
	subsOf := make([][]int, len(w.Topics))
	pubs := make([]sitesPublisher, len(w.Producers))
	var dl dialer
	addReceiver := func(c psClient, dial func(index int) (sitesReceiver, error)) {
		subsOf[c.Exchange] = append(subsOf[c.Exchange], dl.addReceiver(c.Site, dial))
	}
	addPublisher := func(i int, dial func() (sitesPublisher, error)) { dl.addPublisher(pubs, i, dial) }
	setupBegan := time.Now()
	cloud := -1
	reconfig := run.Architecture == ArchReconfigConserve || run.Architecture == ArchReconfigDiscard
	var initial placement.Plan
	switch run.Architecture {
	case ArchLuffyMQ, ArchFullMesh, ArchStar, ArchRandom, ArchReconfigConserve, ArchReconfigDiscard:
		var exports []string
		for _, t := range w.Topics {
			exports = append(exports, t+"/#")
		}
		extra := []string{"--export", strings.Join(exports, ",")}
		if reconfig {
			if err := errReconfigUnsupported(r.env.luffymq); err != nil {
				return err
			}
			extra = append(extra, reconfigLuffyMQFlags(run.Architecture)...)
		}
		brokers := make([]*siteBroker, len(w.Sites))
		for i, s := range w.Sites {
			b, err := r.env.startSiteBroker(ctx, s, logName(run), extra...)
			if err != nil {
				return err
			}
			td.add(func() { _ = b.Close() })
			brokers[i] = b
		}
		var layout federationLayout
		maxHops := 2
		var plan placement.Plan
		switch run.Architecture {
		case ArchFullMesh:
			layout, maxHops = w.meshLayout(), 1
		case ArchStar:
			plan = w.starPlan(w.Sites[central])
		case ArchRandom:
			plan = w.randomPlan(r.cfg.Seed)
		case ArchLuffyMQ:
			res, err := placement.Improved(w.placementInput(w.ExpectedTraffic(nil), r.delays, nil, 0, r.cfg.Seed))
			if err != nil {
				return err
			}
			plan = res.Plan
		case ArchReconfigConserve, ArchReconfigDiscard:
			var err error
			if plan, err = r.initialPlan(w); err != nil {
				return err
			}
			initial = plan
		}
		if plan != nil {
			layout = w.syncLayout(plan)
			run.Plan = plan
		}
		if reconfig {
			// The first configuration goes through the site agents, as
			// the controller's later ones do.
			configs, err := r.env.siteConfigs(layout)
			if err == nil {
				err = r.env.sendConfigs(ctx, configs)
			}
			if err != nil {
				return err
			}
		} else if err := r.env.applyLayout(ctx, layout, maxHops, nil); err != nil {
			return err
		}
		for i, c := range w.Subscribers {
			addReceiver(c, func(idx int) (sitesReceiver, error) {
				return dialMQTTReceiver(ctx, brokers[c.Site].Addr(), fmt.Sprintf("sub-%d-%s", i, w.Sites[c.Site]), w.Topics[c.Exchange]+"/#", idx, 0, 0, rec)
			})
		}
		for i, c := range w.Producers {
			addPublisher(i, func() (sitesPublisher, error) {
				return dialMQTTPublisher(ctx, brokers[c.Site].Addr(), fmt.Sprintf("pub-%d-%s", i, w.Sites[c.Site]), fmt.Sprintf("%s/p%d", w.Topics[c.Exchange], i), ledger)
			})
		}
		if err := dl.run(&td); err != nil {
			return err
		}
		// The site agents create the reconfig runs' first links; creating a
		// node's upstream sets restarts its links (see
		// bridge.ExchangeUpstreamSlots), which can take a busy node long.
		linkWait := 60 * time.Second
		if reconfig {
			linkWait = 2 * time.Minute
		}
		if err := r.env.waitLinks(ctx, layout.Links(), linkWait); err != nil {
			return err
		}
		run.Clients = "MQTT v5 (paho.golang) to the site's luffymq: QoS 1 producers, QoS 1 subscribers of <topic>/#; luffymq exports every topic to pubsub.<topic> on the site's RabbitMQ"
		switch {
		case run.Architecture == ArchFullMesh:
			run.Clients += "; each exchange federated between all its sites (max-hops 1)"
		case reconfig:
			run.Clients += "; each exchange joined through its synchronisation site (max-hops 2), placed and moved by luffy-controller every " + r.cfg.ReconfigPeriod.String() + " through configuration messages to the luffymq site agents"
			if run.Architecture == ArchReconfigDiscard {
				run.Clients += ", which discard what a removed link held (" + flagDiscardHeld + ")"
			} else {
				run.Clients += ", which conserve what a removed link held"
			}
		default:
			run.Clients += "; each exchange joined through its synchronisation site (max-hops 2)"
		}
	case ArchCloud:
		cloud = central
		var xs []string
		for i := range w.Topics {
			xs = append(xs, w.Exchange(i))
		}
		if err := declareAMQP(r.env.node(w.Sites[central]).AMQPURL(), nil, xs); err != nil {
			return err
		}
		for _, c := range w.Subscribers {
			url, err := r.env.amqpURL(w.Sites[c.Site], w.Sites[central])
			if err != nil {
				return err
			}
			addReceiver(c, func(idx int) (sitesReceiver, error) {
				return dialAMQPReceiver(url, w.Exchange(c.Exchange), "", idx, 0, rec)
			})
		}
		for i, c := range w.Producers {
			url, err := r.env.amqpURL(w.Sites[c.Site], w.Sites[central])
			if err != nil {
				return err
			}
			addPublisher(i, func() (sitesPublisher, error) {
				return dialAMQPPublisher(url, w.Exchange(c.Exchange), fmt.Sprintf("%s.p%d", w.Topics[c.Exchange], i), ledger)
			})
		}
		if err := dl.run(&td); err != nil {
			return err
		}
		run.Clients = "AMQP 0-9-1 (amqp091-go) to one RabbitMQ at " + w.Sites[central] + " over each client's WAN link: persistent messages with publisher confirms to pubsub.<topic>, subscribers with an exclusive queue bound with #"
	default:
		return fmt.Errorf("architecture %s does not run pub/sub", run.Architecture)
	}
	if err := probe(ctx, pubs, func(i int) bool {
		for _, s := range subsOf[w.Producers[i].Exchange] {
			if !rec.probed(s, i) {
				return false
			}
		}
		return true
	}, 60*time.Second); err != nil {
		return err
	}
	if err := r.endSetup(ctx, run, setupBegan); err != nil {
		return err
	}

	arrivals := w.Arrivals(r.cfg.Seed)
	var during func(time.Time) func()
	var ctl *reconfigRun
	if reconfig {
		var err error
		if ctl, err = r.startController(ctx, run, initial); err != nil {
			return err
		}
		td.add(func() { _ = ctl.proc.Close() })
		during = func(start time.Time) func() {
			stop := ctl.watch(ctx, start)
			return func() {
				// The controller stops with the publishers: the plan in
				// force at the end stays while the last messages drain.
				stop()
				_ = ctl.proc.Close()
			}
		}
	}
	quiet := drainQuiet
	if reconfig {
		quiet = reconfigDrainQuiet
	}
	m := r.publishAll(ctx, quiet, len(arrivals), func(i int) time.Duration { return arrivals[i].At },
		func(i int) (sitesPublisher, uint64, sitesExpectation) {
			a := arrivals[i]
			c := w.Producers[a.Producer]
			return pubs[a.Producer], sitesMsgID(false, a.Producer, a.Seq), sitesExpectation{Origin: c.Site, Receivers: subsOf[c.Exchange]}
		}, ledger, rec, func(owed map[uint64]sitesExpectation) int {
			n := 0
			for _, e := range owed {
				n += len(e.Receivers)
			}
			return n
		}, during, nil)
	r.fill(run, m, dl.receiverSite, cloud)
	if ctl != nil {
		ctl.finish(run, r.cfg.ReconfigPeriod)
	}
	return ctx.Err()
}
