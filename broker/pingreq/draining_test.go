package pingreq

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDrainingFollowsTheSocket: a client counts as draining while its
// socket takes bytes; once it stops reading and its socket stays full for
// stallAfter, it does not; when it reads again, it does again.
func TestDrainingFollowsTheSocket(t *testing.T) {
	const stallAfter = 100 * time.Millisecond
	server, client := tcpPair(t)
	c := NewConn(server, 0)
	require.True(t, c.Draining(stallAfter), "nothing queued")

	pk := filled(0x32, 64<<10, 'x') // QoS 1 publishes are never dropped
	for range 2 {
		_, err := c.Write(pk)
		require.NoError(t, err)
	}
	require.Greater(t, c.WriteStats().QueuedBytes, 0, "the peer reads nothing: bytes wait")
	require.Eventually(t, func() bool { return !c.Draining(stallAfter) }, 5*time.Second, 10*time.Millisecond,
		"a full socket for stallAfter: not draining")

	// The peer reads everything: the outbox empties and the client drains.
	go func() { _, _ = io.Copy(io.Discard, client) }()
	require.Eventually(t, func() bool { return c.Draining(stallAfter) }, 5*time.Second, time.Millisecond,
		"reading again: draining")
	// (4 KiB socket buffers and delayed ACKs make loopback slow here.)
	require.Eventually(t, func() bool { return c.WriteStats().QueuedBytes == 0 }, 20*time.Second, time.Millisecond)
	require.True(t, c.Draining(stallAfter))
}

// TestDrainingFalseAboveQueueLimitOrClosed: a client whose outbox is over
// MaxQueuedBytes loses its QoS 0 publishes whatever happens, so it never
// counts as draining; nor does a closed connection.
func TestDrainingFalseAboveQueueLimitOrClosed(t *testing.T) {
	server, _ := tcpPair(t)
	c := NewConn(server, 0)
	c.SetWriteLimits(WriteLimits{MaxQueuedBytes: 128 << 10})
	pk := filled(0x32, 64<<10, 'x')
	for range 3 {
		_, err := c.Write(pk)
		require.NoError(t, err)
	}
	require.Greater(t, c.WriteStats().QueuedBytes, 128<<10)
	require.False(t, c.Draining(time.Hour), "over the outbox limit")

	other, _ := tcpPair(t)
	closed := NewConn(other, 0)
	require.True(t, closed.Draining(time.Hour))
	require.NoError(t, closed.Close())
	require.False(t, closed.Draining(time.Hour), "closing")
}

// TestWritesGoOutInChunks: the writer hands the socket at most writeChunk
// bytes per Write, so that a slow client's progress is seen while a large
// batch goes out.
func TestWritesGoOutInChunks(t *testing.T) {
	server, client := tcpPairDefaultBuffers(t)
	rec := &writeSizeConn{Conn: server}
	c := NewConn(rec, 0)
	pk := filled(0x32, 300<<10, 'x')
	writeAndReceive(t, c, client, pk)
	require.GreaterOrEqual(t, rec.calls.Load(), int64(len(pk)/writeChunk))
	require.LessOrEqual(t, rec.largest.Load(), int64(writeChunk))
}

// writeSizeConn counts the Write calls on a net.Conn and the largest.
type writeSizeConn struct {
	net.Conn
	calls, largest atomic.Int64
}

func (w *writeSizeConn) Write(p []byte) (int, error) {
	w.calls.Add(1)
	if n := int64(len(p)); n > w.largest.Load() {
		w.largest.Store(n) // one writer goroutine: no lost update
	}
	return w.Conn.Write(p)
}
