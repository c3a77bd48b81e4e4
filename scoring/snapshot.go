package scoring

import (
	"sort"
	"time"
)

// GroupSnapshot is a point-in-time view of one shared group.
type GroupSnapshot struct {
	// Filter is the group's full `$share/<group>/<filter>` filter.
	Filter   string
	Strategy string
	Members  []MemberSnapshot
}

// MemberSnapshot is a point-in-time view of one member of a group.
type MemberSnapshot struct {
	ClientID string
	Online   bool
	// Stale is true when its last report is older than StaleAfter.
	Stale bool
	// Selections counts the messages of this group selected for it.
	Selections uint64
	// ReportedPending is the pending count of its last report (m_q).
	ReportedPending int
	// ProcessingTime is the thesis's t_p: the mean of its last reported
	// processing times, zeros included.
	ProcessingTime time.Duration
	// ServiceEstimate is the adaptive per-message service time, with its
	// workers in parallel; 0 until it reports a processing time.
	ServiceEstimate time.Duration
	Workers         int
	InFlight        int
	// PredictedWait is how long a message handed to it now would wait
	// before it starts, by the adaptive model.
	PredictedWait time.Duration
	// Reports counts the reports it sent this session; LastReportAge is
	// meaningful only when Reports > 0.
	Reports       uint64
	LastReportAge time.Duration
	// Completions counts the acknowledgements taken as finished messages
	// (the service estimate learns from them); AcksAreFinishes is false
	// once the member was found to acknowledge on receipt.
	Completions     uint64
	AcksAreFinishes bool
}

// Snapshot returns every group with its members, sorted by filter; online
// members come first, in join order.
func (e *Engine) Snapshot() []GroupSnapshot {
	e.mu.RLock()
	defer e.mu.RUnlock()
	now := e.now()
	out := make([]GroupSnapshot, 0, len(e.groups))
	for _, g := range e.groups {
		gs := GroupSnapshot{Filter: g.key, Strategy: e.strategy.Name()}
		g.mu.Lock()
		prior := e.groupPrior(g, now)
		for i, m := range g.members {
			gs.Members = append(gs.Members, e.memberSnapshot(m, g.totals[m.id]+g.selections[i], now, prior))
		}
		for _, m := range g.offline {
			gs.Members = append(gs.Members, e.memberSnapshot(m, g.totals[m.id], now, prior))
		}
		g.mu.Unlock()
		out = append(out, gs)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Filter < out[j].Filter })
	return out
}

func (e *Engine) memberSnapshot(m *member, selections uint64, now, prior time.Duration) MemberSnapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	svc := m.serviceOr(prior)
	return MemberSnapshot{
		ClientID:        m.id,
		Online:          m.online,
		Stale:           e.isStale(m, now),
		Selections:      selections,
		ReportedPending: m.reportedPending,
		ProcessingTime:  m.thesisProcessingTime(),
		ServiceEstimate: m.service(),
		Workers:         m.workers,
		InFlight:        m.inflight,
		PredictedWait:   m.predictedStart(now, svc, e.cfg.StaleAfter) - now,
		Reports:         m.reports,
		LastReportAge:   now - m.lastReport,
		Completions:     m.completions,
		AcksAreFinishes: m.acksAreFinishes,
	}
}
