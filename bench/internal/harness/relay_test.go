package harness

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// echoServer answers every connection with what it reads.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends msg through c and reads it back.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	require.NoError(t, c.SetDeadline(time.Now().Add(5*time.Second)))
	_, err := c.Write([]byte(msg))
	require.NoError(t, err)
	got := make([]byte, len(msg))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, msg, string(got))
}

// requireCut: the relay closed c, so a read ends at once instead of
// waiting for data.
func requireCut(t *testing.T, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err := c.Read(make([]byte, 1))
	require.Error(t, err)
	var ne net.Error
	if errors.As(err, &ne) {
		require.False(t, ne.Timeout(), "the relay should have closed the connection, not left it open")
	}
}

func TestTCPRelayCountsDropsAndCloses(t *testing.T) {
	r, err := NewTCPRelay(echoServer(t))
	require.NoError(t, err)
	defer r.Close()

	c, err := net.Dial("tcp", r.Addr())
	require.NoError(t, err)
	defer c.Close()
	roundTrip(t, c, "hello")
	require.Eventually(t, func() bool { return r.Up.Load() == 5 && r.Down.Load() == 5 }, 5*time.Second, 5*time.Millisecond,
		"bytes counted each way: up %d, down %d", r.Up.Load(), r.Down.Load())

	r.DropConnections()
	requireCut(t, c)
	again, err := net.Dial("tcp", r.Addr())
	require.NoError(t, err, "still accepting after DropConnections")
	defer again.Close()
	roundTrip(t, again, "again")

	r.Close()
	requireCut(t, again)
	if late, err := net.DialTimeout("tcp", r.Addr(), time.Second); err == nil {
		requireCut(t, late)
		_ = late.Close()
	}
}
