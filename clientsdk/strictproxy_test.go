package clientsdk_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/luffymq/luffymq/clientsdk/report"
)

// strictProxy forwards MQTT connections to a broker and closes any
// connection whose client sends a PINGREQ with a non-zero remaining length,
// as a broker that enforces the MQTT rule "PINGREQ has no payload" does. It
// counts the rejections and the client's PUBLISHes to report.LoadTopic.
type strictProxy struct {
	ln            net.Listener
	upstream      string
	rejected      atomic.Int32
	loadPublishes atomic.Int32

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func startStrictProxy(t *testing.T, upstream string) *strictProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &strictProxy{ln: ln, upstream: upstream}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *strictProxy) addr() string { return p.ln.Addr().String() }

func (p *strictProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, u)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(c, u)
			_ = c.Close()
		}()
		go func() {
			defer p.wg.Done()
			p.forward(c, u)
			_ = c.Close()
			_ = u.Close()
		}()
	}
}

// forward copies client packets to the broker, judging each.
func (p *strictProxy) forward(c, u net.Conn) {
	r := bufio.NewReader(c)
	for {
		header, body, err := readPacket(r)
		if err != nil {
			return
		}
		switch header[0] >> 4 {
		case report.PingreqType >> 4:
			if len(body) > 0 {
				p.rejected.Add(1)
				return
			}
		case 3: // PUBLISH: topic name first
			if len(body) >= 2 {
				n := int(body[0])<<8 | int(body[1])
				if len(body) >= 2+n && string(body[2:2+n]) == report.LoadTopic {
					p.loadPublishes.Add(1)
				}
			}
		}
		if _, err := u.Write(append(header, body...)); err != nil {
			return
		}
	}
}

// readPacket reads one MQTT packet: its fixed header and its body.
func readPacket(r *bufio.Reader) (header, body []byte, err error) {
	first, err := r.ReadByte()
	if err != nil {
		return nil, nil, err
	}
	header = []byte{first}
	length, mult := 0, 1
	for i := 0; ; i++ {
		if i == 4 {
			return nil, nil, errors.New("bad remaining length")
		}
		b, err := r.ReadByte()
		if err != nil {
			return nil, nil, err
		}
		header = append(header, b)
		length += int(b&0x7f) * mult
		mult *= 128
		if b&0x80 == 0 {
			break
		}
	}
	body = make([]byte, length)
	_, err = io.ReadFull(r, body)
	return header, body, err
}

func (p *strictProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
