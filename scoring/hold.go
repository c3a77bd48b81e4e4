package scoring

import "time"

// Late binding. When every member of a group is predicted busy, a message
// handed to one of them now would only wait in that member's queue, and
// the choice would be made on what the broker knows now. Held at the
// broker instead and handed over shortly before the chosen member is
// predicted to be free, it starts no later (the lead covers the trip to
// the member) and goes to whoever is then known to start it soonest: a
// report or an acknowledgement that arrives meanwhile, or a member that
// joins, can change the choice. This is what a work queue with a small
// prefetch does, decided with the adaptive model.

// HoldAdvice says whether a message for a group should wait at the broker.
type HoldAdvice struct {
	// Hold is true when the message should wait.
	Hold bool
	// RecheckAfter is when to ask again at the latest, if nothing the
	// engine learns meanwhile changes the answer.
	RecheckAfter time.Duration
}

// AdviseHold tells whether a message for the group keyed by groupKey should
// be held at the broker now (see Config.HoldLead). It is never true for a
// strategy other than adaptive, for a group without online members, or when
// the member that would be chosen has no service estimate of its own
// (handing it a message is how the engine learns it) or has one learnt from
// its acknowledgements: many clients send those in batches (paho.golang
// every 50 ms), and a member handed one message at a time would then
// seem to take a whole batch interval per message. It does not allocate
// and books nothing.
func (e *Engine) AdviseHold(groupKey string) HoldAdvice {
	if e.cfg.HoldLead <= 0 {
		return HoldAdvice{}
	}
	if _, adaptive := e.strategy.(adaptiveStrategy); !adaptive {
		return HoldAdvice{}
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	g, ok := e.groups[groupKey]
	if !ok || len(g.members) == 0 {
		return HoldAdvice{}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := e.now()
	_, best := bestCandidate(e, g, now)
	return e.holdAdvice(best, now)
}

// holdAdvice is the advice for a group whose best candidate is best.
func (e *Engine) holdAdvice(best candidate, now time.Duration) HoldAdvice {
	if best.index < 0 || best.capped || !best.known || best.fromAcks {
		return HoldAdvice{}
	}
	if wait := best.start - now; wait > e.cfg.HoldLead {
		return HoldAdvice{Hold: true, RecheckAfter: wait - e.cfg.HoldLead}
	}
	return HoldAdvice{}
}
