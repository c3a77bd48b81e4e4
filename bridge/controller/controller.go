package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/luffymq/luffymq/bridge/placement"
	"github.com/luffymq/luffymq/bridge/siteconfig"
)

// Site APIs whose reachability the controller tracks.
const (
	APIManagement = "management" // the RabbitMQ management API
	APILuffyMQ    = "luffymq"    // the luffymq status API
	APIAMQP       = "amqp"       // RabbitMQ itself, to publish configurations
)

var apis = []string{APIManagement, APILuffyMQ, APIAMQP}

// reachability is what the controller knows of one API of one site.
type reachability struct {
	known    bool
	ok       bool
	since    time.Time
	err      string
	failures uint64 // times it became unreachable
}

// siteState is everything the controller keeps about one site.
type siteState struct {
	site   Site
	reader *managementReader
	// sample is the last successful read of the management API; rates
	// were computed from it and the read before.
	sample *siteSample
	rates  *siteRates
	// capacity and luffyConnected come from the last read of the luffymq
	// status API.
	capacity       []GroupCapacity
	luffyConnected bool
	// luffy is the last read of the luffymq status API; overflowIn the
	// work-queue overflow the site took from each other site over the
	// period before it, in messages per second (nil before two reads).
	luffy      *luffyStatus
	overflowIn map[string]float64
	// published is the configuration last published to the site, or found
	// applied there on first contact; nil while unknown.
	published   siteconfig.SiteConfig
	publishedAt time.Time
	publishes   uint64
	reach       map[string]*reachability
}

// Controller runs the reconfiguration rounds of the control plane.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	sites   []*siteState
	luffy   *http.Client
	metrics *metrics

	roundMu sync.Mutex // one round at a time
	damp    *damper    // used under roundMu

	mu         sync.Mutex // guards what follows and every siteState
	rounds     uint64
	plan       placement.Plan
	decisions  map[string]placement.Decision
	inputs     []ExchangeInput
	evaluation *placement.Evaluation
	lastRound  *RoundInfo
	lastChange *Change
	held       []HeldMove
	wq         map[string]WorkQueueTraffic
	addr       net.Addr
}

// New validates cfg and returns a controller. Nothing is contacted until
// Round or Run.
func New(cfg Config) (*Controller, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Controller{
		cfg:   cfg,
		log:   cfg.Logger.With("component", "controller"),
		luffy: &http.Client{Timeout: cfg.RequestTimeout},
		plan:  placement.Plan{},
		damp:  newDamper(cfg.RateHalfLife, cfg.Period.Seconds(), cfg.MoveMargin),
	}
	for _, s := range cfg.Sites.Sites {
		r, err := newManagementReader(s, cfg.RequestTimeout)
		if err != nil {
			return nil, fmt.Errorf("%w: site %s: %w", ErrInvalidConfig, s.Name, err)
		}
		st := &siteState{site: s, reader: r, reach: map[string]*reachability{}}
		for _, api := range apis {
			st.reach[api] = &reachability{}
		}
		c.sites = append(c.sites, st)
	}
	c.metrics = newMetrics(c)
	return c, nil
}

// Move is one exchange whose synchronisation site changed.
type Move struct {
	Exchange string `json:"exchange"`
	// From is the previous synchronisation site ("" for a first
	// placement), To the new one ("" when the exchange stopped being
	// global).
	From string `json:"from"`
	To   string `json:"to"`
	// Reason is placement's reason (best-score, bandwidth, least-loaded,
	// local-search) or "no-longer-global".
	Reason string `json:"reason"`
	// CostBeforeMs and CostAfterMs are the exchange's term of eq. 2.1 at
	// From and at To (mean latency in ms plus the λ share); null where
	// there is no such site.
	CostBeforeMs *float64 `json:"cost_before_ms"`
	CostAfterMs  *float64 `json:"cost_after_ms"`
}

// Change is the last round that changed the plan.
type Change struct {
	Round uint64    `json:"round"`
	At    time.Time `json:"at"`
	Moves []Move    `json:"moves"`
	// PlanCostBefore and PlanCostAfter are eq. 2.1 for the whole plan
	// before and after the round, on the round's measurements.
	PlanCostBefore float64 `json:"plan_cost_before"`
	PlanCostAfter  float64 `json:"plan_cost_after"`
}

