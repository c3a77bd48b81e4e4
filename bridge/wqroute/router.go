package wqroute

import (
	"maps"
	"sync"
	"time"

	"github.com/luffymq/luffymq/scoring"
)

// State is one broker's work-group state as it publishes it to the other
// sites: what a message sent to its site would wait behind.
type State struct {
	// Site and Broker name the publishing broker; Boot changes when it
	// restarts (its Taken counts start again).
	Site   string `json:"site"`
	Broker string `json:"broker"`
	Boot   string `json:"boot"`
	// Sent is when it was published (Unix nanoseconds, the publisher's
	// clock).
	Sent int64 `json:"sent"`
	// Intake counts the other sites' messages ready in the site's intake
	// queue: a message routed to the site waits behind them, not behind
	// the site's own queue, which its brokers serve after the intake.
	Intake int `json:"intake"`
	// Members are the group's online members as the broker predicts them.
	Members []MemberState `json:"members"`
	// Taken counts, by origin site, the other sites' messages the broker
	// has taken from its intake since it started.
	Taken map[string]uint64 `json:"taken"`
	// Unbooked counts, by the broker of the same site that booked them
	// and by the site they were booked to, the messages the publishing
	// broker has taken back from the link queues towards silent sites
	// since it started: that broker's router unbooks them (Observe).
	Unbooked map[string]map[string]uint64 `json:"unbooked,omitempty"`
	// Publishes is the broker's rate of local publishes (a second,
	// PublishRate) when it sent the state: its siblings weigh their
	// site's members' time by the whole site's publishes (LocalCost).
	Publishes float64 `json:"publishes,omitempty"`
}

// MemberState is one online member in a State.
type MemberState struct {
	// Wait is how long a message handed to it at Sent would wait before
	// it starts (0: idle).
	Wait time.Duration `json:"wait"`
	// Service is its learned service time per message; 0 when the broker
	// has none (a member that acknowledges on receipt or has not finished
	// anything yet). Such a member is counted for one message while it
	// is idle (PredictStart), never for more.
	Service time.Duration `json:"service"`
	// InFlight counts the messages sent to it and not yet acknowledged.
	InFlight int `json:"inflight,omitempty"`
	// AcksOnReceipt is true once the broker found that its
	// acknowledgements do not mark finished work: its idle look then
	// says nothing of whether it is free.
	AcksOnReceipt bool `json:"acks_on_receipt,omitempty"`
}

// snapshot is m as PredictStart reads it.
func (m MemberState) snapshot() scoring.MemberSnapshot {
	return scoring.MemberSnapshot{Online: true, PredictedWait: m.Wait, ServiceEstimate: m.Service, InFlight: m.InFlight, AcksAreFinishes: !m.AcksOnReceipt}
}

// StateOf builds the State of members (online ones are kept).
func StateOf(site, broker, boot string, sent time.Time, intake int, members []scoring.MemberSnapshot, taken map[string]uint64) State {
	st := State{Site: site, Broker: broker, Boot: boot, Sent: sent.UnixNano(), Intake: intake, Taken: taken}
	for _, m := range members {
		if m.Online {
			st.Members = append(st.Members, MemberState{Wait: m.PredictedWait, Service: m.ServiceEstimate, InFlight: m.InFlight, AcksOnReceipt: !m.AcksAreFinishes})
		}
	}
	return st
}

// Config tunes a Router.
type Config struct {
	// Site is the site the Router routes from: the key of the other
	// sites' Taken counts that are its own.
	Site string
	// Broker names the broker the Router serves. The states of the other
	// brokers of Site (its siblings) are kept apart: their members are
	// local ones (AppendSiblings), not another site's.
	Broker string
	// StaleAfter is how long a state counts after it arrived (2.5 s); an
	// older one is ignored.
	StaleAfter time.Duration
	// Credit is how long after a site's last state arrived the Router
	// still expects the messages it sends there to start on arrival: the
	// longest a live site leaves a router that holds a lease without a
	// state (its heartbeat to lease holders: a site that takes the
	// router's messages as the router predicts says nothing until then,
	// Extrapolates). What it sends later, with no state since, counts as
	// queued there from the new message's arrival on, as a site that
	// stopped (its broker gone) would keep it. Zero: StaleAfter / 3.
	Credit time.Duration
}

