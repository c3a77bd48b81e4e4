package pingreq

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/luffymq/luffymq/internal/testenv"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/stretchr/testify/require"
)

// guardedListener is a listener wrapped by a Guard and served with an
// establish function that, like Mochi's, reads the connection until it
// fails, closes it and returns the error.
type guardedListener struct {
	listeners.Listener
	established chan *Conn // each connection handed to establish
	ended       chan *Conn // each connection whose establish returned
	log         *testenv.LockedBuffer
}

func serveGuarded(t *testing.T, g *Guard, l listeners.Listener) *guardedListener {
	t.Helper()
	gl := &guardedListener{
		Listener:    g.WrapListener(l),
		established: make(chan *Conn, 256),
		ended:       make(chan *Conn, 256),
		log:         &testenv.LockedBuffer{},
	}
	require.NoError(t, gl.Init(slog.New(slog.NewTextHandler(gl.log, nil))))
	served := make(chan struct{})
	go func() {
		defer close(served)
		gl.Serve(func(id string, c net.Conn) error {
			cn := c.(*Conn)
			gl.established <- cn
			defer func() { gl.ended <- cn }()
			buf := make([]byte, 2048)
			for {
				if _, err := cn.Read(buf); err != nil {
					_ = cn.Close()
					return err
				}
			}
		})
	}()
	t.Cleanup(func() {
		gl.Close(func(string) {})
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return gl
}

// dialFrom connects to addr from the loopback address src.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// requireClosedByServer waits for the server to close c.
func requireClosedByServer(t *testing.T, c net.Conn, within time.Duration) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(within)))
	_, err := io.ReadAll(c)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "connection still open after %v", within)
}

func (gl *guardedListener) requireEstablished(t *testing.T) *Conn {
	t.Helper()
	select {
	case c := <-gl.established:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no connection established")
		return nil
	}
}

func (gl *guardedListener) requireNoneEstablished(t *testing.T) {
	t.Helper()
	select {
	case <-gl.established:
		t.Fatal("a refused connection reached establish")
	default:
	}
}

func (gl *guardedListener) requireEnded(t *testing.T) {
	t.Helper()
	select {
	case <-gl.ended:
	case <-time.After(5 * time.Second):
		t.Fatal("establish did not return after the client closed")
	}
}

func newTCPListener(id string) listeners.Listener {
	return listeners.NewTCP(listeners.Config{ID: id, Address: "127.0.0.1:0"})
}

