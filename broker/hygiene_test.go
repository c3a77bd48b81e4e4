package broker

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"
	"github.com/stretchr/testify/require"
)

// hygieneDial connects to addr from the loopback address src.
func hygieneDial(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	conn, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// packetBytes encodes cp.
func packetBytes(t *testing.T, cp *packets.ControlPacket) []byte {
	t.Helper()
	var buf bytes.Buffer
	_, err := cp.WriteTo(&buf)
	require.NoError(t, err)
	return buf.Bytes()
}

// closedWithin reports whether the server closed conn within d: reading
// it ends in EOF or a reset rather than the deadline.
func closedWithin(conn net.Conn, d time.Duration) (bool, error) {
	if err := conn.SetReadDeadline(time.Now().Add(d)); err != nil {
		return false, err
	}
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false, err
	}
	return true, err
}

// requireMetric checks that GET /metrics has the sample line.
func requireMetric(t *testing.T, b *Broker, line string) {
	t.Helper()
	metrics := getMetrics(t, b)
	require.Contains(t, metrics, "\n"+line+"\n", "in /metrics:\n%s", grepLuffy(metrics))
}

func grepLuffy(metrics string) string {
	var out []string
	for _, l := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(l, "luffymq_con") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestIdleConnectionsAreClosedAfterConnectTimeout(t *testing.T) {
	const timeout = time.Second
	const idle = 250
	b := startBroker(t, func(c *Config) { c.ConnectTimeout = timeout })
	baseline := runtime.NumGoroutine()

	conns := make([]net.Conn, idle)
	dialed := make([]time.Time, idle)
	for i := range conns {
		conns[i] = hygieneDial(t, "127.0.0.1", b.MQTTAddr())
		dialed[i] = time.Now()
	}
	eventually(t, 5*time.Second, func() bool { return runtime.NumGoroutine() > baseline+idle }, "the broker serves the idle connections")
	for i, conn := range conns {
		closed, err := closedWithin(conn, time.Until(dialed[i].Add(timeout+time.Second)))
		require.True(t, closed, "connection %d still open %v after it was made: %v", i, timeout+time.Second, err)
		if i == 0 {
			require.GreaterOrEqual(t, time.Since(dialed[0]), timeout-100*time.Millisecond, "closed before the timeout")
		}
	}
	eventually(t, 5*time.Second, func() bool { return runtime.NumGoroutine() <= baseline+5 },
		"goroutines back near the baseline %d", baseline)
	t.Logf("goroutines: %d before, %d after %d idle connections were closed", baseline, runtime.NumGoroutine(), idle)

	eventually(t, 5*time.Second, func() bool { return b.Overview().ConnectTimeouts == idle })
	requireMetric(t, b, fmt.Sprintf("luffymq_connect_timeouts_total %d", idle))
}

func TestSlowConnectWithinTimeoutIsAccepted(t *testing.T) {
	const timeout = time.Second
	b := startBroker(t, func(c *Config) { c.ConnectTimeout = timeout })
	conn := hygieneDial(t, "127.0.0.1", b.MQTTAddr())
	rc := &rawConn{t: t, conn: conn}
	connect := packetBytes(t, connectPacket("slow", "", ""))
	third := len(connect) / 3
	for _, piece := range [][]byte{connect[:1], connect[1:third], connect[third:]} {
		rc.writeBytes(piece)
		time.Sleep(300 * time.Millisecond)
	}
	ack := rc.read()
	require.Equal(t, packets.CONNACK, ack.Type)
	require.Equal(t, byte(0), ack.Content.(*packets.Connack).ReasonCode)

	time.Sleep(timeout) // past the connect timeout: the keep-alive rules now
	rc.write(packets.NewControlPacket(packets.PINGREQ))
	require.Equal(t, packets.PINGRESP, rc.read().Type)
	require.Zero(t, b.Overview().ConnectTimeouts)
}

func TestKeepAliveZeroClientOutlivesConnectTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	b := startBroker(t, func(c *Config) { c.ConnectTimeout = timeout })
	conn := hygieneDial(t, "127.0.0.1", b.MQTTAddr())
	rc := &rawConn{t: t, conn: conn}
	cp := connectPacket("forever", "", "")
	cp.Content.(*packets.Connect).KeepAlive = 0
	rc.write(cp)
	require.Equal(t, packets.CONNACK, rc.read().Type)

	closed, _ := closedWithin(conn, 4*timeout)
	require.False(t, closed, "a keep-alive 0 client was cut after its CONNECT")
	require.NoError(t, conn.SetReadDeadline(time.Time{}))
	rc.write(packets.NewControlPacket(packets.PINGREQ))
	require.Equal(t, packets.PINGRESP, rc.read().Type)
	require.Zero(t, b.Overview().ConnectTimeouts)
}