// maxPrediction bounds how far a site's start is predicted.
const maxPrediction = time.Minute

// delaySamples is how many (arrival − send time) samples of a site's
// states the one-way delay estimate takes the minimum of.
const delaySamples = 16

// brokerState is the last state of one broker.
type brokerState struct {
	name, boot string
	members    []scoring.MemberSnapshot
	sentAt     time.Time // the state's send time, in the publisher's clock
	arrived    time.Time // when it arrived, in ours
	// taken is its count of the Router's site's messages it took from
	// its intake since its boot; since, that count when the Router first
	// heard of it (what it took before is not the Router's).
	taken, since uint64
	// thirdTaken is its count of the messages of sites other than the
	// Router's it took from its intake since its boot: their routers'
	// messages, which race the Router's for the site's idle members
	// (site.racing).
	thirdTaken uint64
	heard      bool
	// unbooked is, for a sibling, its last State.Unbooked of the Router's
	// broker, by site.
	unbooked map[string]uint64
	// publishes is its last State.Publishes.
	publishes float64
}

// site is what a Router knows of one other site: the last state of each
// of its brokers.
type site struct {
	name    string
	brokers []*brokerState
	// merged holds the members of its brokers whose states were fresh at
	// the last merge, their waits as of arrived (the newest state's
	// arrival); mergedUntil is when the first of those states goes stale.
	merged      []scoring.MemberSnapshot
	arrived     time.Time
	mergedUntil time.Time
	// publishes is the merged brokers' local publishes a second: they
	// race a routed message for the members that are idle.
	publishes float64
	// racing is the rate of the other sites' messages its brokers take
	// from their intake, the Router's own excepted: what third sites'
	// routers send it races the Router's messages for its idle members
	// as its own publishes do.
	racing PublishRate
	// intake is the other sites' messages ready in the site's intake
	// queue, by its newest state.
	intake int
	// samples are the last (arrived − sent) of its states; delay is
	// their minimum: the one-way delay, assuming synchronised clocks (NTP;
	// a skew adds to or takes from it).
	samples [delaySamples]time.Duration
	nSample int
	delay   time.Duration
	// sent counts the messages routed to the site. What its brokers took
	// of them (their taken − since, plus retired: what brokers took
	// before they restarted) is subtracted: the rest is on its way or
	// waiting there, in the federation link (a link that stalls or is cut
	// keeps them, and the site's states cannot show them) or in its
	// intake.
	sent, retired uint64
	// sends holds the times of the latest sends to the site (a ring of
	// maxTrackedSends; nSends counts them all): the outstanding messages
	// are the newest of them, on their way or started on arrival.
	sends  [maxTrackedSends]time.Time
	nSends uint64
}

// outstanding is how many of the messages routed to s its brokers have
// not taken.
func (s *site) outstanding() int {
	taken := s.retired
	for _, b := range s.brokers {
		taken += b.taken - b.since
	}
	if s.sent < taken {
		return 0
	}
	return int(s.sent - taken)
}

// brokerNamed returns the state of broker name in brokers, added if new.
func brokerNamed(brokers *[]*brokerState, name string) *brokerState {
	for _, b := range *brokers {
		if b.name == name {
			return b
		}
	}
	b := &brokerState{name: name}
	*brokers = append(*brokers, b)
	return b
}

// merge rebuilds s.merged from the states fresh at now.
func (s *site) merge(now time.Time, staleAfter time.Duration) {
	s.merged = s.merged[:0]
	s.mergedUntil = now.Add(staleAfter)
	s.publishes = 0
	for _, b := range s.brokers {
		if now.Sub(b.arrived) > staleAfter {
			continue
		}
		s.publishes += b.publishes
		if until := b.arrived.Add(staleAfter); until.Before(s.mergedUntil) {
			s.mergedUntil = until
		}
		shift := s.arrived.Sub(b.arrived) // how much older than the newest
		for _, m := range b.members {
			m.PredictedWait = max(m.PredictedWait-shift, 0)
			s.merged = append(s.merged, m)
		}
	}
}

