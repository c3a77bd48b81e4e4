package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/hooks/storage/badger"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/internal/testenv"
)

// The Receive Maximum conformance matrix: a persistent session goes away
// (or is taken over while it holds deliveries unacknowledged), messages
// are queued for it, and it comes back. Every message must then arrive, in
// order, never more than the client's Receive Maximum unacknowledged at
// once, as Mosquitto delivers them. luffymq, Mosquitto and vanilla Mochi run
// the same cells; luffymq must match Mosquitto in every cell, and vanilla
// Mochi's differences are logged.
//
// Why earlier tests missed the stranded messages: every resume test used
// paho.golang clients, whose Receive Maximum is 65 535 and which do not
// subscribe again on a resumed session, and compared what arrived as a
// set. mosquitto_sub resumes with Receive Maximum 20 and subscribes again
// with packet identifier 1, which Mochi refused (0x91 Packet Identifier in
// use) while its own delivery used that identifier; mosquitto_sub then
// quits. And Mochi resends a resumed session's messages shuffled within
// each second. The client here does what mosquitto_sub does, with small
// Receive Maximums, and checks order.

// matrixMode is how the session comes back.
type matrixMode string

const (
	modeReconnect matrixMode = "reconnect" // the client disconnects and connects again
	modeRestart   matrixMode = "restart"   // ... and the broker restarts in between
	modeTakeover  matrixMode = "takeover"  // the old connection stays open, unacknowledging
)

type matrixCell struct {
	mode           matrixMode
	receiveMaximum uint16
	queued         int
	qos            byte
}

func (c matrixCell) String() string {
	return fmt.Sprintf("%s/rm%d/n%d/qos%d", c.mode, c.receiveMaximum, c.queued, c.qos)
}

func (c matrixCell) clientID() string {
	return strings.ReplaceAll("rmx-"+c.String(), "/", "-")
}

func (c matrixCell) topic() string { return "rmx/" + c.String() }

// matrixCells returns every cell: Receive Maximum 1, 20 and 65 535, with
// 0, RM−1, RM and 10×RM messages queued, at QoS 1 and 2, for each mode.
// For Receive Maximum 65 535 the queued counts are 0, 100 and 1 000:
// RM−1 and more would be tens of thousands of messages per cell, beyond
// what a test on two cores should publish, and all below the limit anyway.
func matrixCells() []matrixCell {
	var cells []matrixCell
	for _, mode := range []matrixMode{modeReconnect, modeRestart, modeTakeover} {
		for _, rm := range []uint16{1, 20, 65535} {
			counts := []int{0, int(rm) - 1, int(rm), 10 * int(rm)}
			if rm == 65535 {
				counts = []int{0, 100, 1000}
			}
			counts = slices.Compact(counts) // RM 1: 0 and RM−1 are the same
			for _, n := range counts {
				for _, qos := range []byte{1, 2} {
					cells = append(cells, matrixCell{mode: mode, receiveMaximum: rm, queued: n, qos: qos})
				}
			}
		}
	}
	return cells
}

// matrixOutcome is what one cell delivered after the session came back.
type matrixOutcome struct {
	delivered  []int // message numbers, in order of first arrival
	duplicates int
	overLimit  int  // deliveries that took the unacknowledged count over the Receive Maximum
	subackOK   bool // the SUBSCRIBE sent again on the resumed session was granted
}

func (o matrixOutcome) inOrder(n int) bool {
	if len(o.delivered) != n {
		return false
	}
	for i, m := range o.delivered {
		if m != i {
			return false
		}
	}
	return true
}

func (o matrixOutcome) String() string {
	return fmt.Sprintf("%d delivered (%s), %d duplicates, %d over the limit, suback ok %v",
		len(o.delivered), summariseSequence(o.delivered), o.duplicates, o.overLimit, o.subackOK)
}

// summariseSequence shows the first numbers of a sequence, enough to see
// a shuffle.
func summariseSequence(s []int) string {
	if len(s) > 12 {
		return fmt.Sprint(s[:12]) + "…"
	}
	return fmt.Sprint(s)
}

