package scoring

import (
	"sync"
	"sync/atomic"
	"time"
)

// group is one shared subscription (`$share/<group>/<filter>`): its online
// members in join order, the offline ones whose sessions survive, and the
// per-group state of the strategies. The membership lists change only
// under the engine's write lock; mu guards the selection state.
type group struct {
	mu         sync.Mutex
	key        string
	members    []*member // online members
	selections []uint64  // messages selected per online member, same order
	offline    []*member
	// total selections per member ID survive offline periods and removal
	// from members; kept for the status API.
	totals map[string]uint64

	nextRoundRobin int
	// runnerUp is the index of the adaptive strategy's second choice at
	// the last selection in a sampled group, joined to the next sample
	// while runnerUpMember is still at that index.
	runnerUp       int
	runnerUpMember *member
	nextOffline    int
	sticky         *member
	rng            uint64
	// freed holds the indices of the members that last showed a free
	// worker (an acknowledgement, a report of going idle), newest at
	// freedNext-1, until they are given a message (-1: none): a sampled
	// selection compares them too, so a member that has just freed up is
	// not missed by the draw. Written without mu by acks and reports; an
	// index gone stale is only one more candidate.
	freed     [freedHints]atomic.Int32
	freedNext atomic.Uint32

	// The adaptive prior (Engine.groupPrior) cached until the membership or
	// a member's estimate changes, or until priorUntil, when a member it
	// counts turns stale.
	prior      time.Duration
	priorValid atomic.Bool // cleared without mu by reports and acks
	priorUntil time.Duration
}

// invalidatePrior makes the next selection recompute the prior.
func (g *group) invalidatePrior() { g.priorValid.Store(false) }

// freedHints is how many recently freed members a group remembers.
const freedHints = 4

func newGroup(key string, seed uint64) *group {
	g := &group{key: key, rng: seed | 1, totals: make(map[string]uint64)}
	for i := range g.freed {
		g.freed[i].Store(-1)
	}
	return g
}

// takeFreed forgets the member at index i, which has just been given a
// message: it is no longer known to be free.
func (g *group) takeFreed(i int32) {
	for k := range g.freed {
		if g.freed[k].Load() == i { // a load is cheaper than a swap
			g.freed[k].CompareAndSwap(i, -1)
		}
	}
}

// noteFreed remembers that the member at index i has a free worker.
func (g *group) noteFreed(i int32) {
	if g.freed[(g.freedNext.Load()+freedHints-1)%freedHints].Load() == i {
		return // already the newest
	}
	g.freed[(g.freedNext.Add(1)-1)%freedHints].Store(i)
}

func (g *group) empty() bool { return len(g.members) == 0 && len(g.offline) == 0 }

func (g *group) indexOf(list []*member, m *member) int {
	for i, x := range list {
		if x == m {
			return i
		}
	}
	return -1
}

// add adds m (online or not, as m says) and reports whether it was new.
func (g *group) add(m *member) bool {
	if g.indexOf(g.members, m) >= 0 || g.indexOf(g.offline, m) >= 0 {
		return false
	}
	g.invalidatePrior()
	if m.online {
		g.members = append(g.members, m)
		g.selections = append(g.selections, 0)
	} else {
		g.offline = append(g.offline, m)
	}
	return true
}

func (g *group) remove(m *member) {
	g.invalidatePrior()
	if i := g.indexOf(g.members, m); i >= 0 {
		g.members = append(g.members[:i], g.members[i+1:]...)
		g.selections = append(g.selections[:i], g.selections[i+1:]...)
	}
	if i := g.indexOf(g.offline, m); i >= 0 {
		g.offline = append(g.offline[:i], g.offline[i+1:]...)
	}
	if g.sticky == m {
		g.sticky = nil
	}
	delete(g.totals, m.id)
}

func (g *group) setOnline(m *member, online bool) {
	g.invalidatePrior()
	if online {
		if i := g.indexOf(g.offline, m); i >= 0 {
			g.offline = append(g.offline[:i], g.offline[i+1:]...)
			g.members = append(g.members, m)
			g.selections = append(g.selections, 0)
		}
		return
	}
	if i := g.indexOf(g.members, m); i >= 0 {
		g.totals[m.id] += g.selections[i]
		g.members = append(g.members[:i], g.members[i+1:]...)
		g.selections = append(g.selections[:i], g.selections[i+1:]...)
		g.offline = append(g.offline, m)
		if g.sticky == m {
			g.sticky = nil
		}
	}
}

// random returns a pseudo-random number below n (n > 0).
func (g *group) random(n int) int {
	return int(splitmix(&g.rng) % uint64(n))
}

// nextUnderReceiveMaximum returns the first member after idx (in join
// order, wrapping) that is below its Receive Maximum, or idx if none is.
func (g *group) nextUnderReceiveMaximum(idx int) int {
	n := len(g.members)
	for k := 1; k < n; k++ {
		if i := (idx + k) % n; !g.members[i].lockedAtReceiveMaximum() {
			return i
		}
	}
	return idx
}
