package scoring

import "time"

// Strategy picks the member of a shared group that receives a message.
// Strategies are stateless values; per-group state lives in the group.
// selectIndex is called with the engine locked, on a group with at least
// one online member, and returns an index into its online members.
type Strategy interface {
	Name() string
	selectIndex(e *Engine, g *group, msg Message, now time.Duration) int
}

var strategies = []Strategy{
	adaptiveStrategy{},
	thesisStrategy{},
	roundRobinStrategy{},
	randomStrategy{},
	stickyStrategy{},
	shortestQueueStrategy{},
	powerOfTwoStrategy{},
	hashStrategy{name: "hash-clientid", key: func(m Message) string { return m.PublisherID }},
	hashStrategy{name: "hash-topic", key: func(m Message) string { return m.Topic }},
}

// roundRobinStrategy hands members messages in turn.
type roundRobinStrategy struct{}

func (roundRobinStrategy) Name() string { return "round-robin" }

func (roundRobinStrategy) selectIndex(_ *Engine, g *group, _ Message, _ time.Duration) int {
	i := g.nextRoundRobin % len(g.members)
	g.nextRoundRobin = i + 1
	return i
}

// randomStrategy picks a member uniformly at random.
type randomStrategy struct{}

func (randomStrategy) Name() string { return "random" }

func (randomStrategy) selectIndex(_ *Engine, g *group, _ Message, _ time.Duration) int {
	return g.random(len(g.members))
}

// shortestQueueStrategy is join-the-shortest-queue, the classical policy,
// on what the broker knows of each member's queue (member.outstanding):
// the member holding the fewest messages wins; ties go to the first after
// a rotating start, so equal members take turns.
type shortestQueueStrategy struct{}

func (shortestQueueStrategy) Name() string { return "jsq" }

func (shortestQueueStrategy) selectIndex(_ *Engine, g *group, _ Message, _ time.Duration) int {
	n := len(g.members)
	from := g.nextRoundRobin % n
	g.nextRoundRobin = from + 1
	best, bestQueue := from, g.members[from].outstanding()
	for k := 1; k < n; k++ {
		i := (from + k) % n
		if q := g.members[i].outstanding(); q < bestQueue {
			best, bestQueue = i, q
		}
	}
	return best
}

// powerOfTwoStrategy is the power of two choices: two members drawn at
// random, the one holding fewer messages (member.outstanding) wins, the
// first drawn on a tie. It needs O(1) per message at any group size and
// herds far less than join-the-shortest-queue on stale counts.
type powerOfTwoStrategy struct{}

func (powerOfTwoStrategy) Name() string { return "power-of-two" }

func (powerOfTwoStrategy) selectIndex(_ *Engine, g *group, _ Message, _ time.Duration) int {
	n := len(g.members)
	if n == 1 {
		return 0
	}
	a := g.random(n)
	b := g.random(n - 1)
	if b >= a {
		b++ // two distinct members
	}
	if g.members[b].outstanding() < g.members[a].outstanding() {
		return b
	}
	return a
}

// stickyStrategy keeps sending to one member until it leaves or goes
// offline, then picks another at random.
type stickyStrategy struct{}

func (stickyStrategy) Name() string { return "sticky" }

func (stickyStrategy) selectIndex(_ *Engine, g *group, _ Message, _ time.Duration) int {
	if g.sticky != nil {
		if i := g.indexOf(g.members, g.sticky); i >= 0 {
			return i
		}
	}
	i := g.random(len(g.members))
	g.sticky = g.members[i]
	return i
}

// hashStrategy sends every message with the same key (publisher client ID
// or topic) to the same member while the membership does not change.
type hashStrategy struct {
	name string
	key  func(Message) string
}

func (s hashStrategy) Name() string { return s.name }

func (s hashStrategy) selectIndex(_ *Engine, g *group, msg Message, _ time.Duration) int {
	return int(fnv1a(s.key(msg)) % uint64(len(g.members)))
}

