package controller

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/luffymq/luffymq/bridge/placement"
)

// metrics are the controller's Prometheus series (prefix luffy_controller_).
type metrics struct {
	registry         *prometheus.Registry
	rounds           prometheus.Counter
	lastRoundSeconds prometheus.Gauge
	planChanges      prometheus.Counter
	moves            *prometheus.CounterVec
	syncSite         *prometheus.GaugeVec
	reachable        *prometheus.GaugeVec
	unreachable      *prometheus.CounterVec
	publishes        *prometheus.CounterVec
	planCost         prometheus.Gauge
	planOverload     prometheus.Gauge
	globalExchanges  prometheus.Gauge
	heldMoves        *prometheus.CounterVec
	held             prometheus.Gauge
}

func newMetrics(c *Controller) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		rounds: prometheus.NewCounter(prometheus.CounterOpts{Name: "luffy_controller_rounds_total",
			Help: "Reconfiguration rounds run."}),
		lastRoundSeconds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "luffy_controller_last_round_duration_seconds",
			Help: "How long the last round took (reading every site, placing, publishing)."}),
		planChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "luffy_controller_plan_changes_total",
			Help: "Rounds whose plan differed from the previous one (a move, a first placement or an exchange no longer global)."}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "luffy_controller_moves_total",
			Help: "Times an exchange's synchronisation site moved from one site to another."}, []string{"exchange"}),
		syncSite: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "luffy_controller_sync_site",
			Help: "1 for each global exchange's current synchronisation site."}, []string{"exchange", "site"}),
		reachable: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "luffy_controller_site_reachable",
			Help: "1 when the site's API (management, luffymq, amqp) answered on its last use, else 0."}, []string{"site", "api"}),
		unreachable: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "luffy_controller_site_unreachable_total",
			Help: "Times a site's API became unreachable."}, []string{"site", "api"}),
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "luffy_controller_configurations_published_total",
			Help: "Configuration messages published to a site's configuration queue (only when its configuration changed)."}, []string{"site"}),
		planCost: prometheus.NewGauge(prometheus.GaugeOpts{Name: "luffy_controller_plan_cost",
			Help: "The current plan's cost (eq. 2.1: mean latency in ms over publications and interested consumers, plus λ for moves) on the last round's measurements."}),
		planOverload: prometheus.NewGauge(prometheus.GaugeOpts{Name: "luffy_controller_plan_overload_bytes_per_second",
			Help: "How far the current plan's estimated overlay traffic exceeds the sites' bandwidth limits (0: within them)."}),
		globalExchanges: prometheus.NewGauge(prometheus.GaugeOpts{Name: "luffy_controller_global_exchanges",
			Help: "pubsub* exchanges present at two sites or more."}),
		heldMoves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "luffy_controller_moves_held_total",
			Help: "Rounds in which the hysteresis (--move-margin) kept an exchange at its synchronisation site although placement chose another."}, []string{"exchange"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "luffy_controller_moves_held",
			Help: "Exchanges whose move the hysteresis held in the last round."}),
	}
	m.registry.MustRegister(m.rounds, m.lastRoundSeconds, m.planChanges, m.moves, m.syncSite, m.reachable,
		m.unreachable, m.publishes, m.planCost, m.planOverload, m.globalExchanges, m.heldMoves, m.held)
	for _, st := range c.sites {
		m.publishes.WithLabelValues(st.site.Name)
		for _, api := range apis {
			if api == APILuffyMQ && st.site.LuffyMQURL == "" {
				continue
			}
			m.unreachable.WithLabelValues(st.site.Name, api)
		}
	}
	return m
}

// observePlan updates the plan series after a round.
func (m *metrics) observePlan(old, plan placement.Plan, change *Change, eval *placement.Evaluation, held []HeldMove) {
	for _, h := range held {
		m.heldMoves.WithLabelValues(h.Exchange).Inc()
	}
	m.held.Set(float64(len(held)))
	for x, site := range old {
		if plan[x] != site {
			m.syncSite.DeleteLabelValues(x, site)
		}
	}
	for x, site := range plan {
		m.syncSite.WithLabelValues(x, site).Set(1)
	}
	m.globalExchanges.Set(float64(len(plan)))
	if change != nil {
		m.planChanges.Inc()
		for _, mv := range change.Moves {
			if mv.From != "" && mv.To != "" {
				m.moves.WithLabelValues(mv.Exchange).Inc()
			}
		}
	}
	if eval != nil {
		m.planCost.Set(eval.Cost)
		m.planOverload.Set(eval.Overload)
	} else {
		m.planCost.Set(0)
		m.planOverload.Set(0)
	}
}