// RoundInfo describes the last round.
type RoundInfo struct {
	Number     uint64    `json:"number"`
	At         time.Time `json:"at"`
	DurationMs float64   `json:"duration_ms"`
	// Published names the sites that were sent a configuration.
	Published []string `json:"published"`
	// Errors lists what failed (unreachable sites, refused publishes).
	Errors []string `json:"errors"`
}

// RoundResult is what one round did.
type RoundResult struct {
	RoundInfo
	// Input is what placement was given; Exchanges summarises it.
	Input     placement.Input
	Exchanges []ExchangeInput
	// Result is placement's answer.
	Result placement.Result
	// Configs are the configurations the plan asks of each site.
	Configs map[string]siteconfig.SiteConfig
	// Change is non-nil when the plan changed.
	Change *Change
	// Held lists the moves the hysteresis refused (--move-margin).
	Held []HeldMove
}

// readResult is one site's reads of a round.
type readResult struct {
	// prev is the sample rates are computed from: the site's last one, or
	// on its first read one taken FirstWindow before sample.
	prev     *siteSample
	sample   *siteSample
	mgmtErr  error
	luffy    *luffyStatus
	luffyErr error
}

// Round reads every site, computes the plan and publishes each reachable
// site's configuration when it differs from what the site has. Sites that
// cannot be read keep their last plan: their last measurements stand in,
// and nothing is sent to them. The error joins what failed; the round
// still did everything else.
func (c *Controller) Round(ctx context.Context) (*RoundResult, error) {
	c.roundMu.Lock()
	defer c.roundMu.Unlock()
	start := time.Now()
	c.mu.Lock()
	c.rounds++
	res := &RoundResult{RoundInfo: RoundInfo{Number: c.rounds, At: start}}
	c.mu.Unlock()

	reads := make([]readResult, len(c.sites))
	c.mu.Lock()
	for i, st := range c.sites {
		reads[i].prev = st.sample
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for i, st := range c.sites {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &reads[i]
			if st.site.LuffyMQURL != "" {
				r.luffy, r.luffyErr = readLuffyMQ(ctx, c.luffy, st.site)
			}
			r.sample, r.mgmtErr = readOnce(ctx, st.reader)
			if r.mgmtErr != nil || r.prev != nil {
				return
			}
			// First read of the site: measure over FirstWindow.
			r.prev = r.sample
			t := time.NewTimer(c.cfg.FirstWindow)
			defer t.Stop()
			select {
			case <-ctx.Done():
				r.mgmtErr = ctx.Err()
				return
			case <-t.C:
			}
			r.sample, r.mgmtErr = readOnce(ctx, st.reader)
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		// Stopped (or out of time) while reading: no site is to blame.
		c.finishRound(res, start, []error{err})
		return res, err
	}

	var errs []error
	c.mu.Lock()
	samples := map[string]*siteSample{}
	rates := map[string]*siteRates{}
	for i, st := range c.sites {
		r := reads[i]
		c.setReach(st, APIManagement, r.mgmtErr)
		if r.mgmtErr == nil {
			rr := c.damp.smooth(st.site.Name, ratesBetween(st.site.Name, r.prev, r.sample))
			st.sample, st.rates = r.sample, &rr
		} else {
			errs = append(errs, fmt.Errorf("site %s: management API %s: %w", st.site.Name, redactURL(st.site.ManagementURL), r.mgmtErr))
		}
		if st.site.LuffyMQURL != "" {
			c.setReach(st, APILuffyMQ, r.luffyErr)
			if r.luffyErr == nil {
				st.capacity, st.luffyConnected = r.luffy.groups, r.luffy.connected
				if st.luffy != nil {
					st.overflowIn = overflowRates(st.luffy, r.luffy)
				}
				st.luffy = r.luffy
			} else {
				errs = append(errs, fmt.Errorf("site %s: luffymq API %s: %w", st.site.Name, redactURL(st.site.LuffyMQURL), r.luffyErr))
			}
		}
		if st.sample != nil {
			samples[st.site.Name] = st.sample
			rates[st.site.Name] = st.rates
		}
	}
	received, sizes := map[string]map[string]float64{}, map[string]float64{}
	for _, st := range c.sites {
		if st.overflowIn != nil && st.rates != nil {
			received[st.site.Name], sizes[st.site.Name] = st.overflowIn, st.rates.meanMessageSize
		}
	}
	wq := workQueueTraffic(received, sizes)
	oldPlan, seed := c.plan, c.rounds
	c.mu.Unlock()

	dec, err := c.decide(rates, samples, wq, oldPlan, seed)
	if err != nil {
		// Never expected: the input is built from validated sites.
		errs = append(errs, err)
		c.finishRound(res, start, errs)
		return res, errors.Join(errs...)
	}
	in, result := dec.in, dec.result
	res.Input, res.Exchanges, res.Result, res.Held = in, dec.summary, result, dec.held
	change, eval := c.describeChange(in, dec.previous, oldPlan, result)
	res.Change = change

	c.mu.Lock()
	res.Configs = desiredConfigs(c.cfg.Sites, in, result.Plan, workQueueHolders(c.cfg.Sites, samples))
	type job struct {
		st   *siteState
		want siteconfig.SiteConfig
		body []byte
	}
	var jobs []job
	for _, st := range c.sites {
		if st.sample == nil || !st.reach[APIManagement].ok {
			continue // never read, or unreachable now: it keeps its last plan
		}
		want := res.Configs[st.site.Name]
		if st.published == nil {
			st.published = st.sample.observed // first contact: what the site applied
		}
		if want.Equal(st.published) {
			continue
		}
		body, err := want.Marshal()
		if err != nil {
			errs = append(errs, fmt.Errorf("site %s: configuration: %w", st.site.Name, err))
			continue
		}
		jobs = append(jobs, job{st, want, body})
	}
	c.mu.Unlock()

	published := make([]error, len(jobs))
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			published[i] = publishConfig(ctx, j.st.site, j.body, c.cfg.RequestTimeout)
		}()
	}
	wg.Wait()

	c.mu.Lock()
	for i, j := range jobs {
		if published[i] != nil && ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			continue // stopped while publishing: sent again next round
		}
		c.setReach(j.st, APIAMQP, published[i])
		if published[i] != nil {
			errs = append(errs, fmt.Errorf("site %s: publishing configuration to %s: %w", j.st.site.Name, siteconfig.ConfigQueueName(j.st.site.Name), published[i]))
			continue
		}
		j.st.published, j.st.publishedAt = j.want, time.Now()
		j.st.publishes++
		c.metrics.publishes.WithLabelValues(j.st.site.Name).Inc()
		res.Published = append(res.Published, j.st.site.Name)
		c.log.Info("controller: configuration published", "site", j.st.site.Name, "queue", siteconfig.ConfigQueueName(j.st.site.Name), "entities", len(j.want))
	}
	c.plan = result.Plan
	c.decisions = map[string]placement.Decision{}
	for _, d := range result.Decisions {
		c.decisions[d.Exchange] = d
	}
	c.inputs = dec.summary
	c.held = dec.held
	c.wq = wq
	c.evaluation = eval
	if change != nil {
		c.lastChange = change
	}
	c.mu.Unlock()
	c.metrics.observePlan(oldPlan, result.Plan, change, eval, dec.held)
	c.finishRound(res, start, errs)
	return res, errors.Join(errs...)
}

