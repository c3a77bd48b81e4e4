package bridge

import (
	"log/slog"
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
	reconnects atomic.Uint64
	nacked     atomic.Uint64
	lastWarn   atomic.Int64 // unix nanos of the last outbox-full warning
	descs      map[string]*prometheus.Desc
}

func newStats(b *Bridge) *stats {
	site := prometheus.Labels{"site": b.cfg.Site}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("luffymq_bridge_"+name, help, labels, site)
	}
	return &stats{
		b:       b,
		exports: map[string]uint64{},
		imports: map[string]*[numImportResults]uint64{},
		descs: map[string]*prometheus.Desc{
			"exported":   d("messages_exported_total", "MQTT messages published to a pub/sub exchange and confirmed by RabbitMQ.", "exchange"),
			"imported":   d("messages_imported_total", "Messages taken from the import queue, by exchange and outcome (delivered, local_origin, duplicate, unmappable, failed).", "exchange", "outcome"),
			"connected":  d("link_up", "1 when the bridge has a working connection to its RabbitMQ node, else 0."),
			"reconnects": d("connection_failures_total", "RabbitMQ connection attempts that failed or sessions that were lost."),
			"outbox":     d("outbox_messages", "Messages waiting to be published or confirmed."),
			"dropped":    d("messages_dropped_total", "Messages dropped before reaching RabbitMQ (outbox full or refused 5 times).", "reason"),
			"bindings":   d("bindings", "Bindings of the import queue (one per exchange and local subscription overlapping an export)."),
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
}
