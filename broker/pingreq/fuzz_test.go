package pingreq

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
)

// fuzzLimits are the report limits a fuzz input can select; small ones
// make oversized reports common.
var fuzzLimits = [...]int{4096, 1, 8, 300}

// wellFormed splits in into whole packets whose remaining lengths are
// valid and whose PINGREQ payloads fit max. ok is false if in is not such
// a concatenation.
func wellFormed(in []byte, max int) (pkts [][]byte, ok bool) {
	for len(in) > 0 {
		val, n, status := refLength(in[1:])
		if status != lengthOK || 1+n+val > len(in) || (in[0] == pingreqByte && val > max) {
			return nil, false
		}
		pkts = append(pkts, in[:1+n+val])
		in = in[1+n+val:]
	}
	return pkts, true
}

// maxOwed bounds the output a Conn may hold for the next Read: at most the
// 2-byte replacement of a PINGREQ and a byte after it.
const maxOwed = 3

// fuzzReadPlan derives, from seed, the report limit, the inner chunking of
// in, the caller's buffer sizes and whether EOF comes with the last bytes.
type fuzzReadPlan struct {
	max    int
	inner  *chunkConn
	bufLen func() int
}

func newFuzzReadPlan(in []byte, seed uint64) fuzzReadPlan {
	max := fuzzLimits[seed%uint64(len(fuzzLimits))]
	maxChunk := 1 + int(seed>>2%64)
	maxBuf := 1 + int(seed>>8%32)
	if seed&(1<<14) != 0 {
		maxBuf = 2048
	}
	rng := rand.New(rand.NewPCG(seed, uint64(len(in))))
	// The chunks are cut in one pass into a slice sized for the expected
	// count: built piecewise they were about half of an iteration's own cost.
	data := bytes.Clone(in)
	chunks := make([][]byte, 0, 2*len(data)/(maxChunk+1)+4)
	for len(data) > 0 {
		n := min(1+rng.IntN(maxChunk), len(data))
		chunks = append(chunks, data[:n])
		data = data[n:]
	}
	inner := &chunkConn{chunks: chunks}
	if seed&(1<<15) != 0 {
		inner.finalErr = io.EOF // EOF together with the last bytes
	}
	return fuzzReadPlan{max: max, inner: inner, bufLen: func() int { return 1 + rng.IntN(maxBuf) }}
}

// boundedBuffers wraps bufLen to check, before every Read, that the Conn
// holds no more than maxOwed bytes of output and no lifted payload
// buffer beyond its limit: its memory does not grow with the input.
func boundedBuffers(t *testing.T, c *Conn, bufLen func() int) func() int {
	return func() int {
		if len(c.owed) > maxOwed || cap(c.payload) > c.max {
			t.Fatalf("Conn holds %d owed bytes and a %d-byte payload buffer (limit %d)", len(c.owed), cap(c.payload), c.max)
		}
		return bufLen()
	}
}