// readOnce reads a site's management API, trying a second time half a
// second after a failure: a single failed request (RabbitMQ 3.10's
// management API answers 500 now and then to concurrent requests) does not
// make a site unreachable.
func readOnce(ctx context.Context, r *managementReader) (*siteSample, error) {
	s, err := r.read(ctx)
	if err == nil {
		return s, nil
	}
	t := time.NewTimer(500 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, err
	case <-t.C:
	}
	return r.read(ctx)
}

func (c *Controller) finishRound(res *RoundResult, start time.Time, errs []error) {
	d := time.Since(start)
	res.DurationMs = float64(d) / float64(time.Millisecond)
	for _, err := range errs {
		res.Errors = append(res.Errors, err.Error())
	}
	sort.Strings(res.Published)
	info := res.RoundInfo
	c.mu.Lock()
	c.lastRound = &info
	c.mu.Unlock()
	c.metrics.rounds.Inc()
	c.metrics.lastRoundSeconds.Set(d.Seconds())
}

// decision is what a round decided from its measurements.
type decision struct {
	in       placement.Input
	summary  []ExchangeInput
	previous map[string]string
	result   placement.Result
	held     []HeldMove
}

// decide places the global exchanges on the (smoothed) rates of every
// known site, with the bandwidth the work-queue overflow wq leaves, from
// the plan oldPlan (or, for exchanges it lacks, the one the sites' links
// show), and applies the hysteresis. It does no I/O.
func (c *Controller) decide(rates map[string]*siteRates, samples map[string]*siteSample, wq map[string]WorkQueueTraffic, oldPlan placement.Plan, seed uint64) (decision, error) {
	in, summary := buildInput(c.cfg.Sites, rates, nil, c.cfg.Lambda, seed)
	for i := range in.Sites {
		t := wq[in.Sites[i].Name]
		in.Sites[i].WorkQueueInbound, in.Sites[i].WorkQueueOutbound = t.In, t.Out
	}
	previous := recoverPrevious(in, samples, oldPlan)
	for _, x := range in.Exchanges {
		if p, ok := previous[x.Name]; ok {
			in.Previous[x.Name] = p
		}
	}
	result, err := c.place(in)
	if err != nil {
		return decision{}, err
	}
	result, held := c.damp.hold(in, result)
	return decision{in: in, summary: summary, previous: previous, result: result, held: held}, nil
}

