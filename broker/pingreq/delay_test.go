package pingreq

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestOneWayDelayOfALoopbackConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer client.Close()
	server := <-accepted
	defer server.Close()
	// A round trip gives the kernel an RTT sample.
	_, err = client.Write([]byte{0xC0, 0x00})
	require.NoError(t, err)
	buf := make([]byte, 2)
	_, err = server.Read(buf)
	require.NoError(t, err)
	_, err = server.Write([]byte{0xD0, 0x00})
	require.NoError(t, err)
	_, err = client.Read(buf)
	require.NoError(t, err)

	d := NewConn(server, 0).OneWayDelay()
	require.Greater(t, d, time.Duration(0))
	require.Less(t, d, 100*time.Millisecond, "loopback")

	require.Zero(t, NewConn(discardConn{}, 0).OneWayDelay(), "not TCP: unknown")
}