func fnv1a(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// thesisStrategy is the score of algorithms.md §1.4, exactly:
//
//	t1 = now − t_s;  t2 = now − t_r
//	back = max((m_q + m_s)·t_p − t2, 0);  score = t1 − back
//
// with the group's mean t_p standing in for members whose t_p is 0. The
// highest score wins; with no backlog anywhere it is round robin.
type thesisStrategy struct{}

func (thesisStrategy) Name() string { return "thesis" }

func (thesisStrategy) selectIndex(_ *Engine, g *group, _ Message, now time.Duration) int {
	var sum time.Duration
	var known int
	for _, m := range g.members {
		m.mu.Lock()
		if tp := m.thesisProcessingTime(); tp > 0 {
			sum += tp
			known++
		}
		m.mu.Unlock()
	}
	var groupMean time.Duration
	if known > 0 {
		groupMean = sum / time.Duration(known)
	}
	best, bestScore := 0, time.Duration(0)
	for i, m := range g.members {
		m.mu.Lock()
		score := thesisScore(m, now, groupMean)
		m.mu.Unlock()
		if i == 0 || score > bestScore {
			best, bestScore = i, score
		}
	}
	return best
}

// thesisScore is the thesis's score of m at now.
func thesisScore(m *member, now, groupMean time.Duration) time.Duration {
	tp := m.thesisProcessingTime()
	if tp == 0 {
		tp = groupMean
	}
	t1 := now - m.lastSend
	t2 := now - m.lastReport
	back := time.Duration(m.reportedPending+m.sentSinceReport)*tp - t2
	if back < 0 {
		back = 0
	}
	return t1 - back
}

// adaptiveStrategy is LuffyMQ's own. It keeps, per member, a predicted time
// at which the member can start a new message: every message sent adds the
// member's estimated service time, every report re-anchors it to the
// reported queue (plus what is still on the wire), and unacknowledged QoS≥1
// deliveries are a floor on it. The member predicted to start the message
// soonest wins; ties go to the one idle longest, then to the one sent the
// fewest messages since its last report. Members that never reported a
// processing time are assumed to need the group's median and, while any
// other member is available, hold at most NewcomerCap messages until their
// first measurement; one still silent after its oldest message ran longer
// than that median is taken to be slower (halfway through that message).
// Groups larger than 16 members compare a random sample of 16, with the
// previous runner-up and the last few members that freed up, so one
// selection stays O(1).
type adaptiveStrategy struct{}

func (adaptiveStrategy) Name() string { return "adaptive" }

// maxSample bounds Config.SampleSize.
const maxSample = 16

func (adaptiveStrategy) selectIndex(e *Engine, g *group, _ Message, now time.Duration) int {
	best, _ := bestCandidate(e, g, now)
	return best
}

// candidate is what the adaptive strategy knows of one member when it
// compares them.
type candidate struct {
	index  int
	start  time.Duration // predicted start of a message handed to it now
	svc    time.Duration // its service estimate (or the group's prior)
	held   int
	free   time.Duration
	sent   int
	capped bool
	known  bool // it has a service estimate of its own
	// fromAcks is true when its service estimate is learnt from its
	// acknowledgements rather than from its reports.
	fromAcks bool
}

// bestCandidate returns the member of g (with online members) that the
// adaptive strategy would choose at now. It does not change any state but
// the sampling pointer of a large group; g's lock is held.
func bestCandidate(e *Engine, g *group, now time.Duration) (int, candidate) {
	n := len(g.members)
	prior := time.Duration(-1) // computed on first need (a member without an estimate)
	var candidates [maxSample + freedHints]int
	count := n
	if n > exhaustiveLimit {
		count = e.cfg.SampleSize
		for i := 0; i < count; i++ {
			candidates[i] = g.random(n)
		}
		// The round-robin pointer joins the sample so no member starves.
		candidates[0] = g.nextRoundRobin % n
		g.nextRoundRobin++
		// So does the runner-up of the previous selection (sampling with
		// memory): a good member found once is not lost to the draw.
		if r := g.runnerUp; r < n && g.members[r] == g.runnerUpMember && count > 1 {
			candidates[1] = r
		}
		// So do the members that freed up last (group.freed): when a few
		// of many are idle, a draw of 16 may miss them all.
		for k := 0; k < freedHints; k++ {
			if i := g.freed[k].Load(); i >= 0 && int(i) < n {
				candidates[count] = int(i)
				count++
			}
		}
	}
	best := candidate{index: -1, capped: true}
	second := candidate{index: -1, capped: true}
	for k := 0; k < count; k++ {
		i := k
		if n > exhaustiveLimit {
			i = candidates[k]
		}
		m := g.members[i]
		m.mu.Lock()
		if prior < 0 && !m.hasService() {
			// Only a member without an estimate needs the prior, which
			// reads the others' locks: every ack that teaches an
			// estimate invalidates it, and recomputing it for a group of
			// known members cost more than the selection itself.
			m.mu.Unlock()
			prior = e.groupPrior(g, now) // cached: O(1) between changes
			m.mu.Lock()
		}
		c := candidate{index: i, svc: m.serviceOr(max(prior, 0)), known: m.hasService()}
		c.start = m.predictedStart(now, c.svc, e.cfg.StaleAfter)
		c.held = m.held(now, c.start, c.svc)
		c.capped = (!c.known || m.unproven()) && c.held >= e.cfg.NewcomerCap
		if c.known {
			// The model's count breaks ties only while nothing is known;
			// then what the member was sent and has not said it finished
			// does: the deliveries not acknowledged, where acks mark
			// finished work, or, for a member that reports going idle at
			// once (the SDK), what its last report held and what it was
			// sent since. A member predicted free with one of those may
			// not be; one with none is.
			switch {
			case m.qosDeliveries == 0 && m.reportsIdle:
				c.held = m.heldByReport()
			case m.acksAreFinishes:
				c.held = m.inflight
			default:
				c.held = 0
			}
		}
		c.free = m.freeAt
		c.sent = m.sentSinceReport
		c.fromAcks = m.learnsFromAcks()
		m.mu.Unlock()
		if best.index < 0 || better(c.capped, c.start, c.held, c.free, c.sent, best.capped, best.start, best.held, best.free, best.sent) {
			best, second = c, best
		} else if c.index != best.index && (second.index < 0 || better(c.capped, c.start, c.held, c.free, c.sent, second.capped, second.start, second.held, second.free, second.sent)) {
			second = c
		}
	}
	if n > exhaustiveLimit && second.index >= 0 {
		g.runnerUp, g.runnerUpMember = second.index, g.members[second.index]
	}
	return best.index, best
}

// better reports whether candidate a beats b: uncapped first, then the
// earlier predicted start, then the one holding fewer messages (with
// nothing known yet, the model's count; known, what it has not said it
// finished: its unacknowledged deliveries where acks mark finished work,
// or, where it reports going idle at once, what its last report held and
// was sent since), then the one idle longest, then
// the one sent fewer messages since its last report (so that a burst at one
// instant is spread instead of all going to the first member).
func better(aCapped bool, aStart time.Duration, aHeld int, aFree time.Duration, aSent int,
	bCapped bool, bStart time.Duration, bHeld int, bFree time.Duration, bSent int) bool {
	if aCapped != bCapped {
		return !aCapped
	}
	if aStart != bStart {
		return aStart < bStart
	}
	if aHeld != bHeld {
		return aHeld < bHeld
	}
	if aFree != bFree {
		return aFree < bFree
	}
	return aSent < bSent
}
