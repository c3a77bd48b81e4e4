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
