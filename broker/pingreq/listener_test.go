package pingreq

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/luffymq/luffymq/internal/testenv"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
)

// established is what the establish function saw.
type established struct {
	id   string
	conn net.Conn
}

// serveWrapped wraps l, initialises and serves it, and returns the wrapper
// and a channel of the connections Mochi's establish function would get.
// Each establish call blocks until the test ends, as Mochi's does while
// the client is connected (the websocket listener closes the connection
// when establish returns).
func serveWrapped(t *testing.T, l listeners.Listener, maxPayload int) (listeners.Listener, <-chan established) {
	t.Helper()
	wl := WrapListener(l, maxPayload)
	require.NoError(t, wl.Init(slog.New(slog.NewTextHandler(io.Discard, nil))))

	conns := make(chan established, 4)
	done := make(chan struct{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		wl.Serve(func(id string, c net.Conn) error {
			conns <- established{id: id, conn: c}
			<-done
			return nil
		})
	}()
	t.Cleanup(func() {
		close(done)
		wl.Close(func(string) {})
		select {
		case <-served:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return wl, conns
}

func waitConn(t *testing.T, conns <-chan established, id string) *Conn {
	t.Helper()
	select {
	case e := <-conns:
		require.Equal(t, id, e.id)
		c, ok := e.conn.(*Conn)
		require.Truef(t, ok, "establish got %T, want *pingreq.Conn", e.conn)
		t.Cleanup(func() { _ = c.Close() })
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no connection established")
		return nil
	}
}

// requireFiltered reads len(s.want) bytes from c and checks them and the
// lifted payloads.
func requireFiltered(t *testing.T, c *Conn, s *stream) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	out := make([]byte, len(s.want))
	_, err := io.ReadFull(c, out)
	require.NoError(t, err)
	require.Equal(t, s.want, out)
	got, oversized := c.TakeLiftedReports()
	require.False(t, oversized)
	require.Equal(t, s.payloads, got)
}

func listenerStream() *stream {
	s := &stream{}
	return s.add(
		packet(0x10, []byte{0, 4, 'M', 'Q', 'T', 'T', 5, 2, 0, 60, 0, 0, 2, 'c', '1'}),
		packet(0xC0, []byte(`{"pending":1,"workers":4}`)),
		packet(0x30, filler(3000, 1)),
		[]byte{0xC0, 0},
		packet(0xC0, jsonReport(1000)),
		packet(0x82, []byte{0, 1, 0, 0, 3, 'a', '/', 'b', 1}),
	)
}

func TestWrapListenerTCP(t *testing.T) {
	cases := []struct {
		name string
		tls  bool
	}{
		{"plain", false},
		{"tls", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := listeners.Config{ID: "t1", Address: "127.0.0.1:0"}
			var clientTLS *tls.Config
			if tc.tls {
				cfg.TLSConfig, clientTLS = testTLSConfigs(t)
			}
			wl, conns := serveWrapped(t, listeners.NewTCP(cfg), 4096)
			require.Equal(t, "t1", wl.ID())
			require.Equal(t, "tcp", wl.Protocol())

			client, err := net.Dial("tcp", wl.Address())
			require.NoError(t, err)
			if tc.tls {
				// The handshake runs on the first Write here and on the
				// server's first Read (through the *Conn).
				client = tls.Client(client, clientTLS)
			}
			t.Cleanup(func() { _ = client.Close() })

			s := listenerStream()
			go func() {
				for _, ch := range chunksOf(s.in, 700) {
					if _, err := client.Write(ch); err != nil {
						return
					}
				}
			}()
			c := waitConn(t, conns, "t1")
			if tc.tls {
				_, isTLS := c.NetConn().(*tls.Conn)
				require.True(t, isTLS, "inner conn is %T", c.NetConn())
			}
			requireFiltered(t, c, s)

			// Writes pass through unfiltered.
			_, err = c.Write([]byte{0xD0, 0})
			require.NoError(t, err)
			require.NoError(t, client.SetReadDeadline(time.Now().Add(10*time.Second)))
			resp := make([]byte, 2)
			_, err = io.ReadFull(client, resp)
			require.NoError(t, err)
			require.Equal(t, []byte{0xD0, 0}, resp)
		})
	}
}

func TestWrapListenerWebsocket(t *testing.T) {
	addr := freeLoopbackAddr(t)
	wl, conns := serveWrapped(t, listeners.NewWebsocket(listeners.Config{ID: "ws1", Address: addr}), 4096)
	require.Equal(t, "ws", wl.Protocol())
	require.Equal(t, addr, wl.Address())

	// Serve binds in the background: poll until it accepts, with a deadline.
	dialer := websocket.Dialer{Subprotocols: []string{"mqtt"}, HandshakeTimeout: 5 * time.Second}
	var ws *websocket.Conn
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for ws == nil {
		var err error
		ws, _, err = dialer.Dial("ws://"+addr+"/", nil) //nolint:bodyclose // nil body on success
		if err == nil {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("websocket listener not up: %v", err)
		case <-tick.C:
		}
	}
	require.Equal(t, "mqtt", ws.Subprotocol())
	t.Cleanup(func() { _ = ws.Close() })

	s := listenerStream()
	// Messages split packets (and a PINGREQ) at arbitrary points.
	written := make(chan error, 1)
	go func() {
		for _, ch := range splitAt(s.in, []int{10, 1, 30, 2000, 3000, 5}) {
			if err := ws.WriteMessage(websocket.BinaryMessage, ch); err != nil {
				written <- err
				return
			}
		}
		written <- nil
	}()
	c := waitConn(t, conns, "ws1")
	requireFiltered(t, c, s)
	require.NoError(t, <-written) // gorilla allows one writer at a time

	// One extended PINGREQ as one binary message.
	ping := packet(0xC0, []byte(`{"pending":7}`))
	require.NoError(t, ws.WriteMessage(websocket.BinaryMessage, ping))
	out := make([]byte, 2)
	_, err := io.ReadFull(c, out)
	require.NoError(t, err)
	require.Equal(t, []byte{0xC0, 0}, out)
	got, _ := c.TakeLiftedReports()
	require.Equal(t, [][]byte{[]byte(`{"pending":7}`)}, got)
}

// freeLoopbackAddr returns a loopback address with a port that was free a
// moment ago (Mochi's websocket listener cannot report a :0 port).
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// testTLSConfigs returns a server config with a fresh self-signed
// certificate for 127.0.0.1 and a client config that trusts it.
func testTLSConfigs(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "pingreq test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server = &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}},
		MinVersion:   tls.VersionTLS12,
	}
	client = &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	return server, client
}

// fakeListener records calls and establishes one given conn per Serve.
type fakeListener struct {
	conn     net.Conn
	inited   bool
	closed   bool
	serveErr error // what establish returned
}

func (f *fakeListener) Init(*slog.Logger) error { f.inited = true; return errInit }
func (f *fakeListener) Serve(establish listeners.EstablishFn) {
	f.serveErr = establish("f1", f.conn)
}
func (f *fakeListener) ID() string       { return "f1" }
func (f *fakeListener) Address() string  { return "127.0.0.1:1883" }
func (f *fakeListener) Protocol() string { return "fake" }
func (f *fakeListener) Close(closeClients listeners.CloseFn) {
	f.closed = true
	closeClients("f1")
}

var errInit = errors.New("init failed")

func TestWrapListenerDelegates(t *testing.T) {
	a, b := net.Pipe()
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	inner := &fakeListener{conn: a}
	wl := WrapListener(inner, 32)

	require.Equal(t, "f1", wl.ID())
	require.Equal(t, "127.0.0.1:1883", wl.Address())
	require.Equal(t, "fake", wl.Protocol())
	require.ErrorIs(t, wl.Init(nil), errInit)
	require.True(t, inner.inited)

	errEstablish := errors.New("establish failed")
	var got net.Conn
	wl.Serve(func(id string, c net.Conn) error {
		require.Equal(t, "f1", id)
		got = c
		return errEstablish
	})
	require.NoError(t, inner.serveErr, "establish's error is the wrapper's to log (logConnectionEnd), not the inner listener's")
	c, ok := got.(*Conn)
	require.Truef(t, ok, "establish got %T", got)
	require.Equal(t, a, c.NetConn())
	require.Equal(t, 32, c.max)

	var closedID string
	wl.Close(func(id string) { closedID = id })
	require.True(t, inner.closed)
	require.Equal(t, "f1", closedID)
	require.Equal(t, inner, wl.(interface{ Unwrap() listeners.Listener }).Unwrap())
}

// TestListenerLogsConnectionEnds: the error a connection ends with is
// logged by the wrapper, with a message, a level that fits it and the
// client's address, and not handed back to Mochi's listener (which would
// log it again with an empty message, at WARN). Each client here sends one
// byte naming the error establish returns, as Mochi's would.
func TestListenerLogsConnectionEnds(t *testing.T) {
	endings := map[byte]error{
		'p': fmt.Errorf("read connection: %w", io.EOF),                                   // a port probe
		'd': io.EOF,                                                                      // a device gone without DISCONNECT
		't': fmt.Errorf("read: %w", os.ErrDeadlineExceeded),                              // a keepalive missed
		'm': fmt.Errorf("read connection: %w", packets.ErrProtocolViolationProtocolName), // garbage before CONNECT
		'b': packets.ErrBadUsernameOrPassword,                                            // refused
		'n': nil,                                                                         // a clean DISCONNECT
	}
	for _, guarded := range []bool{false, true} {
		t.Run(fmt.Sprintf("guarded=%v", guarded), func(t *testing.T) {
			var l listeners.Listener = WrapListener(listeners.NewTCP(listeners.Config{ID: "t1", Address: "127.0.0.1:0"}), 4096)
			if guarded {
				l = NewGuard(GuardConfig{MaxPayload: 4096, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).WrapListener(listeners.NewTCP(listeners.Config{ID: "t1", Address: "127.0.0.1:0"}))
			}
			logs := &testenv.LockedBuffer{}
			// Mochi hands a listener its logger with the listener's ID.
			require.NoError(t, l.Init(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})).With("listener", "t1")))
			ended := make(chan struct{}, len(endings))
			go l.Serve(func(_ string, c net.Conn) error {
				defer func() { ended <- struct{}{} }()
				defer c.Close()
				b := make([]byte, 1)
				if _, err := io.ReadFull(c, b); err != nil {
					return err
				}
				return endings[b[0]]
			})
			t.Cleanup(func() { l.Close(func(string) {}) })
			for _, b := range []byte("pdtmbn") {
				c, err := net.Dial("tcp", l.Address())
				require.NoError(t, err)
				_, err = c.Write([]byte{b})
				require.NoError(t, err)
				select {
				case <-ended:
				case <-time.After(5 * time.Second):
					t.Fatal("establish did not return")
				}
				_ = c.Close()
			}
			// Each line is written after its establish returned.
			require.Eventually(t, func() bool { return strings.Count(logs.String(), "\n") >= 5 }, 5*time.Second, 10*time.Millisecond, "logs:\n%s", logs.String())
			time.Sleep(50 * time.Millisecond) // a sixth line, if any, comes now
			out := logs.String()
			require.NotContains(t, out, `msg=""`)
			for _, want := range []string{
				`level=DEBUG msg="connection closed before its CONNECT" listener=t1 remote=127.0.0.1:`,
				`level=DEBUG msg="client connection lost without DISCONNECT" listener=t1 remote=127.0.0.1:`,
				`level=INFO msg="client connection timed out" listener=t1 remote=127.0.0.1:`,
				`level=WARN msg="client connection ended with an error" listener=t1 remote=127.0.0.1:`,
				`level=WARN msg="client connection refused or ended by the broker" listener=t1 remote=127.0.0.1:`,
			} {
				require.Contains(t, out, want)
			}
			require.Equal(t, 5, strings.Count(out, "\n"), "one line per connection that ended with an error, none for a clean one:\n%s", out)
		})
	}
}