func TestGuardListenerLimit(t *testing.T) {
	g := NewGuard(GuardConfig{MaxConnections: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	gl := serveGuarded(t, g, newTCPListener("t1"))
	first := dialFrom(t, "127.0.0.1", gl.Address())
	gl.requireEstablished(t)
	dialFrom(t, "127.0.0.1", gl.Address())
	gl.requireEstablished(t)

	requireClosedByServer(t, dialFrom(t, "127.0.0.1", gl.Address()), 5*time.Second)
	gl.requireNoneEstablished(t)
	require.Equal(t, GuardStats{RefusedListenerLimit: 1}, g.Stats())

	// Closing a connection gives its place back (once the establish
	// function has returned, just after the test's handler ended).
	require.NoError(t, first.Close())
	gl.requireEnded(t)
	active := &gl.Listener.(*listener).active
	require.Eventually(t, func() bool { return active.Load() == 1 }, 5*time.Second, time.Millisecond)
	dialFrom(t, "127.0.0.1", gl.Address())
	gl.requireEstablished(t)
	require.Equal(t, uint64(1), g.Stats().RefusedListenerLimit)
}

func TestGuardPerIPLimitSpansListeners(t *testing.T) {
	g := NewGuard(GuardConfig{MaxConnectionsPerIP: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	a := serveGuarded(t, g, newTCPListener("a"))
	b := serveGuarded(t, g, newTCPListener("b"))
	first := dialFrom(t, "127.0.0.1", a.Address())
	a.requireEstablished(t)
	dialFrom(t, "127.0.0.1", b.Address())
	b.requireEstablished(t)

	// 127.0.0.1 has its two connections, on either listener.
	requireClosedByServer(t, dialFrom(t, "127.0.0.1", a.Address()), 5*time.Second)
	requireClosedByServer(t, dialFrom(t, "127.0.0.1", b.Address()), 5*time.Second)
	a.requireNoneEstablished(t)
	b.requireNoneEstablished(t)
	require.Equal(t, GuardStats{RefusedIPLimit: 2}, g.Stats())

	// Another address is counted apart.
	dialFrom(t, "127.0.0.2", a.Address())
	a.requireEstablished(t)

	// Closing a connection gives its place back to its address (once the
	// establish function has returned, just after the test's handler).
	require.NoError(t, first.Close())
	a.requireEnded(t)
	loopback := netip.MustParseAddr("127.0.0.1")
	require.Eventually(t, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.perIP[loopback] == 1
	}, 5*time.Second, time.Millisecond)
	dialFrom(t, "127.0.0.1", a.Address())
	a.requireEstablished(t)
	require.Equal(t, uint64(2), g.Stats().RefusedIPLimit)
}

func TestGuardRefusalLogIsRateLimited(t *testing.T) {
	var logs testenv.LockedBuffer
	g := NewGuard(GuardConfig{MaxConnections: 1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	gl := serveGuarded(t, g, newTCPListener("t1"))
	dialFrom(t, "127.0.0.1", gl.Address())
	gl.requireEstablished(t)
	const refused = 30
	for range refused {
		requireClosedByServer(t, dialFrom(t, "127.0.0.1", gl.Address()), 5*time.Second)
	}
	require.Equal(t, uint64(refused), g.Stats().RefusedListenerLimit)
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	require.Len(t, lines, 1, "one line per %v, not one per refusal:\n%s", refusalLogInterval, logs.String())
	require.Contains(t, lines[0], "connection refused: listener limit reached")
	require.Contains(t, lines[0], "max=1")
	require.Empty(t, gl.log.String(), "refusals are not logged by the inner listener either")
}

func TestGuardConnectTimeout(t *testing.T) {
	serverTLS, clientTLS := testTLSConfigs(t)
	for _, tc := range []struct {
		name string
		tls  *tls.Config
	}{{"plain", nil}, {"tls", serverTLS}} {
		t.Run(tc.name, func(t *testing.T) {
			const timeout = 300 * time.Millisecond
			g := NewGuard(GuardConfig{ConnectTimeout: timeout, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			gl := serveGuarded(t, g, listeners.NewTCP(listeners.Config{ID: "t1", Address: "127.0.0.1:0", TLSConfig: tc.tls}))

			// A client that completes its CONNECT (over TLS: after the
			// handshake) is not cut, however long it then stays idle.
			talker := dialFrom(t, "127.0.0.1", gl.Address())
			if tc.tls != nil {
				talker = tls.Client(talker, clientTLS)
			}
			_, err := talker.Write(packet(0x10, []byte{0, 4, 'M', 'Q', 'T', 'T', 5, 2, 0, 0, 0, 0, 2, 'c', '1'}))
			require.NoError(t, err)
			gl.requireEstablished(t)

			// Idle ones (over TLS: no handshake either) are closed.
			const idle = 5
			start := time.Now()
			conns := make([]net.Conn, idle)
			for i := range conns {
				conns[i] = dialFrom(t, "127.0.0.1", gl.Address())
			}
			for _, c := range conns {
				requireClosedByServer(t, c, timeout+time.Second-time.Since(start))
			}
			require.Eventually(t, func() bool { return g.Stats().ConnectTimeouts == idle }, 5*time.Second, 10*time.Millisecond)

			require.NoError(t, talker.SetReadDeadline(time.Now().Add(2*timeout)))
			_, err = talker.Read(make([]byte, 1))
			var ne net.Error
			require.True(t, errors.As(err, &ne) && ne.Timeout(), "the client that sent its CONNECT is still connected: %v", err)
			require.Equal(t, uint64(idle), g.Stats().ConnectTimeouts)
			require.Empty(t, gl.log.String(), "timeouts are counted, not logged by the inner listener")
		})
	}
}
