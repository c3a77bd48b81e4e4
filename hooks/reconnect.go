package hooks

import (
	"errors"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// ReconnectOrderHook makes a client that reconnects while its previous
// connection is still registered wait until Mochi has finished with that
// connection, so that the previous connection's teardown can never remove
// the new one from Mochi's client registry.
//
// # The race
//
// Mochi 2.7.9 ends a connection whose session ends with it (MQTT 5 session
// expiry 0, or a 3.1.1 clean session) in three steps on the old
// connection's goroutine: it checks that the client was not taken over,
// removes its subscriptions, then deletes the client ID from its client
// registry. A new connection with the same client ID that registers itself
// between the check and the delete is deleted instead: it stays connected,
// its PINGREQs are answered, but no message is ever delivered to it (the
// registry no longer knows it), and the old connection's unsubscribe may
// remove the new connection's subscriptions too. Two cases lead there:
//
//   - Closing predecessor: the old connection already dropped and Mochi is
//     tearing it down when the client reconnects (autopaho, Paho and
//     MQTT.js reconnect at once).
//   - Open predecessor (takeover): the broker still holds the old
//     connection open (a half-open socket after the device's network
//     dropped) when the device reconnects. Mochi's own takeover, on the new
//     connection's goroutine, closes the old connection first and marks it
//     taken over only after unsubscribing it, so the old goroutine, woken
//     by the close, can pass its taken-over check in between.
//
// # The fix
//
// The hook acts in OnSessionEstablish, which Mochi calls on the new
// connection after authentication and before the new client looks up the
// old one, and only for a predecessor whose session ends with its
// connection:
//
//   - A closing predecessor: the new connection waits until Mochi has
//     removed it from the registry (at most MaxWait).
//   - An open predecessor: the hook takes it over itself, with the
//     server's DisconnectClient and reason 0x8E Session taken over (the
//     DISCONNECT Mochi would send, [MQTT-3.1.4-3]), closes its network
//     connection if the server runs with PassiveClientDisconnect (the
//     server MUST close it, [MQTT-3.1.4-3]), then waits as above. Mochi's
//     own teardown of the old connection then runs alone: its taken-over
//     check, unsubscribe and registry delete all concern the old
//     connection, and the new connection's inheritClientSession finds no
//     predecessor.
//
// The new connection then gets session present = 0 and no state from the
// old one, which is what the protocols require: under MQTT 5 a session
// with expiry interval 0 ends when its network connection closes
// (3.1.2.11.2), and the server closes the existing connection before it
// processes Clean Start ([MQTT-3.1.4-3] then [MQTT-3.1.4-4]), so even a
// Clean Start 0 reconnection finds no session to resume; under 3.1.1 a
// clean session lasts as long as its network connection ([MQTT-3.1.2-6]),
// and Mochi's own takeover already returns session present = 0 for it.
// The only visible change from Mochi's takeover is for an MQTT 5 Clean
// Start 0 reconnection to an expiry-0 session, which Mochi would resume
// with the dead session's subscriptions and in-flight messages.
//
// A predecessor whose session outlives its connection (MQTT 5 expiry > 0,
// or 3.1.1 clean session 0) is left to Mochi's takeover, which resumes the
// session (session present = 1, subscriptions and in-flight messages
// moved): that takeover is not exposed to the race, because Mochi's
// teardown of such a connection (expire false in attachClient) neither
// unsubscribes it nor deletes its client ID. Only an old connection that
// sends DISCONNECT with Session Expiry Interval 0 at the very moment its
// client reconnects elsewhere could still turn into the expiring case
// after the hook looked at it.
//
// Counters: Waited and TimedOut for closing predecessors, TookOver and
// TakeoverTimedOut for open ones, exported by ReconnectOrderCollector as
// luffymq_reconnect_teardown_waits_total{kind="closing"|"takeover",
// outcome="done"|"timed_out"}. A wait that times out (a teardown held up
// by a slow hook) lets the new connection go on into Mochi's own path.
type ReconnectOrderHook struct {
	mqtt.HookBase
	server  *mqtt.Server
	maxWait time.Duration

	// Waited counts connections that waited for the teardown of a
	// predecessor that was already closing; TimedOut those of them that
	// gave up after MaxWait and went on.
	Waited   atomic.Uint64
	TimedOut atomic.Uint64
	// TookOver counts connections whose predecessor was still open and
	// that the hook took over (DISCONNECT 0x8E, then the wait for its
	// teardown); TakeoverTimedOut those of them that gave up after MaxWait.
	TookOver         atomic.Uint64
	TakeoverTimedOut atomic.Uint64
}

// DefaultReconnectMaxWait bounds the wait for a teardown: Mochi's takes
// microseconds, a slow storage or bridge hook a few milliseconds.
const DefaultReconnectMaxWait = 2 * time.Second

// NewReconnectOrderHook returns a hook for server, whose client registry it
// watches and whose DisconnectClient it uses to take over an open
// predecessor. maxWait ≤ 0 means DefaultReconnectMaxWait.
func NewReconnectOrderHook(server *mqtt.Server, maxWait time.Duration) (*ReconnectOrderHook, error) {
	if server == nil || server.Clients == nil {
		return nil, errors.New("reconnect order hook: the server and its client registry are required")
	}
	if maxWait <= 0 {
		maxWait = DefaultReconnectMaxWait
	}
	return &ReconnectOrderHook{server: server, maxWait: maxWait}, nil
}

// ID identifies the hook to Mochi.
func (h *ReconnectOrderHook) ID() string { return "luffymq-reconnect-order" }

// Provides says the hook only uses OnSessionEstablish.
func (h *ReconnectOrderHook) Provides(b byte) bool { return b == mqtt.OnSessionEstablish }

// OnSessionEstablish takes over an open predecessor of cl whose session
// ends with its connection, then waits, bounded, until Mochi has torn that
// predecessor down (see the type's comment).
func (h *ReconnectOrderHook) OnSessionEstablish(cl *mqtt.Client, _ packets.Packet) {
	old, ok := h.server.Clients.Get(cl.ID)
	if !ok || old == cl || !sessionEndsWithConnection(old) {
		return
	}
	waited, timedOut := &h.Waited, &h.TimedOut
	if !old.Closed() {
		waited, timedOut = &h.TookOver, &h.TakeoverTimedOut
		// The DISCONNECT write error, if any, only means the old
		// connection is already gone: Mochi ignores it too.
		_ = h.server.DisconnectClient(old, packets.ErrSessionTakenOver)
		old.Stop(packets.ErrSessionTakenOver) // no-op unless PassiveClientDisconnect left it open
	}
	waited.Add(1)
	if !h.awaitTeardown(cl.ID, old) {
		timedOut.Add(1)
		if h.Log != nil {
			h.Log.Warn("previous connection with the same client ID still being torn down; connecting anyway",
				"client", cl.ID, "waited", h.maxWait)
		}
	}
}

// awaitTeardown waits until the registry no longer holds old under id (or
// old was taken over by another connection); false after MaxWait.
func (h *ReconnectOrderHook) awaitTeardown(id string, old *mqtt.Client) bool {
	deadline := time.Now().Add(h.maxWait)
	pause := 50 * time.Microsecond
	for {
		if cur, ok := h.server.Clients.Get(id); !ok || cur != old || old.IsTakenOver() {
			return true
		}
		if time.Now().After(deadline) {
			return false
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
