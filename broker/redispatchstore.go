package broker

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// storedInflight is the hooks.InflightStorage of a broker: re-dispatch
// (a departed member's messages, or a stalled one's with --ack-timeout)
// tells it what it took out of a session, and with --data-dir the record
// is deleted from the Badger store, so a restart does not load it back
// into the session. Without a data directory it does nothing.
type storedInflight struct{ b *Broker }

// OnQosDropped deletes cl's in-flight message pk from the store. The
// broker's persistence is set in New, before any client connects.
func (s storedInflight) OnQosDropped(cl *mqtt.Client, pk packets.Packet) {
	if p := s.b.persist; p != nil {
		p.store.Hook.OnQosDropped(cl, pk)
	}
}