// matrixBroker is a broker under test that keeps sessions across Restart.
type matrixBroker struct {
	name    string
	addr    func() string
	restart func(t *testing.T)
}

func TestReceiveMaximumConformanceMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Mosquitto and three brokers")
	}
	cells := matrixCells()
	brokers := []matrixBroker{luffymqMatrixBroker(t), mosquittoMatrixBroker(t), mochiMatrixBroker(t)}
	results := make(map[string]map[matrixCell]matrixOutcome)
	for _, b := range brokers {
		results[b.name] = runMatrix(t, b, cells)
	}

	var mochiDiffers []string
	for _, c := range cells {
		lm, mo, mc := results["luffymq"][c], results["mosquitto"][c], results["mochi"][c]
		assert.True(t, mo.inOrder(c.queued), "mosquitto, %s: %s", c, mo)
		assert.Equal(t, mo.delivered, lm.delivered, "luffymq delivers otherwise than mosquitto in %s: luffymq %s; mosquitto %s", c, lm, mo)
		assert.True(t, lm.inOrder(c.queued), "luffymq, %s: %s", c, lm)
		assert.Zero(t, lm.overLimit, "luffymq exceeded the Receive Maximum in %s: %s", c, lm)
		assert.True(t, lm.subackOK, "luffymq refused the SUBSCRIBE of the resumed session in %s", c)
		if !slices.Equal(mc.delivered, mo.delivered) || mc.overLimit > 0 || !mc.subackOK {
			mochiDiffers = append(mochiDiffers, fmt.Sprintf("%s: %s", c, mc))
		}
	}
	t.Logf("%d cells: luffymq delivers as mosquitto in all; vanilla Mochi differs in %d", len(cells), len(mochiDiffers))
	for _, d := range mochiDiffers {
		t.Logf("  vanilla Mochi %s", d)
	}
}

// runMatrix runs every cell against b: it leaves (or holds) each session,
// queues its messages, restarts b once for the restart cells, and brings
// each session back.
func runMatrix(t *testing.T, b matrixBroker, cells []matrixCell) map[matrixCell]matrixOutcome {
	t.Helper()
	out := make(map[matrixCell]matrixOutcome, len(cells))
	for _, mode := range []matrixMode{modeReconnect, modeRestart, modeTakeover} {
		var modeCells []matrixCell
		for _, c := range cells {
			if c.mode == mode {
				modeCells = append(modeCells, c)
			}
		}
		held := make(map[matrixCell]*matrixConn)
		for _, c := range modeCells {
			// Clean Start 0 on a new client ID, as mosquitto_sub -c does:
			// Mosquitto 2.0.11 does not keep a session begun with Clean
			// Start 1 across its restart, whatever its expiry interval.
			mc := dialMatrix(t, b.addr(), c.clientID(), c.receiveMaximum, false)
			require.True(t, mc.subscribe(c.topic(), c.qos), "%s: %s refused the first SUBSCRIBE", b.name, c)
			if mode == modeTakeover {
				held[c] = mc // stays connected and acknowledges nothing
			} else {
				mc.disconnect()
			}
		}
		publishMatrix(t, b.addr(), modeCells)
		if mode == modeRestart {
			b.restart(t)
		}
		var mu sync.Mutex
		var errs []error
		var wg sync.WaitGroup
		limit := make(chan struct{}, 8)
		for _, c := range modeCells {
			wg.Add(1)
			limit <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-limit }()
				o, err := resumeMatrix(b.addr(), c)
				mu.Lock()
				out[c] = o
				errs = append(errs, err)
				mu.Unlock()
			}()
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...), "%s: resuming the %s sessions", b.name, mode)
		for _, mc := range held {
			mc.close()
		}
	}
	return out
}

// publishMatrix publishes each cell's messages, numbered from 0, at the
// cell's QoS, in order, one at a time (each acknowledged before the next).
func publishMatrix(t *testing.T, addr string, cells []matrixCell) {
	t.Helper()
	pub := dialMatrix(t, addr, "rmx-publisher", 65535, true)
	defer pub.disconnect()
	for _, c := range cells {
		publishNumbered(t, pub, c.topic(), c.qos, c.queued)
	}
}