// Router holds the other sites' states for one work group and chooses
// where each message goes. It is safe for concurrent use.
type Router struct {
	cfg      Config
	mu       sync.Mutex
	sites    []*site
	siblings []*brokerState
	// wantSince is when the current demand for the other sites' states
	// began (Demand); zero while there is none.
	wantSince time.Time
}

// NewRouter returns a Router with no site known.
func NewRouter(cfg Config) *Router {
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = 2500 * time.Millisecond
	}
	if cfg.Credit <= 0 {
		cfg.Credit = cfg.StaleAfter / 3
	}
	return &Router{cfg: cfg}
}

// Observe records st, which arrived at arrived. A site of several
// brokers is predicted with all their members whose states are fresh.
// A state of the Router's own broker is ignored; one of its siblings
// (another broker of its site) is kept for AppendSiblings.
func (r *Router) Observe(st State, arrived time.Time) {
	members := make([]scoring.MemberSnapshot, len(st.Members))
	for i, m := range st.Members {
		members[i] = m.snapshot()
	}
	sent := time.Unix(0, st.Sent)
	r.mu.Lock()
	defer r.mu.Unlock()
	if st.Site == r.cfg.Site {
		if st.Broker == r.cfg.Broker {
			return
		}
		b := brokerNamed(&r.siblings, st.Broker)
		if sent.Before(b.sentAt) {
			return
		}
		r.unbookTakenBack(b, st)
		b.members, b.sentAt, b.arrived, b.publishes = members, sent, arrived, st.Publishes
		return
	}
	s := r.find(st.Site)
	if s == nil {
		s = &site{name: st.Site}
		r.sites = append(r.sites, s)
	}
	b := brokerNamed(&s.brokers, st.Broker)
	if sent.Before(b.sentAt) {
		return // overtaken by a newer state
	}
	taken := st.Taken[r.cfg.Site]
	var third uint64
	for origin, n := range st.Taken {
		if origin != r.cfg.Site {
			third += n
		}
	}
	switch {
	case !b.heard:
		b.since, b.heard = taken, true
	case st.Boot != b.boot:
		// A restarted broker counts from zero: what it had not finished
		// is requeued to the intake, which the states count.
		s.retired += b.taken - b.since
		b.since = 0
		s.racing.AddN(arrived, float64(third))
	case third > b.thirdTaken:
		s.racing.AddN(arrived, float64(third-b.thirdTaken))
	}
	b.boot, b.taken, b.thirdTaken = st.Boot, taken, third
	b.members, b.sentAt, b.arrived, b.publishes = members, sent, arrived, st.Publishes
	if !arrived.Before(s.arrived) {
		s.arrived, s.intake = arrived, st.Intake
	}
	s.samples[s.nSample%delaySamples] = max(arrived.Sub(sent), 0)
	s.nSample++
	s.delay = s.samples[0]
	for i := 1; i < min(s.nSample, delaySamples); i++ {
		s.delay = min(s.delay, s.samples[i])
	}
	s.merge(s.arrived, r.cfg.StaleAfter)
}

// unbookTakenBack unbooks what sibling b took back, by st, of the
// messages the Router's broker had booked: what its counts grew by since
// its last state. The counts of a sibling first heard of are only
// recorded (what they count may have been unbooked before this Router
// started); a restarted sibling counts from zero.
func (r *Router) unbookTakenBack(b *brokerState, st State) {
	mine := st.Unbooked[r.cfg.Broker]
	switch {
	case !b.heard:
		b.heard = true
	case st.Boot != b.boot:
		b.unbooked = nil
		fallthrough
	default:
		for name, n := range mine {
			if prev := b.unbooked[name]; n > prev {
				if s := r.find(name); s != nil {
					s.sent -= min(s.sent, n-prev)
				}
			}
		}
	}
	b.boot = st.Boot
	b.unbooked = maps.Clone(mine)
}

// AppendSiblings appends to dst the online members of the other brokers
// of the Router's own site whose states are fresh at now, their waits as
// of now: a message queued at the site is started by whichever broker's
// member frees first. It also returns the sum of those brokers'
// publish rates (State.Publishes). It allocates only when dst has no
// room.
func (r *Router) AppendSiblings(now time.Time, dst []scoring.MemberSnapshot) ([]scoring.MemberSnapshot, float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	publishes := 0.0
	for _, b := range r.siblings {
		age := now.Sub(b.arrived)
		if age > r.cfg.StaleAfter {
			continue
		}
		publishes += b.publishes
		for _, m := range b.members {
			m.PredictedWait = max(m.PredictedWait-age, 0)
			dst = append(dst, m)
		}
	}
	return dst, publishes
}