func (c *Controller) place(in placement.Input) (placement.Result, error) {
	if c.cfg.Algorithm == AlgorithmThesis {
		return placement.Heuristic(in)
	}
	return placement.Improved(in)
}

// describeChange compares the new plan with the previous one and logs
// every move. It returns nil when nothing changed.
func (c *Controller) describeChange(in placement.Input, previous map[string]string, oldPlan placement.Plan, result placement.Result) (*Change, *placement.Evaluation) {
	var eval *placement.Evaluation
	if len(in.Exchanges) > 0 {
		if e, err := placement.Evaluate(in, result.Plan); err == nil {
			eval = &e
		}
	}
	before := placement.Plan{}
	for _, x := range in.Exchanges {
		before[x.Name] = result.Plan[x.Name]
		if p, ok := in.Previous[x.Name]; ok && holds(x, p) {
			before[x.Name] = p
		}
	}
	change := &Change{At: time.Now()}
	c.mu.Lock()
	change.Round = c.rounds
	c.mu.Unlock()
	if eval != nil {
		change.PlanCostAfter = eval.Cost
		if e, err := placement.Evaluate(in, before); err == nil {
			change.PlanCostBefore = e.Cost
		}
	}
	for _, d := range result.Decisions {
		from := previous[d.Exchange]
		if from == d.Site {
			continue
		}
		m := Move{Exchange: d.Exchange, From: from, To: d.Site, Reason: string(d.Reason)}
		for _, cand := range d.Candidates {
			cost := cand.Cost
			if cand.Site == from {
				m.CostBeforeMs = &cost
			}
			if cand.Site == d.Site {
				m.CostAfterMs = &cost
			}
		}
		change.Moves = append(change.Moves, m)
		if from == "" {
			c.log.Info("controller: exchange placed", "exchange", d.Exchange, "sync_site", d.Site, "reason", d.Reason, "cost_ms", deref(m.CostAfterMs))
		} else {
			c.log.Info("controller: moving synchronisation site", "exchange", d.Exchange, "from", from, "to", d.Site, "reason", d.Reason,
				"cost_before_ms", deref(m.CostBeforeMs), "cost_after_ms", deref(m.CostAfterMs))
		}
	}
	for x, site := range oldPlan {
		if _, ok := result.Plan[x]; !ok {
			change.Moves = append(change.Moves, Move{Exchange: x, From: site, Reason: "no-longer-global"})
			c.log.Info("controller: exchange no longer global", "exchange", x, "was_synced_at", site)
		}
	}
	if len(change.Moves) == 0 {
		return nil, eval
	}
	sort.Slice(change.Moves, func(i, j int) bool { return change.Moves[i].Exchange < change.Moves[j].Exchange })
	return change, eval
}