// FuzzConnRead feeds arbitrary bytes, cut into arbitrary inner reads and
// read with arbitrary buffer sizes, and checks the Conn against reference,
// which computes from the whole input what must be delivered and lifted
// and how the stream ends (EOF, ErrReportTooLarge or ErrMalformedLength).
// For input that is whole well-formed packets it also checks the contract
// stated without the reference: the output is the input with every
// extended PINGREQ replaced by C0 00, each replacement delivered only after
// its payload was read and queued.
func FuzzConnRead(f *testing.F) {
	s, _ := testStream(false)
	f.Add(s.in, uint64(0))
	f.Add(s.in, uint64(0x0102_0304_0506_0701))
	f.Add([]byte{0xC0, 0x00, 0xC0, 0x03, '{', '}', ' ', 0xC0, 0x80, 0x00}, uint64(0x11))
	f.Add([]byte{0xC0, 0x80, 0x80, 0x80, 0x80, 0x01, 0xC0, 0x01, 'x'}, uint64(0x21))
	f.Add([]byte{0x30, 0xFF, 0xFF, 0xFF, 0x7F, 0xC0, 0x01, 'x'}, uint64(0x31))
	f.Add([]byte{0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F, 0xC0, 0x01, 'x'}, uint64(0x4031))
	f.Add(concat(packet(0xC0, jsonReport(5)), []byte{0xC0, 0x80, 0x80, 0x80, 0x80, 0x00}), uint64(0x8003))
	f.Add(concat(packet(0x30, filler(200, 1)), packet(0xC0, jsonReport(9)), []byte{0xC0, 0x7F}), uint64(0x0201))
	f.Add(concat([]byte{0xC1, 0x02, 0xC0, 0x00}, packet(0xC0, []byte("{}"))), uint64(0x41))

	f.Fuzz(func(t *testing.T, in []byte, seed uint64) {
		plan := newFuzzReadPlan(in, seed)
		c := NewConn(plan.inner, plan.max)
		pkts, whole := wellFormed(in, plan.max)
		var s *stream
		if whole {
			s = &stream{}
			s.add(pkts...)
		}
		res := fuzzDrive(t, c, plan.inner, boundedBuffers(t, c, plan.bufLen), s)

		if len(res.out) > len(in) {
			t.Fatalf("output %d bytes longer than input %d", len(res.out), len(in))
		}
		want := reference(in, plan.max)
		if !bytes.Equal(res.out, want.out) {
			t.Fatalf("output\n got %x\nwant %x", res.out, want.out)
		}
		requireFuzzPayloads(t, res.payloads, want.payloads)
		if res.oversized != want.oversized {
			t.Fatalf("oversized %v, want %v", res.oversized, want.oversized)
		}
		switch {
		case want.oversized:
			if !errors.Is(res.err, ErrReportTooLarge) {
				t.Fatalf("error %v, want ErrReportTooLarge", res.err)
			}
		case want.malformed:
			if !errors.Is(res.err, ErrMalformedLength) {
				t.Fatalf("error %v, want ErrMalformedLength", res.err)
			}
		default:
			if !errors.Is(res.err, io.EOF) {
				t.Fatalf("error %v, want io.EOF", res.err)
			}
		}
		if c.Dropped() != 0 || c.Lifted() != uint64(len(want.payloads)) {
			t.Fatalf("lifted %d dropped %d, want %d and 0", c.Lifted(), c.Dropped(), len(want.payloads))
		}
		if want.oversized || want.malformed {
			// The end is sticky and reads nothing more.
			consumed := plan.inner.consumed
			if n, err := c.Read(make([]byte, 16)); n != 0 || !errors.Is(err, res.err) {
				t.Fatalf("Read after the end: %d, %v; want 0, %v", n, err, res.err)
			}
			if plan.inner.consumed != consumed {
				t.Fatal("Read after the end read the inner conn")
			}
		}

		// Whole packets come out with every extended PINGREQ's payload
		// stripped, independently of the reference.
		if whole {
			if !bytes.Equal(res.out, s.want) {
				t.Fatalf("well-formed input: output\n got %x\nwant %x", res.out, s.want)
			}
			requireFuzzPayloads(t, res.payloads, s.payloads)
		}
	})
}

// fuzzDrive is drive (conn_test.go) for the fuzz targets, with the same
// checks made in time linear in the input: a PINGREQ's "delivered only after
// its payload was read and queued" is checked once, at the Read whose
// output first reaches its replacement. Later Reads cannot break it, since
// the bytes consumed and the payloads taken only grow.
func fuzzDrive(t testing.TB, c *Conn, inner *chunkConn, bufSize func() int, s *stream) readResult {
	t.Helper()
	var res readResult
	limit := 4*len(s.inOrNil()) + 4*inner.remaining() + 1000
	var buf []byte
	res.out = make([]byte, 0, inner.remaining()+maxOwed)
	next := 0 // the first PINGREQ of s whose replacement is not yet delivered
	for {
		res.reads++
		if res.reads > limit {
			t.Fatalf("no end after %d reads", res.reads)
		}
		size := bufSize()
		if size > len(buf) {
			buf = make([]byte, max(size, 2*len(buf)))
		}
		n, err := c.Read(buf[:size])
		if n < 0 || n > size {
			t.Fatalf("Read returned n=%d for a %d-byte buffer", n, size)
		}
		res.out = append(res.out, buf[:n]...)
		payloads, oversized := c.TakeLiftedReports()
		res.payloads = append(res.payloads, payloads...)
		res.oversized = oversized
		if s != nil {
			for ; next < len(s.outEnd) && s.outEnd[next] <= len(res.out); next++ {
				if len(res.payloads) <= next {
					t.Fatalf("PINGREQ %d delivered (output %d bytes) before its payload was queued", next, len(res.out))
				}
				if s.inEnd[next] > inner.consumed {
					t.Fatalf("PINGREQ %d delivered before its payload was read (read %d of %d bytes)", next, inner.consumed, s.inEnd[next])
				}
			}
		}
		if err != nil {
			res.err = err
			return res
		}
	}
}

// remaining returns how many bytes c has still to return.
func (c *chunkConn) remaining() int {
	n := 0
	for _, ch := range c.chunks {
		n += len(ch)
	}
	return n
}

