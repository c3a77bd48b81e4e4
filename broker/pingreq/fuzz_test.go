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
	var sizes []int
	for n := 0; n < len(in); {
		s := 1 + rng.IntN(maxChunk)
		sizes = append(sizes, s)
		n += s
	}
	inner := newChunkConn(splitAt(bytes.Clone(in), sizes)...)
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
		res := drive(t, c, plan.inner, boundedBuffers(t, c, plan.bufLen), s)

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
		res := drive(t, c, plan.inner, boundedBuffers(t, c, plan.bufLen), s)
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
