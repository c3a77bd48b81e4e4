package clientsdk

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/clientsdk/report"
)

// lockedConn is a net.Conn with a sync.Locker, like the connections paho
// wraps for thread-safe writes. It records every Write and whether the lock
// was held during it.
type lockedConn struct {
	net.Conn // nil: only Write and Close are used
	mu       sync.Mutex
	held     atomic.Bool
	writes   chan []byte
	unlocked atomic.Int32 // writes made without the lock
	closed   chan struct{}
	once     sync.Once
}

func newLockedConn() *lockedConn {
	return &lockedConn{writes: make(chan []byte, 100), closed: make(chan struct{})}
}

func (c *lockedConn) Lock()   { c.mu.Lock(); c.held.Store(true) }
func (c *lockedConn) Unlock() { c.held.Store(false); c.mu.Unlock() }

func (c *lockedConn) Write(b []byte) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	if !c.held.Load() {
		c.unlocked.Add(1)
	}
	c.writes <- bytes.Clone(b)
	return len(b), nil
}

func (c *lockedConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

// nextWrite returns the next packet written, failing after a deadline.
func (c *lockedConn) nextWrite(t *testing.T, within time.Duration) []byte {
	t.Helper()
	select {
	case b := <-c.writes:
		return b
	case <-time.After(within):
		t.Fatalf("no packet written within %s", within)
		return nil
	}
}

// fakeSource is a reportSource with settable load.
type fakeSource struct {
	mu          sync.Mutex
	signal      loadSignal
	connections int
}

func (f *fakeSource) loadSignal() loadSignal {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.signal
}

func (f *fakeSource) takeReport(time.Time) report.Report {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := report.Report{Pending: f.signal.pending, Workers: 1}
	if f.signal.finishedSinceReport > 0 {
		r.ProcessingTime = 25 * time.Millisecond
	}
	f.signal.finishedSinceReport = 0
	return r
}

func (f *fakeSource) connectionStarted() {
	f.mu.Lock()
	f.connections++
	f.mu.Unlock()
}

func (f *fakeSource) set(s loadSignal) {
	f.mu.Lock()
	f.signal = s
	f.mu.Unlock()
}

func quietLogger(buf *syncBuffer) *slog.Logger {
	if buf == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return slog.New(slog.NewTextHandler(buf, nil))
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runPinger runs p.Run on conn in the background. stop cancels it and
// returns Run's result; done is closed when Run has returned.
func runPinger(t *testing.T, p *reportPinger, conn net.Conn, keepAlive uint16) (stop func() error, done <-chan struct{}, result func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	var err error
	go func() {
		err = p.Run(ctx, conn, keepAlive)
		close(finished)
	}()
	result = func() error {
		<-finished
		return err
	}
	stop = func() error {
		cancel()
		select {
		case <-finished:
		case <-time.After(5 * time.Second):
			t.Fatal("pinger did not stop")
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop, finished, result
}

// splitPingreq checks pkt is one whole PINGREQ and returns its payload.
func splitPingreq(t *testing.T, pkt []byte) []byte {
	t.Helper()
	require.Equal(t, byte(report.PingreqType), pkt[0])
	n, mult, i := 0, 1, 1
	for ; ; i++ {
		n += int(pkt[i]&0x7f) * mult
		mult *= 128
		if pkt[i]&0x80 == 0 {
			break
		}
	}
	require.Len(t, pkt[i+1:], n, "one Write carries exactly one whole packet")
	return pkt[i+1:]
}

func TestPingerSendsFirstMeasurementAtOnceInOneLockedWrite(t *testing.T) {
	src := &fakeSource{}
	p := newReportPinger(src, ReportViaPingreq, func() time.Duration { return time.Hour }, quietLogger(nil))
	conn := newLockedConn()
	stop, _, _ := runPinger(t, p, conn, 0)

	src.set(loadSignal{pending: 0, finishedSinceReport: 1, meanKnown: true})
	p.signal()
	payload := splitPingreq(t, conn.nextWrite(t, 2*time.Second))
	r, err := report.Decode(payload)
	require.NoError(t, err)
	require.Equal(t, 25*time.Millisecond, r.ProcessingTime)
	require.Zero(t, conn.unlocked.Load(), "writes hold the connection's lock")
	require.NoError(t, stop())
	require.Equal(t, 1, src.connections)
	require.Equal(t, uint64(1), p.reportsSent.Load())
}

func TestPingerReportsPeriodically(t *testing.T) {
	src := &fakeSource{}
	p := newReportPinger(src, ReportViaPingreq, func() time.Duration { return 50 * time.Millisecond }, quietLogger(nil))
	conn := newLockedConn()
	_, _, _ = runPinger(t, p, conn, 0)
	start := time.Now()
	for range 4 {
		splitPingreq(t, conn.nextWrite(t, time.Second))
		p.PingResp()
	}
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond, "four reports 50 ms apart")
}

func TestPingerReportsPendingJump(t *testing.T) {
	src := &fakeSource{}
	p := newReportPinger(src, ReportViaPingreq, func() time.Duration { return time.Hour }, quietLogger(nil))
	conn := newLockedConn()
	_, _, _ = runPinger(t, p, conn, 0)

	src.set(loadSignal{pending: 7})
	p.notePending(7)
	r, err := report.Decode(splitPingreq(t, conn.nextWrite(t, time.Second)))
	require.NoError(t, err)
	require.Equal(t, 7, r.Pending)
	require.Equal(t, int64(7), p.lastPending.Load())

	p.notePending(8) // no jump from 7: no report
	select {
	case b := <-conn.writes:
		t.Fatalf("unexpected report %q", b)
	default:
	}
}

func TestPingerFallsBackWhenConnectionDropsAfterExtendedPingreq(t *testing.T) {
	logs := &syncBuffer{}
	src := &fakeSource{}
	src.set(loadSignal{finishedSinceReport: 1, meanKnown: true})
	p := newReportPinger(src, ReportViaPingreq, func() time.Duration { return time.Hour }, quietLogger(logs))

	conn := newLockedConn()
	stop, _, _ := runPinger(t, p, conn, 0)
	splitPingreq(t, conn.nextWrite(t, time.Second))
	require.NoError(t, stop()) // the broker dropped the connection, unanswered
	require.True(t, p.fellBack.Load())
	require.Equal(t, ReportViaPublish, p.via())

	// The next connection reports by PUBLISH to the load topic.
	src.set(loadSignal{finishedSinceReport: 1, meanKnown: true})
	conn2 := newLockedConn()
	stop2, _, _ := runPinger(t, p, conn2, 0)
	pkt := conn2.nextWrite(t, time.Second)
	require.Equal(t, byte(0x30), pkt[0], "QoS 0 PUBLISH")
	require.True(t, bytes.Contains(pkt, []byte(report.LoadTopic)))
	require.True(t, bytes.Contains(pkt, []byte(`"msgsInQueue":0`)))
	require.NoError(t, stop2())
	require.Equal(t, 1, strings.Count(logs.String(), "reporting load by PUBLISH"), "logged once")
}

func TestPingerKeepsPingreqWhenBrokerAnswers(t *testing.T) {
	src := &fakeSource{}
	src.set(loadSignal{finishedSinceReport: 1, meanKnown: true})
	p := newReportPinger(src, ReportViaPingreq, func() time.Duration { return time.Hour }, quietLogger(nil))
	conn := newLockedConn()
	stop, _, _ := runPinger(t, p, conn, 0)
	splitPingreq(t, conn.nextWrite(t, time.Second))
	p.PingResp()
	require.NoError(t, stop())
	require.False(t, p.fellBack.Load(), "an answered extended PINGREQ proves the broker takes them")
}

func TestPingerDoesNotFallBackWhileClosing(t *testing.T) {
	src := &fakeSource{}
	src.set(loadSignal{finishedSinceReport: 1, meanKnown: true})
	p := newReportPinger(src, ReportViaPingreq, func() time.Duration { return time.Hour }, quietLogger(nil))
	conn := newLockedConn()
	stop, _, _ := runPinger(t, p, conn, 0)
	splitPingreq(t, conn.nextWrite(t, time.Second))
	p.closing.Store(true)
	require.NoError(t, stop())
	require.False(t, p.fellBack.Load())
}

func TestPingerKeepAlive(t *testing.T) {
	src := &fakeSource{}
	p := newReportPinger(src, ReportOff, func() time.Duration { return 50 * time.Millisecond }, quietLogger(nil))
	conn := newLockedConn()
	_, done, result := runPinger(t, p, conn, 1)

	// Nothing is reported; a plain PINGREQ goes out after 1 s of silence.
	start := time.Now()
	require.Equal(t, []byte{0xC0, 0x00}, conn.nextWrite(t, 3*time.Second))
	require.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond)
	p.PacketReceived()
	p.PingResp()

	// Unanswered, the next one times the connection out.
	require.Equal(t, []byte{0xC0, 0x00}, conn.nextWrite(t, 3*time.Second))
	select {
	case <-done:
		require.ErrorContains(t, result(), "PINGRESP not received")
	case <-time.After(3 * time.Second):
		t.Fatal("no PINGRESP timeout")
	}
	require.False(t, p.fellBack.Load(), "plain PINGREQs say nothing about extended ones")
}

func TestPingerTimeoutOnExtendedPingreqFallsBack(t *testing.T) {
	src := &fakeSource{}
	src.set(loadSignal{finishedSinceReport: 1, meanKnown: true})
	p := newReportPinger(src, ReportViaPingreq, func() time.Duration { return time.Hour }, quietLogger(nil))
	conn := newLockedConn()
	_, done, result := runPinger(t, p, conn, 1)
	splitPingreq(t, conn.nextWrite(t, time.Second))
	select {
	case <-done:
		require.ErrorContains(t, result(), "PINGRESP not received")
	case <-time.After(3 * time.Second):
		t.Fatal("no PINGRESP timeout")
	}
	require.True(t, p.fellBack.Load(), "a broker that ignores extended PINGREQs gets reports by PUBLISH")
}

func TestPingerSuspendsPingrespTimeoutWhileReadingIsPaused(t *testing.T) {
	src := &fakeSource{}
	src.set(loadSignal{finishedSinceReport: 1, meanKnown: true})
	p := newReportPinger(src, ReportViaPingreq, func() time.Duration { return time.Hour }, quietLogger(nil))
	conn := newLockedConn()
	_, done, _ := runPinger(t, p, conn, 1)
	p.pauseReading() // back-pressure: paho cannot read the PINGRESP
	splitPingreq(t, conn.nextWrite(t, time.Second))
	select {
	case <-done:
		t.Fatal("timed out a PINGRESP that could not be read")
	case <-time.After(1500 * time.Millisecond):
	}
	p.resumeReading()
	p.PingResp()
	select {
	case <-done:
		t.Fatal("pinger stopped after reading resumed")
	default:
	}
	require.False(t, p.fellBack.Load())
}