func requireFuzzPayloads(t *testing.T, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("lifted %d payloads, want %d", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("payload %d: got %q want %q", i, got[i], want[i])
		}
	}
}

// fuzzPackets turns arbitrary bytes into whole packets: each takes a type
// byte, a length byte (mod 64, and at most max for a PINGREQ) and that
// many body bytes, as far as there are.
func fuzzPackets(b []byte, max int) [][]byte {
	var pkts [][]byte
	for len(b) >= 2 {
		typ, n := b[0], int(b[1]%64)
		if typ == pingreqByte {
			n = min(n, max)
		}
		b = b[2:]
		n = min(n, len(b))
		pkts = append(pkts, packet(typ, b[:n]))
		b = b[n:]
	}
	return pkts
}

// FuzzConnReadMalformedLength: whatever well-formed packets come first,
// a packet whose remaining length has a fourth byte with the continuation
// bit set ends the connection with ErrMalformedLength. Everything before
// it is delivered as usual; of it only the bytes before that fourth byte
// of a non-PINGREQ may be; nothing after it ever is, nor lifted.
func FuzzConnReadMalformedLength(f *testing.F) {
	f.Add([]byte{}, byte(0xC0), []byte{0x80, 0x80, 0x80, 0x80, 0x00}, []byte{}, uint64(0))
	f.Add([]byte{0x30, 3, 'a', 'b', 'c', 0xC0, 2, '{', '}'}, byte(0x30), []byte{0xFF, 0xFF, 0xFF, 0xFF, 0x7F}, packet(0xC0, []byte("{}")), uint64(0x0105))
	f.Add([]byte{0xC0, 10, '{', '"', 'm', '"', ':', '1', '}', ' ', ' ', ' '}, byte(0xC0), []byte{0xFF, 0xFF, 0xFF, 0xFF}, []byte{0xC0, 0}, uint64(0x4002))
	f.Add([]byte{0x82, 6, 0, 1, 0, 1, 'a', 0}, byte(0x82), []byte{0x80, 0x81, 0x82, 0x83, 0x84}, []byte{0x30, 0}, uint64(0x8000))

	f.Fuzz(func(t *testing.T, before []byte, typ byte, length []byte, after []byte, seed uint64) {
		if len(length) < 4 {
			return
		}
		max := 64
		s := &stream{}
		s.add(fuzzPackets(before, max)...)
		bad := []byte{typ, length[0] | 0x80, length[1] | 0x80, length[2] | 0x80, length[3] | 0x80}
		want := bytes.Clone(s.want)
		if typ != pingreqByte {
			want = append(want, bad[:4]...)
		}
		in := concat(s.in, bad, length[4:], after)

		plan := newFuzzReadPlan(in, seed)
		c := NewConn(plan.inner, max)
		res := fuzzDrive(t, c, plan.inner, boundedBuffers(t, c, plan.bufLen), s)
		if !errors.Is(res.err, ErrMalformedLength) {
			t.Fatalf("error %v, want ErrMalformedLength", res.err)
		}
		if !bytes.Equal(res.out, want) {
			t.Fatalf("output\n got %x\nwant %x", res.out, want)
		}
		requireFuzzPayloads(t, res.payloads, s.payloads)
		if res.oversized {
			t.Fatal("marked oversized")
		}
		if ref := reference(in, max); !ref.malformed || !bytes.Equal(ref.out, want) {
			t.Fatalf("reference disagrees: malformed %v, output %x", ref.malformed, ref.out)
		}
	})
}

// FuzzPublishPacketID: publishPacketID reads any bytes without panicking,
// and an identifier it returns lies inside the packet.
func FuzzPublishPacketID(f *testing.F) {
	f.Add([]byte{0x32, 0x06, 0x00, 0x01, 't', 0x12, 0x34, 0x00}, 1)
	f.Add([]byte{0x34, 0x04, 0x00, 0x00, 0xFF, 0xFF}, 1)
	f.Add([]byte{0x32, 0x03, 0x00, 0x05, 't'}, 1)
	f.Add([]byte{}, 0)
	f.Fuzz(func(t *testing.T, pk []byte, lengthBytes int) {
		if lengthBytes < 0 || lengthBytes > 4 {
			return // callers pass the 1 to 4 bytes of a decoded remaining length
		}
		id, ok := publishPacketID(pk, lengthBytes)
		if !ok {
			return
		}
		at := 1 + lengthBytes
		at += 2 + (int(pk[at])<<8 | int(pk[at+1]))
		if at+2 > len(pk) || uint16(pk[at])<<8|uint16(pk[at+1]) != id {
			t.Fatalf("identifier %d not at offset %d of %x", id, at, pk)
		}
	})
}
