package pingreq

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// recordingConn is a net.Conn that records what is written to it.
type recordingConn struct {
	net.Conn
	mu  sync.Mutex
	out bytes.Buffer
	err error
}

func (r *recordingConn) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return 0, r.err
	}
	return r.out.Write(p)
}

func (r *recordingConn) SetWriteDeadline(time.Time) error { return nil }
func (r *recordingConn) SetReadDeadline(time.Time) error  { return nil }
func (r *recordingConn) Close() error                     { return nil }

// writtenThrough waits until c's writer has sent everything queued to r,
// then returns what r received.
func writtenThrough(c *Conn, r *recordingConn) []byte {
	for c.WriteStats().QueuedBytes > 0 {
		time.Sleep(100 * time.Microsecond)
	}
	return r.written()
}

func (r *recordingConn) written() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]byte(nil), r.out.Bytes()...)
}

// filled returns an MQTT packet with the given fixed header byte and a
// body of n bytes of b.
func filled(header byte, n int, b byte) []byte { return packet(header, bytes.Repeat([]byte{b}, n)) }

var (
	qos1Publish = func(b byte) []byte { return filled(0x32, 5, b) }
	qos2Publish = func(b byte) []byte { return filled(0x34, 5, b) }
	qos0Publish = func(b byte) []byte { return filled(0x30, 5, b) }
	pingresp    = []byte{0xD0, 0x00}
)

func TestSendQuotaHoldsPublishesOverReceiveMaximum(t *testing.T) {
	inner := &recordingConn{}
	c := NewConn(inner, 0)
	require.NoError(t, c.SetReceiveMaximum(2))

	// One Write with several packets, as Mochi's buffered writes do.
	n, err := c.Write(concat(qos1Publish('a'), qos0Publish('z'), qos2Publish('b'), qos1Publish('c'), pingresp, qos0Publish('y')))
	require.NoError(t, err)
	require.Equal(t, 5*7+2, n, "the whole write is reported written")
	require.Equal(t, concat(qos1Publish('a'), qos0Publish('z'), qos2Publish('b'), pingresp, qos0Publish('y')), writtenThrough(c, inner),
		"QoS 0 and other packets pass; the third QoS≥1 publish waits")
	inflight, held := c.QuotaState()
	require.Equal(t, 2, inflight)
	require.Equal(t, 1, held)

	// Later publishes queue behind the held one, in order.
	_, err = c.Write(qos1Publish('d'))
	require.NoError(t, err)
	require.NoError(t, c.ReleaseDelivery())
	require.Equal(t, concat(qos1Publish('a'), qos0Publish('z'), qos2Publish('b'), pingresp, qos0Publish('y'), qos1Publish('c')), writtenThrough(c, inner))
	require.NoError(t, c.ReleaseDelivery())
	inflight, held = c.QuotaState()
	require.Equal(t, 2, inflight) // c and d
	require.Zero(t, held)
	require.True(t, bytes.HasSuffix(writtenThrough(c, inner), qos1Publish('d')))

	// Raising the limit (or 0: none) writes what waits.
	_, err = c.Write(concat(qos1Publish('e'), qos1Publish('f')))
	require.NoError(t, err)
	require.NoError(t, c.SetReceiveMaximum(0))
	require.True(t, bytes.HasSuffix(writtenThrough(c, inner), concat(qos1Publish('e'), qos1Publish('f'))))
}

func TestSendQuotaWithoutLimitPassesEverything(t *testing.T) {
	inner := &recordingConn{}
	c := NewConn(inner, 0)
	stream := concat(qos1Publish('a'), qos1Publish('b'), qos2Publish('c'))
	_, err := c.Write(stream)
	require.NoError(t, err)
	require.Equal(t, stream, writtenThrough(c, inner))
	inflight, _ := c.QuotaState()
	require.Equal(t, 3, inflight, "counted even before a limit is known")
}

func TestSendQuotaPassesThroughWhenFramingIsLost(t *testing.T) {
	inner := &recordingConn{}
	c := NewConn(inner, 0)
	require.NoError(t, c.SetReceiveMaximum(1))
	half := qos1Publish('a')[:4]
	_, err := c.Write(half)
	require.NoError(t, err)
	_, err = c.Write(concat(qos1Publish('b'), qos1Publish('c')))
	require.NoError(t, err)
	require.Equal(t, concat(half, qos1Publish('b'), qos1Publish('c')), writtenThrough(c, inner))
}

func TestSendQuotaBoundsHeldBytes(t *testing.T) {
	inner := &recordingConn{}
	c := NewConn(inner, 0)
	require.NoError(t, c.SetReceiveMaximum(1))
	big := filled(0x32, 1<<20, 'x')
	var err error
	for i := 0; i < MaxHeldBytes/len(big)+3 && err == nil; i++ {
		_, err = c.Write(big)
	}
	require.ErrorIs(t, err, ErrHeldTooMuch)
	_, err = c.Write(qos0Publish('z'))
	require.ErrorIs(t, err, ErrHeldTooMuch, "the connection stays failed")
}

func TestWriteErrorsAreSticky(t *testing.T) {
	broken := errors.New("broken pipe")
	inner := &recordingConn{err: broken}
	c := NewConn(inner, 0)
	// The write is queued; the writer goroutine meets the error, and from
	// then on every Write returns it.
	_, err := c.Write(qos1Publish('a'))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err = c.Write(qos0Publish('b'))
		return err != nil
	}, 2*time.Second, time.Millisecond)
	require.ErrorIs(t, err, broken)
	_, err = c.Write(qos1Publish('c'))
	require.ErrorIs(t, err, broken, "the connection stays failed")
}