func holds(x placement.Exchange, site string) bool {
	for _, inst := range x.Instances {
		if inst.Site == site {
			return true
		}
	}
	return false
}

func deref(v *float64) any {
	if v == nil {
		return nil
	}
	return *v
}

// setReach records whether api of st answered and logs one line when that
// changes (or on the first failure). Call with c.mu held.
func (c *Controller) setReach(st *siteState, api string, err error) {
	r := st.reach[api]
	ok := err == nil
	changed := !r.known || r.ok != ok
	if err != nil {
		r.err = err.Error()
	} else {
		r.err = ""
	}
	if changed {
		if !ok {
			r.failures++
			c.metrics.unreachable.WithLabelValues(st.site.Name, api).Inc()
		}
		if !ok {
			what := "keeping its last plan"
			if api == APIAMQP {
				what = "its configuration will be sent again next round"
			}
			c.log.Warn(fmt.Sprintf("controller: site %s unreachable (%s API); %s", st.site.Name, api, what), "site", st.site.Name, "api", api, "error", r.err)
		} else if r.known {
			c.log.Info(fmt.Sprintf("controller: site %s reachable again (%s API)", st.site.Name, api), "site", st.site.Name, "api", api)
		}
		r.since = time.Now()
	}
	r.known, r.ok = true, ok
	v := 0.0
	if ok {
		v = 1
	}
	c.metrics.reachable.WithLabelValues(st.site.Name, api).Set(v)
}

// publishConfig sends one configuration message to the site's
// configuration queue, persistent and confirmed.
func publishConfig(ctx context.Context, s Site, body []byte, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("luffy-controller")
	conn, err := amqp.DialConfig(s.AMQPURL, amqp.Config{Dial: amqp.DefaultDial(timeout), Heartbeat: 10 * time.Second, Properties: props})
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", redactURL(s.AMQPURL), err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	q := siteconfig.ConfigQueueName(s.Name)
	// Declared as the site agent declares it, so either may come first.
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		return fmt.Errorf("declaring %s: %w", q, err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		Timestamp:    time.Now(),
		AppId:        "luffy-controller",
		Body:         body,
	})
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("RabbitMQ refused the message (nack)")
	}
	return nil
}

// Run serves HTTP (when configured) and runs a round every period until ctx
// ends. With Once it runs one round, writes the status JSON to Output and
// returns the round's error.
func (c *Controller) Run(ctx context.Context) error {
	if c.cfg.Once {
		_, roundErr := c.Round(ctx)
		enc := json.NewEncoder(c.cfg.Output)
		enc.SetIndent("", "  ")
		if err := enc.Encode(c.Status()); err != nil {
			return err
		}
		return roundErr
	}
	if c.cfg.HTTPListen != "" {
		ln, err := net.Listen("tcp", c.cfg.HTTPListen)
		if err != nil {
			return fmt.Errorf("http %s: %w", c.cfg.HTTPListen, err)
		}
		c.mu.Lock()
		c.addr = ln.Addr()
		c.mu.Unlock()
		srv := &http.Server{Handler: c.Handler(), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}
	c.log.Info("luffy-controller started", "sites", len(c.sites), "period", c.cfg.Period, "algorithm", c.cfg.Algorithm,
		"lambda", c.cfg.Lambda, "rate_half_life_periods", c.cfg.RateHalfLife, "move_margin", c.cfg.MoveMargin, "http", c.HTTPAddr())
	tick := time.NewTicker(c.cfg.Period)
	defer tick.Stop()
	for {
		rctx, cancel := context.WithTimeout(ctx, c.cfg.Period)
		res, err := c.Round(rctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			c.log.Debug("controller: round finished with errors", "round", res.Number, "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// HTTPAddr returns the address the HTTP server listens on, or "" before
// Run started it (or without one).
func (c *Controller) HTTPAddr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.addr == nil {
		return ""
	}
	return c.addr.String()
}

// Plan returns a copy of the current plan: exchange -> synchronisation
// site.
func (c *Controller) Plan() placement.Plan {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := make(placement.Plan, len(c.plan))
	for k, v := range c.plan {
		p[k] = v
	}
	return p
}
