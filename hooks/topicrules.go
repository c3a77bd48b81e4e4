package hooks

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/luffymq/luffymq/clientsdk/report"
)

// ACLChecker decides what the operator lets a client read and write: in
// LuffyMQ, Mochi's auth-ledger hook or its allow-all hook.
type ACLChecker interface {
	OnACLCheck(cl *mqtt.Client, topic string, write bool) bool
}

// TopicRulesConfig configures a TopicRulesHook.
type TopicRulesConfig struct {
	// Access is the operator's access control, consulted for everything
	// the topic rules do not refuse. Required. Register it with Mochi
	// through WithoutACLCheck so that the topic rules are the only hook
	// Mochi asks.
	Access ACLChecker
}

// TopicRulesCounters counts what the topic rules refused or withheld.
type TopicRulesCounters struct {
	// ReadsRefused counts read checks refused because the filter or topic
	// is in the reserved namespace: SUBSCRIBEs answered "not authorized"
	// (0x87 in MQTT v5, 0x80 in 3.1.1).
	ReadsRefused atomic.Uint64
	// PublishesRefused counts publishes to reserved topics other than
	// report.LoadTopic, at every QoS (a refused QoS 0 publish is dropped
	// silently, as MQTT requires).
	PublishesRefused atomic.Uint64
	// RetainedWithheld counts retained messages on '$' topics not sent to
	// a subscription whose filter starts with a wildcard.
	RetainedWithheld atomic.Uint64
	// SharedWithheld counts shared groups, with a filter starting with a
	// wildcard, that a message on a '$' topic was kept from.
	SharedWithheld atomic.Uint64
}

// TopicRulesHook is the Mochi hook that enforces LuffyMQ's topic rules:
//
//   - MQTT-4.7.2-1: a topic filter starting with a wildcard ('#' or '+')
//     does not match a topic name starting with '$'. Mochi 2.7.9 applies
//     this only to live messages for plain subscriptions; the hook applies
//     it to shared subscriptions ($share/g/#) and to retained messages
//     sent on SUBSCRIBE too.
//   - Topics under report.ReservedTopicPrefix ($luffy/) belong to the
//     broker: no client may subscribe to a filter that can match one, the
//     only one a client may publish to is report.LoadTopic (its own load
//     report, which the selection hook consumes), and nothing on them is
//     retained.
//
// Mochi allows a publish or subscribe when any hook's OnACLCheck does, so
// a rule that refuses works only if no other hook answers ACL checks: the
// hook asks the operator's access control (TopicRulesConfig.Access) itself
// for everything the rules allow, and that hook is registered with Mochi
// through WithoutACLCheck. The hook must also be added before every other
// hook with OnSelectSubscribers, so that no group it withholds a message
// from is picked.
type TopicRulesHook struct {
	mqtt.HookBase
	access ACLChecker

	// answering holds the clients whose SUBSCRIBE with a filter starting
	// with a wildcard Mochi is answering (*mqtt.Client → struct{}), from
	// OnSubscribed, after their subscriptions are recorded, to
	// OnPacketProcessed, after the retained messages are sent.
	answering sync.Map

	// Counters counts what the rules refused or withheld.
	Counters TopicRulesCounters
}

// NewTopicRulesHook returns a hook for cfg.
func NewTopicRulesHook(cfg TopicRulesConfig) (*TopicRulesHook, error) {
	if cfg.Access == nil {
		return nil, errors.New("topic rules hook needs the operator's access control")
	}
	return &TopicRulesHook{access: cfg.Access}, nil
}

// ID identifies the hook to Mochi.
func (h *TopicRulesHook) ID() string { return "luffymq-topic-rules" }

// Provides tells Mochi which events the hook handles.
func (h *TopicRulesHook) Provides(b byte) bool { return topicRulesEvents[b] }

// topicRulesEvents are the Mochi events the topic rules hook handles, as a
// table: Mochi asks on every event it dispatches.
var topicRulesEvents = func() (t [256]bool) {
	for _, e := range []byte{
		mqtt.OnACLCheck,
		mqtt.OnSelectSubscribers,
		mqtt.OnPublish,
		mqtt.OnWill,
		mqtt.OnSubscribed,
		mqtt.OnPacketProcessed,
		mqtt.OnDisconnect,
	} {
		t[e] = true
	}
	return t
}()

// reservedLevel is the first topic level of every reserved topic.
var reservedLevel = strings.TrimSuffix(report.ReservedTopicPrefix, "/")

// OnACLCheck applies the topic rules, then the operator's access control.
//
// Writes: a reserved topic other than report.LoadTopic is refused.
// Reads (a SUBSCRIBE's filter, or the topic of a message about to be sent):
// a filter or topic in the reserved namespace is refused; while Mochi sends
// the retained messages of a SUBSCRIBE with a filter starting with a
// wildcard, a message on a '$' topic is withheld unless the client holds
// another subscription that matches it by MQTT-4.7.2-1 (Mochi does not say
// which filter a retained message is sent for).
func (h *TopicRulesHook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	if len(topic) > 0 && topic[0] == '$' {
		switch {
		case write:
			if isReserved(topic) && topic != report.LoadTopic {
				h.Counters.PublishesRefused.Add(1)
				return false
			}
		case isReserved(withoutShare(topic)):
			h.Counters.ReadsRefused.Add(1)
			return false
		case h.isAnsweringSubscribe(cl) && !holdsDollarFilterFor(cl, topic):
			h.Counters.RetainedWithheld.Add(1)
			return false
		}
	}
	return h.access.OnACLCheck(cl, topic, write)
}

