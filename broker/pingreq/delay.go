package pingreq

import (
	"crypto/tls"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// OneWayDelay estimates the time a packet takes from the client to the
// broker: half the kernel's smoothed round-trip time of the TCP connection
// under the wrapper (TLS included). It returns 0 where the kernel does not
// say (a WebSocket connection, a non-TCP transport).
func (c *Conn) OneWayDelay() time.Duration {
	inner := c.Conn
	for {
		switch t := inner.(type) {
		case *tls.Conn:
			inner = t.NetConn()
			continue
		case *net.TCPConn:
			return tcpOneWayDelay(t)
		}
		return 0
	}
}

func tcpOneWayDelay(tc *net.TCPConn) time.Duration {
	raw, err := tc.SyscallConn()
	if err != nil {
		return 0
	}
	var rtt uint32
	ctrlErr := raw.Control(func(fd uintptr) {
		info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if err == nil {
			rtt = info.Rtt // microseconds
		}
	})
	if ctrlErr != nil {
		return 0
	}
	return time.Duration(rtt) * time.Microsecond / 2
}
