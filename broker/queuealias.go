package broker

import (
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// QueuePrefix starts EMQX's group-less shared subscription:
// "$queue/<filter>" is the shared subscription of one group that every
// $queue subscriber to that filter joins.
const QueuePrefix = "$queue/"

// QueueGroupFilterPrefix is what QueuePrefix is rewritten to: the group
// is named "$queue", so "$queue/jobs" is "$share/$queue/jobs".
const QueueGroupFilterPrefix = "$share/$queue/"

// QueueAliasHook is the Mochi hook that serves EMQX's "$queue/<filter>"
// as the shared subscription "$share/$queue/<filter>": it rewrites the
// filters of SUBSCRIBE and UNSUBSCRIBE packets before Mochi (or any other
// hook) handles them, so the subscription is an ordinary member of the
// "$queue" group — selection, ACL checks, topic rules and persistence
// see the rewritten filter. Add it before every other hook.
type QueueAliasHook struct {
	mqtt.HookBase
}

// ID identifies the hook to Mochi.
func (h *QueueAliasHook) ID() string { return "luffymq-queue-alias" }

// Provides tells Mochi which events the hook handles.
func (h *QueueAliasHook) Provides(b byte) bool {
	return b == mqtt.OnSubscribe || b == mqtt.OnUnsubscribe
}

// OnSubscribe rewrites $queue/ filters.
func (h *QueueAliasHook) OnSubscribe(_ *mqtt.Client, pk packets.Packet) packets.Packet {
	return rewriteQueueFilters(pk)
}

// OnUnsubscribe rewrites $queue/ filters, so that unsubscribing from
// "$queue/jobs" leaves the group that subscribing joined.
func (h *QueueAliasHook) OnUnsubscribe(_ *mqtt.Client, pk packets.Packet) packets.Packet {
	return rewriteQueueFilters(pk)
}

// rewriteQueueFilters returns pk with its $queue/ filters rewritten; the
// packet's own filter slice is left as it was.
func rewriteQueueFilters(pk packets.Packet) packets.Packet {
	var filters packets.Subscriptions
	for i, sub := range pk.Filters {
		rest, ok := strings.CutPrefix(sub.Filter, QueuePrefix)
		if !ok {
			continue
		}
		if filters == nil {
			filters = make(packets.Subscriptions, len(pk.Filters))
			copy(filters, pk.Filters)
		}
		if rest == "" {
			// "$queue/" names no filter: "$share/$queue", which Mochi
			// refuses as invalid (MQTT-4.8.2-1).
			filters[i].Filter = strings.TrimSuffix(QueueGroupFilterPrefix, "/")
			continue
		}
		filters[i].Filter = QueueGroupFilterPrefix + rest
	}
	if filters != nil {
		pk.Filters = filters
	}
	return pk
}
