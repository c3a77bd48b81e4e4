package pingreq

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tcpPair returns the two ends of a loopback TCP connection, the server
// end with small socket buffers so that a peer that does not read fills
// it quickly.
func tcpPair(t *testing.T) (server *net.TCPConn, client *net.TCPConn) {
	t.Helper()
	server, client = tcpPairDefaultBuffers(t)
	require.NoError(t, server.SetWriteBuffer(4096))
	require.NoError(t, client.SetReadBuffer(4096))
	return server, client
}

// tcpPairDefaultBuffers returns the two ends of a loopback TCP connection
// with the kernel's default buffers.
func tcpPairDefaultBuffers(t *testing.T) (server *net.TCPConn, client *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	cc, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	sc := <-accepted
	require.NotNil(t, sc)
	server, client = sc.(*net.TCPConn), cc.(*net.TCPConn)
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	return server, client
}

// TestWriteNeverBlocksOnAPeerThatDoesNotRead: with the peer reading
// nothing, 1 MiB of writes all return at once; the bytes wait in the
// outbox.
func TestWriteNeverBlocksOnAPeerThatDoesNotRead(t *testing.T) {
	server, _ := tcpPair(t)
	c := NewConn(server, 0)
	pk := filled(0x32, 64<<10, 'x')
	start := time.Now()
	for range 16 {
		_, err := c.Write(pk)
		require.NoError(t, err)
	}
	require.Less(t, time.Since(start), time.Second)
	require.Greater(t, c.WriteStats().QueuedBytes, 512<<10, "most of it is still queued")
}

// TestWriteTimeoutEndsAStuckConnection: a peer that accepts no byte for the
// write timeout has its connection closed; later writes fail.
func TestWriteTimeoutEndsAStuckConnection(t *testing.T) {
	server, client := tcpPair(t)
	c := NewConn(server, 0)
	c.SetWriteLimits(WriteLimits{Timeout: 200 * time.Millisecond})
	pk := filled(0x32, 64<<10, 'x')
	for range 16 {
		_, err := c.Write(pk)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return c.WriteStats().WriteTimeout }, 3*time.Second, 10*time.Millisecond)
	var err error
	require.Eventually(t, func() bool {
		_, err = c.Write(pk)
		return err != nil
	}, time.Second, time.Millisecond)
	require.ErrorIs(t, err, ErrWriteTimeout)
	// The socket is closed: the peer reads what was sent, then EOF.
	require.NoError(t, client.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = io.Copy(io.Discard, client)
	require.NoError(t, err, "EOF, not a timeout")
}

// TestSlowReaderIsNotTimedOut: a peer that reads slowly but steadily keeps
// its connection, however long the whole transfer takes. (Default socket
// buffers: with tiny ones, Linux reopens the window only through
// zero-window probes, which back off for longer than any sane timeout.)
func TestSlowReaderIsNotTimedOut(t *testing.T) {
	server, client := tcpPairDefaultBuffers(t)
	c := NewConn(server, 0)
	const timeout = 200 * time.Millisecond
	c.SetWriteLimits(WriteLimits{Timeout: timeout, MaxQueuedBytes: 32 << 20})
	pk := filled(0x32, 16<<20, 'x')
	_, err := c.Write(pk)
	require.NoError(t, err)
	got := 0
	buf := make([]byte, 256<<10)
	start := time.Now()
	for got < len(pk) {
		n, err := client.Read(buf)
		require.NoError(t, err, "after %d bytes in %v; %+v", got, time.Since(start), c.WriteStats())
		got += n
		time.Sleep(5 * time.Millisecond)
	}
	require.Greater(t, time.Since(start), timeout, "the transfer outlasted the timeout")
	require.False(t, c.WriteStats().WriteTimeout)
	_, err = c.Write(qos0Publish('z'))
	require.NoError(t, err)
}

// TestFullOutboxDropsQoS0AndEndsOnOthers: over the limit QoS 0 publishes
// are dropped and counted (the client loses only its own QoS 0 messages);
// past twice the limit anything else ends the connection, so memory stays
// bounded.
func TestFullOutboxDropsQoS0AndEndsOnOthers(t *testing.T) {
	server, _ := tcpPair(t)
	c := NewConn(server, 0)
	c.SetWriteLimits(WriteLimits{MaxQueuedBytes: 256 << 10})
	q0 := filled(0x30, 16<<10, 'a')
	for range 200 {
		_, err := c.Write(q0)
		require.NoError(t, err, "QoS 0 is dropped, never an error")
	}
	st := c.WriteStats()
	require.Greater(t, st.DroppedQoS0, uint64(100))
	require.LessOrEqual(t, st.QueuedBytes, 256<<10)

	q1 := filled(0x32, 16<<10, 'b')
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = c.Write(q1)
	}
	require.ErrorIs(t, err, ErrOutboxFull)
	require.LessOrEqual(t, c.WriteStats().QueuedBytes, 512<<10)
}