func (r *Router) find(name string) *site {
	for _, s := range r.sites {
		if s.name == name {
			return s
		}
	}
	return nil
}

// fresh reports whether s has a state fresh at now, and drops from its
// merged members those whose states have gone stale since.
func (r *Router) fresh(s *site, now time.Time) bool {
	if now.Sub(s.arrived) > r.cfg.StaleAfter {
		return false
	}
	if now.After(s.mergedUntil) {
		s.merge(now, r.cfg.StaleAfter)
	}
	return true
}

// Choice is a Router's answer for one message.
type Choice struct {
	// Site is where the message goes; empty: it stays at the local site.
	Site string
	// Start is the predicted time from now until a member starts it,
	// delay included.
	Start time.Duration
	// Fresh is false when no other site's state is fresh and predictable:
	// the Router knows nothing, and the caller follows its old rule.
	Fresh bool
	// Due is when the Router expects the message at Site: now plus the
	// one-way delay estimate. It counts a message started then if a
	// member is free (site.start); the site, which knows when it took the
	// message, compares its members with that (Extrapolates).
	Due time.Time
}

// Route chooses where a message published now goes: the other site whose
// one-way delay plus predicted wait is least, if it is less than local
// (the local members' predicted wait), else the local site. When local
// exceeds localLimit — the message would outlive its TTL in the local
// queue and leave through the hash ring, to a site drawn by weight — it
// goes to the best other site whatever its start. A message
// routed to another site counts ahead of the next ones there until
// that site's state shows it taken. Sites whose state is stale or
// unpredictable (a member without a service time) are not candidates.
// It allocates nothing.
func (r *Router) Route(now time.Time, local, localLimit time.Duration) Choice {
	return r.RouteWeighed(now, local, local, localLimit)
}

// RouteWeighed is Route with a second price of staying home: a site
// where a member would start the message on arrival (no wait there, only
// the delay) is compared with localCost rather than local. localCost
// (LocalCost, at least local) counts that a local member left for the
// next publish is not lost while other sites have members free; a site
// where the message would queue is compared with local itself, since the
// local members' time is then what the sites are short of.
func (r *Router) RouteWeighed(now time.Time, local, localCost, localLimit time.Duration) Choice {
	r.mu.Lock()
	defer r.mu.Unlock()
	localCost = max(localCost, local)
	mustLeave := local > localLimit
	var best *site
	var bestStart time.Duration
	known := false // some site is fresh and predictable
	for _, s := range r.sites {
		if !r.fresh(s, now) {
			continue
		}
		limit := localCost
		if mustLeave {
			limit = maxPrediction
		}
		if best != nil {
			limit = min(limit, bestStart)
		}
		start, ok := s.start(now, limit, r.cfg.Credit)
		if !ok {
			continue
		}
		known = true
		beats := mustLeave || start < local || (start <= s.delay && start < localCost)
		if beats && (best == nil || start < bestStart) {
			best, bestStart = s, start
		}
	}
	if best == nil {
		return Choice{Start: local, Fresh: known}
	}
	best.sent++
	best.sends[best.nSends%maxTrackedSends] = now
	best.nSends++
	return Choice{Site: best.name, Start: bestStart, Fresh: true, Due: now.Add(best.delay)}
}

// SiteView is what a Router knows of one other site at a moment: the
// inputs of its choice, for tracing it.
type SiteView struct {
	Site string
	// Age is how long ago its last state arrived; a state older than
	// Config.StaleAfter is ignored.
	Age time.Duration
	// Delay is the one-way delay estimate.
	Delay time.Duration
	// Intake is the other sites' messages its last state counted in its
	// intake; Outstanding, the messages routed to it that its last state
	// did not count as taken. A message sent now waits behind the more.
	Intake, Outstanding int
	// Members and Idle count its online members and those idle (no
	// predicted wait) in its last state.
	Members, Idle int
	// Start is the predicted time from now until a member starts a
	// message sent now, delay included; ok is false when its state is
	// stale or unpredictable.
	Start time.Duration
	OK    bool
}

