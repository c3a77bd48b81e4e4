package wqroute

import (
	"slices"
	"time"
)

// States on demand. A site needs the other sites' states only while it
// may send them work or waits to hear what they took of it: while a
// message published now could start sooner elsewhere than at home (its
// local members would not start it within the least one-way delay to
// another site), while messages wait in its work queue, and while
// messages it routed are not yet taken (Router.Demand). Its brokers then
// ask for the states with a Want every few intervals; each broker that
// hears it grants that site a lease (Leases) and addresses its states to
// it until the lease runs out. A site whose members keep up thus costs
// the WAN no state traffic at all.

// Want asks the other sites' brokers of a group for their states.
type Want struct {
	// Site and Broker name the asking broker.
	Site   string `json:"site"`
	Broker string `json:"broker"`
	// LeaseMs is how long, from its arrival, the states are wanted
	// (milliseconds).
	LeaseMs int64 `json:"lease_ms"`
}

// Lease is w's lease as a duration.
func (w Want) Lease() time.Duration { return time.Duration(w.LeaseMs) * time.Millisecond }

// Leases records which other sites want a broker's states, and until
// when. It is not safe for concurrent use.
type Leases struct {
	until map[string]time.Time
}

// Grant records that site wants the states until until. It reports
// whether site held no lease at now: its states are then due at once.
func (l *Leases) Grant(site string, now, until time.Time) bool {
	if l.until == nil {
		l.until = map[string]time.Time{}
	}
	prev, held := l.until[site]
	fresh := !held || !now.Before(prev)
	if until.After(prev) {
		l.until[site] = until
	}
	return fresh
}

// Holders appends to dst, in name order, the sites whose lease runs at
// now, and forgets the others.
func (l *Leases) Holders(now time.Time, dst []string) []string {
	start := len(dst)
	for site, until := range l.until {
		if now.Before(until) {
			dst = append(dst, site)
		} else {
			delete(l.until, site)
		}
	}
	slices.Sort(dst[start:])
	return dst
}

// Demand reports whether the Router's broker needs the other sites'
// states now: a message that would start after localStart at home may
// start sooner at a site no farther than the least one-way delay known
// (any site when none is known), held messages wait in the work queue
// to be dispatched, or messages routed to a site are not taken yet (its
// states say when they are). It also records, for StaleSites, since
// when the demand has lasted.
func (r *Router) Demand(now time.Time, localStart time.Duration, held int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	want := held > 0
	for _, s := range r.sites {
		if s.outstanding() > 0 {
			want = true
		}
	}
	least, _ := r.leastDelay()
	want = want || localStart > least
	switch {
	case !want:
		r.wantSince = time.Time{}
	case r.wantSince.IsZero():
		r.wantSince = now
	}
	return want
}

// Wanting reports whether the last Demand found a demand.
func (r *Router) Wanting() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.wantSince.IsZero()
}

// LeastDelay is the least one-way delay to another site that the Router
// has heard a state from; known is false when it has heard none.
func (r *Router) LeastDelay() (least time.Duration, known bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leastDelay()
}

// leastDelay is LeastDelay; r.mu is held.
func (r *Router) leastDelay() (least time.Duration, known bool) {
	for _, s := range r.sites {
		if s.nSample > 0 && (!known || s.delay < least) {
			least, known = s.delay, true
		}
	}
	return least, known
}
