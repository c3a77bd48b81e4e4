// Package pingreq lifts LuffyMQ load reports off extended PINGREQ packets
// before Mochi MQTT reads them.
//
// An extended PINGREQ is the byte 0xC0, an MQTT variable byte integer
// remaining length and that many payload bytes. Mochi reads and discards a
// PINGREQ's payload, so every accepted connection is wrapped in a Conn that
// follows the MQTT framing of the inbound byte stream, queues each PINGREQ
// payload and hands Mochi a plain PINGREQ (0xC0 0x00) instead. A Mochi hook
// then takes the queued payloads with TakeLiftedReports when Mochi reports
// the PINGREQ in OnPacketRead.
package pingreq

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/luffymq/luffymq/clientsdk/report"
)

// DefaultMaxPayload is the report size limit NewConn uses when it is given
// a limit of zero or less.
const DefaultMaxPayload = 4096

// MaxQueuedReports is how many lifted payloads a Conn keeps until they are
// taken; on overflow the oldest is dropped and counted by Dropped.
const MaxQueuedReports = 64

// pingreqByte is the fixed header byte of a PINGREQ packet.
const pingreqByte = 0xC0

// ErrReportTooLarge is returned by every Read after the connection sent an
// extended PINGREQ whose payload exceeded the limit; the returned error
// wraps it and names the limit.
var ErrReportTooLarge = errors.New("pingreq: load report too large")

// ErrMalformedLength is returned by every Read after the connection sent a
// packet whose remaining length runs past the 4 bytes MQTT allows (a
// fourth length byte with the continuation bit set): the packet framing is
// lost, so the connection must end. The returned error wraps it and names
// the packet's fixed header byte.
var ErrMalformedLength = errors.New("pingreq: malformed remaining length")

// ReportSource is implemented by Conn. A Mochi hook can type-assert
// cl.Net.Conn to it to take the lifted payloads.
type ReportSource interface {
	TakeLiftedReports() (payloads [][]byte, oversized bool)
}

// state is the position of the reader in the MQTT framing.
type state uint8

const (
	stType        state = iota // next byte is a fixed header type byte
	stLen                      // inside the remaining length of a non-PINGREQ packet
	stBody                     // inside the body of a non-PINGREQ packet
	stPingLen                  // inside the remaining length of a PINGREQ (held back)
	stPingPayload              // inside the payload of an extended PINGREQ (lifted)
	stHeldLen                  // inside the remaining length of a non-PINGREQ packet (held back; see ReadLimits)
	stHeldBody                 // inside the body of a packet held back until complete (see ReadLimits)
)

// Conn wraps a net.Conn and lifts extended PINGREQ payloads off the bytes
// read from it; on the bytes written to it, it enforces the client's
// Receive Maximum (see Write). Other methods pass through to the embedded
// net.Conn. Read must not be called concurrently with itself (as for any
// io.Reader); TakeLiftedReports, Lifted and Dropped may be called from any
// goroutine.
type Conn struct {
	net.Conn

	max int

	// Read state, owned by the reading goroutine.
	st      state
	vlVal   int    // remaining length decoded so far
	vlN     int    // remaining length bytes seen so far
	left    int    // body or payload bytes still to come
	payload []byte // payload of the extended PINGREQ being lifted
	owed    []byte // output that did not fit into the caller's buffer; emitted first
	owedBuf [8]byte
	readErr error // an error from the inner conn, returned once owed is emitted
	fatal   error // sticky ErrReportTooLarge or ErrMalformedLength: the connection must end
	typ     byte  // fixed header byte of the packet whose remaining length is being decoded

	mu        sync.Mutex
	queue     [][]byte
	oversized bool

	lifted  atomic.Uint64
	dropped atomic.Uint64

	// Outbound: the client's Receive Maximum (see flow.go), and the bytes
	// queued for the writer goroutine (see outbox.go).
	quota sendQuota
	out   outbox

	// Read limits (see readlimits.go), owned by the reading goroutine.
	held    heldPacket
	connect connectWatch
}

var (
	_ net.Conn     = (*Conn)(nil)
	_ ReportSource = (*Conn)(nil)
)

// NewConn wraps c. Extended PINGREQs with a payload longer than maxPayload
// bytes end the connection (see ErrReportTooLarge); maxPayload <= 0 selects
// DefaultMaxPayload.
func NewConn(c net.Conn, maxPayload int) *Conn {
	if maxPayload <= 0 {
		maxPayload = DefaultMaxPayload
	}
	cn := &Conn{Conn: c, max: maxPayload}
	cn.owed = cn.owedBuf[:0]
	cn.out.limits = WriteLimits{}.withDefaults()
	return cn
}