// Views appends to dst what the Router knows of each other site at now.
func (r *Router) Views(now time.Time, dst []SiteView) []SiteView {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.sites {
		v := SiteView{Site: s.name, Age: now.Sub(s.arrived), Delay: s.delay, Intake: s.intake, Outstanding: s.outstanding()}
		if r.fresh(s, now) {
			v.Start, v.OK = s.start(now, maxPrediction, r.cfg.Credit)
		}
		v.Members = len(s.merged)
		for _, m := range s.merged {
			if m.PredictedWait == 0 {
				v.Idle++
			}
		}
		dst = append(dst, v)
	}
	return dst
}

// Unbook takes back one message Route sent to site that was not sent
// after all.
func (r *Router) Unbook(site string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.find(site); s != nil && s.sent > 0 {
		s.sent--
	}
}

// StaleSites appends to dst the other sites whose newest state arrived
// more than after before now: sites heard of once whose brokers all went
// silent (a site down, its node gone, or the links to it cut). States
// come on demand, so silence counts only once the demand has lasted
// after: before, a live site may not have been asked.
func (r *Router) StaleSites(now time.Time, after time.Duration, dst []string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.wantSince.IsZero() || now.Sub(r.wantSince) <= after {
		return dst
	}
	for _, s := range r.sites {
		if now.Sub(s.arrived) > after {
			dst = append(dst, s.name)
		}
	}
	return dst
}

// Outstanding is how many of the messages Route sent to site (less those
// taken back by Unbook) its brokers have not taken.
func (r *Router) Outstanding(site string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.find(site); s != nil {
		return s.outstanding()
	}
	return 0
}

// FreshSites counts the sites whose state is fresh at now and
// predictable: the candidates of Route.
func (r *Router) FreshSites(now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.sites {
		if !r.fresh(s, now) {
			continue
		}
		if _, ok := PredictStart(s.merged, 0, 0, 0); ok {
			n++
		}
	}
	return n
}

// start predicts how long from now a member of s would start a message
// sent now: the one-way delay, then the wait behind what is ahead there:
// the intake, or the messages routed there and not yet taken, if more
// (they are on the way, or in the intake). The newest of those whose send
// times are known, sent at most credit after the site's last state
// arrived, reach the site one delay after they were sent, and a free
// member starts each on arrival. Meanwhile, from the site's state until
// the message arrives, the site's own publishes and the messages third
// sites route there (site.racing) take the members idle when they come.
// It gives up above limit.
func (s *site) start(now time.Time, limit, credit time.Duration) (time.Duration, bool) {
	// The state describes the site at (arrived − delay) in our clock; the
	// message gets there at now + delay, and one sent at t at t + delay.
	elapsed := now.Add(s.delay).Sub(s.arrived.Add(-s.delay))
	out := s.outstanding()
	known := min(out, int(min(s.nSends, maxTrackedSends)))
	var arrivals [maxTrackedSends]time.Duration
	creditUntil := s.arrived.Add(credit)
	for j := range known {
		if sent := s.sends[(s.nSends-uint64(known-j))%maxTrackedSends]; !sent.After(creditUntil) {
			arrivals[j] = sent.Sub(now)
		}
	}
	extra := max(s.intake-out, 0) + out - known
	// The racers expected meanwhile: the start is interpolated between
	// the whole numbers around their count, so that a member likely taken
	// counts in part.
	takers := min((s.publishes+s.racing.PerSecond(now))*elapsed.Seconds(), maxIdleTakers)
	whole := int(takers)
	limit = max(limit-s.delay, 0)
	wait, ok := predictStartAfter(s.merged, elapsed, extra, arrivals[:known], whole, limit)
	if !ok {
		return 0, false
	}
	if part := takers - float64(whole); part > 0 && wait <= limit {
		if next, ok := predictStartAfter(s.merged, elapsed, extra, arrivals[:known], whole+1, limit); ok {
			wait += time.Duration(part * float64(next-wait))
		}
	}
	return s.delay + wait, true
}

// maxIdleTakers bounds how many racers site.start counts.
const maxIdleTakers = 16
