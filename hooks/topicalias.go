package hooks

import (
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// SessionTopicAliasHook stops the broker from using topic aliases towards
// a client whose session outlives its connection.
//
// Mochi 2.7.9 stores a QoS≥1 delivery as it wrote it: under a topic alias
// of that connection, with the topic name left out when the alias was
// already set up. When the session resumes on a new connection, Mochi
// resends the stored packet unchanged, with an alias the new connection
// never learnt and no topic name: the client cannot tell the topic (MQTT
// 5 makes it a protocol error), and since every resumption resends it the
// session is stuck. Measured with a raw MQTT 5 client (Topic Alias
// Maximum 10, session expiry 3600 s): it acknowledged the first of two
// messages on one topic and resumed; the second came back with topic ""
// and alias 1.
//
// A server may always send the topic name in full (a client's Topic Alias
// Maximum is a most, not a request), so the hook sets the client's Topic
// Alias Maximum, as Mochi reads it, to 0 when the session can resume; a
// session that ends with its connection is never resent anything and
// keeps its aliases. The cost is the topic name in every PUBLISH to those
// clients.
type SessionTopicAliasHook struct {
	mqtt.HookBase
}

// ID names the hook.
func (h *SessionTopicAliasHook) ID() string { return "luffymq-session-topic-alias" }

// Provides says which events the hook handles.
func (h *SessionTopicAliasHook) Provides(b byte) bool { return b == mqtt.OnSessionEstablish }

// OnSessionEstablish turns outbound topic aliases off for a client whose
// session can resume, before Mochi sends it anything.
func (h *SessionTopicAliasHook) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	if !sessionEndsWithConnection(cl) {
		cl.Properties.Props.TopicAliasMaximum = 0
	}
}
