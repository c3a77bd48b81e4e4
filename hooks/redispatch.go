package hooks

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Re-dispatch: when a shared-group member goes away with QoS≥1 messages it
// never acknowledged, those messages go to the other members of the group
// instead of dying with its session (as EMQX does).
//
// A message is re-dispatched when the member's session ends (a clean
// session's connection ends, or a persistent session expires) or, for a
// persistent session, after SelectionConfig.RedispatchGrace offline. It is
// taken out of the departed session's in-flight store, so a member that
// reconnects to its living session never gets a second copy, and published
// again through Mochi as the RedispatchOrigin client, DUP set, to that one
// group only: OnSelectSubscribers keeps only the group and leaves the
// departed member out, and the engine selects the receiver as for any
// message. With no other member, the message is parked (at most
// MaxParkedRedispatch, oldest dropped first) until a member joins.
//
// A message taken out of a session is also taken out of the session's
// persistent store, when the broker has one (SetInflightStorage): without
// that, a restart would load it back into the session and send it to the
// member again, after another member already had it.
//
// A connected member that holds a delivery unacknowledged for too long has
// it re-dispatched the same way (see acktimeout.go).
//
// A message counts for the first group (in filter order) of the departed
// member that matches its topic: with overlapping groups Mochi merges the
// member's deliveries into one, and which group selected it is not
// recorded. Messages already received (a QoS 2 delivery past PUBREC) are
// the client's, and are not re-dispatched.

// RedispatchOrigin is the client ID re-dispatched messages are published
// as (their Origin inside the broker); it is never a connected client.
const RedispatchOrigin = "$luffymq-redispatch"

// MaxParkedRedispatch is how many re-dispatched messages wait, across all
// groups, for a group that has no member left.
const MaxParkedRedispatch = 10000

// RedispatchCounters counts what re-dispatch did.
type RedispatchCounters struct {
	// Redispatched counts messages given to another member of their group.
	Redispatched atomic.Uint64
	// Parked counts messages that waited for a group with no member left.
	Parked atomic.Uint64
	// ParkedDropped counts parked messages dropped over MaxParkedRedispatch.
	ParkedDropped atomic.Uint64
	// Unroutable counts unacknowledged messages that could not be
	// re-dispatched (sent under a topic alias, without their topic name).
	Unroutable atomic.Uint64
	// LeftToOwner counts unacknowledged messages of a departed member left
	// to the component that puts them back itself
	// (SelectionConfig.RequeuedElsewhere: the bridge's work queues).
	LeftToOwner atomic.Uint64
	// AckTimeouts counts messages taken from a connected member that did
	// not acknowledge them within the ack timeout (see acktimeout.go); each
	// is also counted as Redispatched or Parked.
	AckTimeouts atomic.Uint64
	// LateAcks counts acknowledgements that arrived, after all, for
	// messages taken away by the ack timeout: the member finished a message
	// another member was given too, a duplicate.
	LateAcks atomic.Uint64
}

// InflightStorage is a persistent store of sessions' in-flight messages
// that re-dispatch tells when it takes a delivery out of a session. Mochi's
// storage hooks (hooks/storage/badger and the others) implement it: they
// delete the message's record in OnQosDropped, which Mochi itself calls only
// for deliveries it drops.
type InflightStorage interface {
	OnQosDropped(cl *mqtt.Client, pk packets.Packet)
}

// parkedMessage is a re-dispatched message waiting for a member.
type parkedMessage struct {
	group string
	pk    packets.Packet
}

// redispatcher holds re-dispatch state. One message is injected at a time:
// OnSelectSubscribers, called from inside the injection on the same
// goroutine, reads group and exclude.
type redispatcher struct {
	mu      sync.Mutex
	inline  *mqtt.Client
	group   string // the group being injected to; "" outside an injection
	exclude string // the departed member
	// avoid are members that are left out too while some other member
	// of the group remains (members stalled on their own deliveries).
	avoid     map[string]struct{}
	delivered bool // a member of group was there to receive it
	parked    []parkedMessage
	// storage is told of deliveries taken out of a session; nil without
	// persistence. Set before the server starts, read-only after.
	storage InflightStorage
}

// SetInflightStorage makes re-dispatch delete what it takes out of a
// session from storage too. Call it before the server starts.
func (h *SelectionHook) SetInflightStorage(s InflightStorage) {
	h.redispatch.storage = s
}

// forgetStored deletes cl's delivery pk, taken out of its session, from
// the persistent store, if any, and from the delivery order.
func (h *SelectionHook) forgetStored(cl *mqtt.Client, pk packets.Packet) {
	h.cfg.DeliveryOrder.Ended(cl.ID, pk.PacketID)
	if s := h.redispatch.storage; s != nil {
		s.OnQosDropped(cl, pk)
	}
}

// redispatchUnacknowledged re-dispatches the QoS≥1 deliveries cl never
// acknowledged, taking them out of its session.
func (h *SelectionHook) redispatchUnacknowledged(cl *mqtt.Client) {
	for _, pk := range cl.State.Inflight.GetAll(false) {
		if pk.FixedHeader.Type != packets.Publish || pk.FixedHeader.Qos == 0 {
			continue
		}
		if pk.TopicName == "" {
			h.Redispatch.Unroutable.Add(1)
			continue
		}
		group, ok := h.groupOf(cl.ID, pk.TopicName)
		if !ok {
			continue // a plain subscription's delivery: the session's own
		}
		if h.requeuedElsewhere(group) {
			h.Redispatch.LeftToOwner.Add(1)
			continue
		}
		if !cl.State.Inflight.Delete(pk.PacketID) {
			continue // acknowledged meanwhile
		}
		atomic.AddInt64(&h.cfg.Server.Info.Inflight, -1)
		h.forgetStored(cl, pk)
		h.inject(group, cl.ID, pk)
	}
}

