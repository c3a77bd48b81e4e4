// Package scoring decides which member of an MQTT shared-subscription group
// receives each message. It keeps the load state of every subscriber — what
// it reported, what it was sent, what it has not acknowledged — and offers
// several selection strategies behind one interface.
//
// The package is pure: no I/O, no MQTT types, and time comes from an
// injected Clock, so every strategy can be tested deterministically and
// benchmarked alone. An Engine is safe for concurrent use.
package scoring

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
)

// Defaults applied by NewEngine to zero Config fields.
const (
	DefaultReportInterval = time.Second
	DefaultNewcomerCap    = 2
	DefaultSampleSize     = 4
	// exhaustiveLimit is the largest group the adaptive strategy scans in
	// full; larger groups are sampled.
	exhaustiveLimit = 8
)

// Config configures an Engine.
type Config struct {
	// Strategy names the selection strategy (see Strategies).
	Strategy string
	// ReportInterval is how often members are expected to report.
	ReportInterval time.Duration
	// StaleAfter is how long without a report makes a member stale
	// (default 3 report intervals).
	StaleAfter time.Duration
	// NewcomerCap is how many messages a member that has never reported a
	// processing time is handed while others are available (default 2).
	NewcomerCap int
	// SampleSize is how many candidates the adaptive strategy compares in
	// groups larger than 8 members (default 4).
	SampleSize int
	// Clock supplies the time (default SystemClock).
	Clock Clock
	// Seed seeds the pseudo-random choices (0 picks a fixed default).
	Seed uint64
}

// ErrUnknownStrategy is returned for a strategy name that does not exist.
var ErrUnknownStrategy = errors.New("unknown strategy")

// Engine holds the load state of every client and the shared groups they are
// members of, and selects a member for each message.
type Engine struct {
	mu       sync.Mutex
	cfg      Config
	strategy Strategy
	epoch    time.Time
	members  map[string]*member
	groups   map[string]*group
	rng      uint64
}

// NewEngine returns an Engine for cfg.
func NewEngine(cfg Config) (*Engine, error) {
	if cfg.Strategy == "" {
		cfg.Strategy = "adaptive"
	}
	strategy, err := StrategyByName(cfg.Strategy)
	if err != nil {
		return nil, err
	}
	if cfg.ReportInterval <= 0 {
		cfg.ReportInterval = DefaultReportInterval
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = 3 * cfg.ReportInterval
	}
	if cfg.NewcomerCap <= 0 {
		cfg.NewcomerCap = DefaultNewcomerCap
	}
	if cfg.SampleSize <= 1 {
		cfg.SampleSize = DefaultSampleSize
	}
	if cfg.SampleSize > maxSample {
		cfg.SampleSize = maxSample
	}
	if cfg.Clock == nil {
		cfg.Clock = SystemClock{}
	}
	if cfg.Seed == 0 {
		cfg.Seed = 0x9E3779B97F4A7C15
	}
	return &Engine{
		cfg:      cfg,
		strategy: strategy,
		epoch:    cfg.Clock.Now(),
		members:  make(map[string]*member),
		groups:   make(map[string]*group),
		rng:      cfg.Seed,
	}, nil
}

// StrategyName returns the name of the engine's strategy.
func (e *Engine) StrategyName() string { return e.strategy.Name() }

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

func (e *Engine) now() time.Duration { return e.cfg.Clock.Now().Sub(e.epoch) }

// Connect starts a session for clientID: its load state starts afresh, and
// the groups it is still a member of (a resumed session) see it online.
func (e *Engine) Connect(clientID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.now()
	m, ok := e.members[clientID]
	if !ok {
		e.members[clientID] = newMember(clientID, now)
		return
	}
	m.reset(now)
	for _, g := range m.groups {
		g.setOnline(m, true) // also drops the group's prior: m's estimate is gone
	}
}

// Disconnect ends clientID's session. With expired, the session is gone:
// the client leaves every group and its state is removed (the thesis's
// rule). Otherwise its subscriptions survive and it is kept as an offline
// member, chosen only when no member of a group is online.
func (e *Engine) Disconnect(clientID string, expired bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m, ok := e.members[clientID]
	if !ok {
		return
	}
	m.online = false
	for _, g := range m.groups {
		if expired {
			g.remove(m)
			if g.empty() {
				delete(e.groups, g.key)
			}
		} else {
			g.setOnline(m, false)
		}
	}
	if expired {
		m.groups = nil
		delete(e.members, clientID)
	}
}

// Join makes clientID a member of the shared group keyed by groupKey (the
// full `$share/<group>/<filter>` filter). Joining twice is harmless.
func (e *Engine) Join(groupKey, clientID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m, ok := e.members[clientID]
	if !ok {
		m = newMember(clientID, e.now())
		e.members[clientID] = m
	}
	g, ok := e.groups[groupKey]
	if !ok {
		g = newGroup(groupKey, e.nextRandom())
		e.groups[groupKey] = g
	}
	if g.add(m) {
		m.groups = append(m.groups, g)
	}
}

// Leave removes clientID from the group keyed by groupKey.
func (e *Engine) Leave(groupKey, clientID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m, ok := e.members[clientID]
	g, gok := e.groups[groupKey]
	if !ok || !gok {
		return
	}
	g.remove(m)
	if g.empty() {
		delete(e.groups, groupKey)
	}
	for i, mg := range m.groups {
		if mg == g {
			m.groups = append(m.groups[:i], m.groups[i+1:]...)
			break
		}
	}
}

// Report applies a load report from clientID. It returns false if the
// client has no session.
func (e *Engine) Report(clientID string, l Load) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	m, ok := e.members[clientID]
	if !ok {
		return false
	}
	m.applyReport(e.now(), l, e.priorFor(m))
	for _, g := range m.groups {
		g.priorValid = false // its estimate or freshness may have changed
	}
	return true
}