// publishNumbered publishes the payloads "0" to n-1 to topic.
func publishNumbered(t *testing.T, pub *matrixConn, topic string, qos byte, n int) {
	t.Helper()
	for m := range n {
		require.NoError(t, pub.publish(topic, qos, uint16(m%65535)+1, strconv.Itoa(m)))
	}
}

// resumeMatrix brings c's session back on a new connection, subscribes
// again with packet identifier 1 as mosquitto_sub does, and acknowledges
// everything at once, until c's messages have all arrived and nothing more
// comes for a while. It runs on a goroutine of its own: it reports
// failures rather than ending the test.
func resumeMatrix(addr string, c matrixCell) (matrixOutcome, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return matrixOutcome{}, err
	}
	mc := &matrixConn{id: c.clientID(), conn: conn, rm: c.receiveMaximum}
	defer mc.close()
	if err := mc.connect(false); err != nil {
		return matrixOutcome{}, fmt.Errorf("%s: %w", c, err)
	}
	o, err := mc.receive(c)
	if err != nil {
		err = fmt.Errorf("%s: %w", c, err)
	}
	return o, err
}

// matrixConn is a raw MQTT v5 client that does exactly what the matrix
// needs: no retries, no reordering, every packet seen.
type matrixConn struct {
	id   string
	conn net.Conn
	rm   uint16
}

// dialMatrix connects a client with a session that outlives its
// connection (expiry one hour) and Receive Maximum rm.
func dialMatrix(t *testing.T, addr, clientID string, rm uint16, cleanStart bool) *matrixConn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	mc := &matrixConn{id: clientID, conn: conn, rm: rm}
	t.Cleanup(mc.close)
	require.NoError(t, mc.connect(cleanStart))
	return mc
}

func (mc *matrixConn) connect(cleanStart bool) error {
	cp := packets.NewControlPacket(packets.CONNECT)
	connect := cp.Content.(*packets.Connect)
	connect.ProtocolName, connect.ProtocolVersion = "MQTT", 5
	connect.ClientID, connect.KeepAlive, connect.CleanStart = mc.id, 60, cleanStart
	expiry, rm := uint32(3600), mc.rm
	connect.Properties = &packets.Properties{SessionExpiryInterval: &expiry, ReceiveMaximum: &rm}
	if err := mc.write(cp); err != nil {
		return err
	}
	ack := mc.read(5 * time.Second)
	switch {
	case ack == nil:
		return fmt.Errorf("%s: no CONNACK", mc.id)
	case ack.Type != packets.CONNACK:
		return fmt.Errorf("%s: %s instead of CONNACK", mc.id, ack.PacketType())
	case ack.Content.(*packets.Connack).ReasonCode != 0:
		return fmt.Errorf("%s: CONNACK refused (reason %#x)", mc.id, ack.Content.(*packets.Connack).ReasonCode)
	}
	return nil
}

func (mc *matrixConn) write(cp *packets.ControlPacket) error {
	_, err := cp.WriteTo(mc.conn)
	return err
}

// read returns the next packet, or nil after wait without one.
func (mc *matrixConn) read(wait time.Duration) *packets.ControlPacket {
	_ = mc.conn.SetReadDeadline(time.Now().Add(wait))
	cp, err := packets.ReadPacket(mc.conn)
	if err != nil {
		return nil
	}
	return cp
}

// subscribe subscribes with packet identifier 1 and reports whether the
// subscription was granted. Deliveries that arrive before the SUBACK are
// left for receive: it is only called on a fresh session here.
func (mc *matrixConn) subscribe(filter string, qos byte) bool {
	if mc.write(subscribePacket(filter, qos)) != nil {
		return false
	}
	for {
		cp := mc.read(5 * time.Second)
		if cp == nil {
			return false
		}
		if cp.Type == packets.SUBACK {
			return cp.Content.(*packets.Suback).Reasons[0] < 0x80
		}
	}
}