// tryConnect connects from src and reports whether the broker answered the
// CONNECT with a CONNACK (true) or closed the connection (false).
func tryConnect(t *testing.T, src, addr, clientID string) (net.Conn, bool) {
	t.Helper()
	conn := hygieneDial(t, src, addr)
	if _, err := conn.Write(packetBytes(t, connectPacket(clientID, "", ""))); err != nil {
		return conn, false
	}
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	cp, err := packets.ReadPacket(conn)
	if err != nil {
		var ne net.Error
		require.False(t, errors.As(err, &ne) && ne.Timeout(), "neither CONNACK nor close")
		return conn, false
	}
	require.Equal(t, packets.CONNACK, cp.Type)
	require.NoError(t, conn.SetReadDeadline(time.Time{}))
	return conn, true
}

// requireConnectsSoon retries tryConnect until the broker accepts: the
// place a closed connection held is given back when the broker has
// finished with it.
func requireConnectsSoon(t *testing.T, src, addr, clientID string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, ok := tryConnect(t, src, addr, clientID); ok {
			return
		}
	}
	t.Fatalf("no connection accepted from %s within 5s", src)
}

func TestConnectionLimits(t *testing.T) {
	t.Run("per address", func(t *testing.T) {
		b := startBroker(t, func(c *Config) { c.MaxConnectionsPerIP = 2 })
		addr := b.MQTTAddr()
		first, ok := tryConnect(t, "127.0.0.1", addr, "a1")
		require.True(t, ok)
		_, ok = tryConnect(t, "127.0.0.1", addr, "a2")
		require.True(t, ok)
		_, ok = tryConnect(t, "127.0.0.1", addr, "a3")
		require.False(t, ok, "a third connection from 127.0.0.1")
		_, ok = tryConnect(t, "127.0.0.2", addr, "b1")
		require.True(t, ok, "another address has its own count")
		require.Equal(t, ConnectionsRefused{IPLimit: 1}, b.Overview().ConnectionsRefused)
		requireMetric(t, b, `luffymq_connections_refused_total{limit="ip"} 1`)
		requireMetric(t, b, `luffymq_connections_refused_total{limit="listener"} 0`)

		// Closing a connection gives its place back.
		require.NoError(t, first.Close())
		requireConnectsSoon(t, "127.0.0.1", addr, "a4")
	})
	t.Run("per listener", func(t *testing.T) {
		b := startBroker(t, func(c *Config) { c.MaxConnections = 2 })
		addr := b.MQTTAddr()
		first, ok := tryConnect(t, "127.0.0.1", addr, "a1")
		require.True(t, ok)
		_, ok = tryConnect(t, "127.0.0.2", addr, "a2")
		require.True(t, ok)
		_, ok = tryConnect(t, "127.0.0.3", addr, "a3")
		require.False(t, ok, "a third connection to the listener")
		require.Equal(t, ConnectionsRefused{ListenerLimit: 1}, b.Overview().ConnectionsRefused)
		requireMetric(t, b, `luffymq_connections_refused_total{limit="listener"} 1`)

		require.NoError(t, first.Close())
		requireConnectsSoon(t, "127.0.0.3", addr, "a4")
	})
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func TestDeclaredLargePublishesAreNotAllocatedUpFront(t *testing.T) {
	const clients = 200
	const declared = 1_000_000 // under the default 1 MiB packet limit
	b := startBroker(t, nil)
	conns := make([]*rawConn, clients)
	for i := range conns {
		conns[i], _ = dialRaw(t, hygieneDial(t, "127.0.0.1", b.MQTTAddr()), fmt.Sprintf("big-%d", i))
	}
	before := heapInUse()
	// A PUBLISH header announcing about 1 MB, then 14 bytes of it.
	start := append([]byte{0x30}, varint(declared)...)
	start = append(start, 0, 3, 'a', '/', 'b', 0)
	start = append(start, bytes.Repeat([]byte{'x'}, 14-6)...)
	for _, rc := range conns {
		rc.writeBytes(start)
	}
	// Let the broker read every connection's bytes (Mochi, unguarded,
	// would allocate the declared length at once).
	time.Sleep(500 * time.Millisecond)
	after := heapInUse()
	grew := int64(after) - int64(before)
	t.Logf("heap in use: %d MB before, %d MB after %d connections declared %d bytes each", before>>20, after>>20, clients, declared)
	require.Less(t, grew, int64(20<<20), "heap grew by %d bytes", grew)

	// The connections are alive and the broker still serves others.
	sub := connectPaho(t, b.MQTTAddr(), "still-serving", nil)
	sub.subscribe(t, "x", 0)
}

func TestLargePublishArrivingSlowlyIsDeliveredIntact(t *testing.T) {
	b := startBroker(t, nil)
	received := make(chan *paho.Publish, 1)
	sub := connectPaho(t, b.MQTTAddr(), "sub", func(p *paho.Publish) { received <- p })
	sub.subscribe(t, "big/one", 1)

	payload := make([]byte, 1_000_000)
	_, err := rand.Read(payload)
	require.NoError(t, err)
	pub := packets.NewControlPacket(packets.PUBLISH)
	p := pub.Content.(*packets.Publish)
	p.Topic, p.QoS, p.PacketID, p.Payload = "big/one", 1, 7, payload
	wire := packetBytes(t, pub)
	require.Less(t, len(wire), DefaultMaxPacketSize)

	rc, _ := dialRaw(t, hygieneDial(t, "127.0.0.1", b.MQTTAddr()), "pub")
	for off := 0; off < len(wire); off += 50_000 {
		rc.writeBytes(wire[off:min(off+50_000, len(wire))])
		time.Sleep(2 * time.Millisecond)
	}
	ack := rc.read()
	require.Equal(t, packets.PUBACK, ack.Type)
	select {
	case got := <-received:
		require.Equal(t, "big/one", got.Topic)
		require.True(t, bytes.Equal(payload, got.Payload), "payload of %d bytes differs", len(got.Payload))
	case <-time.After(10 * time.Second):
		t.Fatal("the 1 MB publish was not delivered")
	}
}

func TestConnectionHygieneFlags(t *testing.T) {
	cfg, err := ConfigFromArgs(nil, io.Discard, io.Discard)
	require.NoError(t, err)
	full, err := cfg.withDefaults()
	require.NoError(t, err)
	require.Equal(t, DefaultConnectTimeout, full.ConnectTimeout)
	require.Zero(t, full.MaxConnections)
	require.Zero(t, full.MaxConnectionsPerIP)

	cfg, err = ConfigFromArgs([]string{"--connect-timeout", "0", "--max-connections", "100", "--max-connections-per-ip", "10"}, io.Discard, io.Discard)
	require.NoError(t, err)
	full, err = cfg.withDefaults()
	require.NoError(t, err)
	require.Negative(t, full.ConnectTimeout, "0 disables the timeout")
	require.Equal(t, 100, full.MaxConnections)
	require.Equal(t, 10, full.MaxConnectionsPerIP)

	for _, args := range [][]string{
		{"--connect-timeout", "-1s"},
		{"--max-connections", "-1"},
		{"--max-connections-per-ip", "-2"},
	} {
		_, err := ConfigFromArgs(args, io.Discard, io.Discard)
		require.Error(t, err, "%v", args)
		require.Contains(t, err.Error(), strings.TrimPrefix(args[0], "--"))
	}
}