// InFlightStarted records a QoS≥1 delivery to clientID awaiting its
// acknowledgement.
func (e *Engine) InFlightStarted(clientID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if m, ok := e.members[clientID]; ok {
		m.inflight++
		m.qosDeliveries++
	}
}

// InFlightAcknowledged records that clientID acknowledged a QoS≥1
// delivery. A client that acknowledges after processing (as LuffyMQ's SDK
// does) has just finished a message, so its predicted backlog is re-anchored
// to the deliveries still unacknowledged.
func (e *Engine) InFlightAcknowledged(clientID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m, ok := e.members[clientID]
	if !ok || m.inflight == 0 {
		return
	}
	m.inflight--
	if !m.acksAreFinishes {
		return
	}
	now := e.now()
	m.acknowledged(now)
	svc := m.serviceOr(e.priorFor(m))
	queued := m.inflight - (m.workers - 1) // the others may run in parallel
	if queued < 0 {
		queued = 0
	}
	m.freeAt = now + time.Duration(queued)*svc
}

// InFlightDropped records that a QoS≥1 delivery to clientID was abandoned
// without acknowledgement (expired or failed).
func (e *Engine) InFlightDropped(clientID string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if m, ok := e.members[clientID]; ok && m.inflight > 0 {
		m.inflight--
	}
}

// SetInFlight sets clientID's count of unacknowledged QoS≥1 deliveries,
// for example after a resumed session or a broker-side rollback.
func (e *Engine) SetInFlight(clientID string, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if m, ok := e.members[clientID]; ok && n >= 0 {
		m.inflight = n
	}
}

// SetReceiveMaximum records how many unacknowledged QoS≥1 deliveries
// clientID accepts at once (its MQTT v5 Receive Maximum; 0 means no
// limit). A member at its limit is chosen only when every member is.
func (e *Engine) SetReceiveMaximum(clientID string, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if m, ok := e.members[clientID]; ok && n >= 0 {
		m.receiveMax = n
	}
}

// Message describes the message a member is selected for.
type Message struct {
	PublisherID string
	Topic       string
}

// SelectMember chooses the member of the group keyed by groupKey that
// receives msg, and books the delivery. It returns false if the engine
// knows no member of that group. It does not allocate.
func (e *Engine) SelectMember(groupKey string, msg Message) (clientID string, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	g, ok := e.groups[groupKey]
	if !ok || g.empty() {
		return "", false
	}
	now := e.now()
	var m *member
	if len(g.members) == 0 {
		// Every member is offline: their sessions queue the message.
		m = g.offline[g.nextOffline%len(g.offline)]
		g.nextOffline++
		g.totals[m.id]++
	} else {
		idx := e.strategy.selectIndex(e, g, msg, now)
		if g.members[idx].atReceiveMaximum() {
			idx = g.nextUnderReceiveMaximum(idx)
		}
		m = g.members[idx]
		g.selections[idx]++
	}
	svc := m.service()
	if !m.hasService() {
		svc = e.groupPrior(g, now)
	}
	m.recordSend(now, m.predictedStart(now, svc, e.cfg.StaleAfter), svc)
	return m.id, true
}

// priorFor is the service time assumed for a member that never reported
// one: the median of the known estimates in its groups (0 if none).
// Stale members do not count.
func (e *Engine) priorFor(m *member) time.Duration {
	if m.hasService() || len(m.groups) == 0 {
		return 0
	}
	return e.groupPrior(m.groups[0], e.now())
}

// groupPrior returns the median service estimate of the group's fresh
// members that have one (the first 64 of them), or 0. It does not allocate,
// and it is cached in the group, so it costs O(1) between reports.
func (e *Engine) groupPrior(g *group, now time.Duration) time.Duration {
	if g.priorValid && now < g.priorUntil {
		return g.prior
	}
	var buf [64]time.Duration
	known := buf[:0]
	until := time.Duration(math.MaxInt64)
	for _, m := range g.members {
		if m.hasService() && !e.isStale(m, now) {
			if len(known) == cap(known) {
				break
			}
			known = append(known, m.service())
			// It turns stale, and leaves the median, just after this.
			if stale := m.lastReport + e.cfg.StaleAfter + 1; stale < until {
				until = stale
			}
		}
	}
	var prior time.Duration
	if len(known) > 0 {
		for i := 1; i < len(known); i++ { // insertion sort: tiny, allocation-free
			for j := i; j > 0 && known[j] < known[j-1]; j-- {
				known[j], known[j-1] = known[j-1], known[j]
			}
		}
		prior = known[len(known)/2]
	}
	g.prior, g.priorValid, g.priorUntil = prior, true, until
	return prior
}

func (e *Engine) isStale(m *member, now time.Duration) bool {
	return m.reports > 0 && now-m.lastReport > e.cfg.StaleAfter
}

func (e *Engine) nextRandom() uint64 {
	return splitmix(&e.rng)
}

// splitmix64: a small, fast, allocation-free generator; quality is ample
// for load spreading.
func splitmix(state *uint64) uint64 {
	*state += 0x9E3779B97F4A7C15
	z := *state
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// Strategies lists the names StrategyByName accepts.
func Strategies() []string {
	names := make([]string, 0, len(strategies))
	for _, s := range strategies {
		names = append(names, s.Name())
	}
	return names
}

// StrategyByName returns the strategy called name.
func StrategyByName(name string) (Strategy, error) {
	for _, s := range strategies {
		if s.Name() == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("%w %q: choose one of %s", ErrUnknownStrategy, name, strings.Join(Strategies(), ", "))
}
