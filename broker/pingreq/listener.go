package pingreq

import (
	"net"
	"sync/atomic"

	"github.com/mochi-mqtt/server/v2/listeners"
)

// listener wraps a Mochi listener so that every connection it establishes
// is a *Conn.
type listener struct {
	listeners.Listener
	max int

	guard  *Guard       // nil: no limits (WrapListener)
	active atomic.Int64 // connections admitted and not yet ended, counted with a guard's MaxConnections
}

// WrapListener returns a listener that delegates to l but wraps each
// accepted net.Conn in NewConn(conn, maxPayload) before handing it to
// Mochi's establish function. It works with Mochi's TCP (plain and TLS),
// Unix socket and Websocket listeners: it sees the net.Conn those give
// Mochi, which for websockets is the message-framed stream of MQTT bytes.
func WrapListener(l listeners.Listener, maxPayload int) listeners.Listener {
	return &listener{Listener: l, max: maxPayload}
}

// Serve serves the inner listener, wrapping every connection it accepts.
func (l *listener) Serve(establish listeners.EstablishFn) {
	l.Listener.Serve(func(id string, c net.Conn) error {
		if l.guard != nil {
			return l.guard.establish(l, id, c, establish)
		}
		return establish(id, NewConn(c, l.max))
	})
}

// Unwrap returns the inner listener.
func (l *listener) Unwrap() listeners.Listener { return l.Listener }
