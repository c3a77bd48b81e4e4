package hooks

import (
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/luffymq/luffymq/scoring"
)

// Late binding: when every member of a shared group is predicted busy, the
// engine advises holding a message at the broker (scoring.AdviseHold)
// rather than queueing it at a member chosen on what is known now. The
// hook keeps such messages in one FIFO per group and hands each over,
// oldest first, once the engine no longer advises holding it: shortly
// before a member is predicted to be free, or at once when a report, an
// acknowledgement or a new member changes the prediction. It is then
// published again as the LateBindingOrigin client to that group only, and
// the engine selects its receiver as for any message.
//
// Held messages are in memory only: with --data-dir they are not stored
// (the broker turns late binding off then). A held message keeps its
// publish time, so its expiry still counts from it. Messages of one
// publisher to one group keep their order: while a group holds messages,
// every new message for it waits behind them.

// LateBindingOrigin is the client ID held messages are published as when
// they are handed over; it is never a connected client.
const LateBindingOrigin = "$luffymq-late-binding"

// MaxHeldMessages bounds the messages held across all groups; beyond it a
// message is handed to a member at once.
const MaxHeldMessages = 100000

// LateBindingCounters counts what late binding did.
type LateBindingCounters struct {
	// Held counts messages held at the broker.
	Held atomic.Uint64
	// Released counts held messages handed to a member.
	Released atomic.Uint64
	// Overflow counts messages handed over at once because
	// MaxHeldMessages were held.
	Overflow atomic.Uint64
	// Dropped counts held QoS 0 messages whose group had no member left
	// when they were handed over (QoS 1 and 2 ones wait for the next member,
	// as re-dispatched messages do).
	Dropped atomic.Uint64
	// Current is how many messages are held now.
	Current atomic.Int64
}

// lateBinder holds the messages of groups whose members are all busy.
type lateBinder struct {
	mu     sync.Mutex
	queues map[string][]packets.Packet // by group filter, oldest first
	held   int
	// Made by NewSelectionHook; the goroutine starts with the first held
	// message.
	wake     chan struct{} // buffered: a pending "look again"
	stop     chan struct{}
	done     chan struct{}
	start    sync.Once
	started  atomic.Bool
	stopOnce sync.Once

	// Injection state, one message at a time (inject holds injectMu):
	// OnSelectSubscribers, on the same goroutine, reads group.
	injectMu  sync.Mutex
	inline    *mqtt.Client
	group     string
	delivered bool
}

// lateBindingOn reports whether the engine may advise holding: its
// HoldLead, fixed when it was made, read once by NewSelectionHook (Config
// copies the whole configuration, on every message otherwise).
func (h *SelectionHook) lateBindingOn() bool { return h.holdLead }

// holdOrSelect handles one matched group of a publish: it selects the
// receiving member, or holds the message (and returns false) when the
// group already holds messages or the engine advises holding.
func (h *SelectionHook) holdOrSelect(filter string, pk packets.Packet) (clientID string, held, ok bool) {
	lb := &h.late
	lb.mu.Lock()
	queued := len(lb.queues[filter]) > 0
	lb.mu.Unlock()
	if !queued {
		id, advice, ok := h.cfg.Engine.SelectMemberOrHold(filter, scoringMessage(pk))
		if !ok || !advice.Hold {
			return id, false, ok
		}
	}
	if !h.hold(filter, pk) {
		id, ok := h.cfg.Engine.SelectMember(filter, scoringMessage(pk))
		return id, false, ok
	}
	return "", true, true
}

// scoringMessage is what the engine is told of a message.
func scoringMessage(pk packets.Packet) scoring.Message {
	return scoring.Message{PublisherID: pk.Origin, Topic: pk.TopicName}
}

// hold appends a copy of pk to the group's FIFO; false when
// MaxHeldMessages are held.
func (h *SelectionHook) hold(filter string, pk packets.Packet) bool {
	lb := &h.late
	lb.start.Do(func() { h.startLateBinder() })
	out := pk.Copy(false)
	out.FixedHeader.Retain = false // stored as retained already, if it was
	out.PacketID = 0               // Mochi requires none at QoS 0 ...
	if out.FixedHeader.Qos > 0 {
		out.PacketID = 1 // ... and one at QoS 1 and 2 (ignored for an inline publish)
	}
	out.Properties.TopicAlias, out.Properties.TopicAliasFlag = 0, false
	out.Properties.SubscriptionIdentifier = nil
	lb.mu.Lock()
	if lb.held >= MaxHeldMessages {
		lb.mu.Unlock()
		h.LateBinding.Overflow.Add(1)
		return false
	}
	if lb.queues == nil {
		lb.queues = make(map[string][]packets.Packet)
	}
	lb.queues[filter] = append(lb.queues[filter], out)
	lb.held++
	lb.mu.Unlock()
	h.LateBinding.Held.Add(1)
	h.LateBinding.Current.Add(1)
	h.wakeLateBinder()
	return true
}

