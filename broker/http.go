package broker

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/luffymq/luffymq/broker/dashboard"
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
	// Completions counts the acknowledgements the service estimate learnt
	// from; AcksAreCompletions is false once the member was found to
	// acknowledge on receipt.
	Completions        uint64 `json:"completions"`
	AcksAreCompletions bool   `json:"acks_are_completions"`
}

// OverviewResponse is the body of GET /api/v1/overview: broker-wide
// figures for the dashboard. Counters count since the broker started.
type OverviewResponse struct {
	Strategy         string  `json:"strategy"`
	ReportIntervalMs float64 `json:"report_interval_ms"`
	StaleAfterMs     float64 `json:"stale_after_ms"`
	UptimeSeconds    int64   `json:"uptime_s"`
	ClientsConnected int64   `json:"clients_connected"`
	MessagesReceived int64   `json:"messages_received"`
	MessagesSent     int64   `json:"messages_sent"`
	MessagesDropped  int64   `json:"messages_dropped"`
	ReportsAccepted  uint64  `json:"reports_accepted"`
	ReportsMalformed uint64  `json:"reports_malformed"`
	ReportsOversized uint64  `json:"reports_oversized"`
	// ConnectTimeouts counts connections closed for not sending their
	// CONNECT within the connect timeout; ConnectionsRefused those closed
	// at accept because a connection limit was reached.
	ConnectTimeouts    uint64             `json:"connect_timeouts"`
	ConnectionsRefused ConnectionsRefused `json:"connections_refused"`
	// QoS0Dropped counts QoS 0 publishes dropped for clients whose outbox
	// was full; SlowClientsDisconnected clients ended for not reading.
	QoS0Dropped             uint64 `json:"qos0_dropped_slow_client"`
	SlowClientsDisconnected uint64 `json:"slow_clients_disconnected"`
	// Redispatched counts departed members' unacknowledged messages given
	// to the rest of their group; RedispatchParked those waiting for a
	// member now.
	Redispatched     uint64 `json:"redispatched"`
	RedispatchParked int    `json:"redispatch_parked"`
}

// ConnectionsRefused counts connections closed at accept, by the limit
// that was reached.
type ConnectionsRefused struct {
	ListenerLimit uint64 `json:"listener_limit"`
	IPLimit       uint64 `json:"ip_limit"`
}

// Overview returns the broker-wide figures of GET /api/v1/overview.
func (b *Broker) Overview() OverviewResponse {
	info := b.server.Info
	cfg := b.engine.Config()
	r := &b.selection.Reports
	o := OverviewResponse{
		Strategy:         b.engine.StrategyName(),
		ReportIntervalMs: millis(cfg.ReportInterval),
		StaleAfterMs:     millis(cfg.StaleAfter),
		ClientsConnected: atomic.LoadInt64(&info.ClientsConnected),
		MessagesReceived: atomic.LoadInt64(&info.MessagesReceived),
		MessagesSent:     atomic.LoadInt64(&info.MessagesSent),
		MessagesDropped:  atomic.LoadInt64(&info.MessagesDropped),
		ReportsOversized: r.Oversized.Load(),
	}
	gs := b.guard.Stats()
	o.ConnectTimeouts = gs.ConnectTimeouts
	o.ConnectionsRefused = ConnectionsRefused{ListenerLimit: gs.RefusedListenerLimit, IPLimit: gs.RefusedIPLimit}
	o.QoS0Dropped = b.guard.Outbox.DroppedQoS0.Load()
	o.SlowClientsDisconnected = b.guard.Outbox.WriteTimeouts.Load() + b.guard.Outbox.OutboxFull.Load()
	o.Redispatched = b.selection.Redispatch.Redispatched.Load()
	o.RedispatchParked = b.selection.ParkedRedispatch()
	for i := range r.Accepted {
		o.ReportsAccepted += r.Accepted[i].Load()
		o.ReportsMalformed += r.Malformed[i].Load()
	}
	if started := atomic.LoadInt64(&info.Started); started > 0 {
		o.UptimeSeconds = max(0, time.Now().Unix()-started)
	}
	return o
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

		Completions:        m.Completions,
		AcksAreCompletions: m.AcksAreFinishes,
	}
	if m.Reports > 0 {
		age := millis(m.LastReportAge)
		s.LastReportAgeMs = &age
	}
	return s
}

func (b *Broker) httpHandler() http.Handler {
	registry := b.metricsRegistry()
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
	mux.HandleFunc("GET /api/v1/overview", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(b.Overview())
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /api/v1/events", b.serveEvents)
	mux.HandleFunc("GET /api/v1/clients", b.serveClients)
	mux.HandleFunc("GET /api/v1/rejected-reports", func(w http.ResponseWriter, _ *http.Request) {
		writeStatusJSON(w, b.RejectedReports())
	})
	mux.HandleFunc("GET /api/v1/bridge", func(w http.ResponseWriter, _ *http.Request) {
		writeStatusJSON(w, BridgeResponse{Bridge: b.BridgeStatus()})
	})
	if b.cfg.Pprof {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	page := dashboard.Handler()
	mux.Handle("GET /{$}", page)
	mux.Handle("GET /dashboard", page)
	return b.requireHTTPAccess(mux)
}
