package pingreq

import (
	"bytes"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBufferPoolSizes(t *testing.T) {
	require.Equal(t, 8, pooledSizes, "8 KiB to 1 MiB")
	for _, tc := range []struct{ n, class, size int }{
		{idleBuffer + 1, 0, 8 << 10}, {8 << 10, 0, 8 << 10}, {8<<10 + 1, 1, 16 << 10},
		{300 << 10, 6, 512 << 10}, {shrinkAbove, 7, shrinkAbove},
	} {
		require.Equal(t, tc.class, poolClass(tc.n), "%d bytes", tc.n)
		b := getBuffer(tc.n)
		require.Zero(t, len(b))
		require.Equal(t, tc.size, cap(b), "%d bytes", tc.n)
		putBuffer(b)
	}
	require.Equal(t, -1, poolClass(shrinkAbove+1))
	require.GreaterOrEqual(t, cap(getBuffer(shrinkAbove+1)), shrinkAbove+1)

	// appendOut keeps what the buffer held, whether it grows or not.
	var buf []byte
	var want bytes.Buffer
	for i := range 200 {
		p := bytes.Repeat([]byte{byte(i)}, 100*i)
		buf = appendOut(buf, p)
		want.Write(p)
		require.True(t, bytes.Equal(want.Bytes(), buf), "after %d appends", i+1)
	}
}

// TestPooledBuffersKeepEveryConnectionsBytes: connections whose sockets
// take each write slowly grow their outboxes from the shared pools while
// bytes pile up, and give the buffers back when their writers go idle,
// concurrently; every client gets exactly its own bytes, in order (run
// with -race).
func TestPooledBuffersKeepEveryConnectionsBytes(t *testing.T) {
	const conns = 6
	var wg sync.WaitGroup
	for w := range conns {
		sink := &slowConn{}
		c := NewConn(sink, 0)
		var want bytes.Buffer
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 3000 {
				size := 20 + i%7*300
				if i%97 == 0 {
					size = 20 << 10
				}
				body := bytes.Repeat([]byte{byte(w)}, size)
				binary.BigEndian.PutUint32(body, uint32(w<<16|i)) // each packet is unique
				pk := packet(0x30, body)
				want.Write(pk)
				if _, err := c.Write(pk); err != nil {
					t.Errorf("connection %d: %v", w, err)
					return
				}
				if i%500 == 0 {
					time.Sleep(5 * time.Millisecond) // the writer ends and gives its buffers back
				}
			}
			require.Eventually(t, func() bool { return c.WriteStats().QueuedBytes == 0 }, 20*time.Second, time.Millisecond)
			if got := sink.written(); !bytes.Equal(want.Bytes(), got) {
				t.Errorf("connection %d: got %d bytes, want %d, or not in order", w, len(got), want.Len())
			}
		}()
	}
	wg.Wait()
}

// slowConn records what is written to it, taking 100 µs per write.
type slowConn struct {
	recordingConn
}

func (s *slowConn) Write(p []byte) (int, error) {
	time.Sleep(100 * time.Microsecond)
	return s.recordingConn.Write(p)
}
func (*slowConn) SetWriteDeadline(time.Time) error { return nil }
func (*slowConn) Close() error                     { return nil }