// OnSubscribed marks the client while Mochi sends the retained messages of
// a SUBSCRIBE in which a filter starting with a wildcard was granted.
func (h *TopicRulesHook) OnSubscribed(cl *mqtt.Client, pk packets.Packet, reasonCodes []byte) {
	if cl.Net.Inline {
		return // inline subscriptions get no retained messages
	}
	for i, sub := range pk.Filters {
		if i < len(reasonCodes) && reasonCodes[i] < packets.ErrUnspecifiedError.Code && startsWithWildcard(sub.Filter) {
			h.answering.Store(cl, struct{}{})
			return
		}
	}
}

// OnPacketProcessed ends the mark OnSubscribed set once the SUBSCRIBE is
// answered.
func (h *TopicRulesHook) OnPacketProcessed(cl *mqtt.Client, pk packets.Packet, _ error) {
	if pk.FixedHeader.Type == packets.Subscribe {
		h.answering.Delete(cl)
	}
}

// OnDisconnect forgets the client.
func (h *TopicRulesHook) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	h.answering.Delete(cl)
}

func (h *TopicRulesHook) isAnsweringSubscribe(cl *mqtt.Client) bool {
	_, ok := h.answering.Load(cl)
	return ok
}

// OnSelectSubscribers keeps a message on a '$' topic from every shared
// group whose filter (after $share/<group>/) starts with a wildcard.
func (h *TopicRulesHook) OnSelectSubscribers(subs *mqtt.Subscribers, pk packets.Packet) *mqtt.Subscribers {
	if len(pk.TopicName) == 0 || pk.TopicName[0] != '$' {
		return subs
	}
	for filter := range subs.Shared {
		if startsWithWildcard(withoutShare(filter)) {
			delete(subs.Shared, filter)
			h.Counters.SharedWithheld.Add(1)
		}
	}
	return subs
}

// OnPublish keeps the reserved namespace off the retained store and the
// subscribers for publishes no ACL check saw (the inline client's): a
// report.LoadTopic publish loses its retain flag, and one to any other
// reserved topic is dropped.
func (h *TopicRulesHook) OnPublish(_ *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if len(pk.TopicName) == 0 || pk.TopicName[0] != '$' || !isReserved(pk.TopicName) {
		return pk, nil
	}
	if pk.TopicName != report.LoadTopic {
		h.Counters.PublishesRefused.Add(1)
		return pk, packets.ErrRejectPacket
	}
	pk.FixedHeader.Retain = false
	return pk, nil
}

// OnWill keeps a will on a reserved topic from being retained (Mochi does
// not check wills against the ACL); no subscription can match it.
func (h *TopicRulesHook) OnWill(_ *mqtt.Client, will mqtt.Will) (mqtt.Will, error) {
	if isReserved(will.TopicName) {
		will.Retain = false
	}
	return will, nil
}

// WithoutACLCheck returns hook as Mochi should see it when a
// TopicRulesHook consults it: everything but OnACLCheck. Mochi allows a
// publish or subscribe when any hook allows it, so the topic rules could
// not refuse anything the operator's hook allows.
func WithoutACLCheck(hook mqtt.Hook) mqtt.Hook { return withoutACLCheck{hook} }

// withoutACLCheck forwards every method to the wrapped hook, and says it
// does not provide OnACLCheck.
type withoutACLCheck struct{ mqtt.Hook }

// Provides reports the wrapped hook's events, less OnACLCheck.
func (w withoutACLCheck) Provides(b byte) bool { return b != mqtt.OnACLCheck && w.Hook.Provides(b) }

// isReserved reports whether topic (a name or a filter) is in the reserved
// namespace: its first level is that of report.ReservedTopicPrefix. A
// filter that does not name that level cannot match a reserved topic
// (MQTT-4.7.2-1).
func isReserved(topic string) bool {
	return strings.HasPrefix(topic, reservedLevel) &&
		(len(topic) == len(reservedLevel) || topic[len(reservedLevel)] == '/')
}

// withoutShare returns the filter of a shared subscription
// ($share/<group>/<filter>), or filter itself.
func withoutShare(filter string) string {
	if !mqtt.IsSharedFilter(filter) {
		return filter
	}
	_, rest, _ := strings.Cut(filter, "/")
	_, inner, _ := strings.Cut(rest, "/")
	return inner
}

// startsWithWildcard reports whether a filter starts with '#' or '+'.
func startsWithWildcard(filter string) bool {
	return len(filter) > 0 && (filter[0] == '#' || filter[0] == '+')
}

// holdsDollarFilterFor reports whether the client holds a subscription,
// plain or shared, whose filter matches topic, a name starting with '$',
// without starting with a wildcard.
func holdsDollarFilterFor(cl *mqtt.Client, topic string) bool {
	for filter := range cl.State.Subscriptions.GetAll() {
		f := withoutShare(filter)
		if !startsWithWildcard(f) && filterMatches(f, topic) {
			return true
		}
	}
	return false
}

// filterMatches reports whether an MQTT topic filter matches a topic name,
// level by level ('+' one level, a final '#' the parent level and any
// below). It leaves MQTT-4.7.2-1 to the caller.
func filterMatches(filter, topic string) bool {
	for {
		f, filterRest, filterMore := strings.Cut(filter, "/")
		if f == "#" {
			return true
		}
		t, topicRest, topicMore := strings.Cut(topic, "/")
		if f != "+" && f != t {
			return false
		}
		if !filterMore || !topicMore {
			return filterMore == topicMore || (filterMore && filterRest == "#")
		}
		filter, topic = filterRest, topicRest
	}
}