func subscribePacket(filter string, qos byte) *packets.ControlPacket {
	cp := packets.NewControlPacket(packets.SUBSCRIBE)
	sub := cp.Content.(*packets.Subscribe)
	sub.PacketID = 1
	sub.Subscriptions = []packets.SubOptions{{Topic: filter, QoS: qos}}
	return cp
}

// publish publishes one message and waits for its flow to complete.
func (mc *matrixConn) publish(topic string, qos byte, id uint16, payload string) error {
	cp := packets.NewControlPacket(packets.PUBLISH)
	p := cp.Content.(*packets.Publish)
	p.Topic, p.QoS, p.PacketID, p.Payload = topic, qos, id, []byte(payload)
	if err := mc.write(cp); err != nil {
		return err
	}
	for {
		ack := mc.read(5 * time.Second)
		if ack == nil {
			return fmt.Errorf("%s: publish %s to %s unacknowledged", mc.id, payload, topic)
		}
		switch ack.Type {
		case packets.PUBACK, packets.PUBCOMP:
			return nil
		case packets.PUBREC:
			rel := packets.NewControlPacket(packets.PUBREL)
			rel.Content.(*packets.Pubrel).PacketID = id
			if err := mc.write(rel); err != nil {
				return err
			}
		}
	}
}

// receive subscribes again on the resumed session and takes deliveries,
// acknowledging each at once, until c.queued distinct messages arrived and
// 200 ms passed without a packet (or 10 s in all).
func (mc *matrixConn) receive(c matrixCell) (matrixOutcome, error) {
	var o matrixOutcome
	if err := mc.write(subscribePacket(c.topic(), c.qos)); err != nil {
		return o, err
	}
	seen := make(map[int]bool)
	unacked := 0
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		wait := 2 * time.Second
		if len(seen) >= c.queued && o.subackOK {
			wait = 200 * time.Millisecond
		}
		cp := mc.read(wait)
		if cp == nil {
			if len(seen) >= c.queued {
				break
			}
			continue
		}
		switch cp.Type {
		case packets.SUBACK:
			o.subackOK = cp.Content.(*packets.Suback).Reasons[0] < 0x80
		case packets.PUBLISH:
			p := cp.Content.(*packets.Publish)
			if p.QoS > 0 {
				unacked++
				if unacked > int(mc.rm) {
					o.overLimit++
				}
			}
			m, err := strconv.Atoi(string(p.Payload))
			if err != nil {
				return o, fmt.Errorf("payload %q is not a message number", p.Payload)
			}
			if seen[m] {
				o.duplicates++
			} else {
				seen[m] = true
				o.delivered = append(o.delivered, m)
			}
			switch p.QoS {
			case 1:
				ack := packets.NewControlPacket(packets.PUBACK)
				ack.Content.(*packets.Puback).PacketID = p.PacketID
				if err := mc.write(ack); err != nil {
					return o, err
				}
				unacked--
			case 2:
				rec := packets.NewControlPacket(packets.PUBREC)
				rec.Content.(*packets.Pubrec).PacketID = p.PacketID
				if err := mc.write(rec); err != nil {
					return o, err
				}
			}
		case packets.PUBREL:
			comp := packets.NewControlPacket(packets.PUBCOMP)
			comp.Content.(*packets.Pubcomp).PacketID = cp.Content.(*packets.Pubrel).PacketID
			if err := mc.write(comp); err != nil {
				return o, err
			}
			unacked--
		}
	}
	return o, nil
}

func (mc *matrixConn) disconnect() {
	_, _ = packets.NewControlPacket(packets.DISCONNECT).WriteTo(mc.conn)
	mc.close()
}

func (mc *matrixConn) close() { _ = mc.conn.Close() }

// luffymqMatrixBroker starts luffymq with a data directory; restart closes
// it and starts a new one on the same address and directory.
func luffymqMatrixBroker(t *testing.T) matrixBroker {
	dir := t.TempDir()
	cfg := Config{
		MQTTListen:     "127.0.0.1:0",
		ReportInterval: time.Second,
		DataDir:        dir,
		Logger:         discardLogger(),
	}
	b := startMatrixLuffymq(t, cfg)
	t.Cleanup(func() { _ = b.Close() }) // the broker running at the end
	cfg.MQTTListen = b.MQTTAddr()
	return matrixBroker{
		name: "luffymq",
		addr: func() string { return cfg.MQTTListen },
		restart: func(t *testing.T) {
			require.NoError(t, b.Close())
			b = startMatrixLuffymq(t, cfg)
		},
	}
}

