package harness

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// TCPRelay forwards every TCP connection made to its loopback address to
// a target and counts the bytes in each direction. The benchmarks use it
// to cut a client off as a crash or a network failure would (no MQTT
// DISCONNECT, no AMQP close): DropConnections closes what is open and
// keeps accepting, Close also stops accepting.
type TCPRelay struct {
	ln       net.Listener
	target   string
	Up, Down atomic.Int64 // client → target, target → client

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func NewTCPRelay(target string) (*TCPRelay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("relay to %s: %w", target, err)
	}
	r := &TCPRelay{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go r.serve()
	return r, nil
}

// Addr is the address clients dial.
func (r *TCPRelay) Addr() string { return r.ln.Addr().String() }

func (r *TCPRelay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", r.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		for _, x := range []net.Conn{c, u} {
			if t, ok := x.(*net.TCPConn); ok {
				_ = t.SetNoDelay(true)
			}
		}
		if !r.track(c, u) {
			_ = c.Close()
			_ = u.Close()
			return
		}
		go r.pipe(u, c, &r.Up)
		go r.pipe(c, u, &r.Down)
	}
}

func (r *TCPRelay) track(cs ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	for _, c := range cs {
		r.conns[c] = struct{}{}
	}
	return true
}

func (r *TCPRelay) pipe(dst, src net.Conn, n *atomic.Int64) {
	_, _ = io.Copy(countingWriter{dst, n}, src)
	_ = dst.Close()
	_ = src.Close()
	r.mu.Lock()
	delete(r.conns, dst)
	delete(r.conns, src)
	r.mu.Unlock()
}

// DropConnections closes every connection through the relay and keeps
// accepting new ones.
func (r *TCPRelay) DropConnections() {
	r.mu.Lock()
	conns := r.conns
	r.conns = map[net.Conn]struct{}{}
	r.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
}

// Close stops accepting and closes every connection.
func (r *TCPRelay) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	_ = r.ln.Close()
	r.DropConnections()
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}
