package pingreq

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// listener wraps a Mochi listener so that every connection it establishes
// is a *Conn.
type listener struct {
	listeners.Listener
	max int

	guard  *Guard       // nil: no limits (WrapListener)
	active atomic.Int64 // connections admitted and not yet ended, counted with a guard's MaxConnections
	log    *slog.Logger // the logger Mochi gave the listener (Init)
}

// WrapListener returns a listener that delegates to l but wraps each
// accepted net.Conn in NewConn(conn, maxPayload) before handing it to
// Mochi's establish function. It works with Mochi's TCP (plain and TLS),
// Unix socket and Websocket listeners: it sees the net.Conn those give
// Mochi, which for websockets is the message-framed stream of MQTT bytes.
func WrapListener(l listeners.Listener, maxPayload int) listeners.Listener {
	return &listener{Listener: l, max: maxPayload}
}

// Init keeps the logger for logConnectionEnd and initialises the inner
// listener with it.
func (l *listener) Init(log *slog.Logger) error {
	l.log = log
	return l.Listener.Init(log)
}

// Serve serves the inner listener, wrapping every connection it accepts.
// The error a connection ends with is logged here (logConnectionEnd) and
// not returned: Mochi's listeners log it with an empty message, at WARN,
// without the client's address, even for a device that merely dropped off.
func (l *listener) Serve(establish listeners.EstablishFn) {
	l.Listener.Serve(func(id string, c net.Conn) error {
		var err error
		if l.guard != nil {
			err = l.guard.establish(l, id, c, establish)
		} else {
			err = establish(id, NewConn(c, l.max))
		}
		l.logConnectionEnd(c.RemoteAddr(), err)
		return nil
	})
}

// logConnectionEnd logs the error a connection ended with, if any:
//   - a connection closed or reset by its client, before its CONNECT (a
//     port probe, a health check) or after it without DISCONNECT (a device
//     that lost power or network), at DEBUG: routine for a fleet;
//   - a read that timed out (no CONNECT in time, a keepalive missed), at
//     INFO;
//   - anything else (a malformed or oversized packet, a refused CONNECT:
//     bad credentials, a server at its client limit), at WARN.
//
// Mochi's logger names the listener already.
func (l *listener) logConnectionEnd(remote net.Addr, err error) {
	if err == nil || l.log == nil {
		return
	}
	beforeConnect := strings.HasPrefix(err.Error(), mochiConnectReadError)
	var ne net.Error
	var code packets.Code
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
		msg := "client connection lost without DISCONNECT"
		if beforeConnect {
			msg = "connection closed before its CONNECT"
		}
		l.log.Debug(msg, "remote", remote, "error", err)
	case errors.As(err, &ne) && ne.Timeout():
		l.log.Info("client connection timed out", "remote", remote, "error", err)
	case errors.As(err, &code) && !beforeConnect:
		l.log.Warn("client connection refused or ended by the broker", "remote", remote, "reason", code.Reason, "code", code.Code)
	default:
		l.log.Warn("client connection ended with an error", "remote", remote, "error", err)
	}
}

// mochiConnectReadError begins the error Mochi 2.7.9's establish returns
// when the CONNECT could not be read (it has no sentinel for it). Should a
// later Mochi word it otherwise, a connection closed before its CONNECT is
// logged as one lost without DISCONNECT, at the same level.
const mochiConnectReadError = "read connection: "

// Unwrap returns the inner listener.
func (l *listener) Unwrap() listeners.Listener { return l.Listener }