func startMatrixLuffymq(t *testing.T, cfg Config) *Broker {
	t.Helper()
	var b *Broker
	require.Eventually(t, func() bool { // the port may take a moment to come free
		var err error
		if b, err = New(cfg); err != nil {
			return false
		}
		if err = b.Start(); err != nil {
			_ = b.Close()
			return false
		}
		return true
	}, 10*time.Second, 100*time.Millisecond)
	return b
}

func mosquittoMatrixBroker(t *testing.T) matrixBroker {
	m := testenv.StartPersistentMosquitto(t)
	return matrixBroker{name: "mosquitto", addr: func() string { return m.Addr }, restart: func(t *testing.T) { m.Restart(t) }}
}

// mochiMatrixBroker starts vanilla Mochi MQTT with its Badger store, as
// its documentation sets it up.
func mochiMatrixBroker(t *testing.T) matrixBroker {
	dir := filepath.Join(t.TempDir(), "badger")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	start := func(t *testing.T) *mqtt.Server {
		s := mqtt.New(&mqtt.Options{InlineClient: false, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		require.NoError(t, s.AddHook(new(auth.AllowHook), nil))
		require.NoError(t, s.AddHook(new(badger.Hook), &badger.Options{Path: dir}))
		require.NoError(t, s.AddListener(listeners.NewTCP(listeners.Config{ID: "t", Address: addr})))
		require.NoError(t, s.Serve())
		return s
	}
	s := start(t)
	t.Cleanup(func() { _ = s.Close() })
	return matrixBroker{
		name: "mochi",
		addr: func() string { return addr },
		restart: func(t *testing.T) {
			require.NoError(t, s.Close())
			s = start(t)
		},
	}
}

// TestResumeWithMosquittoSub is the case the matrix grew from, with the
// real mosquitto_sub: a persistent session (Receive Maximum 20, the
// client's default, and MQTT 3.1.1) has 50 QoS 1 messages queued while it
// is away, then resumes, with and without a broker restart in between;
// luffymq must deliver all 50, in order, as Mosquitto does.
func TestResumeWithMosquittoSub(t *testing.T) {
	if testing.Short() {
		t.Skip("runs mosquitto_sub")
	}
	sub := testenv.RequireBinary(t, "mosquitto_sub", "mosquitto-clients")
	for _, b := range []matrixBroker{luffymqMatrixBroker(t), mosquittoMatrixBroker(t)} {
		for _, version := range []string{"5", "311"} {
			for _, restart := range []bool{false, true} {
				name := fmt.Sprintf("%s/v%s/restart=%v", b.name, version, restart)
				t.Run(name, func(t *testing.T) {
					id := strings.ReplaceAll("ms-"+name, "/", "-")
					topic := "ms/" + name
					host, port, _ := net.SplitHostPort(b.addr())
					args := []string{"-V", version, "-h", host, "-p", port, "-i", id, "-c", "-q", "1", "-t", topic}
					if version == "5" {
						args = append(args, "-x", "3600")
					}
					runSub := func(wait time.Duration) []string {
						ctx, cancel := context.WithTimeout(context.Background(), wait)
						defer cancel()
						out, _ := exec.CommandContext(ctx, sub, args...).Output() // ends by the timeout
						return strings.Fields(string(out))
					}
					runSub(time.Second) // creates the session and subscribes
					const queued = 50
					pub := dialMatrix(t, b.addr(), id+"-pub", 65535, true)
					publishNumbered(t, pub, topic, 1, queued)
					pub.disconnect()
					if restart {
						b.restart(t)
					}
					got := runSub(3 * time.Second)
					want := make([]string, queued)
					for i := range want {
						want[i] = strconv.Itoa(i)
					}
					require.Equal(t, want, got, "%s: mosquitto_sub did not get the 50 messages in order", b.name)
				})
			}
		}
	}
}