// wakeLateBinder asks the late binder to look at its queues again: the
// engine learnt something (a report, an acknowledgement, a member).
func (h *SelectionHook) wakeLateBinder() {
	if !h.late.started.Load() {
		return
	}
	select {
	case h.late.wake <- struct{}{}:
	default:
	}
}

func newLateBinder() lateBinder {
	return lateBinder{wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

func (h *SelectionHook) startLateBinder() {
	h.late.started.Store(true)
	go h.runLateBinder()
}

// runLateBinder hands held messages over when the engine allows it, and
// sleeps until the earliest time it advised asking again, or until woken.
func (h *SelectionHook) runLateBinder() {
	lb := &h.late
	defer close(lb.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := h.releaseHeld()
		if next > 0 {
			timer.Reset(next)
		} else {
			timer.Stop()
		}
		select {
		case <-lb.stop:
			return
		case <-lb.wake:
		case <-timer.C:
		}
	}
}

// releaseHeld hands over every held message the engine no longer advises
// holding, oldest first per group, and returns when to look again (0: no
// message held).
func (h *SelectionHook) releaseHeld() time.Duration {
	lb := &h.late
	var next time.Duration
	lb.mu.Lock()
	groups := make([]string, 0, len(lb.queues))
	for filter := range lb.queues {
		groups = append(groups, filter)
	}
	lb.mu.Unlock()
	for _, filter := range groups {
		for {
			lb.mu.Lock()
			queue := lb.queues[filter]
			if len(queue) == 0 {
				delete(lb.queues, filter)
				lb.mu.Unlock()
				break
			}
			advice := h.cfg.Engine.AdviseHold(filter)
			if advice.Hold {
				lb.mu.Unlock()
				if next == 0 || advice.RecheckAfter < next {
					next = advice.RecheckAfter
				}
				break
			}
			pk := queue[0]
			queue[0] = packets.Packet{}
			lb.queues[filter] = queue[1:]
			lb.held--
			lb.mu.Unlock()
			h.LateBinding.Current.Add(-1)
			h.releaseTo(filter, pk)
		}
	}
	return next
}

// releaseTo publishes a held message again to its group only. A QoS≥1
// message whose group has no member left waits in re-dispatch's parking
// for the next member, as a departed member's message would; a QoS 0 one
// is dropped.
func (h *SelectionHook) releaseTo(filter string, pk packets.Packet) {
	lb := &h.late
	lb.injectMu.Lock()
	if lb.inline == nil {
		lb.inline = h.cfg.Server.NewClient(nil, "local", LateBindingOrigin, true)
		lb.inline.Properties.ProtocolVersion = 5
	}
	lb.group, lb.delivered = filter, false
	err := h.cfg.Server.InjectPacket(lb.inline, pk)
	delivered := lb.delivered && err == nil
	lb.group = ""
	lb.injectMu.Unlock()
	if err == nil {
		// Mochi counts an injected publish as received: this one was
		// received once already, when it was held.
		atomic.AddInt64(&h.cfg.Server.Info.PacketsReceived, -1)
		atomic.AddInt64(&h.cfg.Server.Info.MessagesReceived, -1)
	}
	if delivered {
		h.LateBinding.Released.Add(1)
		return
	}
	if err != nil {
		h.Log.Warn("could not hand a held message over", "group", filter, "topic", pk.TopicName, "error", err)
	}
	if pk.FixedHeader.Qos == 0 {
		// As Mochi does with a QoS 0 message nobody can receive.
		h.LateBinding.Dropped.Add(1)
		return
	}
	h.inject(filter, "", pk) // re-dispatch parks it until a member joins
}

// restrictToLateBoundGroup narrows the subscribers of a held message being
// handed over to its group. It reports whether subs is such a message's,
// from the message's origin.
func (h *SelectionHook) restrictToLateBoundGroup(subs *mqtt.Subscribers, origin string) bool {
	if origin != LateBindingOrigin {
		return false
	}
	// Called on the injecting goroutine, which holds injectMu.
	lb := &h.late
	clear(subs.Subscriptions)
	clear(subs.InlineSubscriptions)
	for filter, members := range subs.Shared {
		if filter != lb.group || len(members) == 0 {
			delete(subs.Shared, filter)
			continue
		}
		lb.delivered = true
	}
	return true
}

// stopLateBinder stops the late binder's goroutine; held messages are
// dropped with the broker.
func (h *SelectionHook) stopLateBinder() {
	lb := &h.late
	lb.start.Do(func() {}) // no goroutine starts after this
	if lb.started.Load() {
		lb.stopOnce.Do(func() { close(lb.stop) })
		<-lb.done
	}
}

// HeldMessages is how many messages late binding holds now.
func (h *SelectionHook) HeldMessages() int {
	return int(h.LateBinding.Current.Load())
}
