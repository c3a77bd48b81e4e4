package pingreq

import (
	"errors"
	"net"
	"os"
	"time"
)

// A client must not make the broker hold more than it sent, nor hold a
// connection that never speaks. Mochi 2.7.9 allocates a packet's declared
// remaining length before its bytes arrive, and reads the CONNECT packet
// without any deadline (its first SetDeadline comes after the CONNECT was
// read, validated and passed to the OnConnect hooks). ReadLimits closes
// both gaps from the read path of the Conn.

// DefaultBufferAbove is the remaining length above which the broker holds
// a packet back until all of it has arrived (see ReadLimits.BufferAbove).
const DefaultBufferAbove = 64 << 10

// heldInitialCap is the capacity a held packet's buffer starts with;
// append grows it as the body arrives.
const heldInitialCap = 4 << 10

// connectType is the packet type of CONNECT in the high nibble of the
// fixed header byte.
const connectType = 1

// ReadLimits bounds what a client can make the broker hold before it has
// sent whole packets.
type ReadLimits struct {
	// ConnectTimeout is how long after SetReadLimits the client has to
	// send its whole CONNECT packet; a Read after that fails with a
	// timeout and ConnectTimedOut reports true. The deadline is lifted the
	// moment the CONNECT's last byte is read, before Mochi sets its own
	// keep-alive deadline (none for keep-alive 0). 0 disables it.
	ConnectTimeout time.Duration
	// BufferAbove: a non-PINGREQ packet whose remaining length exceeds it
	// is held back, header included, and its body accumulated in a buffer
	// grown as the bytes arrive; the whole packet is handed on once
	// complete, so the reader never sizes a buffer from an unbacked
	// length. Smaller packets pass through without a copy. 0 disables it.
	BufferAbove int
	// MaxPacketSize is the reader's own limit on a packet (Mochi's
	// MaximumPacketSize: remaining length + 1). A packet over it is not
	// held but passed on at once, so the reader refuses it from its header
	// without waiting for (or anyone buffering) its body. 0: no limit.
	MaxPacketSize int
}

// heldPacket is the read state for packets held back until complete.
type heldPacket struct {
	above     int     // hold packets whose remaining length exceeds this; 0: never
	maxPacket int     // never hold packets over this size (see ReadLimits.MaxPacketSize)
	hdr       [5]byte // fixed header held while its remaining length is decoded
	nhdr      int
	buf       []byte // the held packet so far: fixed header, then the body
}

// holds reports whether a non-PINGREQ packet with this remaining length is
// held back until complete.
func (h *heldPacket) holds(remaining int) bool {
	return h.above > 0 && remaining > h.above && (h.maxPacket <= 0 || remaining+1 <= h.maxPacket)
}

// connectWatch follows the first packet of the inbound stream, the
// CONNECT, to lift the connect deadline when its last byte arrives.
type connectWatch struct {
	waiting  bool // a connect deadline is set and the CONNECT is not complete
	lost     bool // the first packet is no CONNECT or its length is malformed: stop following
	deadline time.Time
	typeSeen bool
	lenDone  bool
	vlVal    int
	vlN      int
	left     int
	timedOut bool // set by the reading goroutine; read through ConnectTimedOut
}

// SetReadLimits applies l to the connection. Call it before the first
// Read, right after the connection was accepted: the connect timeout
// starts now. It returns the error of setting the read deadline.
func (c *Conn) SetReadLimits(l ReadLimits) error {
	c.held.above = max(l.BufferAbove, 0)
	c.held.maxPacket = max(l.MaxPacketSize, 0)
	if l.ConnectTimeout <= 0 {
		return nil
	}
	c.connect.waiting = true
	c.connect.deadline = time.Now().Add(l.ConnectTimeout)
	return c.Conn.SetReadDeadline(c.connect.deadline)
}