// NetConn returns the wrapped connection (for example a *tls.Conn).
func (c *Conn) NetConn() net.Conn { return c.Conn }

// Read reads from the wrapped connection into p, passing MQTT packets
// through byte for byte except that every extended PINGREQ is replaced by
// 0xC0 0x00 once its whole payload has been read and queued.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(c.owed) > 0 {
		n := copy(p, c.owed)
		// Advance rather than shift: owed may hold a whole held packet.
		// Nothing is appended to owed until it is empty again.
		if c.owed = c.owed[n:]; len(c.owed) == 0 {
			c.owed = c.owedBuf[:0]
		}
		if len(c.owed) == 0 && c.readErr != nil {
			err := c.readErr
			c.readErr = nil
			return n, err
		}
		// Never block on the inner conn while holding output: Mochi may
		// need these bytes to finish a packet.
		return n, nil
	}
	if c.fatal != nil {
		return 0, c.fatal
	}
	if c.readErr != nil {
		err := c.readErr
		c.readErr = nil
		return 0, err
	}
	for {
		// While a PINGREQ is in progress its replacement is written when
		// it ends, and it may be longer than the PINGREQ's bytes in this
		// read. Leave that much room before the data so output never
		// overtakes input.
		hr := c.headroom()
		start, end := hr, len(p)
		if len(p) <= hr {
			// Too small for headroom: read one byte, and let whatever
			// does not fit after it go to owed.
			start, end = 0, 1
		}
		n, err := c.Conn.Read(p[start:end])
		if c.connect.waiting {
			c.watchConnect(p[start:start+n], err)
		}
		w := 0
		if n > 0 {
			w = c.filter(p, start, start+n)
		}
		if c.fatal != nil {
			return w, nil // the next Read returns the sticky error
		}
		if err != nil {
			if len(c.owed) > 0 {
				c.readErr = err
				return w, nil
			}
			return w, err
		}
		if w > 0 || n == 0 {
			return w, nil
		}
		// Everything read was lifted or held back: read again rather than
		// return (0, nil), which bufio.Reader tolerates only 100 times.
	}
}

// headroom returns how many output bytes the packet in progress may emit
// beyond its own bytes in the next read.
func (c *Conn) headroom() int {
	// The replacement C0 00 is 2 bytes, and at least the PINGREQ's last
	// byte is in this read.
	if c.st == stPingLen || c.st == stPingPayload {
		return 1
	}
	if c.st == stHeldLen {
		return c.held.nhdr // a small packet's held header is emitted when its length ends
	}
	return 0
}