// BenchmarkConnWrite measures the outbound path: a QoS 1 publish of 100
// bytes passing the Receive Maximum check.
func BenchmarkConnWrite(b *testing.B) {
	c := NewConn(discardConn{}, 0)
	pk := filled(0x32, 100, 'p')
	b.SetBytes(int64(len(pk)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Write(pk); err != nil {
			b.Fatal(err)
		}
		if err := c.ReleaseDelivery(); err != nil {
			b.Fatal(err)
		}
	}
}

type discardConn struct{ net.Conn }

func (discardConn) Write(p []byte) (int, error)      { return len(p), nil }
func (discardConn) SetWriteDeadline(time.Time) error { return nil }
func (discardConn) Close() error                     { return nil }

// publishWithID returns a QoS≥1 PUBLISH (header 0x32 or 0x34) to topic
// "t" with the given packet identifier.
func publishWithID(header byte, id uint16) []byte {
	return packet(header, []byte{0, 1, 't', byte(id >> 8), byte(id), 0})
}

func TestEndResendReleasesInDeliveryOrderWithinReceiveMaximum(t *testing.T) {
	inner := &recordingConn{}
	c := NewConn(inner, 0)
	require.NoError(t, c.SetReceiveMaximum(2))
	c.BeginResend()
	connack := []byte{0x20, 0x03, 0x00, 0x00, 0x00}
	_, err := c.Write(connack)
	require.NoError(t, err)
	// Mochi resends 7, 3, 5 (its own order); the session delivered 3, 5, 7.
	_, err = c.Write(concat(publishWithID(0x32, 7), qos0Publish('z'), publishWithID(0x34, 3)))
	require.NoError(t, err)
	_, err = c.Write(publishWithID(0x32, 5))
	require.NoError(t, err)
	require.Equal(t, concat(connack, qos0Publish('z')), writtenThrough(c, inner),
		"nothing QoS≥1 is written while the session resumes; other packets pass")

	order := map[uint16]uint64{3: 10, 5: 11, 7: 12}
	require.NoError(t, c.EndResend(func(id uint16) (uint64, bool) { s, ok := order[id]; return s, ok }))
	require.Equal(t, concat(connack, qos0Publish('z'), publishWithID(0x34, 3), publishWithID(0x32, 5)), writtenThrough(c, inner),
		"the oldest deliveries first, as many as the Receive Maximum allows")
	inflight, held := c.QuotaState()
	require.Equal(t, 2, inflight)
	require.Equal(t, 1, held)
	require.NoError(t, c.ReleaseDelivery())
	require.True(t, bytes.HasSuffix(writtenThrough(c, inner), publishWithID(0x32, 7)))
}

func TestEndResendKeepsUnknownDeliveriesAfterKnownOnes(t *testing.T) {
	inner := &recordingConn{}
	c := NewConn(inner, 0)
	c.BeginResend()
	_, err := c.Write(concat(publishWithID(0x32, 9), publishWithID(0x32, 8), publishWithID(0x32, 2), publishWithID(0x32, 1)))
	require.NoError(t, err)
	known := map[uint16]uint64{2: 5, 1: 6}
	require.NoError(t, c.EndResend(func(id uint16) (uint64, bool) { s, ok := known[id]; return s, ok }))
	require.Equal(t, concat(publishWithID(0x32, 2), publishWithID(0x32, 1), publishWithID(0x32, 9), publishWithID(0x32, 8)), writtenThrough(c, inner))
}

func TestResentPubrelCountsAgainstReceiveMaximum(t *testing.T) {
	inner := &recordingConn{}
	c := NewConn(inner, 0)
	require.NoError(t, c.SetReceiveMaximum(1))
	c.BeginResend()
	pubrel := []byte{0x62, 0x02, 0x00, 0x04}
	_, err := c.Write(concat(pubrel, publishWithID(0x34, 5)))
	require.NoError(t, err)
	require.NoError(t, c.EndResend(nil))
	require.Equal(t, pubrel, writtenThrough(c, inner), "the QoS 2 delivery waiting for PUBCOMP fills Receive Maximum 1")
	require.NoError(t, c.ReleaseDelivery()) // its PUBCOMP
	require.Equal(t, concat(pubrel, publishWithID(0x34, 5)), writtenThrough(c, inner))

	// A PUBREL written in the live flow (after the client's PUBREC) is
	// not a new delivery: it does not count again.
	_, err = c.Write(pubrel)
	require.NoError(t, err)
	inflight, _ := c.QuotaState()
	require.Equal(t, 1, inflight)
}

func TestPublishPacketID(t *testing.T) {
	id, ok := publishPacketID(publishWithID(0x32, 0xBEEF), 1)
	require.True(t, ok)
	require.Equal(t, uint16(0xBEEF), id)
	_, ok = publishPacketID([]byte{0x32, 0x03, 0x00, 0x05, 't'}, 1)
	require.False(t, ok, "a topic longer than the packet")
}

// signalConn is a net.Conn that takes every write at once and signals it.
type signalConn struct {
	net.Conn
	wrote chan struct{}
}

func (s signalConn) Write(p []byte) (int, error) {
	s.wrote <- struct{}{}
	return len(p), nil
}
func (signalConn) SetWriteDeadline(time.Time) error { return nil }
func (signalConn) Close() error                     { return nil }

// BenchmarkConnWriteOneAtATime writes a QoS 0 publish of 100 bytes and
// waits until the writer has sent it before the next: a connection given
// one message at a time, whose writer is idle at each write. The outbox
// keeps its buffers while idle, so this allocates nothing per message.
func BenchmarkConnWriteOneAtATime(b *testing.B) {
	sink := signalConn{wrote: make(chan struct{})}
	c := NewConn(sink, 0)
	pk := filled(0x30, 100, 'p')
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Write(pk); err != nil {
			b.Fatal(err)
		}
		<-sink.wrote
	}
}