// requeuedElsewhere reports whether group's deliveries are put back by
// another component (SelectionConfig.RequeuedElsewhere).
func (h *SelectionHook) requeuedElsewhere(group string) bool {
	return h.cfg.RequeuedElsewhere != nil && h.cfg.RequeuedElsewhere(group)
}

// groupOf returns the first shared group, in filter order, of which
// clientID is a member and whose filter matches topic.
func (h *SelectionHook) groupOf(clientID, topic string) (string, bool) {
	subs := h.cfg.Server.Topics.Subscribers(topic)
	var groups []string
	for filter, members := range subs.Shared {
		if _, ok := members[clientID]; ok {
			groups = append(groups, filter)
		}
	}
	if len(groups) == 0 {
		return "", false
	}
	return slices.Min(groups), true
}

// inject publishes pk again to group only, leaving out the member exclude;
// with nobody to receive it, it is parked.
func (h *SelectionHook) inject(group, exclude string, pk packets.Packet) {
	h.injectAvoiding(group, exclude, nil, pk)
}

// injectAvoiding is inject that also leaves out the members in avoid,
// unless they are all that is left of the group besides exclude.
func (h *SelectionHook) injectAvoiding(group, exclude string, avoid map[string]struct{}, pk packets.Packet) {
	out := pk.Copy(false)
	out.FixedHeader.Dup = true
	out.FixedHeader.Retain = false
	out.PacketID = 1 // Mochi ignores it for an inline publish, but checks it is set
	out.Properties.TopicAlias, out.Properties.TopicAliasFlag = 0, false
	out.Properties.SubscriptionIdentifier = nil

	r := &h.redispatch
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inline == nil {
		r.inline = h.cfg.Server.NewClient(nil, "local", RedispatchOrigin, true)
		r.inline.Properties.ProtocolVersion = 5
	}
	// Mochi consults OnSelectSubscribers only when some group matches:
	// without a member of this one, plain subscribers would get a copy.
	delivered := false
	if h.hasOtherMember(group, exclude, out.TopicName) {
		r.group, r.exclude, r.avoid, r.delivered = group, exclude, avoid, false
		err := h.cfg.Server.InjectPacket(r.inline, out)
		delivered = r.delivered && err == nil
		r.group, r.exclude, r.avoid = "", "", nil
	}
	if delivered {
		h.Redispatch.Redispatched.Add(1)
		return
	}
	h.Redispatch.Parked.Add(1)
	if len(r.parked) == MaxParkedRedispatch {
		r.parked[0] = parkedMessage{}
		r.parked = r.parked[1:]
		h.Redispatch.ParkedDropped.Add(1)
	}
	r.parked = append(r.parked, parkedMessage{group: group, pk: out})
}

// hasOtherMember reports whether group has a member besides exclude that
// is subscribed to topic.
func (h *SelectionHook) hasOtherMember(group, exclude, topic string) bool {
	members := h.cfg.Server.Topics.Subscribers(topic).Shared[group]
	_, excluded := members[exclude]
	return len(members) > 0 && !(excluded && len(members) == 1)
}

// restrictToRedispatchGroup narrows the subscribers of a message being
// re-dispatched to its group, without the departed member. It reports
// whether subs is such a message's, from the message's origin (not the
// whole packet, 800 bytes to copy on every message).
func (h *SelectionHook) restrictToRedispatchGroup(subs *mqtt.Subscribers, origin string) bool {
	if origin != RedispatchOrigin {
		return false
	}
	// Called on the injecting goroutine, which holds r.mu.
	r := &h.redispatch
	clear(subs.Subscriptions)
	clear(subs.InlineSubscriptions)
	for filter, members := range subs.Shared {
		if filter != r.group {
			delete(subs.Shared, filter)
			continue
		}
		delete(members, r.exclude)
		if len(r.avoid) > 0 {
			avoidAll := true
			for id := range members {
				if _, ok := r.avoid[id]; !ok {
					avoidAll = false
					break
				}
			}
			if !avoidAll {
				for id := range r.avoid {
					delete(members, id)
				}
			}
		}
		if len(members) == 0 {
			delete(subs.Shared, filter)
			continue
		}
		r.delivered = true
	}
	return true
}

// releaseParked re-dispatches the parked messages of the groups a client
// just joined.
func (h *SelectionHook) releaseParked(groups []string) {
	r := &h.redispatch
	r.mu.Lock()
	var ready []parkedMessage
	kept := r.parked[:0]
	for _, m := range r.parked {
		if slices.Contains(groups, m.group) {
			ready = append(ready, m)
		} else {
			kept = append(kept, m)
		}
	}
	clear(r.parked[len(kept):])
	r.parked = kept
	r.mu.Unlock()
	for _, m := range ready {
		h.inject(m.group, "", m.pk)
	}
}

// ParkedRedispatch returns how many re-dispatched messages wait for a
// group member.
func (h *SelectionHook) ParkedRedispatch() int {
	r := &h.redispatch
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.parked)
}

// scheduleRedispatch re-dispatches a disconnected persistent session's
// unacknowledged messages after the grace period, unless the client came
// back (a new connection replaces cl) in the meantime.
func (h *SelectionHook) scheduleRedispatch(cl *mqtt.Client, grace time.Duration) {
	time.AfterFunc(grace, func() {
		cur, ok := h.cfg.Server.Clients.Get(cl.ID)
		if ok && cur == cl && cl.Closed() {
			h.redispatchUnacknowledged(cl)
		}
	})
}