// filter processes the input p[r:end] in place, writing output from p[0]
// on, and returns the output length.
func (c *Conn) filter(p []byte, r, end int) int {
	w := 0
	for r < end {
		switch c.st {
		case stBody:
			n := min(c.left, end-r)
			w = c.pass(p, w, r, n)
			r += n
			c.left -= n
			if c.left == 0 {
				c.st = stType
			}
		case stType:
			b := p[r]
			c.vlVal, c.vlN = 0, 0
			if b == pingreqByte {
				c.st = stPingLen
				r++
				continue
			}
			// Fast path: the whole remaining length is in this read, so
			// pass the header and as much of the body as there is at once.
			if v, k, err := report.DecodeVarint(p[r+1 : end]); err == nil {
				h := 1 + k
				if c.held.holds(v) {
					c.typ = b
					c.startHeld(p[r:r+h], v)
					r += h
					continue
				}
				n := h + min(v, end-r-h)
				w = c.pass(p, w, r, n)
				r += n
				if c.left = v - (n - h); c.left > 0 {
					c.st = stBody
				}
				continue
			}
			c.typ = b
			if c.held.above > 0 {
				// The length may be large: hold the header until it is known.
				c.held.hdr[0] = b
				c.held.nhdr = 1
				r++
				c.st = stHeldLen
				continue
			}
			w = c.pass(p, w, r, 1)
			r++
			c.st = stLen
		case stLen:
			b := p[r]
			done, bad := c.lengthByte(b)
			if bad {
				// The bytes before it are out already; this one and the
				// rest of the input are never delivered.
				c.markMalformed(c.typ)
				return w
			}
			w = c.pass(p, w, r, 1)
			r++
			switch {
			case done && c.vlVal == 0:
				c.st = stType
			case done:
				c.left = c.vlVal
				c.st = stBody
			}
		case stPingLen:
			b := p[r]
			r++
			done, bad := c.lengthByte(b)
			switch {
			case bad:
				// Framing is lost: end the connection. Nothing of this
				// PINGREQ is delivered, nor anything after it. (Mochi
				// itself would accept overlong lengths whose extra bytes
				// carry no value bits, such as 80 80 80 80 00.)
				c.markMalformed(pingreqByte)
				return w
			case !done:
				// more length bytes follow
			case c.vlVal == 0:
				w = c.emit(p, w, r, end, pingreqByte, 0)
				c.st = stType
			case c.vlVal > c.max:
				w = c.emit(p, w, r, end, pingreqByte, 0)
				c.markOversized(c.vlVal)
				return w // the rest of the input is never delivered
			default:
				c.left = c.vlVal
				c.payload = make([]byte, 0, c.vlVal)
				c.st = stPingPayload
			}
		case stHeldLen:
			var ok bool
			if w, r, ok = c.heldLength(p, w, r, end); !ok {
				return w // malformed: the rest of the input is never delivered
			}
		case stHeldBody:
			w, r = c.heldBody(p, w, r, end)
		case stPingPayload:
			n := min(c.left, end-r)
			c.payload = append(c.payload, p[r:r+n]...)
			r += n
			c.left -= n
			if c.left == 0 {
				c.enqueue(c.payload)
				c.payload = nil
				w = c.emit(p, w, r, end, pingreqByte, 0)
				c.st = stType
			}
		}
	}
	return w
}

// lengthByte adds b to the remaining length being decoded. done reports
// that b was its last byte; bad that b is a fourth byte with the
// continuation bit set.
func (c *Conn) lengthByte(b byte) (done, bad bool) {
	c.vlVal |= int(b&0x7F) << (7 * c.vlN)
	c.vlN++
	if b&0x80 == 0 {
		return true, false
	}
	return false, c.vlN == 4
}

// pass moves the n input bytes at p[r:] to the output at p[w:] and returns
// the new output length. Nothing is copied while no byte was removed.
func (c *Conn) pass(p []byte, w, r, n int) int {
	if len(c.owed) > 0 {
		c.owed = append(c.owed, p[r:r+n]...)
		return w
	}
	if w != r {
		copy(p[w:], p[r:r+n])
	}
	return w + n
}

// emit writes bs to the output at p[w:] where that does not overwrite
// unread input (p[r:end]), and appends the rest to owed. It returns the new
// output length.
func (c *Conn) emit(p []byte, w, r, end int, bs ...byte) int {
	limit := r
	if r == end {
		limit = len(p)
	}
	for _, b := range bs {
		if len(c.owed) == 0 && w < limit {
			p[w] = b
			w++
		} else {
			c.owed = append(c.owed, b)
		}
	}
	return w
}

func (c *Conn) enqueue(payload []byte) {
	c.lifted.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == MaxQueuedReports {
		copy(c.queue, c.queue[1:])
		c.queue = c.queue[:len(c.queue)-1]
		c.dropped.Add(1)
	}
	c.queue = append(c.queue, payload)
}

func (c *Conn) markMalformed(typ byte) {
	c.fatal = fmt.Errorf("%w: packet 0x%02X has a fourth length byte with the continuation bit set (MQTT allows at most 4)", ErrMalformedLength, typ)
}

func (c *Conn) markOversized(length int) {
	c.fatal = fmt.Errorf("%w: report of %d bytes exceeded %d bytes", ErrReportTooLarge, length, c.max)
	c.mu.Lock()
	c.oversized = true
	c.mu.Unlock()
}

// TakeLiftedReports returns the payloads lifted since the last call, in
// arrival order, and clears them; the caller owns the returned slices.
// oversized reports that the connection sent a report larger than the
// limit; it stays set.
func (c *Conn) TakeLiftedReports() (payloads [][]byte, oversized bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	payloads, c.queue = c.queue, nil
	return payloads, c.oversized
}

// Lifted returns the number of payloads lifted so far, including dropped
// ones.
func (c *Conn) Lifted() uint64 { return c.lifted.Load() }

// Dropped returns the number of lifted payloads dropped because the queue
// was full.
func (c *Conn) Dropped() uint64 { return c.dropped.Load() }
