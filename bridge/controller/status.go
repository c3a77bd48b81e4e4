package controller

import (
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Status is the body of GET /api/v1/status. URIs never show passwords.
type Status struct {
	Algorithm     string  `json:"algorithm"`
	Lambda        float64 `json:"lambda"`
	PeriodSeconds float64 `json:"period_s"`
	// RateHalfLifePeriods and MoveMargin are the damping settings
	// (--rate-half-life, --move-margin; 0: off).
	RateHalfLifePeriods float64 `json:"rate_half_life_periods"`
	MoveMargin          float64 `json:"move_margin"`
	// Held lists the moves the hysteresis refused in the last round.
	Held   []HeldMove `json:"held_moves"`
	Rounds uint64     `json:"rounds"`
	// LastRound is null before the first round.
	LastRound *RoundInfo `json:"last_round"`
	// Plan maps every global exchange to its synchronisation site.
	Plan map[string]string `json:"plan"`
	// Exchanges details the plan with the inputs of the last round (the
	// smoothed rates placement saw, when --rate-half-life is on).
	Exchanges []ExchangeStatus `json:"exchanges"`
	// PlanCost is eq. 2.1 for the current plan and PlanOverload how far
	// it exceeds the bandwidth limits (bytes/s), on the last round's
	// measurements; null without global exchanges.
	PlanCost     *float64 `json:"plan_cost"`
	PlanOverload *float64 `json:"plan_overload_bytes_per_s"`
	// LastChange is the last round that changed the plan (null if none).
	LastChange *Change       `json:"last_change"`
	Sites      []SiteStatus  `json:"sites"`
	Delays     []DelayStatus `json:"delays_ms"`
}

// ExchangeStatus is one global exchange.
type ExchangeStatus struct {
	Name     string `json:"name"`
	SyncSite string `json:"sync_site"`
	// Reason is why placement chose SyncSite in the last round, or
	// "held" when the move margin kept it there (see Status.Held).
	Reason string `json:"reason"`
	// TrafficPerS is P(E_i), the exchange's local publishes and
	// deliveries per second over all sites (the busiest goes first).
	TrafficPerS     float64         `json:"traffic_per_s"`
	MeanMessageSize float64         `json:"mean_message_size"`
	Instances       []InstanceRates `json:"instances"`
}

// SiteStatus is one site.
type SiteStatus struct {
	Name string `json:"name"`
	// Reachability of the management API, the luffymq API (omitted when
	// not configured) and RabbitMQ (used to publish configurations).
	Management Reachability  `json:"management"`
	LuffyMQ    *Reachability `json:"luffymq,omitempty"`
	AMQP       Reachability  `json:"amqp"`
	// Stale is true when the site's last read failed and its previous
	// measurements stand in (it keeps its last plan).
	Stale bool `json:"stale"`
	// SampledAt is the last successful read of the management API.
	SampledAt *time.Time `json:"sampled_at"`
	// PeriodSeconds is the time the rates cover (0: RabbitMQ's own recent
	// rates, on a site's first read).
	PeriodSeconds   float64 `json:"period_s"`
	MeanMessageSize float64 `json:"mean_message_size"`
	// InboundBandwidth and OutboundBandwidth are the sites file's limits
	// in bytes/s (0: unlimited).
	InboundBandwidth  float64 `json:"inbound_bandwidth_bytes_per_s"`
	OutboundBandwidth float64 `json:"outbound_bandwidth_bytes_per_s"`
	// EstimatedInbound and EstimatedOutbound are the overlay traffic the
	// current plan is expected to put on the site (eq. 2.10–2.11), bytes/s.
	EstimatedInbound  float64 `json:"estimated_inbound_bytes_per_s"`
	EstimatedOutbound float64 `json:"estimated_outbound_bytes_per_s"`
	// WorkQueueOverflow is the work-queue overflow the site received from
	// and sent to other sites over the last period, estimated from the
	// luffymq status APIs; placement gives pub/sub what it leaves of the
	// bandwidth.
	WorkQueueOverflow WorkQueueTraffic `json:"work_queue_overflow"`
	WorkQueues        []string         `json:"work_queues"`
	// Capacity is each work-queue group's capacity from the luffymq API.
	Capacity []GroupCapacity `json:"capacity"`
	// LuffyMQConnected is the site bridge's link to RabbitMQ, as luffymq
	// reports it.
	LuffyMQConnected bool `json:"luffymq_bridge_connected"`
	// Config is the configuration last published to the site or found
	// applied there (null while unknown), passwords hidden.
	Config            map[string][]string `json:"config"`
	ConfigPublishedAt *time.Time          `json:"config_published_at"`
	ConfigsPublished  uint64              `json:"configs_published"`
}

// Reachability is whether a site's API answered.
type Reachability struct {
	// Reachable is null until the API was first used.
	Reachable *bool `json:"reachable"`
	// Since is when it last changed.
	Since *time.Time `json:"since"`
	// Error is the last failure while unreachable.
	Error string `json:"error,omitempty"`
	// Failures counts the times it became unreachable.
	Failures uint64 `json:"failures"`
}

// DelayStatus is one pair of the delay matrix.
type DelayStatus struct {
	From string  `json:"from"`
	To   string  `json:"to"`
	Ms   float64 `json:"ms"`
}

func (r *reachability) status() Reachability {
	var s Reachability
	if r.known {
		ok, since := r.ok, r.since
		s.Reachable, s.Since = &ok, &since
	}
	if !r.ok {
		s.Error = r.err
	}
	s.Failures = r.failures
	return s
}

// Status returns the controller's state for /api/v1/status.
func (c *Controller) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Status{
		Algorithm:           c.cfg.Algorithm,
		Lambda:              c.cfg.Lambda,
		PeriodSeconds:       c.cfg.Period.Seconds(),
		RateHalfLifePeriods: c.cfg.RateHalfLife,
		MoveMargin:          c.cfg.MoveMargin,
		Held:                append([]HeldMove{}, c.held...),
		Rounds:              c.rounds,
		LastRound:           c.lastRound,
		Plan:                map[string]string{},
		Exchanges:           []ExchangeStatus{},
		LastChange:          c.lastChange,
	}
	for k, v := range c.plan {
		s.Plan[k] = v
	}
	if c.evaluation != nil {
		cost, over := c.evaluation.Cost, c.evaluation.Overload
		s.PlanCost, s.PlanOverload = &cost, &over
	}
	for _, x := range c.inputs {
		d := c.decisions[x.Name]
		s.Exchanges = append(s.Exchanges, ExchangeStatus{Name: x.Name, SyncSite: c.plan[x.Name], Reason: string(d.Reason),
			TrafficPerS: d.Traffic, MeanMessageSize: x.MeanMessageSize, Instances: x.Instances})
	}
	for _, st := range c.sites {
		ss := SiteStatus{
			Name:              st.site.Name,
			Management:        st.reach[APIManagement].status(),
			AMQP:              st.reach[APIAMQP].status(),
			Stale:             st.sample != nil && !st.reach[APIManagement].ok,
			InboundBandwidth:  float64(st.site.InboundBandwidth),
			OutboundBandwidth: float64(st.site.OutboundBandwidth),
			Capacity:          st.capacity,
			LuffyMQConnected:  st.luffyConnected,
			ConfigsPublished:  st.publishes,
			WorkQueues:        []string{},
		}
		if st.site.LuffyMQURL != "" {
			r := st.reach[APILuffyMQ].status()
			ss.LuffyMQ = &r
		}
		if st.sample != nil {
			at := st.sample.at
			ss.SampledAt = &at
			ss.WorkQueues = st.sample.workQueues
		}
		if st.rates != nil {
			ss.PeriodSeconds, ss.MeanMessageSize = st.rates.periodSeconds, st.rates.meanMessageSize
		}
		if c.evaluation != nil {
			ss.EstimatedInbound = c.evaluation.InboundLoad[st.site.Name]
			ss.EstimatedOutbound = c.evaluation.OutboundLoad[st.site.Name]
		}
		ss.WorkQueueOverflow = c.wq[st.site.Name]
		if st.published != nil {
			ss.Config = map[string][]string{}
			for k, uris := range st.published {
				red := make([]string, len(uris))
				for i, u := range uris {
					red[i] = redactURL(u)
				}
				ss.Config[k] = red
			}
		}
		if !st.publishedAt.IsZero() {
			at := st.publishedAt
			ss.ConfigPublishedAt = &at
		}
		s.Sites = append(s.Sites, ss)
	}
	names := c.cfg.Sites.Names()
	for i, a := range names {
		for _, b := range names[i+1:] {
			if d, ok := c.cfg.Sites.Delays.Between(a, b); ok {
				s.Delays = append(s.Delays, DelayStatus{From: a, To: b, Ms: float64(d) / float64(time.Millisecond)})
			}
		}
	}
	sort.Slice(s.Exchanges, func(i, j int) bool { return s.Exchanges[i].Name < s.Exchanges[j].Name })
	return s
}

// Handler serves GET /metrics (Prometheus) and GET /api/v1/status (JSON),
// behind the bearer token when one is configured.
func (c *Controller) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(c.metrics.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /api/v1/status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(c.Status())
	})
	if c.cfg.HTTPToken == "" {
		return mux
	}
	want := []byte("Bearer " + c.cfg.HTTPToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(strings.TrimSpace(r.Header.Get("Authorization")))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="luffy-controller"`)
			http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	})
}
