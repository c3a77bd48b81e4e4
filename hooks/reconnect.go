package hooks

import (
	"errors"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// ReconnectOrderHook makes a client that reconnects while Mochi is still
// tearing down its previous connection wait until that teardown is over.
//
// Mochi 2.7.9 ends a connection whose session ends with it (MQTT 5 session
// expiry 0, or a 3.1.1 clean session) in three steps on the old
// connection's goroutine: it checks that the client was not taken over,
// removes its subscriptions, then deletes the client ID from its client
// registry. A new connection with the same client ID that registers itself
// between the check and the delete is deleted instead: it stays connected,
// its PINGREQs are answered, but no message is ever delivered to it (the
// registry no longer knows it), and the old connection's unsubscribe may
// remove the new connection's subscriptions too. Clients that reconnect at
// once after a dropped connection (autopaho, Paho, MQTT.js) hit it.
//
// The hook closes the window through OnSessionEstablish, which Mochi calls
// on the new connection after authentication and before the new client
// looks up the old one: when the registry still holds a closed connection
// with the same client ID whose session ends with it, the new connection
// waits until Mochi has removed it (at most MaxWait). An old connection
// still open is left to Mochi's own takeover.
type ReconnectOrderHook struct {
	mqtt.HookBase
	clients *mqtt.Clients
	maxWait time.Duration

	// Waited counts connections that waited for a previous connection's
	// teardown; TimedOut those that gave up after MaxWait and went on.
	Waited   atomic.Uint64
	TimedOut atomic.Uint64
}

// DefaultReconnectMaxWait bounds the wait for a teardown: Mochi's takes
// microseconds, a slow storage or bridge hook a few milliseconds.
const DefaultReconnectMaxWait = 2 * time.Second

// NewReconnectOrderHook returns a hook that watches clients, the server's
// client registry. maxWait ≤ 0 means DefaultReconnectMaxWait.
func NewReconnectOrderHook(clients *mqtt.Clients, maxWait time.Duration) (*ReconnectOrderHook, error) {
	if clients == nil {
		return nil, errors.New("reconnect order hook: the server's client registry is required")
	}
	if maxWait <= 0 {
		maxWait = DefaultReconnectMaxWait
	}
	return &ReconnectOrderHook{clients: clients, maxWait: maxWait}, nil
}

// ID identifies the hook to Mochi.
func (h *ReconnectOrderHook) ID() string { return "luffymq-reconnect-order" }

// Provides says the hook only uses OnSessionEstablish.
func (h *ReconnectOrderHook) Provides(b byte) bool { return b == mqtt.OnSessionEstablish }

// OnSessionEstablish waits, bounded, for the teardown of a previous
// connection with cl's client ID (see the type's comment).
func (h *ReconnectOrderHook) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	old, ok := h.clients.Get(cl.ID)
	if !ok || old == cl || !old.Closed() || !sessionEndsWithConnection(old) {
		return
	}
	h.Waited.Add(1)
	deadline := time.Now().Add(h.maxWait)
	pause := 50 * time.Microsecond
	for {
		if cur, ok := h.clients.Get(cl.ID); !ok || cur != old || old.IsTakenOver() {
			return
		}
		if time.Now().After(deadline) {
			h.TimedOut.Add(1)
			if h.Log != nil {
				h.Log.Warn("previous connection with the same client ID still being torn down; connecting anyway",
					"client", cl.ID, "waited", h.maxWait)
			}
			return
		}
		time.Sleep(pause)
		pause = min(2*pause, 5*time.Millisecond)
	}
}

// sessionEndsWithConnection reports whether cl's session ends when its
// network connection does, the condition under which Mochi removes it from
// the registry at disconnection.
func sessionEndsWithConnection(cl *mqtt.Client) bool {
	if cl.Properties.ProtocolVersion == 5 {
		return cl.Properties.Props.SessionExpiryInterval == 0
	}
	return cl.Properties.Clean
}
