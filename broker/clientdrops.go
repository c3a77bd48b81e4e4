package broker

import (
	"sort"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Messages lost for a client, by client and reason. A publish can be
// dropped for a client in two places: Mochi's write queue for the client
// is full (Mochi counts these only in total, in messages_dropped), or the
// connection's outbox is over its limit and the publish is QoS 0
// (broker/pingreq.Conn). The connection counts both, so the API and the
// dashboard can say who lost what and why.

// MaxDroppingClients bounds the clients listed in each snapshot's
// dropping_clients, those that lost the most first.
const MaxDroppingClients = 10

// writeQueueDropCounter is implemented by connections that count the
// publishes dropped for them before they reached the connection
// (broker/pingreq.Conn).
type writeQueueDropCounter interface {
	CountWriteQueueDrop()
}

// writeQueueDrops is the hook that tells a client's connection about each
// publish Mochi dropped for it (OnPublishDropped).
type writeQueueDrops struct {
	mqtt.HookBase
}

// ID identifies the hook to Mochi.
func (h *writeQueueDrops) ID() string { return "luffymq-write-queue-drops" }

// Provides tells Mochi which events the hook handles.
func (h *writeQueueDrops) Provides(b byte) bool { return b == mqtt.OnPublishDropped }

// OnPublishDropped counts the drop on the client's connection.
func (h *writeQueueDrops) OnPublishDropped(cl *mqtt.Client, _ packets.Packet) {
	if c, ok := cl.Net.Conn.(writeQueueDropCounter); ok {
		c.CountWriteQueueDrop()
	}
}

// droppingClients returns up to limit connected clients that lost
// messages, those that lost the most first (then by client ID).
func (b *Broker) droppingClients(limit int) []ClientDrops {
	out := []ClientDrops{}
	for id, cl := range b.server.Clients.GetAll() {
		if cl.Net.Inline {
			continue
		}
		ws, ok := cl.Net.Conn.(writeStatsSource)
		if !ok {
			continue
		}
		st := ws.WriteStats()
		d := ClientDrops{ClientID: id, WriteQueueFull: st.DroppedWriteQueue, QoS0OutboxFull: st.DroppedQoS0}
		if d.Total() > 0 {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Total() != out[j].Total() {
			return out[i].Total() > out[j].Total()
		}
		return out[i].ClientID < out[j].ClientID
	})
	return out[:min(len(out), limit)]
}