// ConnectTimedOut reports whether the connection failed a Read because its
// CONNECT packet was not complete within ReadLimits.ConnectTimeout. Call
// it from the reading goroutine or after Read returned for the last time.
func (c *Conn) ConnectTimedOut() bool { return c.connect.timedOut }

// watchConnect follows the bytes just read from the inner connection (in,
// before filtering) and the error of that read while the CONNECT is not
// complete.
func (c *Conn) watchConnect(in []byte, err error) {
	w := &c.connect
	for i := 0; i < len(in) && w.waiting && !w.lost; {
		switch {
		case !w.typeSeen:
			// Anything but a CONNECT is a protocol violation Mochi
			// refuses at once; the deadline stays until it closes.
			w.typeSeen = true
			w.lost = in[i]>>4 != connectType
			i++
		case !w.lenDone:
			b := in[i]
			i++
			w.vlVal |= int(b&0x7F) << (7 * w.vlN)
			w.vlN++
			switch {
			case b&0x80 == 0:
				w.lenDone, w.left = true, w.vlVal
				if w.left == 0 {
					c.connectComplete()
				}
			case w.vlN == 4:
				w.lost = true // malformed: the read path ends the connection
			}
		default:
			n := min(w.left, len(in)-i)
			i += n
			w.left -= n
			if w.left == 0 {
				c.connectComplete()
			}
		}
	}
	if err != nil && w.waiting && isTimeout(err) && !time.Now().Before(w.deadline) {
		w.timedOut = true
	}
}

// connectComplete lifts the connect deadline. Mochi sets its keep-alive
// deadline after it has processed the CONNECT, so it is never overwritten
// here.
func (c *Conn) connectComplete() {
	c.connect.waiting = false
	_ = c.Conn.SetReadDeadline(time.Time{})
}

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// startHeld begins holding a packet whose fixed header is header and whose
// body has remaining bytes still to come.
func (c *Conn) startHeld(header []byte, remaining int) {
	c.held.buf = append(make([]byte, 0, heldInitialCap), header...)
	c.left = remaining
	c.st = stHeldBody
}

// heldLength adds the length byte p[r] of a held fixed header (see
// stHeldLen) and returns the new output and input positions, and false if
// the length is malformed (the connection must end).
func (c *Conn) heldLength(p []byte, w, r, end int) (int, int, bool) {
	b := p[r]
	done, bad := c.lengthByte(b)
	if bad {
		c.markMalformed(c.typ)
		return w, r, false
	}
	r++
	c.held.hdr[c.held.nhdr] = b
	c.held.nhdr++
	switch {
	case !done:
	case c.held.holds(c.vlVal):
		c.startHeld(c.held.hdr[:c.held.nhdr], c.vlVal)
	default:
		w = c.emit(p, w, r, end, c.held.hdr[:c.held.nhdr]...)
		c.left = c.vlVal
		c.st = stBody
		if c.left == 0 {
			c.st = stType
		}
	}
	return w, r, true
}

// heldBody appends the held packet's body bytes in p[r:end] and, once the
// packet is complete, emits it. It returns the new output and input
// positions.
func (c *Conn) heldBody(p []byte, w, r, end int) (int, int) {
	n := min(c.left, end-r)
	c.held.buf = append(c.held.buf, p[r:r+n]...)
	r += n
	c.left -= n
	if c.left > 0 {
		return w, r
	}
	pk := c.held.buf
	c.held.buf = nil
	c.st = stType
	// Like emit: output goes where it does not overwrite unread input, the
	// rest (usually most of the packet) becomes owed, without a copy.
	limit := r
	if r == end {
		limit = len(p)
	}
	if len(c.owed) == 0 && w < limit {
		k := copy(p[w:limit], pk)
		w += k
		pk = pk[k:]
	}
	switch {
	case len(pk) == 0:
	case len(c.owed) == 0:
		c.owed = pk
	default:
		c.owed = append(c.owed, pk...)
	}
	return w, r
}