// TestCloseSendsWhatIsQueued: a packet written just before Close (Mochi's
// DISCONNECT or error CONNACK) reaches the peer before the socket closes.
func TestCloseSendsWhatIsQueued(t *testing.T) {
	server, client := tcpPair(t)
	c := NewConn(server, 0)
	disconnect := []byte{0xE0, 0x01, 0x8B}
	big := filled(0x30, 32<<10, 'x')
	_, err := c.Write(big)
	require.NoError(t, err)
	_, err = c.Write(disconnect)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.NoError(t, client.SetReadDeadline(time.Now().Add(5*time.Second)))
	got, err := io.ReadAll(client)
	require.NoError(t, err)
	require.Equal(t, concat(big, disconnect), got)
	require.True(t, bytes.HasSuffix(got, disconnect))
}

// writeAndReceive writes pk to c and checks that peer reads exactly pk.
func writeAndReceive(t *testing.T, c *Conn, peer net.Conn, pk []byte) {
	t.Helper()
	_, err := c.Write(pk)
	require.NoError(t, err)
	got := make([]byte, len(pk))
	require.NoError(t, peer.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = io.ReadFull(peer, got)
	require.NoError(t, err)
	require.Equal(t, pk, got)
}

// writerRunning reports whether c has a writer goroutine.
func writerRunning(c *Conn) bool {
	c.out.mu.Lock()
	defer c.out.mu.Unlock()
	return c.out.running
}

// TestWriterRunsOnlyWhileBytesWait: once everything written went out the
// writer goroutine ends and the connection keeps no large buffer (an idle
// client costs none of LuffyMQ's goroutines); the next write starts it
// again, and every byte arrives in order.
func TestWriterRunsOnlyWhileBytesWait(t *testing.T) {
	server, client := tcpPairDefaultBuffers(t)
	c := NewConn(server, 0)
	require.False(t, writerRunning(c), "no writer before the first write")
	for round := range 3 {
		writeAndReceive(t, c, client, filled(0x30, 64<<10, byte('a'+round)))
		require.Eventually(t, func() bool { return !writerRunning(c) }, 5*time.Second, time.Millisecond, "round %d: the writer ends once the outbox is empty", round)
		c.out.mu.Lock()
		kept := cap(c.out.pending) + cap(c.out.spare)
		c.out.mu.Unlock()
		require.LessOrEqual(t, kept, 2*idleBuffer, "round %d: an idle connection keeps at most two small buffers", round)
	}
	require.Zero(t, c.WriteStats().QueuedBytes)
}

// TestWritersAndCloseRace writes from several goroutines while the writer
// keeps starting and ending, then closes: every byte written before Close
// arrives, whole and in each writer's order, and the socket closes (run
// with -race).
func TestWritersAndCloseRace(t *testing.T) {
	server, client := tcpPairDefaultBuffers(t)
	c := NewConn(server, 0)
	const writers, each = 4, 200
	done := make(chan struct{})
	for w := range writers {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range each {
				pk := []byte{0x30, 0x03, 0x00, 0x01, byte(w)}
				_, _ = c.Write(pk)
				if i%50 == 0 {
					time.Sleep(time.Millisecond) // a pause, so the writer ends and restarts within the run
				}
			}
		}()
	}
	for range writers {
		<-done
	}
	require.NoError(t, c.Close())
	require.NoError(t, client.SetReadDeadline(time.Now().Add(5*time.Second)))
	got, err := io.ReadAll(client)
	require.NoError(t, err, "EOF once everything went out")
	require.Len(t, got, writers*each*5)
	counts := make([]int, writers)
	for off := 0; off < len(got); off += 5 {
		require.Equal(t, []byte{0x30, 0x03, 0x00, 0x01}, got[off:off+4], "packets arrive whole")
		counts[got[off+4]]++
	}
	for w, n := range counts {
		require.Equal(t, each, n, "writer %d", w)
	}
	require.False(t, writerRunning(c))
}
