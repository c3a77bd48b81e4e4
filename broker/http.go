package broker

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/luffymq/luffymq/hooks"
	"github.com/luffymq/luffymq/scoring"
)

// GroupsResponse is the body of GET /api/v1/groups.
type GroupsResponse struct {
	Groups []GroupStatus `json:"groups"`
}

// GroupStatus describes one shared group.
type GroupStatus struct {
	Filter   string         `json:"filter"`
	Strategy string         `json:"strategy"`
	Members  []MemberStatus `json:"members"`
}

// MemberStatus describes one member of a shared group. Durations are in
// milliseconds; LastReportAgeMs is null until the member reports.
type MemberStatus struct {
	ClientID         string   `json:"client_id"`
	Online           bool     `json:"online"`
	Stale            bool     `json:"stale"`
	Selections       uint64   `json:"selections"`
	ReportedPending  int      `json:"reported_pending"`
	ProcessingTimeMs float64  `json:"processing_time_ms"`
	ServiceTimeMs    float64  `json:"service_time_ms"`
	Workers          int      `json:"workers"`
	InFlight         int      `json:"inflight"`
	PredictedWaitMs  float64  `json:"predicted_wait_ms"`
	Reports          uint64   `json:"reports"`
	LastReportAgeMs  *float64 `json:"last_report_age_ms"`
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Groups returns the status of every shared group.
func (b *Broker) Groups() GroupsResponse {
	resp := GroupsResponse{Groups: []GroupStatus{}}
	for _, g := range b.engine.Snapshot() {
		gs := GroupStatus{Filter: g.Filter, Strategy: g.Strategy, Members: []MemberStatus{}}
		for _, m := range g.Members {
			gs.Members = append(gs.Members, memberStatus(m))
		}
		resp.Groups = append(resp.Groups, gs)
	}
	return resp
}

func memberStatus(m scoring.MemberSnapshot) MemberStatus {
	s := MemberStatus{
		ClientID:         m.ClientID,
		Online:           m.Online,
		Stale:            m.Stale,
		Selections:       m.Selections,
		ReportedPending:  m.ReportedPending,
		ProcessingTimeMs: millis(m.ProcessingTime),
		ServiceTimeMs:    millis(m.ServiceEstimate),
		Workers:          m.Workers,
		InFlight:         m.InFlight,
		PredictedWaitMs:  millis(m.PredictedWait),
		Reports:          m.Reports,
	}
	if m.Reports > 0 {
		age := millis(m.LastReportAge)
		s.LastReportAgeMs = &age
	}
	return s
}

func (b *Broker) httpHandler() http.Handler {
	registry := prometheus.NewRegistry()
	registry.MustRegister(
		hooks.NewMetricsCollector(b.selection),
		newServerInfoCollector(b.server),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	if b.bridge != nil {
		registry.MustRegister(b.bridge.Collector())
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /api/v1/groups", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(b.Groups())
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	return mux
}
