package hooks

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// PacingCollector exposes a PacingHook's counters to Prometheus, read at
// scrape time.
type PacingCollector struct {
	hook                              *PacingHook
	waits, waitSeconds, timedOut, not *prometheus.Desc
}

// NewPacingCollector returns a collector for hook's counters.
func NewPacingCollector(hook *PacingHook) *PacingCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &PacingCollector{
		hook: hook,
		waits: d("luffymq_publisher_pacing_waits_total",
			"Deliveries for which a publisher waited because the receiving client's write queue was above its high-water mark while the client drained it (--publisher-pacing)."),
		waitSeconds: d("luffymq_publisher_pacing_wait_seconds_total",
			"Total time publishers waited for clients draining their write queue."),
		timedOut: d("luffymq_publisher_pacing_timeouts_total",
			"Publisher waits that reached --publisher-pacing-max-wait with the client's write queue still above the mark."),
		not: d("luffymq_publisher_pacing_not_draining_total",
			"Deliveries to a client whose write queue was above the mark but which did not drain (its socket accepted nothing lately): nobody waited."),
	}
}

// Describe sends the descriptors of every metric.
func (c *PacingCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.waits
	ch <- c.waitSeconds
	ch <- c.timedOut
	ch <- c.not
}

// Collect sends the current values.
func (c *PacingCollector) Collect(ch chan<- prometheus.Metric) {
	n := &c.hook.Counters
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	counter(c.waits, float64(n.Waits.Load()))
	counter(c.waitSeconds, (time.Duration(n.WaitNanos.Load())).Seconds())
	counter(c.timedOut, float64(n.TimedOut.Load()))
	counter(c.not, float64(n.NotDraining.Load()))
}
